#include "runtime/measure/attribution.h"

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <utility>

#include "runtime/measure/scope_name.h"

namespace stash::measure {

namespace {

using interval = std::pair<std::uint64_t, std::uint64_t>;

double busy_ms(std::vector<interval>& v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::uint64_t total = 0;
  std::uint64_t cur_start = v.front().first, cur_end = v.front().second;
  for (const interval& i : v) {
    if (i.first > cur_end) {
      total += cur_end - cur_start;
      cur_start = i.first;
      cur_end = i.second;
    } else {
      cur_end = std::max(cur_end, i.second);
    }
  }
  total += cur_end - cur_start;
  return static_cast<double>(total) / 1e6;
}

// Scopes by id, with the lookups attribution needs.
class scope_index {
 public:
  explicit scope_index(const std::vector<scope_record>& scopes) : scopes_(scopes) {
    for (size_t i = 0; i < scopes_.size(); ++i) {
      by_id_[scopes_[i].id] = i;
      by_thread_[scopes_[i].thread_id].push_back(i);
    }
    for (auto& [thread, v] : by_thread_) {
      std::stable_sort(v.begin(), v.end(), [&](size_t a, size_t b) {
        return scopes_[a].begin_ns < scopes_[b].begin_ns;
      });
    }
    names_.reserve(scopes_.size());
    for (const scope_record& s : scopes_) names_.push_back(parse_scope_name(s.name));
  }

  std::optional<size_t> find(std::uint64_t id) const {
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return std::nullopt;
    return it->second;
  }
  std::optional<size_t> parent(size_t i) const {
    if (scopes_[i].parent == 0 || scopes_[i].parent >= scopes_[i].id) return std::nullopt;
    return find(scopes_[i].parent);
  }

  // The innermost scope open on `thread` at `t`, for kernels whose external correlation
  // record is missing (Note [Attribution by launch], step 2).
  std::optional<size_t> open_at(std::uint64_t thread, std::uint64_t t) const {
    auto it = by_thread_.find(thread);
    if (it == by_thread_.end()) return std::nullopt;
    const std::vector<size_t>& v = it->second;
    auto ub = std::upper_bound(v.begin(), v.end(), t, [&](std::uint64_t time, size_t i) {
      return time < scopes_[i].begin_ns;
    });
    if (ub == v.begin()) return std::nullopt;
    std::optional<size_t> c = *std::prev(ub);
    // A scope open at t was open when the latest scope begun by t opened, so it is that
    // scope or one of its ancestors (parents are the innermost open scope at each push).
    while (c) {
      const scope_record& s = scopes_[*c];
      if (s.end_ns == 0 || s.end_ns > t) return c;
      c = parent(*c);
    }
    return std::nullopt;
  }

  const scope_record& at(size_t i) const { return scopes_[i]; }
  const std::optional<scope_name>& name(size_t i) const { return names_[i]; }
  size_t size() const { return scopes_.size(); }

 private:
  const std::vector<scope_record>& scopes_;
  std::unordered_map<std::uint64_t, size_t> by_id_;
  std::unordered_map<std::uint64_t, std::vector<size_t>> by_thread_;
  std::vector<std::optional<scope_name>> names_;
};

}  // namespace

measurement attribute(const activity_log& log) {
  measurement m;
  m.dropped_records = log.dropped_records;
  const scope_index scopes(log.scopes);

  std::unordered_map<std::uint32_t, std::uint64_t> external;  // correlation -> scope id
  external.reserve(log.external.size());
  for (const external_correlation_record& e : log.external) external[e.correlation_id] = e.external_id;
  std::unordered_map<std::uint32_t, const api_record*> calls;
  calls.reserve(log.api_calls.size());
  for (const api_record& a : log.api_calls) calls[a.correlation_id] = &a;

  // Note [Time outside the layers]: the steps begin at the outermost forwards of layer 0.
  const auto in_layer = [&](std::optional<size_t> a) {
    for (; a; a = scopes.parent(*a))
      if (scopes.name(*a) && scopes.name(*a)->is_layer()) return true;
    return false;
  };
  std::vector<std::uint64_t> step_begin;
  for (size_t i = 0; i < scopes.size(); ++i) {
    const std::optional<scope_name>& n = scopes.name(i);
    if (n && n->kind == scope_kind::layer_forward && n->layer == 0 && !in_layer(scopes.parent(i)))
      step_begin.push_back(scopes.at(i).begin_ns);
  }
  std::sort(step_begin.begin(), step_begin.end());
  std::vector<std::vector<interval>> outside(step_begin.size());

  std::vector<std::vector<interval>> intervals(scopes.size());
  for (const kernel_record& k : log.kernels) {
    ++m.kernels;
    if (k.start_ns == 0 && k.end_ns == 0) {
      ++m.kernels_untimed;
      continue;
    }
    const std::uint64_t end = std::max(k.start_ns, k.end_ns);
    const double ms = static_cast<double>(end - k.start_ns) / 1e6;
    m.kernel_ms += ms;
    // Note [Attribution by launch], steps 1 to 3.
    std::optional<size_t> s;
    if (auto e = external.find(k.correlation_id); e != external.end()) s = scopes.find(e->second);
    const auto call = calls.find(k.correlation_id);
    if (s) {
      ++m.kernels_by_correlation;
    } else if (call != calls.end()) {
      s = scopes.open_at(call->second->thread_id, call->second->start_ns);
      if (s) ++m.kernels_by_launch_thread;
    }
    if (!step_begin.empty() && !in_layer(s)) {
      const std::uint64_t launched = call != calls.end() ? call->second->start_ns : k.start_ns;
      const auto after = std::upper_bound(step_begin.begin(), step_begin.end(), launched);
      if (after != step_begin.begin())
        outside[static_cast<size_t>(after - step_begin.begin()) - 1].emplace_back(k.start_ns, end);
    }
    if (!s) {
      ++m.kernels_outside_scopes;
      m.outside_ms += ms;
      continue;
    }
    for (std::optional<size_t> a = s; a; a = scopes.parent(*a)) {
      intervals[*a].emplace_back(k.start_ns, end);
    }
  }

  for (std::vector<interval>& v : outside) m.step_outside_ms.push_back(busy_ms(v));

  for (const memcpy_record& c : log.copies) {
    if (c.direction == copy_direction::h2d) m.h2d_bytes += c.bytes;
    if (c.direction == copy_direction::d2h) m.d2h_bytes += c.bytes;
  }

  for (size_t i = 0; i < scopes.size(); ++i) {
    const std::optional<scope_name>& n = scopes.name(i);
    if (!n) continue;
    // The nearest enclosing layer scope (Note [Nested scopes]).
    std::optional<size_t> outer_layer;
    for (std::optional<size_t> a = scopes.parent(i); a; a = scopes.parent(*a)) {
      if (scopes.name(*a) && scopes.name(*a)->is_layer()) {
        outer_layer = a;
        break;
      }
    }
    const double ms = busy_ms(intervals[i]);
    if (n->is_layer()) {
      if (outer_layer) continue;
      layer_samples& l = m.layers[n->layer];
      (n->kind == scope_kind::layer_forward ? l.fwd_ms : l.bwd_ms).push_back(ms);
    } else {
      const int layer = outer_layer ? scopes.name(*outer_layer)->layer : -1;
      m.tensors[{layer, n->tensor}].push_back(ms);
    }
  }

  if (m.dropped_records > 0) {
    m.warnings.push_back(std::to_string(m.dropped_records) +
                         " activity records were dropped (CUPTI buffers full); the times "
                         "may be too low");
  }
  if (m.kernels_untimed > 0) {
    m.warnings.push_back(std::to_string(m.kernels_untimed) + " kernels had no timestamps");
  }
  return m;
}

}  // namespace stash::measure
