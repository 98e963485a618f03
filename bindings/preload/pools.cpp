#include "pools.h"

#include <mutex>
#include <new>

#include "options.h"

namespace stash::preload {

namespace {

// Static storage: the pool objects themselves cost no heap allocation, and are never
// destroyed (Note [Lazy pools in the preload library]).
alignas(device_pool) unsigned char g_device_storage[kMaxDevices][sizeof(device_pool)];
std::atomic<device_pool*> g_device[kMaxDevices];
std::atomic<bool> g_device_failed[kMaxDevices];

alignas(pinned_pool) unsigned char g_pinned_storage[sizeof(pinned_pool)];
std::atomic<pinned_pool*> g_pinned{nullptr};
std::atomic<bool> g_pinned_failed{false};

std::mutex g_build_mutex;  // constexpr-constructed: usable before any constructor ran
counters g_counters;

}  // namespace

counters& tally() noexcept { return g_counters; }

device_pool* device_pool_for(int device) noexcept {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  if (device_pool* p = g_device[device].load(std::memory_order_acquire)) return p;
  if (g_device_failed[device].load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> lock(g_build_mutex);
  if (device_pool* p = g_device[device].load(std::memory_order_acquire)) return p;
  try {
    device_pool_config cfg;
    cfg.device = device;
    cfg.budget_bytes = opts().device_budget;
    auto* p = new (g_device_storage[device]) device_pool(cfg);
    g_device[device].store(p, std::memory_order_release);
    return p;
  } catch (...) {
    g_device_failed[device].store(true, std::memory_order_relaxed);
    return nullptr;
  }
}

device_pool* device_pool_if_built(int device) noexcept {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return g_device[device].load(std::memory_order_acquire);
}

device_pool* device_pool_owning(const void* p, int* device) noexcept {
  for (int d = 0; d < kMaxDevices; ++d) {
    device_pool* pool = g_device[d].load(std::memory_order_acquire);
    if (pool && pool->owns(p)) {
      *device = d;
      return pool;
    }
  }
  return nullptr;
}

pinned_pool* pinned_pool_get() noexcept {
  if (pinned_pool* p = g_pinned.load(std::memory_order_acquire)) return p;
  if (g_pinned_failed.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> lock(g_build_mutex);
  if (pinned_pool* p = g_pinned.load(std::memory_order_acquire)) return p;
  try {
    pinned_pool_config cfg;
    cfg.cap_bytes = opts().pinned_cap;
    cfg.report_progress = false;  // a preloaded library must not write to the program's stderr
    auto* p = new (g_pinned_storage) pinned_pool(cfg);
    g_pinned.store(p, std::memory_order_release);
    return p;
  } catch (...) {
    g_pinned_failed.store(true, std::memory_order_relaxed);
    return nullptr;
  }
}

pinned_pool* pinned_pool_if_built() noexcept { return g_pinned.load(std::memory_order_acquire); }

}  // namespace stash::preload
