// api_double.cpp: the double-only API (stashdbl.h).
#include <algorithm>
#include <cstring>
#include <mutex>

#include "capture.h"
#include "op_specs.h"
#include "streams.h"

using namespace stash::dbl;

STASHDBL_EXPORT int stashdbl_probe(void) { return 1; }

STASHDBL_EXPORT void stashdbl_reset(void) {
  clear_faults();
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  st.checker.clear_violations();
  st.checker.clear_history();
  st.link_cfg = LinkConfig{};
  st.link.reset();
  st.host_now = 0.0;
  st.memory.set_total(MemoryTable::kDefaultTotal);
  st.memory.set_foreign_is_device(st.foreign_is_device_default);
  abort_all_captures(st);
  thread_capture_mode() = cudaStreamCaptureModeGlobal;
  auto rewind = [](Stream& s) {
    s.last_end = 0.0;
    s.paused = false;
  };
  if (st.legacy) rewind(*st.legacy);
  for (auto& [h, s] : st.streams) rewind(*s);
  for (auto& s : st.graveyard) rewind(*s);
  wake_all_workers(st);
}

STASHDBL_EXPORT int stashdbl_set_foreign_is_device(int on) {
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  const bool was = st.memory.foreign_is_device();
  st.memory.set_foreign_is_device(on != 0);
  return was ? 1 : 0;
}

STASHDBL_EXPORT void stashdbl_set_device_memory(size_t total_bytes) {
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  st.memory.set_total(total_bytes);
}

STASHDBL_EXPORT void stashdbl_set_bandwidth(double h2d_gbps, double d2h_gbps, double bidir_gbps) {
  if (!(h2d_gbps > 0.0) || !(d2h_gbps > 0.0) || !(bidir_gbps > 0.0)) return;  // ignored
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  st.link_cfg = LinkConfig{h2d_gbps, d2h_gbps, bidir_gbps};
}

STASHDBL_EXPORT double stashdbl_host_now_ms(void) {
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  return st.host_now;
}

STASHDBL_EXPORT void stashdbl_host_advance_ms(double ms) {
  if (!(ms > 0.0)) return;
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  st.host_now += ms;
}

STASHDBL_EXPORT cudaError_t stashdbl_enqueue_compute(cudaStream_t stream, double ms,
                                                    const char* name,
                                                    const void* const* reads,
                                                    const size_t* read_sizes, size_t n_reads,
                                                    const void* const* writes,
                                                    const size_t* write_sizes,
                                                    size_t n_writes) {
  STASHDBL_ENTER("stashdbl_enqueue_compute");
  if (!(ms >= 0.0) || (n_reads && (!reads || !read_sizes)) ||
      (n_writes && (!writes || !write_sizes))) {
    return fail(cudaErrorInvalidValue);
  }
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  Stream* s = find_stream(st, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  bool captured = false;
  if (cudaError_t e = route_op(st, *s, &captured); e != cudaSuccess) return fail(e);
  ComputeArgs args;
  args.api = st.checker.intern(name && *name ? name : "stashdbl_enqueue_compute");
  args.ms = ms;
  for (size_t i = 0; i < n_reads; ++i) args.accesses.push_back({reads[i], read_sizes[i], false});
  for (size_t i = 0; i < n_writes; ++i) args.accesses.push_back({writes[i], write_sizes[i], true});
  if (captured) {
    Node n;
    n.kind = NodeKind::kCompute;
    n.api = args.api;
    n.compute = std::move(args);
    add_node(st, *s, std::move(n));
    return cudaSuccess;
  }
  enqueue(st, *s, compute_spec(st, args));
  return cudaSuccess;
}

namespace stash::dbl {
OpSpec compute_spec(State& st, const ComputeArgs& args) {
  OpSpec spec;
  spec.api = args.api;
  spec.duration_ms = args.ms;
  spec.accesses = args.accesses;
  for (const Access& a : args.accesses) {
    if (BlockRef b = st.memory.containing(a.ptr, 1)) spec.keep.push_back(b);
  }
  return spec;
}
}  // namespace stash::dbl

namespace {
cudaError_t set_paused(cudaStream_t stream, bool paused) {
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  Stream* s = find_stream(st, stream);
  if (s == nullptr) return cudaErrorInvalidResourceHandle;
  s->paused = paused;
  s->wake.notify_one();
  return cudaSuccess;
}
}  // namespace

STASHDBL_EXPORT cudaError_t stashdbl_stream_pause(cudaStream_t stream) {
  return set_paused(stream, true);
}

STASHDBL_EXPORT cudaError_t stashdbl_stream_resume(cudaStream_t stream) {
  return set_paused(stream, false);
}

STASHDBL_EXPORT void stashdbl_inject_fault(const char* api, int nth, cudaError_t error) {
  arm_fault(api, nth, error);
}

STASHDBL_EXPORT void stashdbl_clear_faults(void) { clear_faults(); }

STASHDBL_EXPORT void stashdbl_host_access(const void* ptr, size_t bytes, int is_write) {
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  host_access(st, ptr, bytes, is_write != 0, is_write ? "host write" : "host read");
}

STASHDBL_EXPORT size_t stashdbl_violation_count(void) {
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  return st.checker.violation_count();
}

STASHDBL_EXPORT size_t stashdbl_violation_text(size_t i, char* buf, size_t len) {
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  const std::string* v = st.checker.violation(i);
  if (v == nullptr) return 0;
  if (buf != nullptr && len > 0) {
    const size_t n = std::min(len - 1, v->size());
    std::memcpy(buf, v->data(), n);
    buf[n] = '\0';
  }
  return v->size();
}

STASHDBL_EXPORT void stashdbl_clear_violations(void) {
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  st.checker.clear_violations();
}
