// The engine under CUDA graphs: Note [Capturing a step] in prefetch_engine.h.
#include <cstdarg>
#include <cstdio>
#include <utility>

#include "engine_trace.h"
#include "prefetch_engine.h"

namespace stash::engine {

status prefetch_engine::refuse(const char* fmt, ...) noexcept {
  char msg[sizeof refusal_];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!refused_) std::snprintf(refusal_, sizeof refusal_, "%s", msg);
  refused_ = true;
  return fail(status::capture, "%s", msg);
}

void prefetch_engine::drop_graph() noexcept {
  if (!graph_) return;
  // A launch may still run: the executable graph goes only after it.
  prim::stream_synchronize(config_.compute);
  cudaGraphExecDestroy(std::exchange(graph_, nullptr));
  prim::clear_runtime_error();
}

status prefetch_engine::begin_capture(std::size_t pinned_bytes) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  settle_if_ended();
  if (capturing_)
    return fail(status::capture, "begin_capture: a capture is already under way%s",
                joined_ ? " (the caller's, joined by capture_join)" : "");
  if (plan_.empty()) return fail(no_plan, "begin_capture: no plan loaded");
  for (const micro_batch_slot& s : slots_)
    if (s.used && s.live > 0)
      return fail(illegal_transition,
                  "begin_capture: micro-batch %u still holds %zu tensors; a step is captured "
                  "whole, from its first forward_begin to its last release",
                  s.id, s.live);
  // Everything the step would wait for, query or allocate happens here, before capture.
  STASH_CUDA_FAIL(prim::stream_synchronize(d2h_.get()));
  STASH_CUDA_FAIL(prim::stream_synchronize(h2d_.get()));
  while (!in_flight_.empty()) {
    STASH_CUDA_FAIL(prim::event_synchronize(in_flight_.front().done));
    retire_front();
  }
  // The pinned bytes the step will hold, free now (stats() reaps the blocks the last
  // copies guarded); pin what is missing. Free bytes may be fragmented: callers give some
  // slack.
  const pool_stats ps = pinned_->stats();
  const std::uint64_t free_now = ps.reserved_bytes - ps.current_bytes - ps.pending_bytes;
  if (pinned_bytes > free_now) {
    const status st = pinned_->reserve(pinned_bytes - free_now);
    if (st != status::ok) return st;
  }
  // A step's events (d2h + h2d per tensor, per-layer copy events, one order event per
  // prefetch, recycled at once) for every micro-batch slot: captured copies are retired,
  // and their events given back, only at end_capture.
  const std::size_t n = plan_.total(), L = plan_.layers();
  if (const status st = events_.reserve(config_.max_micro_batches * (2 * n + L) + 8);
      st != status::ok)
    return st;
  if (!replayed_.get()) {
    try {
      replayed_ = prim::make_event(false);
    } catch (const error& e) {
      return fail(e.code(), "begin_capture: %s", e.what());
    }
  }
  drop_graph();
  const cudaError_t err = cudaStreamBeginCapture(config_.compute, cudaStreamCaptureModeGlobal);
  if (err != cudaSuccess)
    return prim::record_cuda_error(err, "cudaStreamBeginCapture(compute)", __FILE__, __LINE__);
  capturing_ = true;
  enter_capture();
  return status::ok;
}

status prefetch_engine::end_capture() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!capturing_) return fail(status::capture, "end_capture: no capture under way");
  if (joined_)
    return fail(status::capture,
                "end_capture: the capture under way is the caller's (capture_join): the "
                "caller ends it, then capture_settle");
  // Join the engine's streams back into the compute stream, where they forked into the
  // capture: a whole step has joined them already (the loss turn, the acquires), a
  // refused or partial one may not have, and the capture must still end cleanly.
  for (cudaStream_t c : {d2h_.get(), h2d_.get()}) {
    bool member = false;
    if (prim::stream_capturing(c, &member) != cudaSuccess) prim::clear_runtime_error();
    if (member && prim::event_record(replayed_.get(), c) == cudaSuccess)
      prim::stream_wait(config_.compute, replayed_.get());
  }
  cudaGraph_t g = nullptr;
  const cudaError_t err = cudaStreamEndCapture(config_.compute, &g);
  capturing_ = false;
  pinned_->set_frozen(false);
  events_.set_frozen(false);
  trace_ = std::move(parked_trace_);
  // The captured copies, by bookkeeping alone: the graph's end joins every branch into
  // the compute stream, so their blocks are the compute stream's again for all work
  // ordered after a launch (and nothing of the capture ran).
  while (!in_flight_.empty()) retire_front();
  status st = status::ok;
  const micro_batch_slot* live = nullptr;
  for (const micro_batch_slot& s : slots_)
    if (s.used && s.live > 0 && !live) live = &s;
  if (err != cudaSuccess) {
    st = prim::record_cuda_error(err, "cudaStreamEndCapture(compute)", __FILE__, __LINE__);
  } else if (refused_) {
    st = fail(status::capture, "end_capture: the graph is discarded: %s", refusal_);
  } else if (live) {
    st = fail(status::capture,
              "end_capture: micro-batch %u still holds %zu tensors: a captured step must "
              "release every tensor it offered; the graph is discarded",
              live->id, live->live);
  } else if (stats_.failed_count != failed_at_begin_) {
    st = fail(status::capture,
              "end_capture: %llu tensor(s) failed during the capture (the failing call "
              "returned why); the graph is discarded",
              static_cast<unsigned long long>(stats_.failed_count - failed_at_begin_));
  } else {
    const cudaError_t ie = cudaGraphInstantiate(&graph_, g, 0);
    if (ie != cudaSuccess) {
      graph_ = nullptr;
      st = prim::record_cuda_error(ie, "cudaGraphInstantiate", __FILE__, __LINE__);
    }
  }
  if (g) cudaGraphDestroy(g);
  if (st == status::ok) {
    ++captures_;
    dropped_by_plan_ = false;
  }
  return st;
}

status prefetch_engine::replay() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  settle_if_ended();
  if (capturing_) return fail(status::capture, "replay during a graph capture");
  if (!graph_)
    return fail(status::capture, dropped_by_plan_
                                     ? "replay: the captured step was dropped when the plan "
                                       "changed (set_plan): capture the step again under the "
                                       "new plan"
                                     : "replay: no step has been captured (begin_capture, "
                                       "the step, end_capture)");
  STASH_CUDA_FAIL(cudaGraphLaunch(graph_, config_.compute));
  ++replays_;
  // Note [Capturing a step]: the engine's later copies are ordered after the replay's.
  STASH_CUDA_FAIL(prim::event_record(replayed_.get(), config_.compute));
  STASH_CUDA_FAIL(prim::stream_wait(d2h_.get(), replayed_.get()));
  STASH_CUDA_FAIL(prim::stream_wait(h2d_.get(), replayed_.get()));
  return status::ok;
}

prefetch_engine::graph_state prefetch_engine::graph() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  graph_state g;
  g.capturing = capturing_;
  g.ready = graph_ != nullptr;
  g.captures = captures_;
  g.replays = replays_;
  return g;
}

// --- Note [Capture begun by the caller] ------------------------------------------------

bool actively_capturing(cudaStream_t stream) noexcept {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
    prim::clear_runtime_error();
    return false;
  }
  return st == cudaStreamCaptureStatusActive;
}

bool prefetch_engine::joined_stream_ended() noexcept {
  if (!joined_) return false;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(config_.compute, &st) != cudaSuccess) {
    prim::clear_runtime_error();
    return false;  // cannot tell: stay joined
  }
  return st == cudaStreamCaptureStatusNone;
}

status prefetch_engine::join_capture(cudaStream_t stream) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  settle_if_ended();
  return join_locked(stream, "capture_join");
}

status prefetch_engine::join_locked(cudaStream_t stream, const char* op) noexcept {
  if (capturing_)
    return fail(status::capture, "%s: a capture is already under way (%s)", op,
                joined_ ? "the caller's, joined before: end it and capture_settle"
                        : "the engine's own, from capture_begin");
  if (plan_.empty()) return fail(no_plan, "%s: no plan loaded", op);
  for (const micro_batch_slot& s : slots_)
    if (s.used && s.live > 0)
      return fail(illegal_transition,
                  "%s: micro-batch %u still holds %zu tensors; a step is captured whole, "
                  "from its first forward_begin to its last release",
                  op, s.id, s.live);
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  const cudaError_t qe = cudaStreamIsCapturing(stream, &cs);
  if (qe != cudaSuccess) {
    prim::clear_runtime_error();
    return fail(status::capture, "%s: cudaStreamIsCapturing(%p) failed (%s): join the "
                "capture of a stream that is being captured (not the legacy stream)",
                op, static_cast<void*>(stream), cudaGetErrorName(qe));
  }
  if (cs != cudaStreamCaptureStatusActive)
    return fail(status::capture,
                "%s: stream %p is %s: join after the caller began the capture "
                "(cudaStreamBeginCapture, torch.cuda.graph) and before the step's first call",
                op, static_cast<void*>(stream),
                cs == cudaStreamCaptureStatusInvalidated ? "in an invalidated capture"
                                                         : "not capturing");
  // The earlier copies: done ones retired by query, the rest waited for (their events were
  // recorded outside the capture). The caller's capture is under way, so the thread's
  // mode is relaxed meanwhile: under Global a host query invalidates it.
  {
    prim::relaxed_capture_mode relaxed;
    retire(false);
    while (!in_flight_.empty()) {
      STASH_CUDA_FAIL(prim::event_synchronize(in_flight_.front().done));
      retire_front();
    }
  }
  const std::size_t n = plan_.total(), L = plan_.layers();
  if (const status st = events_.reserve(config_.max_micro_batches * (2 * n + L) + 8);
      st != status::ok)
    return st;
  if (!replayed_.get()) {
    try {
      replayed_ = prim::make_event(false);
    } catch (const error& e) {
      return fail(e.code(), "%s: %s", op, e.what());
    }
  }
  try {
    held_.reserve(held_.size() + config_.max_micro_batches * n);
  } catch (const std::bad_alloc&) {
    return fail(status::internal, "%s: out of host memory", op);
  }
  own_compute_ = config_.compute;
  config_.compute = stream;
  joined_ = capturing_ = true;
  enter_capture();
  return status::ok;
}

void prefetch_engine::enter_capture() noexcept {
  refused_ = false;
  refusal_[0] = '\0';
  failed_at_begin_ = stats_.failed_count;
  pinned_->set_frozen(true);
  events_.set_frozen(true);
  parked_trace_ = std::move(trace_);
}

void prefetch_engine::join_side_streams() noexcept {
  for (cudaStream_t c : {d2h_.get(), h2d_.get()}) {
    bool member = false;
    if (prim::stream_capturing(c, &member) != cudaSuccess) prim::clear_runtime_error();
    if (member && prim::event_record(replayed_.get(), c) == cudaSuccess)
      prim::stream_wait(config_.compute, replayed_.get());
  }
}

status prefetch_engine::settle_capture() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!joined_)
    return fail(status::capture, "capture_settle: no capture of the caller's was joined%s",
                capturing_ ? " (the engine's own is under way: capture_end ends it)" : "");
  if (!joined_stream_ended())
    return fail(status::capture,
                "capture_settle: stream %p is still capturing: end the capture first "
                "(cudaStreamEndCapture; torch.cuda.graph ends it when its block exits)",
                static_cast<void*>(config_.compute));
  return settle_locked();
}

status prefetch_engine::settle_locked() noexcept {
  config_.compute = own_compute_;
  joined_ = capturing_ = false;
  pinned_->set_frozen(false);
  events_.set_frozen(false);
  trace_ = std::move(parked_trace_);
  // The captured copies, by bookkeeping alone: nothing of the capture ran, and the graph's
  // copies are ordered inside the graph (Note [Capture begun by the caller]).
  while (!in_flight_.empty()) retire_front();
  const micro_batch_slot* live = nullptr;
  for (const micro_batch_slot& s : slots_)
    if (s.used && s.live > 0 && !live) live = &s;
  if (refused_)
    return fail(status::capture, "capture_settle: the captured step is not usable: %s",
                refusal_);
  if (live)
    return fail(status::capture,
                "capture_settle: micro-batch %u still holds %zu tensors: a captured step "
                "must release every tensor it offered",
                live->id, live->live);
  if (stats_.failed_count != failed_at_begin_)
    return fail(status::capture,
                "capture_settle: %llu tensor(s) failed during the capture (the failing call "
                "returned why)",
                static_cast<unsigned long long>(stats_.failed_count - failed_at_begin_));
  ++captures_;
  return status::ok;
}

status prefetch_engine::release_held(std::size_t* bytes) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes) *bytes = 0;
  settle_if_ended();
  if (capturing_)
    return fail(status::capture, "capture_release during a graph capture: the pinned "
                "blocks of the capture under way are still being recorded");
  std::size_t total = 0;
  cudaStream_t compute = config_.compute;
  for (const held_block& h : held_) {
    pinned_->deallocate(h.host, &compute, 1);
    total += h.bytes;
  }
  held_.clear();
  if (bytes) *bytes = total;
  return status::ok;
}

}  // namespace stash::engine
