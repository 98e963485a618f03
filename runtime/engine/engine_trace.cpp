#include "engine_trace.h"

#include <string>

#include "cuda_prim.h"

namespace stash::engine {

using planner::span_kind;

engine_trace::engine_trace(event_pool& events, cudaStream_t base_stream) : events_(events) {
  status s = events_.take(&base_);
  if (s != status::ok) throw_last_error(s);
  STASH_CUDA_TRY(prim::event_record(base_, base_stream));
  writer_.set_metadata("source", "engine");
}

engine_trace::~engine_trace() {
  for (timed_op& op : ops_) {
    if (op.end) prim::event_synchronize(op.end);
    events_.give(op.start);
    events_.give(op.end);
  }
  events_.give(base_);
}

status engine_trace::reserve(std::size_t ops) noexcept {
  try {
    ops_.reserve(ops);
  } catch (...) {
    return fail(status::internal, "engine_trace: out of host memory");
  }
  return status::ok;
}

status engine_trace::start(const timed_op& op, cudaStream_t s, std::size_t* id) noexcept {
  timed_op o = op;
  status st = events_.take(&o.start);
  if (st != status::ok) return st;
  st = events_.take(&o.end);
  if (st != status::ok) {
    events_.give(o.start);
    return st;
  }
  const cudaError_t err = prim::event_record(o.start, s);
  if (err != cudaSuccess) {
    events_.give(o.start);
    events_.give(o.end);
    return prim::record_cuda_error(err, "cudaEventRecord(start)", __FILE__, __LINE__);
  }
  try {
    ops_.push_back(o);  // capacity reserved at plan load; grows only past it
  } catch (...) {
    events_.give(o.start);
    events_.give(o.end);
    return fail(status::internal, "engine_trace: out of host memory");
  }
  *id = ops_.size() - 1;
  return status::ok;
}

status engine_trace::stop(std::size_t id, cudaStream_t s) noexcept {
  const cudaError_t err = prim::event_record(ops_[id].end, s);
  if (err != cudaSuccess) {
    cancel(id);
    return prim::record_cuda_error(err, "cudaEventRecord(end)", __FILE__, __LINE__);
  }
  return status::ok;
}

status engine_trace::mark(cudaStream_t s, cudaEvent_t* out) noexcept {
  status st = events_.take(out);
  if (st != status::ok) return st;
  const cudaError_t err = prim::event_record(*out, s);
  if (err != cudaSuccess) {
    events_.give(*out);
    *out = nullptr;
    return prim::record_cuda_error(err, "cudaEventRecord(mark)", __FILE__, __LINE__);
  }
  return status::ok;
}

status engine_trace::finish(timed_op op, cudaStream_t s) noexcept {
  status st = events_.take(&op.end);
  if (st != status::ok) {
    events_.give(op.start);
    return st;
  }
  const cudaError_t err = prim::event_record(op.end, s);
  if (err != cudaSuccess) {
    events_.give(op.start);
    events_.give(op.end);
    return prim::record_cuda_error(err, "cudaEventRecord(end)", __FILE__, __LINE__);
  }
  try {
    ops_.push_back(op);
  } catch (...) {
    events_.give(op.start);
    events_.give(op.end);
    return fail(status::internal, "engine_trace: out of host memory");
  }
  return status::ok;
}

void engine_trace::cancel(std::size_t id) noexcept {
  // The start event was recorded; the op is kept with end == start so it harvests as an
  // empty span and is dropped.
  events_.give(ops_[id].end);
  ops_[id].end = nullptr;
}

namespace {

std::string span_name(const timed_op& op, const engine_plan& plan) {
  const std::string l = std::to_string(op.layer);
  switch (op.kind) {
    case span_kind::forward: return "fwd L" + l;
    case span_kind::backward: return "bwd L" + l;
    case span_kind::wait: return std::string("wait ") + op.what + " L" + l;
    case span_kind::d2h:
    case span_kind::h2d: {
      std::string n = std::string(op.kind == span_kind::d2h ? "d2h L" : "h2d L") + l;
      if (op.flat < plan.total()) n += " " + plan.name(op.flat);
      return n;
    }
    default: return op.what;
  }
}

const char* track_of(span_kind k) {
  if (k == span_kind::d2h) return planner::kD2HTrack;
  if (k == span_kind::h2d) return planner::kH2DTrack;
  return planner::kComputeTrack;
}

}  // namespace

void engine_trace::harvest(bool block, const engine_plan& plan) {
  std::size_t keep = 0;
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    timed_op& op = ops_[i];
    float t0 = 0, t1 = 0;
    bool done = true;
    if (op.end) {
      if (block) prim::event_synchronize(op.end);
      done = prim::event_elapsed(&t1, base_, op.end) == cudaSuccess &&
             prim::event_elapsed(&t0, base_, op.start) == cudaSuccess;
    } else if (block) {
      prim::event_synchronize(op.start);
    }
    if (!done && !block) {
      ops_[keep++] = op;
      continue;
    }
    if (op.end && done && t1 >= t0 && !(op.kind == span_kind::wait && t1 == t0)) {
      planner::trace_span sp;
      sp.track = track_of(op.kind);
      sp.name = span_name(op, plan);
      sp.kind = op.kind;
      sp.start_ms = t0;
      sp.dur_ms = static_cast<double>(t1) - t0;
      sp.layer = op.layer;
      if (op.flat < plan.total()) sp.tensor = plan.name(op.flat);
      sp.bytes = op.bytes;
      sp.extra["micro_batch"] = op.micro_batch;
      const bool copy = op.kind == span_kind::d2h || op.kind == span_kind::h2d;
      if (copy)
        writer_.add_counter(planner::kPinnedBytesCounter, t0,
                            static_cast<double>(op.pinned_bytes));
      // Note [Measured device bytes]
      if (op.device_peak != timed_op::kNoSample)
        writer_.add_counter(planner::kDeviceBytesCounter, t0, static_cast<double>(op.device_peak));
      if (op.device_bytes != timed_op::kNoSample)
        writer_.add_counter(planner::kDeviceBytesCounter, copy ? t0 : t1,
                            static_cast<double>(op.device_bytes));
      writer_.add_span(std::move(sp));
    }
    events_.give(op.start);
    events_.give(op.end);
  }
  ops_.resize(keep);
}

}  // namespace stash::engine
