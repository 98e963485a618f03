// profile_fill.h: a measurement (+ a skeleton, + a link section) -> profile.json.
//
// CUPTI sees kernels, not tensors: it cannot know a tensor's bytes or whether it may be
// offloaded. A skeleton is a stash.profile/1 that lists every layer's tensors with bytes
// and flags (the built-in workload writes one; the PyTorch record pass writes one); its
// times may be 0. Filling it:
//   - skeleton.layers[i] takes fwd_ms / bwd_ms = the median samples of stash:layer:<i>
//     (i is the position in the skeleton's layer list, counting from 0);
//   - tensor t of layer i takes recompute_ms = the median producer time of the scope
//     stash:tensor:<t.name> nested in layer i's forward (a recompute reruns its producer);
//   - step_overhead_ms = the median over steps of the kernel time outside every layer
//     scope (Note [Time outside the layers] in attribution.h);
//   - source becomes "measured"; the link section is replaced when one is given;
//   - the result is validated as stash.profile/1, so it is ready for `stash plan`.
// Whatever the skeleton lists but the run did not measure (a layer's forward or backward, a
// recomputable tensor's producer) keeps the skeleton's value and is named in `notes`, which
// also carry the measurement's warnings (dropped records) and go into the profile as
// measurement.notes: an empty list means every time the skeleton needs was measured.
// Without a skeleton, the output has per-layer times (and the step overhead) only, is
// marked "plannable": false, and notes say so.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/model/profile.h"
#include "runtime/measure/measurement.h"

namespace stash::measure {

struct filled_profile {
  nlohmann::json json;  // what profile.json gets; includes a "measurement" summary
  bool plannable = false;
  std::vector<std::string> notes;  // for the user, one line each
};

// Throws stash::input_error when the skeleton's filled result does not validate.
filled_profile fill_profile(const measurement& m, const planner::step_profile* skeleton,
                            const std::optional<planner::link_profile>& link);

// The link section of a file: a profile's "link", or a `stash bench link --json` output
// (which has one at its top level too). Throws stash::input_error naming the path.
planner::link_profile load_link_section(const std::string& path);

nlohmann::json link_to_json(const planner::link_profile& link);

}  // namespace stash::measure
