#include "pinned_pool.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "cuda_prim.h"
#include "host_memory.h"

namespace stash {

namespace {

constexpr size_t mib = size_t{1} << 20;

size_t align_down(size_t v, size_t a) { return v & ~(a - 1); }
size_t align_up(size_t v, size_t a) { return (v + a - 1) & ~(a - 1); }

[[noreturn]] void bad_config(const char* what) {
  throw error(status::invalid_argument, what);
}

// Validates the config and fills in the defaults (device, cap).
pinned_pool_config resolved(pinned_pool_config c) {
  const size_t a = c.alignment;
  if (a < 256 || a > 2 * mib || (a & (a - 1)) != 0) {
    bad_config("pinned pool: alignment must be a power of two from 256 B to 2 MiB");
  }
  if (c.slab_bytes < a) bad_config("pinned pool: slab_bytes must be at least the alignment");
  c.slab_bytes = align_down(c.slab_bytes, a);
  c.growth_bytes = std::min(align_up(std::max(c.growth_bytes, a), a), c.slab_bytes);
  if (c.device < 0) {
    int dev = 0;
    if (prim::current_device(&dev) != cudaSuccess) {
      prim::clear_runtime_error();
      dev = 0;
    }
    c.device = dev;
  }
  if (c.cap_bytes == 0) {
    const host_memory hm = probe_host_memory("");
    if (hm.default_cap == 0) {
      bad_config("pinned pool: cannot tell how much host memory is available "
                 "(/proc/meminfo unreadable, no cgroup limit); set cap_bytes");
    }
    c.cap_bytes = hm.default_cap;
  }
  c.cap_bytes = align_down(c.cap_bytes, a);
  if (c.cap_bytes == 0) bad_config("pinned pool: cap_bytes is smaller than the alignment");
  if (c.reserve_bytes > c.cap_bytes) {
    char msg[256];
    std::snprintf(msg, sizeof msg, "pinned pool: reserve_bytes (%zu) exceeds the cap (%zu)",
                  c.reserve_bytes, c.cap_bytes);
    throw error(status::invalid_argument, msg);
  }
  if (c.on_exhausted != exhaustion_policy::fail && c.on_exhausted != exhaustion_policy::wait) {
    bad_config("pinned pool: unknown exhaustion policy");
  }
  return c;
}

}  // namespace

pinned_pool::pinned_pool(const pinned_pool_config& config)
    : config_(resolved(config)),
      device_(config_.device),
      source_(config_.device, config_.numa_placement),
      map_(config_.alignment, 1024) {
  map_.set_limit(config_.cap_bytes);
  if (config_.reserve_bytes == 0) return;
  if (config_.reserve_in_background) {
    reserving_ = true;
    reserver_ = std::thread([this, bytes = config_.reserve_bytes] { background_reserve(bytes); });
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  const status s = reserve_locked(config_.reserve_bytes);
  if (s != status::ok) {
    const error e(s, last_error());
    lock.unlock();
    release_all();
    throw e;
  }
}

pinned_pool::~pinned_pool() {
  stop_ = true;
  if (reserver_.joinable()) reserver_.join();
  release_all();
}

// Waits for copies still using pending blocks (a pool destroyed under in-flight DMA must
// not unpin memory the copy engine still reads), then unpins every slab.
void pinned_pool::release_all() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  guard_.drain([](void*) {});
  try {
    map_.clear([](void*, size_t, block_map::tag_t) {});
  } catch (...) {
  }
  for (const slab_record& r : slabs_) source_.release(r.slab);
  slabs_.clear();
}

status pinned_pool::allocate(size_t bytes, void** out) noexcept {
  if (!out) return fail(status::invalid_argument, "pinned pool: out pointer is NULL");
  *out = nullptr;
  if (bytes == 0) return fail(status::invalid_argument, "pinned pool: zero-byte request");
  const size_t r = map_.round_up(bytes);
  if (r == 0 || r > config_.slab_bytes) {
    std::unique_lock<std::mutex> lock(mutex_);
    map_.count_failure();
    return fail(status::invalid_argument,
                "pinned pool: request of %zu bytes exceeds slab_bytes (%zu), the largest "
                "single pin and so the largest block",
                bytes, config_.slab_bytes);
  }
  std::unique_lock<std::mutex> lock(mutex_);
  const status s = try_allocate(r, bytes, out, lock);
  if (s != status::ok) map_.count_failure();
  return s;
}

status pinned_pool::try_allocate(size_t r, size_t requested, void** out,
                                 std::unique_lock<std::mutex>& lock) noexcept {
  using clock = std::chrono::steady_clock;
  clock::time_point deadline{};
  bool waiting = false;
  auto backoff = std::chrono::microseconds(20);
  for (;;) {
    reap();
    if (void* p = map_.allocate(r, 0, requested)) {
      *out = p;
      return status::ok;
    }
    if (reserving_) {
      // The reservation covers this request or will run out; never pin on the hot path
      // while it is under way.
      slab_added_.wait(lock);
      continue;
    }
    if (frozen_) return exhausted(requested, status::out_of_memory);
    bool cap_reached = false;
    const status g = grow(r, &cap_reached);
    if (g == status::ok) continue;
    if (!cap_reached) return g;  // pinning failed: its message is already written
    if (config_.on_exhausted != exhaustion_policy::wait || guard_.pending() == 0) {
      return exhausted(requested, status::out_of_memory);
    }
    // Note: waiting polls (cudaEventQuery) with a short backoff instead of blocking in
    // cudaEventSynchronize, so that the deadline holds and other threads keep the lock.
    if (!waiting) {
      waiting = true;
      deadline = clock::now() + std::chrono::milliseconds(config_.wait_timeout_ms);
    }
    if (clock::now() >= deadline) return exhausted(requested, status::timeout);
    lock.unlock();
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::microseconds(1000));
    lock.lock();
  }
}

// Note [Growth of the pinned pool]
// Growth adds one slab of max(request, growth_bytes), at most slab_bytes, and never past
// the cap (the last slab is trimmed to what the cap leaves, if the request still fits).
// Before it pins, it unpins every grown slab that is entirely free: each is smaller than
// the request (or best fit would have used it), so it cannot serve it, and keeping it
// would only raise the reserved bytes above what is live. That keeps peak reserved close
// to peak live bytes on churn, where a size-class pool strands whole classes. Slabs of
// the up-front reservation are never given back.
status pinned_pool::grow(size_t r, bool* cap_reached) noexcept {
  release_cached_locked(r);
  const size_t cap = config_.cap_bytes;
  const size_t reserved = map_.stats().reserved_bytes;
  if (reserved >= cap || cap - reserved < r) {
    *cap_reached = true;
    return status::out_of_memory;
  }
  const size_t slab = std::min({std::max(r, config_.growth_bytes), config_.slab_bytes,
                                align_down(cap - reserved, config_.alignment)});
  pinned_slab got;
  const status s = source_.acquire(slab, &got);
  if (s != status::ok) return s;
  return insert_slab(got, /*keep=*/false);
}

status pinned_pool::insert_slab(const pinned_slab& slab, bool keep) noexcept {
  // cudaHostAlloc and mmap return page-aligned memory; a larger configured alignment
  // costs at most one alignment unit at the slab's start.
  const uintptr_t raw = reinterpret_cast<uintptr_t>(slab.base);
  const uintptr_t base = (raw + config_.alignment - 1) & ~(uintptr_t{config_.alignment} - 1);
  const size_t lost = base - raw;
  const size_t usable = slab.bytes > lost ? align_down(slab.bytes - lost, config_.alignment) : 0;
  try {
    if (usable == 0) throw std::invalid_argument("slab too small");
    slabs_.reserve(slabs_.size() + 1);
    map_.add_slab(reinterpret_cast<void*>(base), usable, 0, keep);
    slabs_.push_back(slab_record{reinterpret_cast<void*>(base), slab});
  } catch (const std::exception& e) {
    source_.release(slab);
    return fail(status::internal, "pinned pool: cannot index a new slab: %s", e.what());
  }
  slab_added_.notify_all();
  return status::ok;
}

status pinned_pool::reserve(size_t bytes) noexcept {
  std::unique_lock<std::mutex> lock(mutex_);
  return reserve_locked(bytes);
}

status pinned_pool::reserve_locked(size_t bytes) noexcept {
  bytes = align_up(bytes, config_.alignment);
  const size_t reserved = map_.stats().reserved_bytes;
  if (bytes > config_.cap_bytes - std::min(reserved, config_.cap_bytes)) {
    return fail(status::out_of_memory,
                "pinned pool: reserving %zu more bytes would exceed the cap (%zu; %zu reserved)",
                bytes, config_.cap_bytes, reserved);
  }
  for (size_t done = 0; done < bytes;) {
    const size_t chunk = std::min(config_.slab_bytes, bytes - done);
    pinned_slab got;
    status s = source_.acquire(chunk, &got);
    if (s == status::ok) s = insert_slab(got, /*keep=*/true);
    if (s != status::ok) return s;
    done += chunk;
  }
  return status::ok;
}

void pinned_pool::background_reserve(size_t bytes) noexcept {
  // The runtime's current device is per thread.
  prim::set_device(device_);
  prim::clear_runtime_error();
  const auto start = std::chrono::steady_clock::now();
  const double gib = 1024.0 * 1024.0 * 1024.0;
  int reported = 0;
  size_t done = 0;
  status s = status::ok;
  while (done < bytes && !stop_) {
    const size_t chunk = std::min(config_.slab_bytes, align_up(bytes - done, config_.alignment));
    pinned_slab got;
    s = source_.acquire(chunk, &got);  // outside the lock: this is the slow part
    std::lock_guard<std::mutex> lock(mutex_);
    if (s == status::ok) s = insert_slab(got, /*keep=*/true);
    if (s != status::ok) {
      reservation_status_ = s;
      std::snprintf(reservation_error_, sizeof reservation_error_, "%s", last_error());
      break;
    }
    done += chunk;
    const int pct = static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(bytes));
    if (config_.report_progress && (pct / 10 > reported / 10 || done >= bytes)) {
      reported = pct;
      std::fprintf(stderr, "stash: pinned pool: reserved %.2f of %.2f GiB (%d%%)\n",
                   static_cast<double>(done) / gib, static_cast<double>(bytes) / gib, pct);
    }
  }
  if (config_.report_progress) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s == status::ok) {
      std::fprintf(stderr, "stash: pinned pool: reservation done in %.2f s\n", secs);
    } else {
      std::fprintf(stderr, "stash: pinned pool: reservation stopped: %s\n", reservation_error_);
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  reserving_ = false;
  slab_added_.notify_all();
}

status pinned_pool::wait_for_reservation() noexcept {
  std::unique_lock<std::mutex> lock(mutex_);
  slab_added_.wait(lock, [this] { return !reserving_; });
  if (reservation_status_ != status::ok) {
    return fail(reservation_status_, "%s", reservation_error_);
  }
  return status::ok;
}

status pinned_pool::deallocate(void* p, const cudaStream_t* streams, size_t n) noexcept {
  if (!p) return status::ok;
  if (n > 0 && !streams) {
    return fail(status::invalid_argument, "pinned pool: %zu streams given but the array is NULL", n);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  reap();
  const status freeable = check_freeable(map_, p, "pinned pool");
  if (freeable != status::ok) return freeable;
  return free_or_guard(map_, guard_, p, streams, n, "pinned pool");
}

void pinned_pool::reap() noexcept { reap_into(map_, guard_); }

void pinned_pool::set_frozen(bool frozen) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  frozen_ = frozen;
}

size_t pinned_pool::release_cached() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  reap();
  return release_cached_locked(SIZE_MAX);
}

size_t pinned_pool::release_cached_locked(size_t below_bytes) noexcept {
  try {
    return map_.remove_free_slabs(
        [this](void* base, size_t, block_map::tag_t) {
          for (size_t i = 0; i < slabs_.size(); ++i) {
            if (slabs_[i].usable_base == base) {
              source_.release(slabs_[i].slab);
              slabs_.erase(slabs_.begin() + static_cast<ptrdiff_t>(i));
              return;
            }
          }
        },
        below_bytes);
  } catch (...) {
    return 0;
  }
}

pool_stats pinned_pool::stats() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  reap();
  return map_.stats();
}

void pinned_pool::reset_peak() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  map_.reset_peak();
}

bool pinned_pool::owns(const void* p) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return map_.owns(p);
}

status pinned_pool::exhausted(size_t requested, status s) noexcept {
  const pool_stats st = map_.stats();
  return fail(s,
              "pinned pool: %s allocating %zu bytes: cap %" PRIu64 ", reserved %" PRIu64
              " in %" PRIu64 " slabs, in use %" PRIu64 " in %" PRIu64 " blocks (peak %" PRIu64
              "), pending %" PRIu64 " in %" PRIu64 " blocks, largest free block %" PRIu64,
              s == status::timeout ? "timed out waiting for pending blocks" : "out of memory",
              requested, st.limit_bytes, st.reserved_bytes, st.slab_count, st.current_bytes,
              st.current_count, st.peak_bytes, st.pending_bytes, st.pending_count,
              st.largest_free_bytes);
}

}  // namespace stash
