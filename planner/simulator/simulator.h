// simulator.h: a discrete-event replay of a plan on three streams (compute, D2H, H2D) with
// the link model, the pinned-pool capacity and the lookahead depth (`stash simulate`).
//
// Note [Runtime semantics the simulator replays]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The prefetch engine's rules are Note [The step's schedule] (schedule.h): forward of i+2
// waits for layer i's copies, the loss turn for all of them, backward of i issues the
// prefetches of its lookahead window. The simulator applies them through the same
// functions; this note says how it times them.
//  * Compute runs fwd 0..L-1, then for i = L-1..0: recompute of layer i's recomputed
//    tensors (R_i, on the compute stream, at the start of its backward), then bwd_i.
//  * Offloads of layer i are issued on the D2H stream when its forward ends (the profile has
//    no per-tensor production times, so the producer event is the layer's end). A device
//    block is freed when its copy completes. A (rule-breaking) offload of the last layer is
//    prefetched at its forward's end, since its backward cannot wait on itself.
//  * The turn barrier (turn_barrier, on by default) holds the step overhead and the first
//    backward until every forward offload is done.
//  * The profile's step_overhead_ms (loss, optimizer, uploads: Note [Step overhead] in
//    plan.h) runs as one compute span at the turn, after the barrier and before the first
//    backward (its recompute included): the loss sits there, and the time outside the
//    layers is measured as one figure, so the optimizer's share is not split off. Nothing
//    overlaps it at depth 1 with the barrier (every D2H is done, no prefetch is issued
//    yet), as nothing would before forward 0 or after backward 0 either, so the step time
//    does not depend on where it is drawn. Waiting at the barrier first is the
//    conservative choice (the engine's loss can run under the last D2H): hiding copies
//    under it would make the overhead a copy window, which the canonical model, where it is
//    a constant, does not have. Without the barrier it overlaps the last D2H. A zero
//    overhead adds no span.
//  * Backward of layer i "begins", for the prefetch window, when its backward compute
//    begins, i.e. after that layer's recompute (prefetch_after_recompute): the canonical
//    window for layer i's H2D is bwd_{i+1}, not R_{i+1} + bwd_{i+1}. A prefetch copy also
//    waits for its own D2H to have completed (stream-ordered event). The device block is
//    allocated at issue.
//  * Backward of layer i (its recompute included: recompute starts from the layer input,
//    which may itself be offloaded) waits for all of layer i's prefetches.
//  * Memory: fixed bytes throughout; a layer's saved tensors are allocated when its forward
//    starts; recomputed ones are freed when it ends and reallocated when its recompute
//    starts; bwd_temp_bytes, and the plan's share of bwd_recompute_temp_bytes (Note
//    [Backward temporaries of a recompute] in plan.h), are allocated when its backward
//    compute starts; everything of
//    layer i (and its pinned blocks) is released when bwd_i ends. Frees at an instant are
//    applied before allocations at the same instant.
//
// Note [Link model]
// ~~~~~~~~~~~~~~~~~
// One copy at a time per direction (each direction is one stream). Alone, a direction runs
// at its own bandwidth (d2h_gbps / h2d_gbps). While both directions are active and
// share_link is on, they split bidir_gbps max-min fairly:
//     r_d2h = min(d2h, max(bidir/2, bidir - h2d)),  r_h2d = min(h2d, max(bidir/2, bidir - d2h))
// so a direction that needs less than half leaves the rest to the other, and sharing never
// binds when bidir >= d2h + h2d. An in-flight copy is re-timed (its remaining bytes at the
// new rate) whenever the other direction starts or stops.
//
// Note [Pinned capacity]
// ~~~~~~~~~~~~~~~~~~~~~~
// A pinned block is reserved when its offload is issued and returned when the layer's
// backward releases the tensor. Within one step no block is returned before backward
// begins, so an engine that *waited* for pinned memory during forward would deadlock; the
// simulator therefore applies the engine's other policy: an offload that does not fit in
// the remaining capacity stays on the device (counted as a fallback) and is treated as
// kept, so it costs memory, not time.
//
// Note [Simulator vs canonical model]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// At depth 1, with unlimited pinned memory, turn_barrier and prefetch_after_recompute, the
// replay computes the canonical formulas (plan.h) exactly:
//  * D2H of layer i starts exactly when fwd_{i+1} starts (D2H of layer i-1 ended before
//    fwd_{i+1} could start, by the i+2 rule), so fwd_{i+2} (or the turn, for i = L-2) is
//    delayed by exactly max(0, O_i/d2h - fwd_{i+1}); the delays add up.
//  * H2D of layer i starts exactly when bwd_{i+1} starts (H2D of layer i+1 ended before
//    layer i+1's backward could begin), so backward of layer i is delayed by exactly
//    max(0, O_i/h2d - bwd_{i+1}).
//  * D2H and H2D are never active together (the turn barrier separates them), so the
//    link's bidir sharing cannot bind and the copy times are bytes / bandwidth.
//  * The step overhead starts after the barrier and ends before any prefetch is issued,
//    so it adds exactly step_overhead_ms.
//  * At the start of fwd_i the device holds fixed + sum_{l<i} K_l + O_{i-1} (in flight) +
//    A_i; at the start of bwd_i it holds fixed + sum_{l<i} K_l + A_i + O_{i-1} (prefetch of
//    layer i-1 just issued) + bwd_temp_i + rtemp_i. Between these instants memory only
//    falls.
// Depth > 1 prefetches earlier (less exposed H2D, more memory); a pinned cap below the
// plan's offloaded bytes raises the peak. Both leave the canonical model on purpose.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "planner/model/plan.h"
#include "planner/model/profile.h"
#include "planner/model/trace.h"

namespace stash::planner {

struct sim_options {
  int lookahead = 1;  // the prefetch window's depth (Note [The step's schedule])
  std::uint64_t pinned_bytes = std::numeric_limits<std::uint64_t>::max();  // pool capacity
  bool share_link = true;                // apply bidir_gbps while both directions run
  bool turn_barrier = true;              // backward waits for every forward offload
  bool prefetch_after_recompute = true;  // issue at the backward compute, after recompute
  bool record_trace = true;
};

struct sim_result {
  double step_ms = 0;
  double compute_ms = 0;       // sum of fwd + bwd
  double recompute_ms = 0;     // sum of R_i
  double step_overhead_ms = 0; // the profile's, one compute span at the turn
  double exposed_copy_ms = 0;  // compute-stream waits for copies (d2h + h2d)
  double d2h_wait_ms = 0, h2d_wait_ms = 0;
  double link_shared_ms = 0;   // time both directions were active
  std::uint64_t peak_bytes = 0;
  double peak_time_ms = 0;
  std::string peak_at;  // "forward[3]" | "backward[3]": the compute phase at the peak
  std::uint64_t offloaded_bytes = 0;        // bytes actually copied out
  std::uint64_t pinned_peak_bytes = 0;
  std::uint64_t pinned_fallback_bytes = 0;  // offloads kept on device: pool full
  std::size_t pinned_fallback_tensors = 0;
  trace_writer trace{"stash simulate"};
};

// Replays `d` (one action per tensor; input_error otherwise) on `p`. Plans that break the
// rules (e.g. offloading the last layer) are replayed as written: validity is evaluate()'s
// job. Throws input_error for lookahead < schedule::kMinLookahead.
sim_result simulate(const step_profile& p, const decision_table& d, const sim_options& opt = {});

}  // namespace stash::planner
