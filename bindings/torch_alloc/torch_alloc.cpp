// torch_alloc.cpp: libstash_torch.so (stash_torch.h).
#include <atomic>
#include <cstdlib>
#include <cuda_runtime_api.h>
#include <mutex>
#include <new>

#include "byte_count.h"
#include "c_stats.h"
#include "device_pool.h"
#include "stash_torch.h"
#include "core/error.h"

namespace {

using stash::device_pool;
using stash::status;

constexpr int kMaxDevices = 64;

std::atomic<device_pool*> g_pools[kMaxDevices];
std::mutex g_build_mutex;
// The budget each device's pool gets when built. Starts as STASH_DEVICE_BUDGET.
uint64_t g_budget[kMaxDevices];  // guarded by g_build_mutex
std::once_flag g_env_once;

void read_env_budget() {
  uint64_t bytes = 0;
  const char* text = std::getenv("STASH_DEVICE_BUDGET");
  if (text && *text && !stash::preload::parse_byte_count(text, &bytes)) bytes = 0;
  for (uint64_t& b : g_budget) b = bytes;
}

bool valid_device(int device) {
  if (device < 0 || device >= kMaxDevices) {
    stash::fail(status::invalid_argument, "stash_torch: device %d out of range 0..%d", device,
                kMaxDevices - 1);
    return false;
  }
  return true;
}

// The pool of `device`, built on first use. Null (with the error recorded) on failure.
device_pool* pool_for(int device) noexcept {
  if (!valid_device(device)) return nullptr;
  if (device_pool* p = g_pools[device].load(std::memory_order_acquire)) return p;
  try {
    std::call_once(g_env_once, read_env_budget);
    std::lock_guard<std::mutex> lock(g_build_mutex);
    if (device_pool* p = g_pools[device].load(std::memory_order_acquire)) return p;
    stash::device_pool_config cfg;
    cfg.device = device;
    cfg.budget_bytes = g_budget[device];
    auto* p = new device_pool(cfg);
    g_pools[device].store(p, std::memory_order_release);
    return p;
  } catch (const stash::error&) {
    return nullptr;  // the message is in last_error() already
  } catch (const std::exception& e) {
    stash::fail(status::internal, "stash_torch: cannot build the device pool: %s", e.what());
    return nullptr;
  }
}

// Runs f with `device` current, restoring the caller's device.
template <class F>
auto on_device(int device, F f) noexcept -> decltype(f()) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) cudaGetLastError();
  if (current != device && cudaSetDevice(device) != cudaSuccess) cudaGetLastError();
  auto r = f();
  if (current >= 0 && current != device) cudaSetDevice(current);
  return r;
}

stash_status_t to_c(status s) { return static_cast<stash_status_t>(s); }

}  // namespace

extern "C" {

STASH_API void* stash_torch_malloc(size_t size, int device, stash_stream_t stream) {
  if (size == 0) return nullptr;
  device_pool* pool = pool_for(device);
  if (!pool) return nullptr;
  void* out = nullptr;
  const status s = on_device(device, [&] {
    return pool->allocate(size, reinterpret_cast<cudaStream_t>(stream), &out);
  });
  return s == status::ok ? out : nullptr;
}

STASH_API void stash_torch_free(void* ptr, size_t, int device, stash_stream_t) {
  if (!ptr || !valid_device(device)) return;
  device_pool* pool = g_pools[device].load(std::memory_order_acquire);
  if (!pool) {
    stash::fail(status::unknown_pointer, "stash_torch: %p freed on device %d, which has no pool",
                ptr, device);
    return;
  }
  // Back to the allocation stream's free list: PyTorch orders later uses on that stream.
  pool->deallocate(ptr, nullptr, 0);
}

STASH_API stash_status_t stash_torch_set_budget(int device, size_t bytes) {
  if (device != -1 && !valid_device(device)) return STASH_ERROR_INVALID_ARGUMENT;
  try {
    std::call_once(g_env_once, read_env_budget);
    std::lock_guard<std::mutex> lock(g_build_mutex);
    const int first = device == -1 ? 0 : device, last = device == -1 ? kMaxDevices - 1 : device;
    for (int d = first; d <= last; ++d) {
      device_pool* pool = g_pools[d].load(std::memory_order_acquire);
      if (pool) {
        const stash::pool_stats st = pool->stats();
        if (st.current_count != 0 || st.pending_count != 0) {
          return to_c(stash::fail(status::invalid_argument,
                                  "stash_torch: device %d has %llu live blocks; its budget "
                                  "can change only while none is allocated",
                                  d, static_cast<unsigned long long>(st.current_count)));
        }
      }
    }
    for (int d = first; d <= last; ++d) {
      g_budget[d] = bytes;
      device_pool* pool = g_pools[d].exchange(nullptr, std::memory_order_acq_rel);
      if (pool) on_device(d, [&] { delete pool; return 0; });  // rebuilt on next use
    }
    return STASH_OK;
  } catch (const std::exception& e) {
    return to_c(stash::fail(status::internal, "stash_torch_set_budget: %s", e.what()));
  }
}

STASH_API stash_status_t stash_torch_stats(int device, stash_pool_stats_t* stats) {
  if (!valid_device(device)) return STASH_ERROR_INVALID_ARGUMENT;
  stash::pool_stats st;
  if (device_pool* pool = g_pools[device].load(std::memory_order_acquire)) {
    st = pool->stats();
  } else {
    std::call_once(g_env_once, read_env_budget);
    std::lock_guard<std::mutex> lock(g_build_mutex);
    st.limit_bytes = g_budget[device];
  }
  if (!stash::bindings::fill_c_stats(st, stats)) {
    return to_c(stash::fail(status::invalid_argument,
                            "stash_torch_stats: stats is NULL or its struct_size is not set"));
  }
  return STASH_OK;
}

STASH_API stash_status_t stash_torch_reset_peak(int device) {
  if (!valid_device(device)) return STASH_ERROR_INVALID_ARGUMENT;
  if (device_pool* pool = g_pools[device].load(std::memory_order_acquire)) pool->reset_peak();
  return STASH_OK;
}

STASH_API stash_status_t stash_torch_release_cached(int device, size_t* released_bytes) {
  if (!valid_device(device)) return STASH_ERROR_INVALID_ARGUMENT;
  size_t n = 0;
  if (device_pool* pool = g_pools[device].load(std::memory_order_acquire)) {
    n = on_device(device, [&] { return pool->release_cached(); });
  }
  if (released_bytes) *released_bytes = n;
  return STASH_OK;
}

STASH_API const char* stash_torch_last_error(void) { return stash::last_error(); }

}  // extern "C"
