// simulator.cpp: the discrete-event replay (simulator.h has the semantics and the notes).
#include "planner/simulator/simulator.h"
#include "planner/model/schedule.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <optional>
#include <stdexcept>

namespace stash::planner {

namespace {

using schedule::layer_span;

// step_overhead: the profile's time outside the layers, at the turn (layer -1); it holds the
// profile's loss_bytes while it runs (Note [The loss's position] in plan.h).
enum class op_kind { forward, recompute, backward, step_overhead };

struct compute_op {
  op_kind kind;
  int layer;
  double dur_ms;
};

constexpr const char* kStepOverheadSpan = "step overhead (loss, optimizer)";

// One tensor's copy. Its rate can change while it runs (Note [Link model]); the current
// segment started at seg_start_ms with seg_bytes left, so the finish time is recomputed
// from one segment only and stays exact (bytes / bandwidth) when the rate never changes.
struct copy_op {
  int layer = 0;
  std::size_t tensor = 0;
  std::uint64_t bytes = 0;
  double start_ms = 0;
  double seg_start_ms = 0, seg_bytes = 0, rate = 0;  // rate in bytes per ms
  double finish_ms() const { return seg_start_ms + seg_bytes / rate; }
};

class replay {
 public:
  replay(const step_profile& p, const decision_table& d, const sim_options& opt);
  sim_result run();

 private:
  struct layer_state {
    std::uint64_t all = 0, recomputed = 0, offloaded_out = 0;  // offloaded_out: left device
    std::uint64_t bwd_temp = 0;  // bwd_temp_bytes and the plan's recompute temporaries
    double recompute_ms = 0;
    int d2h_pending = 0, h2d_pending = 0;
    double d2h_done_ms = 0, h2d_done_ms = 0;
    bool h2d_issued = false;
    std::vector<std::size_t> out;  // tensors copied out (offloads that got a pinned block)
  };

  bool ready(const compute_op& op) const;
  bool d2h_done(layer_span layers) const;
  void start_op(double t);
  void finish_op(double t);
  void issue_prefetch(int layer, const std::string& label, double t);
  void trigger_prefetch(int backward_layer, const std::string& label, double t);
  void retime(double t);
  void finish_copy(copy_op& c, bool d2h, double t);
  void alloc(std::uint64_t bytes, const std::string& label, double t);
  void free(std::uint64_t bytes, double t);
  void pinned_change(std::int64_t delta, double t);
  void sample(const char* counter, double t, double value);

  const step_profile& p_;
  const decision_table& d_;
  const sim_options& opt_;
  const int L_;
  std::vector<layer_state> layers_;
  std::vector<compute_op> ops_;
  std::size_t next_op_ = 0;
  bool busy_ = false;
  double op_end_ = 0, prev_end_ = 0;  // prev_end_: when the compute stream went idle
  std::deque<copy_op> d2h_queue_, h2d_queue_;
  std::optional<copy_op> d2h_, h2d_;
  std::vector<std::vector<bool>> copied_out_;  // [layer][tensor]: its D2H completed
  std::uint64_t device_ = 0, pinned_ = 0;
  std::vector<counter_sample> samples_;  // moved into the trace at the end
  sim_result r_;
};

std::string phase(const char* what, int layer) {
  return std::string(what) + "[" + std::to_string(layer) + "]";
}

replay::replay(const step_profile& p, const decision_table& d, const sim_options& opt)
    : p_(p), d_(d), opt_(opt), L_(static_cast<int>(p.layers.size())), layers_(p.layers.size()) {
  if (opt.lookahead < schedule::kMinLookahead)
    throw input_error("simulate: lookahead depth must be at least 1");
  if (d.size() != p.layers.size())
    throw input_error("simulate: the plan has " + std::to_string(d.size()) +
                      " layers, the profile " + std::to_string(p.layers.size()));
  copied_out_.resize(p.layers.size());
  bool offloads = false;
  for (int i = 0; i < L_; ++i) {
    const layer_profile& lp = p.layers[i];
    if (d[i].size() != lp.tensors.size())
      throw input_error("simulate: layers[" + std::to_string(i) + "] has " +
                        std::to_string(d[i].size()) + " actions for " +
                        std::to_string(lp.tensors.size()) + " tensors");
    copied_out_[i].assign(lp.tensors.size(), false);
    layer_state& l = layers_[i];
    for (std::size_t j = 0; j < lp.tensors.size(); ++j) {
      l.all += lp.tensors[j].bytes;
      if (d[i][j] == tensor_action::recompute) l.recomputed += lp.tensors[j].bytes;
      offloads |= d[i][j] == tensor_action::offload;
    }
    l.recompute_ms = layer_recompute_ms(p, static_cast<std::size_t>(i), d[i]);  // Note [Recompute by prefix]
    // Note [Backward temporaries of a recompute] in plan.h.
    l.bwd_temp = lp.bwd_temp_bytes + recompute_temp_bytes(p, static_cast<std::size_t>(i), d[i]);
  }
  if (offloads && (p.link.d2h_gbps <= 0 || p.link.h2d_gbps <= 0))
    throw input_error("simulate: the plan offloads but link.d2h_gbps / link.h2d_gbps is not positive");
  for (int i = 0; i < L_; ++i) ops_.push_back({op_kind::forward, i, p.layers[i].fwd_ms});
  if (p.step_overhead_ms > 0 || p.loss_bytes > 0)
    ops_.push_back({op_kind::step_overhead, -1, p.step_overhead_ms});
  for (int i = L_ - 1; i >= 0; --i) {
    if (layers_[i].recompute_ms > 0 || layers_[i].recomputed > 0)
      ops_.push_back({op_kind::recompute, i, layers_[i].recompute_ms});
    ops_.push_back({op_kind::backward, i, p.layers[i].bwd_ms});
  }
}

bool replay::d2h_done(layer_span layers) const {
  for (std::size_t i = layers.lo; i <= layers.hi; ++i)
    if (layers_[i].d2h_pending > 0) return false;
  return true;
}

// Whether the next compute op's copy dependencies are met (Note [The step's schedule] in
// schedule.h; Note [Runtime semantics the simulator replays]).
bool replay::ready(const compute_op& op) const {
  const layer_span turn = schedule::turn_waits_for(layers_.size());
  if (op.kind == op_kind::forward)
    return d2h_done(schedule::forward_waits_for(static_cast<std::size_t>(op.layer)));
  if (op.kind == op_kind::step_overhead) return !opt_.turn_barrier || d2h_done(turn);
  const bool first_of_layer = op.kind == op_kind::recompute || next_op_ == 0 ||
                              ops_[next_op_ - 1].kind != op_kind::recompute;
  if (!first_of_layer) return true;
  if (op.layer == L_ - 1 && opt_.turn_barrier && !d2h_done(turn)) return false;
  return layers_[op.layer].h2d_pending == 0;
}

void replay::start_op(double t) {
  const compute_op& op = ops_[next_op_];
  if (t > prev_end_) {
    // A dependency held the op back; the last one to complete is the one it waited for.
    int layer = -1;
    bool d2h = true;
    double latest = -1;
    auto consider = [&](int l, bool is_d2h) {
      const double at = is_d2h ? layers_[l].d2h_done_ms : layers_[l].h2d_done_ms;
      if (at > latest) latest = at, layer = l, d2h = is_d2h;
    };
    const auto consider_d2h = [&](layer_span span) {
      for (std::size_t i = span.lo; i <= span.hi; ++i) consider(static_cast<int>(i), true);
    };
    const layer_span turn = schedule::turn_waits_for(layers_.size());
    if (op.kind == op_kind::forward) {
      consider_d2h(schedule::forward_waits_for(static_cast<std::size_t>(op.layer)));
    } else if (op.kind == op_kind::step_overhead) {
      consider_d2h(turn);  // only the barrier holds it
    } else {
      if (op.layer == L_ - 1 && opt_.turn_barrier) consider_d2h(turn);
      consider(op.layer, false);
    }
    const double wait = t - prev_end_;
    (d2h ? r_.d2h_wait_ms : r_.h2d_wait_ms) += wait;
    r_.exposed_copy_ms += wait;
    if (opt_.record_trace)
      r_.trace.add_span(kComputeTrack,
                        std::string(d2h ? "wait d2h L" : "wait h2d L") + std::to_string(layer),
                        span_kind::wait, prev_end_, wait, layer);
  }
  if (op.kind == op_kind::step_overhead) {
    alloc(p_.loss_bytes, "loss", t);
    r_.step_overhead_ms += op.dur_ms;
    if (opt_.record_trace)
      r_.trace.add_span(kComputeTrack, kStepOverheadSpan, span_kind::step_overhead, t, op.dur_ms);
    busy_ = true;
    op_end_ = t + op.dur_ms;
    return;
  }
  const std::string label = phase(op.kind == op_kind::forward ? "forward" : "backward", op.layer);
  const char* name = "fwd L";
  span_kind kind = span_kind::forward;
  switch (op.kind) {
    case op_kind::forward:
      alloc(layers_[op.layer].all, label, t);
      r_.compute_ms += op.dur_ms;
      break;
    case op_kind::recompute:
      name = "recompute L", kind = span_kind::recompute;
      alloc(layers_[op.layer].recomputed, label, t);
      r_.recompute_ms += op.dur_ms;
      if (!opt_.prefetch_after_recompute) trigger_prefetch(op.layer, label, t);
      break;
    case op_kind::backward: {
      name = "bwd L", kind = span_kind::backward;
      const bool after_recompute = next_op_ > 0 && ops_[next_op_ - 1].kind == op_kind::recompute;
      alloc(layers_[op.layer].bwd_temp, label, t);
      if (opt_.prefetch_after_recompute || !after_recompute) trigger_prefetch(op.layer, label, t);
      r_.compute_ms += op.dur_ms;
      break;
    }
    case op_kind::step_overhead: break;  // handled above
  }
  if (opt_.record_trace)
    r_.trace.add_span(kComputeTrack, name + std::to_string(op.layer), kind, t, op.dur_ms,
                      op.layer);
  busy_ = true;
  op_end_ = t + op.dur_ms;
}

void replay::finish_op(double t) {
  const compute_op& op = ops_[next_op_];
  if (op.kind == op_kind::step_overhead) {
    free(p_.loss_bytes, t);
    busy_ = false;
    prev_end_ = t;
    ++next_op_;
    return;
  }
  const layer_profile& lp = p_.layers[op.layer];
  layer_state& l = layers_[op.layer];
  if (op.kind == op_kind::forward) {
    free(l.recomputed, t);
    for (std::size_t j = 0; j < lp.tensors.size(); ++j) {
      if (d_[op.layer][j] != tensor_action::offload) continue;
      const std::uint64_t b = lp.tensors[j].bytes;
      if (b > opt_.pinned_bytes - std::min(pinned_, opt_.pinned_bytes)) {
        r_.pinned_fallback_bytes += b;  // Note [Pinned capacity]: stays on device, as kept
        ++r_.pinned_fallback_tensors;
        continue;
      }
      pinned_change(static_cast<std::int64_t>(b), t);
      copy_op c;
      c.layer = op.layer;
      c.tensor = j;
      c.bytes = b;
      d2h_queue_.push_back(c);
      l.out.push_back(j);
      l.offloaded_out += b;
      r_.offloaded_bytes += b;
    }
    l.d2h_pending = l.h2d_pending = static_cast<int>(l.out.size());
    l.d2h_done_ms = t;
    // A (rule-breaking) offload of the last layer is fetched back at the turn; its backward
    // cannot issue it later without waiting on itself.
    if (op.layer == L_ - 1) issue_prefetch(op.layer, phase("backward", op.layer), t);
  } else if (op.kind == op_kind::backward) {
    free(l.all + l.bwd_temp, t);
    pinned_change(-static_cast<std::int64_t>(l.offloaded_out), t);
  }
  busy_ = false;
  prev_end_ = t;
  ++next_op_;
}

void replay::issue_prefetch(int layer, const std::string& label, double t) {
  layer_state& l = layers_[layer];
  if (l.h2d_issued) return;
  l.h2d_issued = true;
  l.h2d_done_ms = t;
  for (std::size_t j : l.out) {
    alloc(p_.layers[layer].tensors[j].bytes, label, t);  // block for the consumer stream
    copy_op c;
    c.layer = layer;
    c.tensor = j;
    c.bytes = p_.layers[layer].tensors[j].bytes;
    h2d_queue_.push_back(c);
  }
}

// Backward compute of `backward_layer` begins: issue the prefetches of its window (Note
// [The step's schedule]; issue_prefetch skips the layers issued already).
void replay::trigger_prefetch(int backward_layer, const std::string& label, double t) {
  const layer_span window =
      schedule::prefetch_window(static_cast<std::size_t>(backward_layer), opt_.lookahead);
  for (std::size_t i = window.hi + 1; i-- > window.lo;)
    issue_prefetch(static_cast<int>(i), label, t);
}

void replay::retime(double t) {
  const double d2h_bw = p_.d2h_bytes_per_ms(), h2d_bw = p_.h2d_bytes_per_ms();
  double rd = d2h_bw, rh = h2d_bw;
  if (d2h_ && h2d_ && opt_.share_link && p_.link.bidir_gbps > 0) {
    const double bidir = p_.link.bidir_gbps * 1e6, half = bidir / 2;
    rd = std::min(d2h_bw, std::max(half, bidir - h2d_bw));
    rh = std::min(h2d_bw, std::max(half, bidir - d2h_bw));
  }
  auto set = [t](std::optional<copy_op>& c, double rate) {
    if (!c || c->rate == rate) return;
    if (c->rate > 0) {
      c->seg_bytes = std::max(0.0, c->seg_bytes - c->rate * (t - c->seg_start_ms));
      c->seg_start_ms = t;
    }
    c->rate = rate;
  };
  set(d2h_, rd);
  set(h2d_, rh);
}

void replay::finish_copy(copy_op& c, bool d2h, double t) {
  layer_state& l = layers_[c.layer];
  const tensor_profile& tp = p_.layers[c.layer].tensors[c.tensor];
  if (d2h) {
    free(c.bytes, t);
    copied_out_[c.layer][c.tensor] = true;
    if (--l.d2h_pending == 0) l.d2h_done_ms = t;
  } else if (--l.h2d_pending == 0) {
    l.h2d_done_ms = t;
  }
  if (!opt_.record_trace) return;
  trace_span s;
  s.track = d2h ? kD2HTrack : kH2DTrack;
  s.name = std::string(d2h ? "d2h L" : "h2d L") + std::to_string(c.layer) + " " + tp.name;
  s.kind = d2h ? span_kind::d2h : span_kind::h2d;
  s.start_ms = c.start_ms;
  s.dur_ms = t - c.start_ms;
  s.layer = c.layer;
  s.tensor = tp.name;
  s.bytes = c.bytes;
  if (s.dur_ms > 0) s.extra["gbps"] = c.bytes / s.dur_ms / 1e6;
  r_.trace.add_span(std::move(s));
}

void replay::alloc(std::uint64_t bytes, const std::string& label, double t) {
  if (bytes == 0) return;
  device_ += bytes;
  sample(kDeviceBytesCounter, t, static_cast<double>(device_));
  if (device_ > r_.peak_bytes) {
    r_.peak_bytes = device_;
    r_.peak_time_ms = t;
    r_.peak_at = label;
  }
}

void replay::free(std::uint64_t bytes, double t) {
  if (bytes == 0) return;
  device_ -= bytes;
  sample(kDeviceBytesCounter, t, static_cast<double>(device_));
}

void replay::pinned_change(std::int64_t delta, double t) {
  if (delta == 0) return;
  pinned_ = static_cast<std::uint64_t>(static_cast<std::int64_t>(pinned_) + delta);
  r_.pinned_peak_bytes = std::max(r_.pinned_peak_bytes, pinned_);
  sample(kPinnedBytesCounter, t, static_cast<double>(pinned_));
}

// Rises at one instant collapse into one sample: frees normally precede allocations at an
// instant, so the sample kept is the instant's highest level. A fall after a rise at the
// same instant (zero-length compute) is appended, so the counter's maximum is the peak.
void replay::sample(const char* counter, double t, double value) {
  if (!opt_.record_trace) return;
  for (auto it = samples_.rbegin(); it != samples_.rend() && it->t_ms == t; ++it)
    if (it->name == counter) {
      if (value < it->value) break;
      it->value = value;
      return;
    }
  samples_.push_back({counter, t, value});
}

sim_result replay::run() {
  r_.trace.set_metadata("source", "stash simulate");
  r_.trace.set_metadata("lookahead", std::to_string(opt_.lookahead));
  alloc(p_.fixed_bytes, phase("forward", 0), 0);
  sample(kPinnedBytesCounter, 0, 0);
  double t = 0;
  for (;;) {
    // Start everything that can start at t; one start may enable another.
    for (bool progress = true; progress;) {
      progress = false;
      if (!busy_ && next_op_ < ops_.size() && ready(ops_[next_op_])) {
        start_op(t);
        progress = true;
      }
      if (!d2h_ && !d2h_queue_.empty()) {
        d2h_ = d2h_queue_.front();
        d2h_queue_.pop_front();
        d2h_->start_ms = d2h_->seg_start_ms = t;
        d2h_->seg_bytes = static_cast<double>(d2h_->bytes);
        progress = true;
      }
      if (!h2d_ && !h2d_queue_.empty() &&
          copied_out_[h2d_queue_.front().layer][h2d_queue_.front().tensor]) {
        h2d_ = h2d_queue_.front();
        h2d_queue_.pop_front();
        h2d_->start_ms = h2d_->seg_start_ms = t;
        h2d_->seg_bytes = static_cast<double>(h2d_->bytes);
        progress = true;
      }
    }
    retime(t);
    if (!busy_ && !d2h_ && !h2d_) {
      if (next_op_ < ops_.size() || !d2h_queue_.empty() || !h2d_queue_.empty())
        throw std::logic_error("simulate: replay stalled (internal error)");
      break;
    }
    double next = busy_ ? op_end_ : std::numeric_limits<double>::infinity();
    if (d2h_) next = std::min(next, d2h_->finish_ms());
    if (h2d_) next = std::min(next, h2d_->finish_ms());
    if (d2h_ && h2d_) r_.link_shared_ms += next - t;
    t = next;
    // Copies first: their frees precede whatever the compute stream does at t.
    if (d2h_ && d2h_->finish_ms() <= t) {
      finish_copy(*d2h_, true, t);
      d2h_.reset();
    }
    if (h2d_ && h2d_->finish_ms() <= t) {
      finish_copy(*h2d_, false, t);
      h2d_.reset();
    }
    if (busy_ && op_end_ <= t) finish_op(t);
  }
  // Note [The optimizer's position] in plan.h: after the last backward, nothing but the
  // fixed bytes alive, the optimizer step holds optimizer_bytes.
  if (p_.optimizer_bytes > device_) {
    const std::uint64_t extra = p_.optimizer_bytes - device_;
    alloc(extra, "optimizer", t);
    free(extra, t);
  }
  r_.step_ms = t;
  for (const counter_sample& c : samples_) r_.trace.add_counter(c.name, c.t_ms, c.value);
  return std::move(r_);
}

}  // namespace

sim_result simulate(const step_profile& p, const decision_table& d, const sim_options& opt) {
  return replay(p, d, opt).run();
}

}  // namespace stash::planner
