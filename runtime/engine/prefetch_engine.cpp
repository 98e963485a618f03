// The engine's lifetime, plan, micro-batch slots, the offload (submit) path and the
// retirement of completed copies. Backward, hooks and tracing: engine_backward.cpp.
#include "prefetch_engine.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <nvtx3/nvToolsExtCudaRt.h>

#include "engine_nvtx.h"
#include "engine_trace.h"
#include "planner/model/schedule.h"

namespace stash::engine {

namespace {

pinned_pool_config pinned_config(const engine_config& c) {
  pinned_pool_config p = c.pinned;
  p.on_exhausted = c.on_pinned_exhausted == pinned_exhausted::wait ? exhaustion_policy::wait
                                                                   : exhaustion_policy::fail;
  return p;
}

// A non-blocking stream named for Nsight Systems (a no-op without a tool attached).
prim::stream_owner make_named_stream(const char* name) {
  prim::stream_owner s = prim::make_stream();
  nvtxNameCudaStreamA(s.get(), name);
  return s;
}

}  // namespace

prefetch_engine::prefetch_engine(const engine_config& config)
    : config_(config), events_(config.timing) {
  if (config.lookahead < planner::schedule::kMinLookahead)
    throw error(status::invalid_argument, "engine config: lookahead must be at least 1");
  if (config.max_micro_batches == 0)
    throw error(status::invalid_argument, "engine config: max_micro_batches must be positive");
  const bool callbacks = config.alloc || config.release;
  if (config.pool && callbacks)
    throw error(status::invalid_argument,
                "engine config: give either a device pool or alloc/release callbacks, not both");
  if (!config.pool && !(config.alloc && config.release))
    throw error(status::invalid_argument,
                "engine config: a device pool or both alloc and release callbacks are required");
  if (config.on_pinned_exhausted != pinned_exhausted::keep_on_device &&
      config.on_pinned_exhausted != pinned_exhausted::wait)
    throw error(status::invalid_argument, "engine config: unknown pinned exhaustion policy");
  d2h_ = make_named_stream("stash d2h");
  h2d_ = make_named_stream("stash h2d");
  pinned_ = std::make_unique<pinned_pool>(pinned_config(config));
  if (config.timing) trace_ = std::make_unique<engine_trace>(events_, config.compute);
}

prefetch_engine::~prefetch_engine() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (joined_) {  // Note [Capture begun by the caller]: the capture is not ours to end
    const bool ended = joined_stream_ended();
    settle_locked();
    prim::clear_runtime_error();
    if (!ended) {
      // Still capturing: waiting for the engine's streams would invalidate the caller's
      // capture. Its copies never ran; hand back what the engine holds without a wait.
      for (micro_batch_slot& s : slots_) {
        for (tensor_record& r : s.tensors) {
          if (r.state == tensor_state::absent || r.state == tensor_state::released) continue;
          if (r.prefetched) free_device(r.prefetched, r.bytes, config_.compute, nullptr, 0);
          if (r.owns_device && r.device) free_device(r.device, r.bytes, r.producer, nullptr, 0);
          r = tensor_record{};
        }
      }
      return;  // the pinned pool goes with the engine
    }
  }
  if (capturing_) {  // abandoned mid-capture: end it, keep no graph (nothing ran)
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(config_.compute, &g) == cudaSuccess && g) cudaGraphDestroy(g);
    prim::clear_runtime_error();
    capturing_ = false;
    while (!in_flight_.empty()) retire_front();
    if (parked_trace_) trace_ = std::move(parked_trace_);
  }
  drop_graph();
  prim::stream_synchronize(d2h_.get());
  prim::stream_synchronize(h2d_.get());
  while (!in_flight_.empty()) {
    prim::event_synchronize(in_flight_.front().done);
    retire_front();
  }
  trace_.reset();
  for (micro_batch_slot& s : slots_) {
    for (tensor_record& r : s.tensors) {
      if (r.state == tensor_state::absent || r.state == tensor_state::released) continue;
      if (r.prefetched) free_device(r.prefetched, r.bytes, config_.compute, nullptr, 0);
      if (r.owns_device && r.device) free_device(r.device, r.bytes, r.producer, nullptr, 0);
      if (r.host) pinned_->deallocate(r.host, nullptr, 0);
      events_.give(r.h2d_done);
      r = tensor_record{};
    }
    for (cudaEvent_t& ev : s.layer_copies) events_.give(std::exchange(ev, nullptr));
    for (cudaEvent_t& ev : s.compute_begin) events_.give(std::exchange(ev, nullptr));
  }
}

status prefetch_engine::set_plan(engine_plan plan) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  settle_if_ended();
  if (capturing_)  // Note [Capturing a step]
    return refuse("set_plan during a graph capture: a new plan changes the step being "
                  "captured; end the capture, then set the plan and capture again");
  for (const micro_batch_slot& s : slots_)
    if (s.used && s.live > 0)
      return fail(illegal_transition,
                  "set_plan: micro-batch %u still holds %zu tensors; release them first", s.id,
                  s.live);
  if (graph_) {  // Note [Capturing a step]: the captured step was this plan's
    drop_graph();
    dropped_by_plan_ = true;
  }
  try {
    while (!in_flight_.empty()) {
      prim::event_synchronize(in_flight_.front().done);
      retire_front();
    }
    for (micro_batch_slot& s : slots_) reset_slot(s);
    plan_ = std::move(plan);
    const std::size_t n = plan_.total(), L = plan_.layers();
    slots_.assign(config_.max_micro_batches, micro_batch_slot{});
    for (micro_batch_slot& s : slots_) {
      s.tensors.assign(n, tensor_record{});
      s.layer_copies.assign(L, nullptr);
      s.layer_copies_seq.assign(L, 0);
      s.compute_begin.assign(2 * L, nullptr);
      s.prefetch_issued.assign(L, 0);
    }
    in_flight_.reset(config_.max_micro_batches * n + 1);
    // Events for one micro-batch's step: d2h + h2d per tensor, per-layer copy events and
    // the timing pairs; more are created on demand.
    status st = events_.reserve(2 * n + 2 * L + 8 + (config_.timing ? 4 * n + 8 * L : 0));
    if (st != status::ok) return st;
    if (trace_) return trace_->reserve(4 * n + 8 * L);
  } catch (const std::bad_alloc&) {
    return fail(status::internal, "set_plan: out of host memory");
  }
  return status::ok;
}

status prefetch_engine::action(std::uint32_t layer, std::uint32_t index,
                               tensor_action* out) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!out) return fail(status::invalid_argument, "action: out is NULL");
  if (plan_.empty()) return fail(no_plan, "action: no plan loaded");
  const std::size_t flat = plan_.flat(layer, index);
  if (flat == engine_plan::npos)
    return fail(unknown_tensor, "action: layer %u tensor %u is not in the plan", layer, index);
  *out = plan_.action(flat);
  return status::ok;
}

void prefetch_engine::reset_slot(micro_batch_slot& s) noexcept {
  for (tensor_record& r : s.tensors) {
    events_.give(r.h2d_done);
    r = tensor_record{};
  }
  for (cudaEvent_t& ev : s.layer_copies) events_.give(std::exchange(ev, nullptr));
  std::fill(s.layer_copies_seq.begin(), s.layer_copies_seq.end(), 0);
  for (cudaEvent_t& ev : s.compute_begin) {
    if (ev && trace_) trace_->drop_mark(ev);
    ev = nullptr;
  }
  std::fill(s.prefetch_issued.begin(), s.prefetch_issued.end(), 0);
  s.used = s.backward_started = s.turn_waited = s.finished = false;
  s.live = 0;
  ++s.generation;
}

status prefetch_engine::slot_for(std::uint32_t mb, bool create, micro_batch_slot** out) noexcept {
  *out = nullptr;
  micro_batch_slot* free_slot = nullptr;
  micro_batch_slot* done_slot = nullptr;
  for (micro_batch_slot& s : slots_) {
    if (s.used && s.id == mb) {
      *out = &s;
      return status::ok;
    }
    if (!s.used && !free_slot) free_slot = &s;
    if (s.used && s.finished && s.live == 0 && !done_slot) done_slot = &s;
  }
  if (!create) return status::ok;
  micro_batch_slot* s = free_slot ? free_slot : done_slot;
  if (!s)
    return fail(status::invalid_argument,
                "micro-batch %u: %zu micro-batches are live already (max_micro_batches); "
                "finish one (backward_end of layer 0 and release its tensors) first",
                mb, slots_.size());
  if (s->used) reset_slot(*s);
  s->used = true;
  s->id = mb;
  *out = s;
  return status::ok;
}

status prefetch_engine::find(tensor_key k, const char* op, bool create, micro_batch_slot** slot,
                             tensor_record** rec, std::size_t* flat) noexcept {
  if (plan_.empty()) return fail(no_plan, "%s: no plan loaded", op);
  *flat = plan_.flat(k.layer, k.index);
  if (*flat == engine_plan::npos)
    return fail(unknown_tensor,
                "%s: tensor (micro-batch %u, layer %u, index %u) is unknown: the plan has %zu "
                "layers%s",
                op, k.micro_batch, k.layer, k.index, plan_.layers(),
                k.layer < plan_.layers() ? " and fewer tensors in that layer" : "");
  status st = slot_for(k.micro_batch, create, slot);
  if (st != status::ok) return st;
  if (!*slot)
    return fail(illegal_transition,
                "%s: tensor (micro-batch %u, layer %u, index %u) was never offered: %s before "
                "offload",
                op, k.micro_batch, k.layer, k.index, op);
  // A finished micro-batch whose tensors are all released starts a new step on offload.
  if (create && (*slot)->finished && (*slot)->live == 0) {
    reset_slot(**slot);
    (*slot)->used = true;
    (*slot)->id = k.micro_batch;
  }
  *rec = &(*slot)->tensors[*flat];
  return status::ok;
}

status prefetch_engine::offload(tensor_key k, void* device, std::size_t bytes,
                                cudaStream_t producer) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  micro_batch_slot* s = nullptr;
  tensor_record* r = nullptr;
  std::size_t flat = 0;
  status st = find(k, "offload", true, &s, &r, &flat);
  if (st != status::ok) return st;
  if (r->state != tensor_state::absent)
    return fail(illegal_transition,
                "offload: tensor (micro-batch %u, layer %u, index %u) is %s: offered twice",
                k.micro_batch, k.layer, k.index, to_string(r->state));
  if (!device || bytes == 0)
    return fail(status::invalid_argument, "offload: %s", device ? "bytes is 0" : "device is NULL");
  if (!in_flight_.empty()) retire(false);
  r->device = device;
  r->bytes = bytes;
  r->producer = producer;
  const tensor_action a = plan_.action(flat);
  if (a != tensor_action::offload) {  // keep / recompute: pass through
    r->state = tensor_state::on_device;
    ++s->live;
    ++(a == tensor_action::keep ? stats_.keep_count : stats_.recompute_count);
    return status::ok;
  }
  nvtx::range range(nvtx::kOffload, nvtx::payload(k.micro_batch, k.layer, k.index));
  if (config_.pool && !config_.pool->owns(device))
    return fail(status::invalid_argument,
                "offload: %p is not the start of a block of the engine's device pool", device);
  if (!capturing_ && producer != config_.compute && actively_capturing(producer))
    return fail(status::capture,
                "offload of tensor (micro-batch %u, layer %u, index %u): its producer stream "
                "is capturing a graph, but the engine is not in capture mode: call "
                "capture_join(producer) before the step's first forward_begin (Note "
                "[Capture begun by the caller])",
                k.micro_batch, k.layer, k.index);
  if (capturing_ && producer != config_.compute)  // Note [Capturing a step]
    return refuse("offload of tensor (micro-batch %u, layer %u, index %u) during a graph "
                  "capture: its producer is not the compute stream, so the block could not "
                  "be handed back as the compute stream's memory after the capture",
                  k.micro_batch, k.layer, k.index);
  ++s->live;
  r->state = tensor_state::on_device;
  r->owns_device = true;  // until the copy is enqueued and the block handed back
  st = make_room(bytes);
  if (st != status::ok) return tensor_fail(*r, st);
  void* host = nullptr;
  st = pinned_->allocate(bytes, &host);
  if (st != status::ok && capturing_) {
    keep_on_device(*s, *r, st);  // intact on the device, the engine's until release
    return refuse("offload of tensor (micro-batch %u, layer %u, index %u), %zu bytes, during "
                  "a graph capture: the pinned pool has no free block for it and may neither "
                  "pin more (cudaHostAlloc) nor wait during capture; give the step's pinned bytes "
                  "at capture begin (pinned_bytes) or run the step eagerly first",
                  k.micro_batch, k.layer, k.index, bytes);
  }
  if (st != status::ok) return keep_on_device(*s, *r, st);
  pinned_in_use_ += bytes;

  cudaEvent_t produced = nullptr, done = nullptr;
  std::size_t op = 0;
  bool timed = false;
  auto undo = [&](status why) {
    if (timed) trace_->cancel(op);
    events_.give(produced);
    events_.give(done);
    pinned_->deallocate(host, nullptr, 0);  // nothing was copied into it
    pinned_in_use_ -= bytes;
    return tensor_fail(*r, why);
  };
  if ((st = events_.take(&produced)) != status::ok) return undo(st);
  if ((st = events_.take(&done)) != status::ok) return undo(st);
  cudaError_t err = prim::event_record(produced, producer);
  if (err != cudaSuccess)
    return undo(prim::record_cuda_error(err, "cudaEventRecord(producer)", __FILE__, __LINE__));
  err = prim::stream_wait(d2h_.get(), produced);
  if (err != cudaSuccess)
    return undo(
        prim::record_cuda_error(err, "cudaStreamWaitEvent(d2h, producer)", __FILE__, __LINE__));
  events_.give(std::exchange(produced, nullptr));  // the wait captured it
  if (trace_) {
    timed_op t;
    t.kind = planner::span_kind::d2h;
    t.layer = static_cast<std::int32_t>(k.layer);
    t.micro_batch = k.micro_batch;
    t.flat = flat;
    t.bytes = bytes;
    t.pinned_bytes = pinned_in_use_;
    sample_device(t, false);
    if ((st = trace_->start(t, d2h_.get(), &op)) != status::ok) return undo(st);
    timed = true;
  }
  err = prim::copy_d2h(host, device, bytes, d2h_.get());
  if (err != cudaSuccess) {
    // The pinned block may still be touched by nothing: the copy was not enqueued; but the
    // wait and the start event were, so guard it with the D2H stream anyway.
    const status why = prim::record_cuda_error(err, "cudaMemcpyAsync(D2H)", __FILE__, __LINE__);
    if (timed) trace_->cancel(op);
    events_.give(done);
    cudaStream_t d2h = d2h_.get();
    pinned_->deallocate(host, &d2h, 1);
    pinned_in_use_ -= bytes;
    return tensor_fail(*r, why);
  }
  if (timed) trace_->stop(op, d2h_.get());  // a failed record costs the span, not the data
  const std::uint64_t seq = ++d2h_seq_;
  err = prim::event_record(done, d2h_.get());
  if (err == cudaSuccess) {
    cudaEvent_t& layer_ev = s->layer_copies[k.layer];
    if (layer_ev || events_.take(&layer_ev) == status::ok) {
      err = prim::event_record(layer_ev, d2h_.get());
      if (err == cudaSuccess) s->layer_copies_seq[k.layer] = seq;
    }
  }
  if (err != cudaSuccess) {
    // The copy is enqueued but cannot be tracked: wait for it here (cold, rare) so that the
    // device block is not reused under it.
    const status why =
        prim::record_cuda_error(err, "cudaEventRecord(d2h done)", __FILE__, __LINE__);
    prim::stream_synchronize(d2h_.get());
    events_.give(done);
    pinned_->deallocate(host, nullptr, 0);
    pinned_in_use_ -= bytes;
    return tensor_fail(*r, why);
  }
  // The device block goes back once the copy is done: Note [Handing offloaded blocks back].
  in_flight_copy c;
  c.slot = static_cast<std::size_t>(s - slots_.data());
  c.generation = s->generation;
  c.flat = flat;
  c.done = done;
  c.device = device;
  c.bytes = bytes;
  c.producer = producer;
  c.seq = seq;
  in_flight_.push(c);
  r->state = tensor_state::offloading;
  r->owns_device = false;
  r->device = nullptr;
  r->host = host;
  r->d2h_done = done;
  ++stats_.offloaded_count;
  stats_.offloaded_bytes += bytes;
  ++stats_.in_flight_count;
  stats_.in_flight_bytes += bytes;
  stats_.peak_in_flight_count = std::max(stats_.peak_in_flight_count, stats_.in_flight_count);
  stats_.peak_in_flight_bytes = std::max(stats_.peak_in_flight_bytes, stats_.in_flight_bytes);
  return status::ok;
}

status prefetch_engine::keep_on_device(micro_batch_slot&, tensor_record& r, status why) noexcept {
  r.state = tensor_state::on_device;
  r.owns_device = true;
  ++stats_.kept_on_device_count;
  stats_.kept_on_device_bytes += r.bytes;
  if (config_.on_pinned_exhausted == pinned_exhausted::keep_on_device) return status::ok;
  append_error(" (the tensor stays on the device, intact)");
  return why;
}

status prefetch_engine::tensor_fail(tensor_record& r, status why) noexcept {
  // The data is still in the producer's block, which the engine now owns: acquire reports
  // the failure, release frees the block. Nothing else is touched.
  r.state = tensor_state::on_device;
  r.owns_device = true;
  r.error = why;
  std::snprintf(r.message, sizeof r.message, "%s", last_error());
  ++stats_.failed_count;
  return why;
}

status prefetch_engine::make_room(std::size_t bytes) noexcept {
  auto over = [&] {
    return (config_.max_in_flight_count &&
            stats_.in_flight_count + 1 > config_.max_in_flight_count) ||
           (config_.max_in_flight_bytes &&
            stats_.in_flight_bytes + bytes > config_.max_in_flight_bytes);
  };
  if (!over()) return status::ok;
  if (capturing_)  // Note [Capturing a step]
    return refuse("offload during a graph capture: the in-flight cap (%zu bytes, %zu copies) "
                  "would make the host wait for a copy (cudaEventSynchronize), which capture "
                  "forbids; capture with the cap off (0) or high enough for the whole step",
                  config_.max_in_flight_bytes, config_.max_in_flight_count);
  retire(false);
  while (!in_flight_.empty() && over()) {
    nvtx::range range(nvtx::kWaitCap, 0);
    ++stats_.cap_waits;
    STASH_CUDA_FAIL(prim::event_synchronize(in_flight_.front().done));
    retire_front();
  }
  return status::ok;
}

void prefetch_engine::retire(bool block) noexcept {
  if (capturing_) return;  // Note [Capturing a step]: end_capture retires the captured copies
  if (in_flight_.empty()) return;
  // A capture of the caller's may be under way (not joined yet, or on another stream):
  // under its Global mode a host query would invalidate it.
  prim::relaxed_capture_mode relaxed;
  while (!in_flight_.empty()) {
    cudaEvent_t ev = in_flight_.front().done;
    const cudaError_t err = block ? prim::event_synchronize(ev) : prim::event_query(ev);
    if (err == cudaErrorNotReady) return;
    retire_front();
  }
}

void prefetch_engine::retire_front() noexcept {
  const in_flight_copy c = in_flight_.front();
  in_flight_.pop();
  micro_batch_slot& s = slots_[c.slot];
  if (s.generation == c.generation) {
    tensor_record& r = s.tensors[c.flat];
    if (r.d2h_done == c.done) r.d2h_done = nullptr;
    if (r.state == tensor_state::offloading) r.state = tensor_state::on_host;
  }
  events_.give(c.done);
  if (c.device) {
    // The copy is complete: nothing pending uses the block on any stream.
    if (config_.pool) {
      config_.pool->deallocate(c.device, nullptr, 0);
    } else {
      config_.release(c.device, c.bytes, c.producer, config_.user);
      ++stats_.release_callbacks;
    }
  }
  --stats_.in_flight_count;
  stats_.in_flight_bytes -= c.bytes;
}

void prefetch_engine::hand_back_through(std::uint64_t seq) noexcept {
  cudaStream_t compute = config_.compute;
  in_flight_.for_each([&](in_flight_copy& c) {
    if (c.seq > seq) return false;  // FIFO: later copies are not covered by the wait
    if (!c.device || c.producer != compute) return true;
    if (config_.pool) {
      cudaStream_t owner = nullptr;
      if (!config_.pool->stream_of(c.device, &owner) || owner != compute) return true;
      if (config_.pool->deallocate(c.device, nullptr, 0) != status::ok) return true;
    } else {
      config_.release(c.device, c.bytes, compute, config_.user);
      ++stats_.release_callbacks;
    }
    c.device = nullptr;
    ++stats_.ordered_handback_count;
    stats_.ordered_handback_bytes += c.bytes;
    return true;
  });
}

status prefetch_engine::free_device(void* p, std::size_t bytes, cudaStream_t stream,
                                    const cudaStream_t* users, std::size_t n_users) noexcept {
  if (config_.pool) return config_.pool->deallocate(p, users, n_users);
  config_.release(p, bytes, stream, config_.user);
  ++stats_.release_callbacks;
  return status::ok;
}

status prefetch_engine::alloc_device(std::size_t bytes, void** out) noexcept {
  if (config_.pool) return config_.pool->allocate(bytes, config_.compute, out);
  *out = nullptr;
  const int rc = config_.alloc(out, bytes, config_.compute, config_.user);
  if (rc != 0 || !*out)
    return fail(status::out_of_memory, "the caller's device allocator failed (%d) for %zu bytes",
                rc, bytes);
  return status::ok;
}

status prefetch_engine::synchronize() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  settle_if_ended();
  if (capturing_)
    return refuse("synchronize during a graph capture: a host wait for the engine's "
                  "streams (cudaStreamSynchronize), which capture forbids");
  STASH_CUDA_FAIL(prim::stream_synchronize(d2h_.get()));
  STASH_CUDA_FAIL(prim::stream_synchronize(h2d_.get()));
  retire(true);
  return status::ok;
}

engine_stats prefetch_engine::stats() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  engine_stats s = stats_;
  s.pinned = pinned_->stats();
  return s;
}

}  // namespace stash::engine
