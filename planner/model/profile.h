// profile.h: the planner's input, schema "stash.profile/1" (documented in README.md).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"

#include <nlohmann/json_fwd.hpp>

namespace stash::planner {

// Malformed input is a stash::input_error (core/error.h): every message names the field,
// with a JSON path such as "layers[3].tensors[0].bytes".

inline constexpr const char* kProfileSchema = "stash.profile/1";
// Tensors under this size never offload (TransformerEngine/Megatron use the same floor).
inline constexpr std::uint64_t kMinOffloadBytes = 1048576;

enum class profile_source { analytic, measured };

// How recompute is paid for (Note [Recompute by prefix] in plan.h): per_tensor, each
// recomputed tensor its own recompute_ms (its producer run from kept inputs); prefix, a
// layer's recompute replays its forward from its input up to the last tensor it needs, so
// it pays every recompute_ms up to that tensor's, chosen or not.
enum class recompute_cost { per_tensor, prefix };

struct tensor_profile {
  std::string name;
  std::uint64_t bytes = 0;
  double recompute_ms = 0;
  bool offloadable = true;
  bool recomputable = true;
  bool must_keep = false;
};

struct layer_profile {
  std::string name;
  std::string signature;
  double fwd_ms = 0;
  double bwd_ms = 0;
  std::uint64_t bwd_temp_bytes = 0;
  // The temporaries the layer's backward makes above bwd_temp_bytes when every tensor
  // allowed to recompute is recomputed: the replay's own intermediates (optional
  // "bwd_recompute_temp_bytes", default 0). A plan pays the share it recomputes (Note
  // [Backward temporaries of a recompute] in plan.h).
  std::uint64_t bwd_recompute_temp_bytes = 0;
  std::vector<tensor_profile> tensors;

  std::uint64_t saved_bytes() const;  // A_i
};

struct link_profile {
  double h2d_gbps = 0;    // per rank, 1e9 B/s
  double d2h_gbps = 0;    // per rank
  double bidir_gbps = 0;  // both directions at once, aggregate
  int local_ranks = 1;    // informational
};

struct step_profile {
  profile_source source = profile_source::analytic;
  std::string device_name;
  std::uint64_t device_memory_bytes = 0;
  link_profile link;
  std::uint64_t pinnable_bytes = 0;  // per rank
  std::uint64_t fixed_bytes = 0;
  // Per-step time outside every layer: the loss, the optimizer step, input uploads
  // (optional "step_overhead_ms", default 0). A constant of the step: it adds to every
  // step time and moves no plan decision (Note [Step overhead] in plan.h).
  double step_overhead_ms = 0;
  // The most the step holds in its optimizer step, after the last backward, when no
  // activation is alive (optional "optimizer_bytes", default 0): every gradient, the
  // optimizer's state and its temporaries. A position of its own that no decision moves
  // (Note [The optimizer's position] in plan.h).
  std::uint64_t optimizer_bytes = 0;
  // What the step holds above the fixed bytes and the kept activations between the last
  // layer's forward and its backward (optional "loss_bytes", default 0): the head, the loss
  // and their backward until the last layer's backward begins. A position of its own,
  // after the forwards and before the backwards, that decisions move through what they
  // keep (Note [The loss's position] in plan.h).
  std::uint64_t loss_bytes = 0;
  // Optional "recompute_cost": "per_tensor" (the default) or "prefix".
  recompute_cost recompute = recompute_cost::per_tensor;
  std::vector<layer_profile> layers;

  // Bandwidths in bytes per millisecond, as the cost model uses them.
  double d2h_bytes_per_ms() const { return link.d2h_gbps * 1e6; }
  double h2d_bytes_per_ms() const { return link.h2d_gbps * 1e6; }
};

// Parse and validate. Rejects any schema other than stash.profile/1, missing fields,
// negative / fractional / non-numeric sizes, negative or non-finite times, empty layer
// lists and duplicate tensor names within a layer; every message names the field.
// "step_overhead_ms" is optional (absent: 0); when present it is a time like the others.
step_profile profile_from_json(const nlohmann::json& j);
nlohmann::json profile_to_json(const step_profile& p);
// Reads a file; errors name the path. Bad JSON is an input_error with line/column.
step_profile load_profile(const std::string& path);
// profile_to_json writes "step_overhead_ms" (and every other optional field, a layer's
// "bwd_recompute_temp_bytes" included) only when it is not 0, so a profile without it
// serializes, and hashes, exactly as it did before the field existed.
// Lowercase hex SHA-256 of the canonical serialization (profile_to_json(p).dump()).
std::string profile_sha256(const step_profile& p);

}  // namespace stash::planner
