#include "runtime/measure/scope_name.h"

#include <charconv>
#include <limits>

namespace stash::measure {

namespace {
constexpr std::string_view kLayer = "stash:layer:";
constexpr std::string_view kTensor = "stash:tensor:";

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
}  // namespace

std::optional<scope_name> parse_scope_name(std::string_view text) {
  if (starts_with(text, kTensor)) {
    std::string_view tensor = text.substr(kTensor.size());
    if (tensor.empty()) return std::nullopt;
    scope_name n;
    n.kind = scope_kind::tensor;
    n.tensor = std::string(tensor);
    return n;
  }
  if (!starts_with(text, kLayer)) return std::nullopt;
  std::string_view rest = text.substr(kLayer.size());
  const size_t colon = rest.find(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  const std::string_view digits = rest.substr(0, colon);
  const std::string_view phase = rest.substr(colon + 1);
  for (char c : digits)
    if (c < '0' || c > '9') return std::nullopt;
  int layer = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), layer);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  scope_name n;
  n.layer = layer;
  if (phase == "fwd") {
    n.kind = scope_kind::layer_forward;
  } else if (phase == "bwd") {
    n.kind = scope_kind::layer_backward;
  } else {
    return std::nullopt;
  }
  return n;
}

std::string layer_scope_name(int layer, bool backward) {
  return std::string(kLayer) + std::to_string(layer) + (backward ? ":bwd" : ":fwd");
}

std::string tensor_scope_name(std::string_view tensor) {
  return std::string(kTensor) + std::string(tensor);
}

}  // namespace stash::measure
