// skeleton.h: the workload's stash.profile/1 skeleton: every layer's five saved tensors
// with their bytes and flags, the backward temporaries and the fixed bytes, with every time
// 0. CUPTI cannot know tensor sizes; `stash profile --skeleton` (or stash_profiler_stop with
// the skeleton) fills the times in (docs/measure.md).
//
// Note [What the skeleton counts]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The figures are the driver's allocations as the device pool carves them (model.h, Note
// [Memory schedule of the step]), so the planner's canonical peak for a plan is the pool's
// measured peak for it:
//  * tensors: input x [T][H] (not recomputable: recompute starts from it), ln.stats [T][2],
//    ln.out [T][H], fc1.out [T][F], act.out [T][F];
//  * bwd_temp_bytes: dout [T][H] + da [T][F] + dh [T][F], the widest set of backward
//    temporaries (du [T][H] replaces da); it also covers the loss turn (out, target, dout);
//  * fixed_bytes: parameters + gradients + the cuBLAS workspace (CUDA backend) + one loss
//    value per micro-batch: everything live through the step.
// Every layer has the signature "mlp_block:H:F:T", so the planner solves one layer problem.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tools/demo/driver/model.h"
#include "planner/model/profile.h"

namespace stash::workload {

struct skeleton_options {
  std::string device_name;  // from the runtime (device_facts)
  std::uint64_t device_memory_bytes = 0;
  // The link section: a measurement (stash bench link, measure::run_link_bench) when one
  // was made; otherwise a stated assumption (kAssumedLink) that the output names.
  std::optional<planner::link_profile> link;
  // 0: the pinned pool's default cap, 0.8 x min(MemAvailable, cgroup headroom) /
  // LOCAL_WORLD_SIZE (allocator/host_memory.h), so the planner never counts on more pinned
  // memory than the engine's pool gives.
  std::uint64_t pinnable_bytes = 0;
};

// PCIe Gen5 x16 as measured by nvbandwidth on H100/H200 (planner/model/analytic.h uses the same):
// 55 GB/s per direction, 100 GB/s both ways.
planner::link_profile assumed_link();

// The device's name and memory from the CUDA runtime (device 0 or the current one);
// stash::error naming the CUDA error when there is none.
void device_facts(std::string* name, std::uint64_t* memory_bytes);

// The skeleton as a validated profile (source "measured": its times are to be measured).
planner::step_profile make_skeleton(const model_config& c, backend_kind kind,
                                    const skeleton_options& o, std::size_t pool_alignment = 512);
// profile_to_json plus a "workload" object recording the configuration and where the link
// figures came from (ignored by the planner, kept for people).
nlohmann::json skeleton_json(const planner::step_profile& p, const model_config& c,
                             backend_kind kind, bool link_measured);

}  // namespace stash::workload
