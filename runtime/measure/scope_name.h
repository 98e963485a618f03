// scope_name.h: the names of the host scopes that delimit layers and tensor producers.
//
//   stash:layer:<i>:fwd    forward of layer i (i = 0, 1, ... in model order)
//   stash:layer:<i>:bwd    backward of layer i
//   stash:tensor:<name>    the producer of saved tensor <name> of the enclosing layer
//
// These are NVTX range messages (any domain) and the names the C API's profiler scopes
// open; a PyTorch user adds them with torch.cuda.nvtx.range_push/pop.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace stash::measure {

enum class scope_kind { layer_forward, layer_backward, tensor };

struct scope_name {
  scope_kind kind = scope_kind::layer_forward;
  int layer = -1;      // layer scopes: the index
  std::string tensor;  // tensor scopes: the name
  bool is_layer() const { return kind != scope_kind::tensor; }
};

// nullopt for every other name, malformed stash names included ("stash:layer:x:fwd",
// "stash:layer:-1:fwd", "stash:tensor:"): those are ordinary ranges to attribution.
std::optional<scope_name> parse_scope_name(std::string_view text);

std::string layer_scope_name(int layer, bool backward);
std::string tensor_scope_name(std::string_view tensor);

}  // namespace stash::measure
