// The pinned pool behind the C API (stash.h).
#include <type_traits>

#include "api_boundary.h"
#include "handles.h"
#include "host_memory.h"
#include "pinned_pool.h"
#include "struct_version.h"

using namespace stash;
using stash::api::api_call;

// The C policy crosses as its number (to_config, stash_pinned_pool_config_init).
static_assert(static_cast<int>(exhaustion_policy::fail) == STASH_EXHAUSTED_FAIL);
static_assert(static_cast<int>(exhaustion_policy::wait) == STASH_EXHAUSTED_WAIT);

namespace {

pinned_pool_config to_config(const stash_pinned_pool_config_t& c) {
  pinned_pool_config out;
  out.device = c.device;
  out.cap_bytes = c.cap_bytes;
  out.slab_bytes = c.slab_bytes;
  out.growth_bytes = c.growth_bytes;
  out.alignment = c.alignment;
  out.reserve_bytes = c.reserve_bytes;
  out.reserve_in_background = c.reserve_in_background != 0;
  out.report_progress = c.report_progress != 0;
  out.numa_placement = c.numa_placement != 0;
  out.on_exhausted = static_cast<exhaustion_policy>(c.on_exhausted);
  out.wait_timeout_ms = c.wait_timeout_ms;
  return out;
}

status no_pool(const char* function) {
  return fail(status::invalid_argument, "%s: pool is NULL", function);
}

}  // namespace

extern "C" {

STASH_API void stash_pinned_pool_config_init(stash_pinned_pool_config_t* config) {
  if (!config) return;
  const pinned_pool_config d;
  *config = stash_pinned_pool_config_t{};
  config->struct_size = sizeof *config;
  config->version = STASH_PINNED_POOL_CONFIG_VERSION;
  config->device = d.device;
  config->cap_bytes = d.cap_bytes;
  config->slab_bytes = d.slab_bytes;
  config->growth_bytes = d.growth_bytes;
  config->alignment = d.alignment;
  config->reserve_bytes = d.reserve_bytes;
  config->reserve_in_background = d.reserve_in_background;
  config->report_progress = d.report_progress;
  config->numa_placement = d.numa_placement;
  config->on_exhausted = static_cast<stash_exhaustion_t>(d.on_exhausted);
  config->wait_timeout_ms = d.wait_timeout_ms;
}

STASH_API stash_status_t stash_pinned_pool_create(const stash_pinned_pool_config_t* config,
                                                  stash_pinned_pool_t** out) {
  static const char* fn = "stash_pinned_pool_create";
  return api_call(fn, [&] {
    if (!out) return fail(status::invalid_argument, "%s: out is NULL", fn);
    *out = nullptr;
    stash_pinned_pool_config_t c;
    if (const status s = api::read_config(fn, "config", config, &c); s != status::ok) return s;
    *out = new stash_pinned_pool_t(to_config(c));
    return status::ok;
  });
}

// A destructor cannot throw (the pool's is noexcept), so delete needs no api_call.
static_assert(std::is_nothrow_destructible_v<stash_pinned_pool_t>);
STASH_API void stash_pinned_pool_destroy(stash_pinned_pool_t* pool) { delete pool; }

STASH_API stash_status_t stash_pinned_alloc(stash_pinned_pool_t* pool, size_t bytes, void** out) {
  static const char* fn = "stash_pinned_alloc";
  return api_call(fn, [&] {
    if (!pool) {
      if (out) *out = nullptr;
      return no_pool(fn);
    }
    return pool->pool.allocate(bytes, out);
  });
}

STASH_API stash_status_t stash_pinned_free(stash_pinned_pool_t* pool, void* ptr,
                                           const stash_stream_t* streams, size_t n_streams) {
  static const char* fn = "stash_pinned_free";
  return api_call(fn, [&] {
    if (!pool) return no_pool(fn);
    return pool->pool.deallocate(ptr, reinterpret_cast<const cudaStream_t*>(streams), n_streams);
  });
}

STASH_API stash_status_t stash_pinned_reserve(stash_pinned_pool_t* pool, size_t bytes) {
  static const char* fn = "stash_pinned_reserve";
  return api_call(fn, [&] { return pool ? pool->pool.reserve(bytes) : no_pool(fn); });
}

STASH_API stash_status_t stash_pinned_wait_reserved(stash_pinned_pool_t* pool) {
  static const char* fn = "stash_pinned_wait_reserved";
  return api_call(fn, [&] { return pool ? pool->pool.wait_for_reservation() : no_pool(fn); });
}

STASH_API stash_status_t stash_pinned_release_cached(stash_pinned_pool_t* pool,
                                                     size_t* released_bytes) {
  static const char* fn = "stash_pinned_release_cached";
  return api_call(fn, [&] {
    if (!pool) return no_pool(fn);
    const size_t n = pool->pool.release_cached();
    if (released_bytes) *released_bytes = n;
    return status::ok;
  });
}

STASH_API stash_status_t stash_pinned_stats(stash_pinned_pool_t* pool, stash_pool_stats_t* stats) {
  static const char* fn = "stash_pinned_stats";
  return api_call(fn, [&] {
    if (!pool) return no_pool(fn);
    return api::copy_stats(pool->pool.stats(), stats, fn);
  });
}

STASH_API stash_status_t stash_pinned_reset_peak(stash_pinned_pool_t* pool) {
  static const char* fn = "stash_pinned_reset_peak";
  return api_call(fn, [&] {
    if (!pool) return no_pool(fn);
    pool->pool.reset_peak();
    return status::ok;
  });
}

STASH_API stash_status_t stash_pinned_default_cap(size_t* bytes) {
  static const char* fn = "stash_pinned_default_cap";
  return api_call(fn, [&]() -> status {
    if (!bytes) return fail(status::invalid_argument, "%s: bytes is NULL", fn);
    *bytes = static_cast<size_t>(probe_host_memory().default_cap);
    return status::ok;
  });
}

}  // extern "C"
