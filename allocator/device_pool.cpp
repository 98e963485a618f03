#include "device_pool.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "cuda_prim.h"

namespace stash {

namespace {

constexpr size_t growth_granule = size_t{2} << 20;  // cudaMalloc's own granularity

block_map::tag_t tag_of(cudaStream_t s) noexcept {
  return static_cast<block_map::tag_t>(reinterpret_cast<uintptr_t>(s));
}

device_pool_config resolved(device_pool_config c) {
  const size_t a = c.alignment;
  if (a < 256 || (a & (a - 1)) != 0 || a > growth_granule) {
    throw error(status::invalid_argument,
                "device pool: alignment must be a power of two from 256 B to 2 MiB");
  }
  c.slab_bytes = std::max(growth_granule, (c.slab_bytes + growth_granule - 1) & ~(growth_granule - 1));
  if (c.device < 0) {
    int dev = 0;
    if (prim::current_device(&dev) != cudaSuccess) {
      prim::clear_runtime_error();
      dev = 0;
    }
    c.device = dev;
  }
  return c;
}

// Switches the calling thread to the pool's device for one cudaMalloc, and back.
class device_scope {
 public:
  explicit device_scope(int device) noexcept {
    if (prim::current_device(&previous_) == cudaSuccess && previous_ != device) {
      switched_ = prim::set_device(device) == cudaSuccess;
    }
    prim::clear_runtime_error();
  }
  ~device_scope() {
    if (switched_) prim::set_device(previous_);
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace

device_pool::device_pool(const device_pool_config& config)
    : config_(resolved(config)), map_(config_.alignment, 1024) {
  map_.set_limit(config_.budget_bytes);
}

device_pool::~device_pool() {
  std::lock_guard<std::mutex> lock(mutex_);
  guard_.drain([](void*) {});
  try {
    map_.clear([](void* base, size_t, block_map::tag_t) { prim::device_free(base); });
  } catch (...) {
  }
}

status device_pool::allocate(size_t bytes, cudaStream_t stream, void** out) noexcept {
  if (!out) return fail(status::invalid_argument, "device pool: out pointer is NULL");
  *out = nullptr;
  if (bytes == 0) return fail(status::invalid_argument, "device pool: zero-byte request");
  const size_t r = map_.round_up(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (r == 0) {
    map_.count_failure();
    return fail(status::invalid_argument, "device pool: request of %zu bytes is too large", bytes);
  }
  bool capturing = false;
  prim::stream_capturing(stream, &capturing);
  if (!capturing) reap();
  const block_map::tag_t tag = tag_of(stream);
  if (void* p = map_.allocate(r, tag, bytes)) {
    *out = p;
    return status::ok;
  }
  if (capturing) {
    map_.count_failure();
    return out_of_memory(bytes, "the stream is capturing a graph, and the pool cannot grow "
                                "during capture (allocate before capturing)");
  }
  status s = grow(r, stream);
  if (s == status::ok) {
    *out = map_.allocate(r, tag, bytes);
    if (*out) return status::ok;
    s = fail(status::internal, "device pool: a new slab did not fit its request");
  }
  map_.count_failure();
  return s;
}

// Note [Growth of the device pool]
// A new slab is max(request, slab_bytes) rounded up to 2 MiB: small requests share a
// slab, large ones get one of their own size (no power-of-two rounding). When that would
// pass the budget, the slab shrinks to what the budget leaves; when even the request
// would, every entirely free slab (of any stream) is given back first, which synchronizes
// the device but turns cached memory of idle streams into room for this one. Only then is
// it an OOM.
status device_pool::grow(size_t r, cudaStream_t stream) noexcept {
  const size_t exact = (r + growth_granule - 1) & ~(growth_granule - 1);
  const size_t budget = config_.budget_bytes ? config_.budget_bytes : SIZE_MAX;
  auto available = [&] { return budget - std::min<size_t>(budget, map_.stats().reserved_bytes); };
  size_t avail = available();
  if (r > avail) {
    release_cached_locked();
    avail = available();
    if (r > avail) return out_of_memory(r, "the budget would be exceeded");
  }
  // Up to the budget's remaining room, but never less than the request.
  size_t slab = std::max(exact, config_.slab_bytes);
  if (slab > avail) slab = std::max(r, avail & ~(config_.alignment - 1));
  void* base = nullptr;
  {
    device_scope scope(config_.device);
    cudaError_t err = prim::device_alloc(&base, slab);
    if (err == cudaErrorMemoryAllocation && release_cached_locked() > 0) {
      prim::clear_runtime_error();
      err = prim::device_alloc(&base, slab);
    }
    if (err != cudaSuccess) {
      prim::record_cuda_error(err, "cudaMalloc(device pool slab)", __FILE__, __LINE__);
      const pool_stats st = map_.stats();
      append_error("; pool: requested %zu, in use %" PRIu64 ", reserved %" PRIu64
                   ", peak %" PRIu64 ", largest free block %" PRIu64,
                   r, st.current_bytes, st.reserved_bytes, st.peak_bytes, st.largest_free_bytes);
      return err == cudaErrorMemoryAllocation ? status::out_of_memory : status::cuda_error;
    }
  }
  try {
    map_.add_slab(base, slab, tag_of(stream), /*keep=*/false);
  } catch (const std::exception& e) {
    prim::device_free(base);
    return fail(status::internal, "device pool: cannot index a new slab: %s", e.what());
  }
  return status::ok;
}

status device_pool::deallocate(void* p, const cudaStream_t* streams, size_t n) noexcept {
  if (!p) return status::ok;
  if (n > 0 && !streams) {
    return fail(status::invalid_argument, "device pool: %zu streams given but the array is NULL", n);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const status freeable = check_freeable(map_, p, "device pool");
  if (freeable != status::ok) return freeable;
  // The allocation stream itself needs no event: its later work is ordered after the
  // block's earlier uses.
  const cudaStream_t own = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(map_.block_tag(p)));
  cudaStream_t others[16];
  size_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    if (streams[i] == own) continue;
    if (m == 16) {
      return fail(status::invalid_argument, "device pool: more than 16 distinct streams used a block");
    }
    others[m++] = streams[i];
  }
  return free_or_guard(map_, guard_, p, others, m, "device pool");
}

void device_pool::reap() noexcept { reap_into(map_, guard_); }

size_t device_pool::release_cached() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  reap();
  return release_cached_locked();
}

size_t device_pool::release_cached_locked() noexcept {
  try {
    return map_.remove_free_slabs(
        [](void* base, size_t, block_map::tag_t) { prim::device_free(base); });
  } catch (...) {
    return 0;
  }
}

pool_stats device_pool::stats() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  reap();
  return map_.stats();
}

uint64_t device_pool::held_bytes() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return map_.held_bytes();
}

uint64_t device_pool::held_peak_since_last() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return map_.take_held_peak();
}

void device_pool::reset_peak() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  map_.reset_peak();
}

bool device_pool::owns(const void* p) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return map_.owns(p);
}

bool device_pool::stream_of(const void* p, cudaStream_t* out) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (map_.find(p) != block_map::lookup::in_use) return false;
  *out = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(map_.block_tag(p)));
  return true;
}

status device_pool::out_of_memory(size_t requested, const char* why) noexcept {
  const pool_stats st = map_.stats();
  return fail(status::out_of_memory,
              "device pool: out of memory: %s. requested %zu, in use %" PRIu64 " in %" PRIu64
              " blocks, reserved %" PRIu64 " (budget %" PRIu64 "), peak %" PRIu64
              ", largest free block %" PRIu64 ", pending %" PRIu64,
              why, requested, st.current_bytes, st.current_count, st.reserved_bytes,
              st.limit_bytes, st.peak_bytes, st.largest_free_bytes, st.pending_bytes);
}

}  // namespace stash
