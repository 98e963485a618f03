// engine_trace.h: times every engine operation with CUDA events and turns the timings into
// spans of planner/model/trace.h's format, so `stash simulate`'s predicted timeline and the
// engine's measured one open side by side and print the same overlap report.
//
// Note [Timing with events]
// Each op is bracketed by two events recorded on the stream it runs on: copies on the D2H
// or H2D stream, layer compute and waits on the compute (or consumer) stream. A wait span
// is the gap between an event recorded just before cudaStreamWaitEvent and one just after:
// exactly the time the stream stood still (on the double's virtual clock event records take
// no time; on a GPU they take ~µs). Times are elapsed from a base event recorded on the
// compute stream when the engine was created. Ops are harvested in bulk: without blocking
// (cudaEventElapsedTime reports not-ready, nothing is queried or synchronized) at the end
// of each micro-batch's backward, and blocking when a trace or report is asked for; their
// events then go back to the pool.
//
// Note [Measured device bytes]
// The simulator's "device bytes" counter is the planner's memory schedule. The engine's is
// measured when it runs on stash's device pool (engine_config::pool): the pool's held bytes
// (blocks in use plus blocks freed but still awaited by their streams: what it cannot hand
// out, the quantity the workload reports as its measured peak), read on the host
//  - as each copy is submitted (a prefetch's after its destination block is allocated),
//    drawn at the copy's start;
//  - as each layer's compute span ends: the level then, drawn at the span's end, and the
//    highest level since the previous span ended (the pool tracks it at every allocation),
//    drawn at the span's start. A layer's temporaries peak inside it, and the work between
//    two layers (the loss, say) counts in the next.
// The pool is stream-ordered, so its count moves when the host enqueues work, which is when
// these reads happen; placing them at the ops' GPU times draws the schedule the GPU ran.
// The counter's maximum is the pool's held peak over the trace. With the caller's allocator
// (callbacks) there is no counter: the engine sees only the blocks it moves. One engine per
// pool should sample it (the highest-level window is the pool's, not the engine's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "engine_plan.h"
#include "core/error.h"
#include "planner/model/trace.h"
#include "tensor_table.h"

namespace stash::engine {

struct timed_op {
  planner::span_kind kind = planner::span_kind::other;
  const char* what = "";  // waits: "d2h" / "h2d" / "turn"
  std::int32_t layer = -1;
  std::uint32_t micro_batch = 0;
  std::size_t flat = engine_plan::npos;  // copies: the tensor
  std::uint64_t bytes = 0;
  std::uint64_t pinned_bytes = 0;        // pinned bytes in use when it was submitted
  // Note [Measured device bytes]; kNoSample without stash's device pool. device_bytes: the
  // pool's held bytes when the op was submitted (copies) or ended (compute); device_peak
  // (compute): the highest level since the previous compute span ended.
  static constexpr std::uint64_t kNoSample = ~std::uint64_t{0};
  std::uint64_t device_bytes = kNoSample;
  std::uint64_t device_peak = kNoSample;
  cudaEvent_t start = nullptr, end = nullptr;
};

class engine_trace {
 public:
  engine_trace(event_pool& events, cudaStream_t base_stream);  // throws stash::error
  ~engine_trace();
  engine_trace(const engine_trace&) = delete;
  engine_trace& operator=(const engine_trace&) = delete;

  status reserve(std::size_t ops) noexcept;
  // Takes two events and records the first on `s`; *id names the op for stop().
  status start(const timed_op& op, cudaStream_t s, std::size_t* id) noexcept;
  status stop(std::size_t id, cudaStream_t s) noexcept;
  // Drops an op whose start was recorded but whose work was not enqueued (a failure).
  void cancel(std::size_t id) noexcept;
  // Spans that cross engine calls (layer compute): mark() records a start event now;
  // finish() records the end event on `s` and queues op (whose start is that event).
  // Ids of start() are only valid within one engine call; harvest() may move ops.
  status mark(cudaStream_t s, cudaEvent_t* out) noexcept;
  status finish(timed_op op, cudaStream_t s) noexcept;
  void drop_mark(cudaEvent_t ev) noexcept { events_.give(ev); }
  // Turns completed ops into spans. block: wait for all of them first.
  void harvest(bool block, const engine_plan& plan);
  const planner::trace_writer& writer() const noexcept { return writer_; }

 private:
  event_pool& events_;
  cudaEvent_t base_ = nullptr;
  std::vector<timed_op> ops_;
  planner::trace_writer writer_{"stash engine"};
};

}  // namespace stash::engine
