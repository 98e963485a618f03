// schedule.h: the rules of a step's copy schedule, in one place: the simulator replays them
// (simulator.cpp) and the prefetch engine enforces them with CUDA events
// (runtime/engine/engine_backward.cpp). Pure C++, no CUDA: these functions answer which
// layers; each side keeps its own bookkeeping (pending copies in the simulator, events in
// the engine).
//
// Note [The step's schedule]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A step of L layers runs forward 0..L-1, the loss turn, then backward L-1..0. The
// offloaded tensors of a layer are copied to the host (D2H) during forward and back (H2D,
// the prefetch) during backward, on one stream per direction.
//  * One layer in flight: forward of layer i waits for every D2H copy of layer i-2
//    (forward_waits_for; layers 0 and 1 wait for none). While layer i runs only layer
//    i-1's copies may still be in flight, which is what the canonical peak assumes
//    (forward_i holds O_{i-1}, plan.h): a slow copy costs compute time, never memory. It is
//    also the point from which an offloaded block is free memory for the compute stream
//    (Note [Handing offloaded blocks back] in runtime/engine/prefetch_engine.h).
//  * The loss turn: the loss and the first backward (layer L-1) wait for every D2H copy
//    of the step (turn_waits_for: layers 0..L-1), not only layer L-2's as the rule above
//    would give "forward of layer L". The engine enqueues that wait at the last layer's
//    forward_end (at the first backward_begin when no forward_end came), so the loss runs
//    as position L of the canonical peak, which holds no offload of layer L-2 (Note [The
//    loss's position] in plan.h; the simulator runs the step overhead, the loss, after
//    the same barrier). Enqueued at backward_begin, after the loss, it left layer L-2's
//    sources alive through the loss wherever the host had not yet seen their copies end:
//    on the CPU test double under load, 1.75 MiB over a 30 MiB plan. The canonical model
//    charges max(0, O_{L-2}/d2h - fwd_{L-1}) in full, which is exactly this wait, and no
//    prefetch then runs beside an offload.
//    (simulate's turn_barrier = false drops it, for what-if runs.)
//  * Prefetch lookahead d >= 1 (kMinLookahead): when backward of layer i begins, the
//    prefetches of layers i .. i-d (down to 0) not issued yet are issued, highest layer
//    first (prefetch_window). In step order layer i and i-1 .. i-d+1 were issued before,
//    so backward of i issues layer i-d, and the first backward issues the run
//    L-2 .. L-1-d; layer i itself is in the window for a prefetch still missing then (the
//    simulator issues a last layer's offloads at its forward's end; a caller that
//    skipped a layer's backward_begin). At d = 1 layer i's H2D runs under bwd_{i+1}: the
//    canonical window.
//  * Backward of layer i waits for layer i's prefetches (the engine per tensor, at
//    acquire), and a prefetch copy waits for its own D2H.
// How each side times these: Note [Runtime semantics the simulator replays] (simulator.h)
// and Note [Engine streams and events] (prefetch_engine.h).
#pragma once

#include <cstddef>

namespace stash::planner::schedule {

// The smallest prefetch lookahead depth (the simulator and the engine refuse less).
inline constexpr int kMinLookahead = 1;

// Layers lo..hi (inclusive); empty when lo > hi.
struct layer_span {
  std::size_t lo = 1, hi = 0;
  constexpr bool empty() const noexcept { return lo > hi; }
  constexpr bool contains(std::size_t layer) const noexcept { return lo <= layer && layer <= hi; }
};

// The layers whose D2H copies forward of `layer` waits for: layer-2, or none.
constexpr layer_span forward_waits_for(std::size_t layer) noexcept {
  return layer >= 2 ? layer_span{layer - 2, layer - 2} : layer_span{};
}

// The layers whose D2H copies the loss turn (the first backward of a step of `n_layers`
// layers) waits for: all of them.
constexpr layer_span turn_waits_for(std::size_t n_layers) noexcept {
  return n_layers > 0 ? layer_span{0, n_layers - 1} : layer_span{};
}

// The layers whose prefetches backward of `layer` issues (those not issued yet, hi first)
// at lookahead depth `lookahead` (>= kMinLookahead): layer .. layer-lookahead, down to 0.
constexpr layer_span prefetch_window(std::size_t layer, int lookahead) noexcept {
  const std::size_t d = static_cast<std::size_t>(lookahead);
  return layer_span{layer >= d ? layer - d : 0, layer};
}

}  // namespace stash::planner::schedule
