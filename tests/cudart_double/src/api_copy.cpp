// api_copy.cpp: cudaMemcpy*, cudaMemset*.
//
// Note [Copy kinds]
// The direction is read from the pointers (unified addressing), and the declared kind
// must agree with it: a kind that names device memory where the pointer is not inside a
// live device block, or host memory where it is, fails with cudaErrorInvalidValue (the
// real runtime leaves that undefined; a test double should catch it). A device range
// running past its block fails the same way. cudaMemcpyDefault accepts any pair. Memory
// outside the double's blocks is pageable host memory, or device memory under the opt-in
// of Note [Foreign memory as device memory] (memory.h).
// Synchronous copies and memsets run on the legacy default stream and the host waits
// for them. cudaMemcpyAsync whose host side is pageable (not from cudaHostAlloc or
// cudaHostRegister) is synchronous with the host, as on real CUDA; so is cudaMemset
// (real CUDA may return early for device memory; waiting only adds ordering).
#include <cstring>
#include <mutex>

#include "capture.h"
#include "op_specs.h"

namespace stash::dbl {
namespace {

struct Side {
  Location loc;
  bool bad = false;  // inside a device block but running past its end
};

Side locate(const MemoryTable& mem, const void* p, size_t n) {
  Side s{mem.locate(p, n)};
  if (!s.loc.block) {
    BlockRef first = mem.containing(p, 1);
    s.bad = first && first->kind == MemKind::kDevice;
  }
  return s;
}

}  // namespace

cudaError_t copy_spec(State& st, void* dst, const void* src, size_t count, int kind,
                      const char* api, OpSpec* out, bool* host_waits, bool* empty) {
  *host_waits = false;
  *empty = false;
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) {
    return cudaErrorInvalidMemcpyDirection;
  }
  if (count == 0) {
    *empty = true;
    return cudaSuccess;
  }
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  const Side d = locate(st.memory, dst, count);
  const Side sr = locate(st.memory, src, count);
  if (d.bad || sr.bad) return cudaErrorInvalidValue;
  const bool dd = d.loc.device(), sd = sr.loc.device();
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToHost: ok = !dd && !sd; break;
    case cudaMemcpyHostToDevice: ok = dd && !sd; break;
    case cudaMemcpyDeviceToHost: ok = !dd && sd; break;
    case cudaMemcpyDeviceToDevice: ok = dd && sd; break;
    default: break;
  }
  if (!ok) return cudaErrorInvalidValue;

  OpSpec spec;
  spec.api = api;
  spec.accesses = {{src, count, false}, {dst, count, true}};
  if (d.loc.block) spec.keep.push_back(d.loc.block);
  if (sr.loc.block) spec.keep.push_back(sr.loc.block);
  spec.run = [dst, src, count] { std::memmove(dst, src, count); };
  if (dd != sd) {
    spec.is_copy = true;
    spec.dir = dd ? CopyDir::kH2D : CopyDir::kD2H;
    spec.bytes = count;
    *host_waits = !(dd ? sr.loc.pinned() : d.loc.pinned());
  } else if (!dd) {
    *host_waits = !d.loc.pinned() || !sr.loc.pinned();
  }
  *out = std::move(spec);
  return cudaSuccess;
}

cudaError_t memset_spec(State& st, void* ptr, int value, size_t count, const char* api,
                        OpSpec* out, bool* empty) {
  *empty = false;
  if (count == 0) {
    *empty = true;
    return cudaSuccess;
  }
  const Side side = locate(st.memory, ptr, count);
  // Pageable host memory is not device-visible; foreign memory is under the opt-in.
  if (side.bad || (!side.loc.block && !side.loc.device())) return cudaErrorInvalidValue;
  OpSpec spec;
  spec.api = api;
  spec.accesses = {{ptr, count, true}};
  if (side.loc.block) spec.keep.push_back(side.loc.block);
  spec.run = [ptr, value, count] { std::memset(ptr, value, count); };
  *out = std::move(spec);
  return cudaSuccess;
}

namespace {

// Note [Capture rules] in capture.h: a synchronous copy or memset is a potentially
// unsafe call and uses the legacy stream; an async one on a capturing stream is a node.
cudaError_t copy(void* dst, const void* src, size_t count, int kind,
                 cudaStream_t stream, bool sync_api, const char* api) {
  State& st = state();
  std::unique_lock<std::mutex> lk(st.mu);
  Stream* s = find_stream(st, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  // A synchronous copy is not refused under a capture (Note [Capture rules]): only its
  // use of the legacy stream can conflict, which route_op checks.
  (void)sync_api;
  bool captured = false;
  if (cudaError_t e = route_op(st, *s, &captured); e != cudaSuccess) return fail(e);
  OpSpec spec;
  bool host_waits = false, empty = false;
  if (cudaError_t e = copy_spec(st, dst, src, count, kind, api, &spec, &host_waits, &empty);
      e != cudaSuccess) {
    return fail(e);
  }
  if (empty) return cudaSuccess;
  if (captured) {
    Node n;
    n.kind = NodeKind::kMemcpy;
    n.api = api;
    n.dst = dst;
    n.src = src;
    n.count = count;
    n.copy_kind = kind;
    add_node(st, *s, std::move(n));
    return cudaSuccess;
  }
  const Enqueued e = enqueue(st, *s, std::move(spec));
  if (sync_api || host_waits) {
    const VectorClock clock = s->clock;
    wait_done(st, lk, e.done);
    host_observe(st, clock, e.end);
  }
  return cudaSuccess;
}

cudaError_t memset(void* ptr, int value, size_t count, cudaStream_t stream, bool sync_api,
                   const char* api) {
  State& st = state();
  std::unique_lock<std::mutex> lk(st.mu);
  Stream* s = find_stream(st, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  // Zero bytes: success before anything else is looked at, as the real runtime answers
  // (seen on an H200, CUDA 13: cudaMemsetAsync(nullptr, 0, 0, s) on a stream whose capture
  // was invalidated returns cudaSuccess).
  if (count == 0) return cudaSuccess;
  if (sync_api) {
    if (cudaError_t e = refuse_unsafe(st); e != cudaSuccess) return fail(e);
  }
  bool captured = false;
  if (cudaError_t e = route_op(st, *s, &captured); e != cudaSuccess) return fail(e);
  OpSpec spec;
  bool empty = false;
  if (cudaError_t e = memset_spec(st, ptr, value, count, api, &spec, &empty); e != cudaSuccess) {
    return fail(e);
  }
  if (empty) return cudaSuccess;
  if (captured) {
    Node n;
    n.kind = NodeKind::kMemset;
    n.api = api;
    n.dst = ptr;
    n.value = value;
    n.count = count;
    add_node(st, *s, std::move(n));
    return cudaSuccess;
  }
  const Enqueued e = enqueue(st, *s, std::move(spec));
  if (sync_api) {
    const VectorClock clock = s->clock;
    wait_done(st, lk, e.done);
    host_observe(st, clock, e.end);
  }
  return cudaSuccess;
}

}  // namespace
}  // namespace stash::dbl

using namespace stash::dbl;

STASHDBL_EXPORT cudaError_t cudaMemcpy(void* dst, const void* src, size_t count,
                                      cudaMemcpyKind kind) {
  STASHDBL_ENTER("cudaMemcpy");
  return copy(dst, src, count, enum_value(kind), nullptr, /*sync_api=*/true, "cudaMemcpy");
}

STASHDBL_EXPORT cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count,
                                           cudaMemcpyKind kind, cudaStream_t stream) {
  STASHDBL_ENTER("cudaMemcpyAsync");
  return copy(dst, src, count, enum_value(kind), stream, /*sync_api=*/false,
              "cudaMemcpyAsync");
}

STASHDBL_EXPORT cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  STASHDBL_ENTER("cudaMemset");
  return stash::dbl::memset(devPtr, value, count, nullptr, /*sync_api=*/true, "cudaMemset");
}

STASHDBL_EXPORT cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count,
                                           cudaStream_t stream) {
  STASHDBL_ENTER("cudaMemsetAsync");
  return stash::dbl::memset(devPtr, value, count, stream, /*sync_api=*/false,
                            "cudaMemsetAsync");
}

// Per-thread default stream variants (nvcc --default-stream per-thread): the same calls,
// counted under their base names (Note [Legacy default stream]).
STASHDBL_EXPORT cudaError_t cudaMemcpy_ptds(void* dst, const void* src, size_t count,
                                           cudaMemcpyKind kind) {
  return cudaMemcpy(dst, src, count, kind);
}
STASHDBL_EXPORT cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count,
                                                cudaMemcpyKind kind, cudaStream_t stream) {
  return cudaMemcpyAsync(dst, src, count, kind, stream);
}
STASHDBL_EXPORT cudaError_t cudaMemset_ptds(void* devPtr, int value, size_t count) {
  return cudaMemset(devPtr, value, count);
}
STASHDBL_EXPORT cudaError_t cudaMemsetAsync_ptsz(void* devPtr, int value, size_t count,
                                                cudaStream_t stream) {
  return cudaMemsetAsync(devPtr, value, count, stream);
}
