// api_memory.cpp: allocation entry points (device, pinned, registered, the default pool)
// and pointer queries. See memory.h for the accounting and release rules.
#include <mutex>

#include "capture.h"
#include "streams.h"

namespace stash::dbl {
namespace {

// The only memory pool: the device's default pool, behind cudaMallocAsync.
struct DefaultPool {
} default_pool;
cudaMemPool_t default_pool_handle() { return reinterpret_cast<cudaMemPool_t>(&default_pool); }

cudaError_t malloc_async(void** ptr, size_t size, cudaStream_t stream, const char* api) {
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  Stream* s = find_stream(st, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  bool captured = false;
  if (cudaError_t e = route_op(st, *s, &captured); e != cudaSuccess) return fail(e);
  if (size == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  if (captured) {
    // Note [Graph memory] (capture.h): an allocation node; the address is the graph's.
    BlockRef b = MemoryTable::map(size, MemKind::kDevice);
    if (!b) return fail(cudaErrorMemoryAllocation);
    b->graph = true;
    b->from_pool = true;
    st.memory.insert(b);
    s->capture->graph->allocations.push_back(b);
    Node n;
    n.kind = NodeKind::kAlloc;
    n.api = api;
    n.block = b;
    add_node(st, *s, std::move(n));
    *ptr = reinterpret_cast<void*>(b->base);
    return cudaSuccess;
  }
  BlockRef b;
  if (cudaError_t e = st.memory.alloc_device(size, /*from_pool=*/true, &b); e != cudaSuccess) {
    return fail(e);
  }
  // Note [Happens-before model]: fresh memory, then a stream-ordered "write" of it.
  st.checker.forget(reinterpret_cast<void*>(b->base), b->size);
  OpSpec spec;
  spec.api = api;
  spec.accesses.push_back({reinterpret_cast<void*>(b->base), b->size, true});
  enqueue(st, *s, std::move(spec));
  *ptr = reinterpret_cast<void*>(b->base);
  return cudaSuccess;
}

cudaError_t host_alloc(void** ptr, size_t size, unsigned flags) {
  constexpr unsigned kKnown = cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined;
  if (ptr == nullptr || (flags & ~kKnown) != 0) return fail(cudaErrorInvalidValue);
  if (size == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  {
    State& st = state();
    std::lock_guard<std::mutex> lk(st.mu);
    if (cudaError_t e = refuse_unsafe(st); e != cudaSuccess) return fail(e);  // Note [Capture rules]
  }
  BlockRef b = MemoryTable::map(size, MemKind::kPinned);
  if (!b) return fail(cudaErrorMemoryAllocation);
  b->flags = flags;
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  st.checker.forget(reinterpret_cast<void*>(b->base), b->size);
  st.memory.insert(b);
  *ptr = reinterpret_cast<void*>(b->base);
  return cudaSuccess;
}

}  // namespace
}  // namespace stash::dbl

using namespace stash::dbl;

STASHDBL_EXPORT cudaError_t cudaMalloc(void** devPtr, size_t size) {
  STASHDBL_ENTER("cudaMalloc");
  if (devPtr == nullptr) return fail(cudaErrorInvalidValue);
  if (size == 0) {
    *devPtr = nullptr;
    return cudaSuccess;
  }
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  if (cudaError_t e = refuse_unsafe(st); e != cudaSuccess) return fail(e);  // Note [Capture rules]
  BlockRef b;
  if (cudaError_t e = st.memory.alloc_device(size, /*from_pool=*/false, &b); e != cudaSuccess) {
    return fail(e);
  }
  st.checker.forget(reinterpret_cast<void*>(b->base), b->size);
  *devPtr = reinterpret_cast<void*>(b->base);
  return cudaSuccess;
}

// No implicit synchronization (Note [Deferred release]): the free is a host write of the
// whole block, so freeing while a stream still uses the block is reported.
STASHDBL_EXPORT cudaError_t cudaFree(void* devPtr) {
  STASHDBL_ENTER("cudaFree");
  if (devPtr == nullptr) return cudaSuccess;
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  if (cudaError_t e = refuse_unsafe(st); e != cudaSuccess) return fail(e);  // Note [Capture rules]
  BlockRef b = st.memory.at_base(devPtr);
  if (!b || b->kind != MemKind::kDevice) return fail(cudaErrorInvalidValue);
  host_access(st, devPtr, b->size, /*is_write=*/true, "cudaFree");
  st.memory.erase(b);
  st.memory.release_device(b);
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
  STASHDBL_ENTER("cudaMallocAsync");
  return malloc_async(devPtr, size, hStream, "cudaMallocAsync");
}

STASHDBL_EXPORT cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t memPool,
                                                   cudaStream_t stream) {
  STASHDBL_ENTER("cudaMallocFromPoolAsync");
  if (memPool != default_pool_handle()) return fail(cudaErrorInvalidValue);
  return malloc_async(ptr, size, stream, "cudaMallocFromPoolAsync");
}

// Stream-ordered: the block leaves the table now (a second free is an error at once), its
// bytes return to the pool when the stream reaches the free.
STASHDBL_EXPORT cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  STASHDBL_ENTER("cudaFreeAsync");
  if (devPtr == nullptr) return cudaSuccess;
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  Stream* s = find_stream(st, hStream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  bool captured = false;
  if (cudaError_t e = route_op(st, *s, &captured); e != cudaSuccess) return fail(e);
  BlockRef b = st.memory.at_base(devPtr);
  if (!b || b->kind != MemKind::kDevice) return fail(cudaErrorInvalidValue);
  if (captured) {
    // A free node: only of a graph allocation, as documented (Note [Graph memory]).
    if (!b->graph) return fail(cudaErrorInvalidValue);
    st.memory.erase(b);
    Node n;
    n.kind = NodeKind::kFree;
    n.api = "cudaFreeAsync";
    n.block = b;
    add_node(st, *s, std::move(n));
    return cudaSuccess;
  }
  st.memory.erase(b);
  OpSpec spec;
  spec.api = "cudaFreeAsync";
  spec.accesses.push_back({devPtr, b->size, true});
  spec.finish = [b](State& s2) { s2.memory.release_device(b); };
  spec.keep.push_back(b);
  enqueue(st, *s, std::move(spec));
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  STASHDBL_ENTER("cudaHostAlloc");
  return host_alloc(pHost, size, flags);
}

STASHDBL_EXPORT cudaError_t cudaMallocHost(void** ptr, size_t size) {
  STASHDBL_ENTER("cudaMallocHost");
  return host_alloc(ptr, size, cudaHostAllocDefault);
}

STASHDBL_EXPORT cudaError_t cudaFreeHost(void* ptr) {
  STASHDBL_ENTER("cudaFreeHost");
  if (ptr == nullptr) return cudaSuccess;
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  if (cudaError_t e = refuse_unsafe(st); e != cudaSuccess) return fail(e);  // Note [Capture rules]
  BlockRef b = st.memory.at_base(ptr);
  if (!b || b->kind != MemKind::kPinned) return fail(cudaErrorInvalidValue);
  host_access(st, ptr, b->size, /*is_write=*/true, "cudaFreeHost");
  st.memory.erase(b);
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  STASHDBL_ENTER("cudaHostRegister");
  constexpr unsigned kKnown = cudaHostRegisterPortable | cudaHostRegisterMapped |
                              cudaHostRegisterIoMemory | cudaHostRegisterReadOnly;
  if (ptr == nullptr || size == 0 || (flags & ~kKnown) != 0) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  if (st.memory.overlaps(ptr, size)) return fail(cudaErrorHostMemoryAlreadyRegistered);
  auto b = std::make_shared<Block>();
  b->base = reinterpret_cast<uintptr_t>(ptr);
  b->size = size;
  b->kind = MemKind::kRegistered;
  b->flags = flags;
  st.memory.insert(b);
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaHostUnregister(void* ptr) {
  STASHDBL_ENTER("cudaHostUnregister");
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  BlockRef b = st.memory.at_base(ptr);
  if (!b || b->kind != MemKind::kRegistered) return fail(cudaErrorHostMemoryNotRegistered);
  st.memory.erase(b);
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaHostGetDevicePointer(void** pDevice, void* pHost, unsigned int flags) {
  STASHDBL_ENTER("cudaHostGetDevicePointer");
  if (pDevice == nullptr || flags != 0) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  BlockRef b = st.memory.containing(pHost, 1);
  if (!b || b->kind == MemKind::kDevice) return fail(cudaErrorInvalidValue);
  *pDevice = pHost;  // unified addressing: the same address on both sides
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaHostGetFlags(unsigned int* pFlags, void* pHost) {
  STASHDBL_ENTER("cudaHostGetFlags");
  if (pFlags == nullptr) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  BlockRef b = st.memory.containing(pHost, 1);
  if (!b || b->kind == MemKind::kDevice) return fail(cudaErrorInvalidValue);
  *pFlags = b->flags;
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes,
                                                    const void* ptr) {
  STASHDBL_ENTER("cudaPointerGetAttributes");
  if (attributes == nullptr) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  BlockRef b = st.memory.containing(ptr, 1);
  *attributes = cudaPointerAttributes{};
  if (!b && !st.memory.foreign_is_device()) {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = cudaInvalidDeviceId;
    return cudaSuccess;
  }
  attributes->device = 0;
  attributes->devicePointer = const_cast<void*>(ptr);
  if (!b || b->kind == MemKind::kDevice) {  // !b: foreign memory counted as device memory
    attributes->type = cudaMemoryTypeDevice;
  } else {
    attributes->type = cudaMemoryTypeHost;
    attributes->hostPointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  STASHDBL_ENTER("cudaMemGetInfo");
  if (free == nullptr || total == nullptr) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  *total = st.memory.total();
  const size_t used = st.memory.device_in_use();
  *free = used >= *total ? 0 : *total - used;
  return cudaSuccess;
}

// --- the default memory pool -----------------------------------------------------------

STASHDBL_EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* memPool, int device) {
  STASHDBL_ENTER("cudaDeviceGetDefaultMemPool");
  if (memPool == nullptr) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  *memPool = default_pool_handle();
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaDeviceGetMemPool(cudaMemPool_t* memPool, int device) {
  STASHDBL_ENTER("cudaDeviceGetMemPool");
  if (memPool == nullptr) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  *memPool = default_pool_handle();
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t memPool) {
  STASHDBL_ENTER("cudaDeviceSetMemPool");
  if (device != 0) return fail(cudaErrorInvalidDevice);
  // Only the default pool exists (cudaMemPoolCreate is not modelled).
  if (memPool != default_pool_handle()) return fail(cudaErrorInvalidValue);
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, cudaMemPoolAttr attr,
                                                   void* value) {
  STASHDBL_ENTER("cudaMemPoolSetAttribute");
  if (memPool != default_pool_handle() || value == nullptr) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  PoolStats& p = st.memory.pool();
  const auto u64 = [&] { return *static_cast<const uint64_t*>(value); };
  const auto i32 = [&] { return *static_cast<const int*>(value); };
  switch (enum_value(attr)) {
    case cudaMemPoolReuseFollowEventDependencies: p.reuse_follow_event = i32(); break;
    case cudaMemPoolReuseAllowOpportunistic: p.reuse_opportunistic = i32(); break;
    case cudaMemPoolReuseAllowInternalDependencies: p.reuse_internal_deps = i32(); break;
    case cudaMemPoolAttrReleaseThreshold: p.release_threshold = u64(); break;
    // High-water marks may only be reset to zero (then they restart from current).
    case cudaMemPoolAttrReservedMemHigh:
      if (u64() != 0) return fail(cudaErrorInvalidValue);
      p.reserved_high = p.reserved();
      break;
    case cudaMemPoolAttrUsedMemHigh:
      if (u64() != 0) return fail(cudaErrorInvalidValue);
      p.used_high = p.used;
      break;
    default: return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, cudaMemPoolAttr attr,
                                                   void* value) {
  STASHDBL_ENTER("cudaMemPoolGetAttribute");
  if (memPool != default_pool_handle() || value == nullptr) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  const PoolStats& p = st.memory.pool();
  auto* u64 = static_cast<uint64_t*>(value);
  auto* i32 = static_cast<int*>(value);
  switch (enum_value(attr)) {
    case cudaMemPoolReuseFollowEventDependencies: *i32 = p.reuse_follow_event; break;
    case cudaMemPoolReuseAllowOpportunistic: *i32 = p.reuse_opportunistic; break;
    case cudaMemPoolReuseAllowInternalDependencies: *i32 = p.reuse_internal_deps; break;
    case cudaMemPoolAttrReleaseThreshold: *u64 = p.release_threshold; break;
    case cudaMemPoolAttrReservedMemCurrent: *u64 = p.reserved(); break;
    case cudaMemPoolAttrReservedMemHigh: *u64 = p.reserved_high; break;
    case cudaMemPoolAttrUsedMemCurrent: *u64 = p.used; break;
    case cudaMemPoolAttrUsedMemHigh: *u64 = p.used_high; break;
    default: return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep) {
  STASHDBL_ENTER("cudaMemPoolTrimTo");
  if (memPool != default_pool_handle()) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  st.memory.trim_pool(minBytesToKeep);
  return cudaSuccess;
}
