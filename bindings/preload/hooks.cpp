// hooks.cpp: the interposed cudart entry points (Note [Reaching the real cudart] in
// real_cudart.cpp says how they reach the real ones).
//
// Every hook is noexcept in effect: it calls only noexcept pool methods and the real
// runtime, writes errors into the allocator's thread-local buffer, never allocates on
// the heap (past a pool's one-time construction and the pools' own node storage), never
// logs, never throws. A hook that cannot serve a call from a pool passes it through
// unchanged, except a device allocation over STASH_DEVICE_BUDGET, which it refuses with
// cudaErrorMemoryAllocation as the runtime would when the device is full.
#include <cstring>

#include <cuda_runtime_api.h>

#include "options.h"
#include "pools.h"
#include "real_cudart.h"
#include "report.h"
#include "core/error.h"

namespace stash::preload {

namespace {

// Note [Re-entrancy guard]
// A hook runs pool code, which calls the runtime. Those calls reach the real functions
// directly (--wrap), so no hook re-enters today; but if anything on that path ever did
// reach a hook (a future runtime calling its own public entry points, a tool layered on
// top), the inner call must pass through rather than take the pool's mutex a second time
// on the same thread. initial-exec TLS: the library is preloaded, so static TLS is there,
// and reading it never calls into the loader (which could allocate).
__thread bool t_in_hook __attribute__((tls_model("initial-exec"))) = false;

struct hook_scope {
  hook_scope() noexcept { t_in_hook = true; }
  ~hook_scope() { t_in_hook = false; }
};

bool bypass() noexcept { return t_in_hook || opts().disabled; }

cudaError_t missing() noexcept { return cudaErrorNotSupported; }

bool capturing(cudaStream_t stream) noexcept {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(stream, &st);
  if (err != cudaSuccess) {
    cudaGetLastError();
    // Querying the legacy stream during another stream's global capture is itself
    // refused; that means a capture is under way.
    return err == cudaErrorStreamCaptureImplicit || err == cudaErrorStreamCaptureUnsupported;
  }
  return st != cudaStreamCaptureStatusNone;
}

// Note [Frees synchronize, as cudaFree does]
// cudaFree and cudaFreeHost of memory still used by queued work are safe with the real
// runtime because they synchronize. A pooled block is handed out again at once, possibly
// to work on another stream, so the hooks keep that guarantee explicitly with
// cudaDeviceSynchronize on the block's device. cudaFreeAsync needs no synchronization: the
// pool guards the block with an event on the freeing stream.
cudaError_t synchronize_device(int device) noexcept {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) return cudaGetLastError();
  if (current != device && cudaSetDevice(device) != cudaSuccess) return cudaGetLastError();
  const cudaError_t err = cudaDeviceSynchronize();
  if (current != device) cudaSetDevice(current);
  return err;
}

// Device allocation from the current device's pool. *handled = false: the caller
// passes the call through.
cudaError_t pooled_device_alloc(void** out, size_t size, cudaStream_t stream,
                                bool* handled) noexcept {
  hook_scope scope;
  *handled = false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return cudaSuccess;
  }
  device_pool* pool = device_pool_for(device);
  if (!pool) return cudaSuccess;
  *handled = true;
  arm_report_at_exit();  // refusals are reported too
  counters& c = tally();
  if (pool->allocate(size, stream, out) == status::ok) {
    c.device_alloc.fetch_add(1, std::memory_order_relaxed);
    raise_max(c.device_largest, size);
    return cudaSuccess;
  }
  *out = nullptr;
  if (std::strstr(last_error(), "budget")) {
    c.device_refused.fetch_add(1, std::memory_order_relaxed);
  } else {
    c.device_failed.fetch_add(1, std::memory_order_relaxed);
  }
  return cudaErrorMemoryAllocation;
}

// *handled = false: not stash's pointer; the caller passes it through.
cudaError_t pooled_device_free(void* p, const cudaStream_t* stream, bool* handled) noexcept {
  hook_scope scope;
  int device = -1;
  device_pool* pool = device_pool_owning(p, &device);
  *handled = pool != nullptr;
  if (!pool) {
    tally().device_foreign_free.fetch_add(1, std::memory_order_relaxed);
    return cudaSuccess;
  }
  if (stream) {
    // A pooled block freed inside a capture would be reused before the graph ran.
    if (capturing(*stream)) return cudaErrorStreamCaptureUnsupported;
  } else {
    const cudaError_t err = synchronize_device(device);
    if (err != cudaSuccess) return err;
  }
  if (pool->deallocate(p, stream, stream ? 1 : 0) != status::ok) return cudaErrorInvalidValue;
  tally().device_free.fetch_add(1, std::memory_order_relaxed);
  return cudaSuccess;
}

cudaError_t pooled_pinned_alloc(void** out, size_t size, bool* handled) noexcept {
  hook_scope scope;
  *handled = false;
  pinned_pool* pool = pinned_pool_get();
  if (!pool) return cudaSuccess;
  // Larger than a slab, or the cap reached: the pinned pool is stash's economy, not a
  // limit the program asked for, so the runtime serves the request instead.
  if (pool->allocate(size, out) != status::ok) return cudaSuccess;
  *handled = true;
  counters& c = tally();
  c.pinned_alloc.fetch_add(1, std::memory_order_relaxed);
  raise_max(c.pinned_largest, size);
  arm_report_at_exit();
  return cudaSuccess;
}

cudaError_t pooled_pinned_free(void* p, bool* handled) noexcept {
  hook_scope scope;
  pinned_pool* pool = pinned_pool_if_built();
  *handled = pool && pool->owns(p);
  if (!*handled) {
    tally().pinned_foreign_free.fetch_add(1, std::memory_order_relaxed);
    return cudaSuccess;
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return cudaGetLastError();
  const cudaError_t err = synchronize_device(device);
  if (err != cudaSuccess) return err;
  if (pool->deallocate(p, nullptr, 0) != status::ok) return cudaErrorInvalidValue;
  tally().pinned_free.fetch_add(1, std::memory_order_relaxed);
  return cudaSuccess;
}

cudaError_t device_alloc_hook(void** out, size_t size, cudaStream_t stream,
                              cudaError_t (*pass)(void**, size_t, cudaStream_t),
                              bool async) noexcept {
  if (!bypass() && out && size > 0 && !(async && capturing(stream))) {
    bool handled = false;
    const cudaError_t err = pooled_device_alloc(out, size, stream, &handled);
    if (handled) return err;
  }
  if (!bypass()) tally().device_passthrough_alloc.fetch_add(1, std::memory_order_relaxed);
  return pass ? pass(out, size, stream) : missing();
}

cudaError_t device_free_hook(void* p, const cudaStream_t* stream,
                             cudaError_t (*pass_async)(void*, cudaStream_t)) noexcept {
  if (p && !bypass()) {
    bool handled = false;
    const cudaError_t err = pooled_device_free(p, stream, &handled);
    if (handled) return err;
  }
  if (stream) return pass_async ? pass_async(p, *stream) : missing();
  return real().free ? real().free(p) : missing();
}

cudaError_t host_alloc_hook(void** out, size_t size, unsigned int flags, bool malloc_host) {
  // Only plain or portable pinned memory comes from the pool (its slabs are portable,
  // a superset of the default); mapped and write-combined requests pass through.
  if (!bypass() && out && size > 0 && (flags & ~unsigned{cudaHostAllocPortable}) == 0) {
    bool handled = false;
    const cudaError_t err = pooled_pinned_alloc(out, size, &handled);
    if (handled) return err;
  }
  if (!bypass()) tally().pinned_passthrough_alloc.fetch_add(1, std::memory_order_relaxed);
  const real_cudart& r = real();
  if (malloc_host) return r.malloc_host ? r.malloc_host(out, size) : missing();
  return r.host_alloc ? r.host_alloc(out, size, flags) : missing();
}

cudaError_t legacy_malloc(void** out, size_t size, cudaStream_t) {
  return real().malloc ? real().malloc(out, size) : missing();
}

// A null stream in a _ptsz call means the calling thread's default stream.
cudaStream_t per_thread(cudaStream_t s) noexcept { return s ? s : cudaStreamPerThread; }

}  // namespace
}  // namespace stash::preload

using namespace stash::preload;

// Exported under libcudart.so.13 (preload.map). The signatures are the runtime's own.
#define STASH_HOOK extern "C" __attribute__((visibility("default")))

STASH_HOOK cudaError_t cudaMalloc(void** devPtr, size_t size) {
  // cudaMalloc'd memory is usable from every stream; its blocks belong to the legacy
  // stream's free list and cudaFree synchronizes (Note [Frees synchronize, as cudaFree does]).
  return device_alloc_hook(devPtr, size, nullptr, legacy_malloc, false);
}

STASH_HOOK cudaError_t cudaFree(void* devPtr) { return device_free_hook(devPtr, nullptr, nullptr); }

STASH_HOOK cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
  return device_alloc_hook(devPtr, size, hStream, real().malloc_async, true);
}

STASH_HOOK cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  return device_free_hook(devPtr, &hStream, real().free_async);
}

STASH_HOOK cudaError_t cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t hStream) {
  if (bypass()) return real().malloc_async_ptsz ? real().malloc_async_ptsz(devPtr, size, hStream) : missing();
  return device_alloc_hook(devPtr, size, per_thread(hStream), real().malloc_async_ptsz, true);
}

STASH_HOOK cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t hStream) {
  if (bypass()) return real().free_async_ptsz ? real().free_async_ptsz(devPtr, hStream) : missing();
  const cudaStream_t s = per_thread(hStream);
  return device_free_hook(devPtr, &s, real().free_async_ptsz);
}

STASH_HOOK cudaError_t cudaMallocHost(void** ptr, size_t size) {
  return host_alloc_hook(ptr, size, cudaHostAllocDefault, true);
}

STASH_HOOK cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  return host_alloc_hook(pHost, size, flags, false);
}

STASH_HOOK cudaError_t cudaFreeHost(void* ptr) {
  if (ptr && !bypass()) {
    bool handled = false;
    const cudaError_t err = pooled_pinned_free(ptr, &handled);
    if (handled) return err;
  }
  return real().free_host ? real().free_host(ptr) : missing();
}
