// budget.cpp: the syntax of a memory budget (budget.h).
#include "core/budget.h"

#include <cstdlib>

#include "core/bytes.h"
#include "core/error.h"

namespace stash {

budget_spec parse_budget_spec(const std::string& text) {
  budget_spec b;
  const std::size_t end = text.find_last_not_of(" \t");
  if (end == std::string::npos || text[end] != '%') {
    const byte_count r = parse_byte_count(text.data(), text.size());
    if (r.error != byte_count_error::none) {
      throw input_error("budget \"" + text + "\": " + byte_count_problem(text, r));
    }
    b.bytes = r.bytes;
    return b;
  }
  const std::string num = text.substr(0, end);
  char* stop = nullptr;
  const double pct = std::strtod(num.c_str(), &stop);
  const bool only_number =
      stop != num.c_str() && num.find_first_not_of(" \t", stop - num.c_str()) == std::string::npos;
  if (!only_number || !(pct > 0) || !(pct <= 1000)) {
    throw input_error("budget \"" + text +
                      "\": expected a share of the keep-all peak in (0, 1000]%, e.g. 70%");
  }
  b.is_share = true;
  b.percent = pct;
  return b;
}

}  // namespace stash
