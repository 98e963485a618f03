// budget.h: the syntax of a memory budget as a user writes it: a byte count ("80GiB",
// "85.9GB", "123456"; Note [One byte-count syntax] in bytes.h) or a share of the keep-all
// peak ("70%"), the way PyTorch's memory budget takes a ratio. What a share comes to needs
// a profile, so it is the planner's (planner::parse_budget); only the syntax is here.
#pragma once

#include <cstdint>
#include <string>

namespace stash {

struct budget_spec {
  bool is_share = false;  // "70%": percent is set; otherwise bytes is
  std::uint64_t bytes = 0;
  double percent = 0;     // in (0, 1000]
};

// Parses a budget. A share is a number then "%", spaces and tabs allowed around both
// ("70 %"), in (0, 1000]. Throws input_error "budget \"<text>\": <what is wrong>".
budget_spec parse_budget_spec(const std::string& text);

}  // namespace stash
