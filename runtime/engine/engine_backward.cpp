// The engine's layer hooks, the backward side (prefetch, acquire, release) and its trace.
#include <algorithm>
#include <cstdio>
#include <utility>

#include "engine_nvtx.h"
#include "engine_trace.h"
#include "planner/model/schedule.h"
#include "prefetch_engine.h"

namespace stash::engine {

namespace {
constexpr std::size_t kFwd = 0, kBwd = 1;

namespace schedule = planner::schedule;

// The highest layer of `span` with D2H copies in this micro-batch, or -1: the D2H stream is
// FIFO, so the event after its latest copy covers every copy of the span (and before).
int latest_copies(const micro_batch_slot& s, schedule::layer_span span) noexcept {
  for (std::size_t l = span.hi + 1; l-- > span.lo;)
    if (s.layer_copies[l]) return static_cast<int>(l);
  return -1;
}
}  // namespace

namespace {

// A device-side wait of `stream` on `ev`, timed as a wait span attributed to `layer`.
status timed_wait(engine_trace* trace, cudaStream_t stream, cudaEvent_t ev, int layer,
                  std::uint32_t mb, const char* what) noexcept {
  std::size_t op = 0;
  if (trace) {
    timed_op t;
    t.kind = planner::span_kind::wait;
    t.what = what;
    t.layer = layer;
    t.micro_batch = mb;
    status st = trace->start(t, stream, &op);
    if (st != status::ok) trace = nullptr;  // lose the span, not the wait
  }
  const cudaError_t err = prim::stream_wait(stream, ev);
  if (err != cudaSuccess) {
    if (trace) trace->cancel(op);
    return prim::record_cuda_error(err, "cudaStreamWaitEvent", __FILE__, __LINE__);
  }
  if (trace) trace->stop(op, stream);
  return status::ok;
}

}  // namespace

status prefetch_engine::forward_begin(std::uint32_t mb, std::uint32_t layer) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (plan_.empty()) return fail(no_plan, "forward_begin: no plan loaded");
  if (layer >= plan_.layers())
    return fail(status::invalid_argument, "forward_begin: layer %u, but the plan has %zu", layer,
                plan_.layers());
  // Note [Capture begun by the caller]: a caller's capture that ended is settled; one of
  // the configured compute stream is joined.
  settle_if_ended();
  if (!capturing_ && actively_capturing(config_.compute)) {
    if (const status js = join_locked(config_.compute, "forward_begin"); js != status::ok)
      return js;
  }
  micro_batch_slot* s = nullptr;
  status st = slot_for(mb, true, &s);
  if (st != status::ok) return st;
  if (layer == 0 && s->finished && s->live == 0) {  // a new step of this micro-batch
    reset_slot(*s);
    s->used = true;
    s->id = mb;
  }
  if (!in_flight_.empty()) retire(false);
  // Note [The step's schedule] (planner/model/schedule.h): one layer in flight.
  if (const int w = latest_copies(*s, schedule::forward_waits_for(layer)); w >= 0) {
    nvtx::range range(nvtx::kWaitInFlight, nvtx::payload(mb, static_cast<std::uint32_t>(w), 0));
    st = timed_wait(trace_.get(), config_.compute, s->layer_copies[w], w, mb, "d2h");
    if (st != status::ok) return st;
    hand_back_through(s->layer_copies_seq[w]);  // Note [Handing offloaded blocks back]
  }
  if (trace_) {
    cudaEvent_t& mark = s->compute_begin[2 * layer + kFwd];
    if (mark) trace_->drop_mark(std::exchange(mark, nullptr));
    trace_->mark(config_.compute, &mark);
  }
  return status::ok;
}

status prefetch_engine::forward_end(std::uint32_t mb, std::uint32_t layer) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (plan_.empty()) return fail(no_plan, "forward_end: no plan loaded");
  if (layer >= plan_.layers())
    return fail(status::invalid_argument, "forward_end: layer %u, but the plan has %zu", layer,
                plan_.layers());
  micro_batch_slot* s = nullptr;
  status st = slot_for(mb, true, &s);
  if (st != status::ok) return st;
  cudaEvent_t& mark = s->compute_begin[2 * layer + kFwd];
  if (trace_ && mark) {
    timed_op t;
    t.kind = planner::span_kind::forward;
    t.layer = static_cast<std::int32_t>(layer);
    t.micro_batch = mb;
    sample_device(t, true);
    t.start = std::exchange(mark, nullptr);
    st = trace_->finish(t, config_.compute);
    if (st != status::ok) return st;
  }
  // The loss is position L (Note [The step's schedule]): it runs after the turn's wait.
  if (layer + 1 == plan_.layers()) return loss_turn(*s, mb);
  return status::ok;
}

status prefetch_engine::loss_turn(micro_batch_slot& s, std::uint32_t mb) noexcept {
  if (s.turn_waited) return status::ok;
  s.turn_waited = true;
  const int w = latest_copies(s, schedule::turn_waits_for(plan_.layers()));
  if (w < 0) return status::ok;
  nvtx::range range(nvtx::kWaitTurn, nvtx::payload(mb, static_cast<std::uint32_t>(w), 0));
  const status st = timed_wait(trace_.get(), config_.compute, s.layer_copies[w], w, mb, "d2h");
  if (st != status::ok) return st;
  hand_back_through(s.layer_copies_seq[w]);  // Note [Handing offloaded blocks back]
  return status::ok;
}

status prefetch_engine::issue_prefetch(micro_batch_slot& s, std::uint32_t layer,
                                       std::size_t flat, cudaStream_t order) noexcept {
  tensor_record& r = s.tensors[flat];
  if (r.state != tensor_state::offloading && r.state != tensor_state::on_host) return status::ok;
  if (r.error != status::ok) return status::ok;
  nvtx::range range(nvtx::kPrefetch, nvtx::payload(s.id, layer, static_cast<std::uint32_t>(flat - plan_.first(layer))));
  void* dst = nullptr;
  status st = alloc_device(r.bytes, &dst);
  if (st != status::ok) {
    r.error = st;  // stays ON_HOST: the data is safe in the pinned block
    std::snprintf(r.message, sizeof r.message, "%s", last_error());
    ++stats_.failed_count;
    return st;
  }
  cudaStream_t h2d = h2d_.get();
  auto undo = [&](status why) {
    free_device(dst, r.bytes, config_.compute, &h2d, 1);
    r.error = why;
    std::snprintf(r.message, sizeof r.message, "%s", last_error());
    ++stats_.failed_count;
    return why;
  };
  // The block is `order`'s (the compute stream's) from this point of its order on, after
  // the allocation itself (a stream-ordered allocator enqueues it there): the H2D may
  // write it only after this point. Recorded per tensor, after its allocation.
  {
    cudaEvent_t issue = nullptr;
    if ((st = events_.take(&issue)) != status::ok) return undo(st);
    cudaError_t err = prim::event_record(issue, order);
    if (err == cudaSuccess) err = prim::stream_wait(h2d, issue);
    events_.give(issue);  // the wait captured it
    if (err != cudaSuccess)
      return undo(
          prim::record_cuda_error(err, "order H2D after the compute stream", __FILE__, __LINE__));
  }
  if (r.d2h_done) {  // still OFFLOADING as far as the host knows: order after the D2H
    const cudaError_t err = prim::stream_wait(h2d, r.d2h_done);
    if (err != cudaSuccess)
      return undo(
          prim::record_cuda_error(err, "cudaStreamWaitEvent(h2d, d2h)", __FILE__, __LINE__));
  }
  cudaEvent_t done = nullptr;
  if ((st = events_.take(&done)) != status::ok) return undo(st);
  std::size_t op = 0;
  bool timed = false;
  if (trace_) {
    timed_op t;
    t.kind = planner::span_kind::h2d;
    t.micro_batch = s.id;
    t.flat = flat;
    t.bytes = r.bytes;
    t.pinned_bytes = pinned_in_use_;
    sample_device(t, false);  // with the destination block
    t.layer = static_cast<std::int32_t>(layer);
    timed = trace_->start(t, h2d, &op) == status::ok;
  }
  cudaError_t err = prim::copy_h2d(dst, r.host, r.bytes, h2d);
  if (err != cudaSuccess) {
    if (timed) trace_->cancel(op);
    events_.give(done);
    return undo(prim::record_cuda_error(err, "cudaMemcpyAsync(H2D)", __FILE__, __LINE__));
  }
  if (timed) trace_->stop(op, h2d);
  err = prim::event_record(done, h2d);
  if (err != cudaSuccess) {
    const status why =
        prim::record_cuda_error(err, "cudaEventRecord(h2d done)", __FILE__, __LINE__);
    prim::stream_synchronize(h2d);  // cold: cannot track the copy, so finish it here
    events_.give(done);
    return undo(why);
  }
  r.prefetched = dst;
  r.h2d_done = done;
  r.state = tensor_state::prefetching;
  ++stats_.prefetched_count;
  stats_.prefetched_bytes += r.bytes;
  return status::ok;
}

status prefetch_engine::prefetch_layer(micro_batch_slot& s, std::uint32_t layer) noexcept {
  s.prefetch_issued[layer] = 1;
  if (!plan_.layer_offloads(layer)) return status::ok;
  status first = status::ok;
  const std::size_t begin = plan_.first(layer), end = begin + plan_.tensors(layer);
  for (std::size_t f = begin; f < end; ++f) {
    if (plan_.action(f) != tensor_action::offload) continue;
    const status st = issue_prefetch(s, layer, f, config_.compute);
    if (st != status::ok && first == status::ok) first = st;  // the others still go
  }
  return first;
}

status prefetch_engine::backward_begin(std::uint32_t mb, std::uint32_t layer) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (plan_.empty()) return fail(no_plan, "backward_begin: no plan loaded");
  if (layer >= plan_.layers())
    return fail(status::invalid_argument, "backward_begin: layer %u, but the plan has %zu",
                layer, plan_.layers());
  micro_batch_slot* s = nullptr;
  status st = slot_for(mb, true, &s);
  if (st != status::ok) return st;
  if (!in_flight_.empty()) retire(false);
  if (!s->backward_started) {
    // The loss turn (Note [The step's schedule]): the micro-batch's first backward waits
    // for every forward offload of it, unless the last layer's forward_end did.
    s->backward_started = true;
    if ((st = loss_turn(*s, mb)) != status::ok) return st;
  }
  // The prefetch window (Note [The step's schedule]), each ordered after this point of the
  // compute stream.
  const schedule::layer_span window = schedule::prefetch_window(layer, config_.lookahead);
  status first = status::ok;
  for (std::size_t i = window.hi + 1; i-- > window.lo;) {
    const auto l = static_cast<std::uint32_t>(i);
    if (s->prefetch_issued[l]) continue;
    st = prefetch_layer(*s, l);
    if (st != status::ok && first == status::ok) first = st;
  }
  if (trace_) {
    cudaEvent_t& mark = s->compute_begin[2 * layer + kBwd];
    if (mark) trace_->drop_mark(std::exchange(mark, nullptr));
    trace_->mark(config_.compute, &mark);
  }
  return first;
}

status prefetch_engine::backward_end(std::uint32_t mb, std::uint32_t layer) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (plan_.empty()) return fail(no_plan, "backward_end: no plan loaded");
  if (layer >= plan_.layers())
    return fail(status::invalid_argument, "backward_end: layer %u, but the plan has %zu", layer,
                plan_.layers());
  micro_batch_slot* s = nullptr;
  status st = slot_for(mb, false, &s);
  if (st != status::ok) return st;
  if (!s) return fail(illegal_transition, "backward_end: micro-batch %u has no forward", mb);
  cudaEvent_t& mark = s->compute_begin[2 * layer + kBwd];
  if (trace_ && mark) {
    timed_op t;
    t.kind = planner::span_kind::backward;
    t.layer = static_cast<std::int32_t>(layer);
    t.micro_batch = mb;
    sample_device(t, true);
    t.start = std::exchange(mark, nullptr);
    st = trace_->finish(t, config_.compute);
  }
  if (layer == 0) {
    s->finished = true;
    if (trace_) trace_->harvest(false, plan_);
    // Note [Capture begun by the caller]: the step is over; its forks end in the caller's
    // stream, which the caller ends the capture on.
    if (joined_ && std::none_of(slots_.begin(), slots_.end(), [](const micro_batch_slot& m) {
          return m.used && m.live > 0;
        }))
      join_side_streams();
  }
  if (!in_flight_.empty()) retire(false);
  return st;
}

status prefetch_engine::acquire(tensor_key k, cudaStream_t consumer, void** out) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!out) return fail(status::invalid_argument, "acquire: out is NULL");
  *out = nullptr;
  micro_batch_slot* s = nullptr;
  tensor_record* r = nullptr;
  std::size_t flat = 0;
  status st = find(k, "acquire", false, &s, &r, &flat);
  if (st != status::ok) return st;
  if (!in_flight_.empty()) retire(false);
  const auto key_fail = [&](status code, const char* why) {
    return fail(code, "acquire: tensor (micro-batch %u, layer %u, index %u) is %s: %s",
                k.micro_batch, k.layer, k.index, to_string(r->state), why);
  };
  if (r->error != status::ok)
    return fail(tensor_failed, "acquire: tensor (micro-batch %u, layer %u, index %u) failed: %s",
                k.micro_batch, k.layer, k.index, r->message);
  switch (r->state) {
    case tensor_state::absent: return key_fail(illegal_transition, "acquire before offload");
    case tensor_state::released: return key_fail(illegal_transition, "acquire after release");
    case tensor_state::ready:
      *out = r->prefetched ? r->prefetched : r->device;
      return status::ok;
    case tensor_state::on_device:
      r->state = tensor_state::ready;
      r->consumer = consumer;
      *out = r->device;
      return status::ok;
    case tensor_state::offloading:
    case tensor_state::on_host:  // prefetch not issued yet: issue it now
      if ((st = issue_prefetch(*s, k.layer, flat, config_.compute)) != status::ok) return st;
      break;
    case tensor_state::prefetching: break;
  }
  // PREFETCHING: the consumer waits for this tensor's H2D only.
  {
    nvtx::range range(nvtx::kWaitAcquire, nvtx::payload(k.micro_batch, k.layer, k.index));
    st = timed_wait(trace_.get(), consumer, r->h2d_done, static_cast<int>(k.layer),
                    k.micro_batch, "h2d");
    if (st != status::ok) return st;
  }
  // The layer's backward compute starts after its waits (Note [Timing with events]).
  cudaEvent_t& mark = s->compute_begin[2 * k.layer + kBwd];
  if (trace_ && mark && consumer == config_.compute) {
    trace_->drop_mark(std::exchange(mark, nullptr));
    trace_->mark(consumer, &mark);
  }
  r->state = tensor_state::ready;
  r->consumer = consumer;
  *out = r->prefetched;
  return status::ok;
}

status prefetch_engine::release(tensor_key k) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  micro_batch_slot* s = nullptr;
  tensor_record* r = nullptr;
  std::size_t flat = 0;
  status st = find(k, "release", false, &s, &r, &flat);
  if (st != status::ok) return st;
  if (r->state == tensor_state::absent || r->state == tensor_state::released)
    return fail(illegal_transition, "release: tensor (micro-batch %u, layer %u, index %u) is %s: %s",
                k.micro_batch, k.layer, k.index, to_string(r->state),
                r->state == tensor_state::absent ? "release before offload" : "double release");
  if (!in_flight_.empty()) retire(false);
  // A consumer other than the compute stream guards the blocks it read.
  cudaStream_t users[2] = {nullptr, nullptr};
  std::size_t n_users = 0;
  if (r->consumer && r->consumer != config_.compute) users[n_users++] = r->consumer;
  if (r->prefetched) {
    // The block is the compute stream's (allocated for it before the H2D was ordered after
    // it). Its only other writer is the H2D copy, which its consumer has already waited for
    // (acquire). Never acquired: make the compute stream wait for the copy now. Either way
    // no event on the H2D stream is needed, and none may be used: the H2D stream runs ahead
    // with later prefetches, so such a guard would keep the block from the compute stream
    // until the host sees those complete too (Note [Handing offloaded blocks back]: the same
    // lesson on the D2H side; gradient accumulation's next forward ran over budget).
    if (r->state == tensor_state::prefetching && r->h2d_done &&
        prim::stream_wait(config_.compute, r->h2d_done) != cudaSuccess) {
      prim::clear_runtime_error();
      users[n_users++] = h2d_.get();  // cannot order it: fall back to guarding
    }
    free_device(r->prefetched, r->bytes, r->consumer ? r->consumer : config_.compute, users,
                n_users);
    if (n_users && users[n_users - 1] == h2d_.get()) --n_users;
  }
  if (r->owns_device && r->device) {
    free_device(r->device, r->bytes, r->consumer ? r->consumer : r->producer, users, n_users);
  }
  if (r->host) {
    if (joined_) {  // Note [Capture begun by the caller]: the caller's graph keeps it
      held_.push_back(held_block{r->host, r->bytes});  // capacity reserved at the join
    } else {
      cudaStream_t copies[2] = {d2h_.get(), h2d_.get()};
      pinned_->deallocate(r->host, copies, 2);
    }
    pinned_in_use_ -= r->bytes;
  }
  events_.give(r->h2d_done);
  r->h2d_done = nullptr;
  r->prefetched = r->device = r->host = nullptr;
  r->owns_device = false;
  r->state = tensor_state::released;
  --s->live;
  ++stats_.released_count;
  return status::ok;
}

status prefetch_engine::info(tensor_key k, tensor_info* out) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!out) return fail(status::invalid_argument, "info: out is NULL");
  *out = tensor_info{};
  if (plan_.empty()) return fail(no_plan, "info: no plan loaded");
  const std::size_t flat = plan_.flat(k.layer, k.index);
  if (flat == engine_plan::npos)
    return fail(unknown_tensor, "info: tensor (layer %u, index %u) is not in the plan", k.layer,
                k.index);
  out->action = plan_.action(flat);
  micro_batch_slot* s = nullptr;
  slot_for(k.micro_batch, false, &s);
  if (!s) return status::ok;
  const tensor_record& r = s->tensors[flat];
  out->state = r.state;
  out->error = r.error;
  out->message = r.message;
  out->device = r.prefetched ? r.prefetched : r.device;
  out->bytes = r.bytes;
  return status::ok;
}

void prefetch_engine::sample_device(timed_op& t, bool compute) noexcept {
  if (!config_.pool) return;
  if (compute) t.device_peak = config_.pool->held_peak_since_last();
  t.device_bytes = config_.pool->held_bytes();
}

planner::trace_writer prefetch_engine::trace() {
  std::lock_guard<std::mutex> lock(mutex_);
  settle_if_ended();
  if (capturing_)  // Note [Capturing a step]: harvesting would query captured events
    throw error(status::capture, "trace during a graph capture: end the capture first");
  if (!trace_) throw error(status::invalid_argument, "trace: the engine was created with timing off");
  trace_->harvest(true, plan_);
  return trace_->writer();
}

void prefetch_engine::write_trace(const std::string& path) { trace().write(path); }

planner::overlap_report prefetch_engine::overlap() {
  return planner::compute_overlap(trace().spans());
}

}  // namespace stash::engine
