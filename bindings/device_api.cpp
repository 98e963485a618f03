// The device pool behind the C API (stash.h).
#include <type_traits>

#include "api_boundary.h"
#include "handles.h"
#include "device_pool.h"
#include "struct_version.h"

using namespace stash;
using stash::api::api_call;


namespace {

status no_pool(const char* function) {
  return fail(status::invalid_argument, "%s: pool is NULL", function);
}

}  // namespace

extern "C" {

STASH_API void stash_device_pool_config_init(stash_device_pool_config_t* config) {
  if (!config) return;
  const device_pool_config d;
  *config = stash_device_pool_config_t{};
  config->struct_size = sizeof *config;
  config->version = STASH_DEVICE_POOL_CONFIG_VERSION;
  config->device = d.device;
  config->budget_bytes = d.budget_bytes;
  config->slab_bytes = d.slab_bytes;
  config->alignment = d.alignment;
}

STASH_API stash_status_t stash_device_pool_create(const stash_device_pool_config_t* config,
                                                  stash_device_pool_t** out) {
  static const char* fn = "stash_device_pool_create";
  return api_call(fn, [&] {
    if (!out) return fail(status::invalid_argument, "%s: out is NULL", fn);
    *out = nullptr;
    stash_device_pool_config_t given;
    if (const status s = api::read_config(fn, "config", config, &given); s != status::ok)
      return s;
    device_pool_config c;
    c.device = given.device;
    c.budget_bytes = given.budget_bytes;
    c.slab_bytes = given.slab_bytes;
    c.alignment = given.alignment;
    *out = new stash_device_pool_t(c);
    return status::ok;
  });
}

// A destructor cannot throw (the pool's is noexcept), so delete needs no api_call.
static_assert(std::is_nothrow_destructible_v<stash_device_pool_t>);
STASH_API void stash_device_pool_destroy(stash_device_pool_t* pool) { delete pool; }

STASH_API stash_status_t stash_device_alloc(stash_device_pool_t* pool, size_t bytes,
                                            stash_stream_t stream, void** out) {
  static const char* fn = "stash_device_alloc";
  return api_call(fn, [&] {
    if (!pool) {
      if (out) *out = nullptr;
      return no_pool(fn);
    }
    return pool->pool.allocate(bytes, reinterpret_cast<cudaStream_t>(stream), out);
  });
}

STASH_API stash_status_t stash_device_free(stash_device_pool_t* pool, void* ptr,
                                           const stash_stream_t* streams, size_t n_streams) {
  static const char* fn = "stash_device_free";
  return api_call(fn, [&] {
    if (!pool) return no_pool(fn);
    return pool->pool.deallocate(ptr, reinterpret_cast<const cudaStream_t*>(streams), n_streams);
  });
}

STASH_API stash_status_t stash_device_release_cached(stash_device_pool_t* pool,
                                                     size_t* released_bytes) {
  static const char* fn = "stash_device_release_cached";
  return api_call(fn, [&] {
    if (!pool) return no_pool(fn);
    const size_t n = pool->pool.release_cached();
    if (released_bytes) *released_bytes = n;
    return status::ok;
  });
}

STASH_API stash_status_t stash_device_stats(stash_device_pool_t* pool, stash_pool_stats_t* stats) {
  static const char* fn = "stash_device_stats";
  return api_call(fn, [&] {
    if (!pool) return no_pool(fn);
    return api::copy_stats(pool->pool.stats(), stats, fn);
  });
}

STASH_API stash_status_t stash_device_reset_peak(stash_device_pool_t* pool) {
  static const char* fn = "stash_device_reset_peak";
  return api_call(fn, [&] {
    if (!pool) return no_pool(fn);
    pool->pool.reset_peak();
    return status::ok;
  });
}

}  // extern "C"
