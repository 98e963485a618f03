// handles.h: what the C API's opaque pool handles are, for every translation unit of
// libstash that takes one (the pool APIs and the engine, which draws on a device pool).
// One definition here keeps the ODR honest.
#pragma once

#include "device_pool.h"
#include "pinned_pool.h"
#include "stash.h"

struct stash_device_pool_t {
  explicit stash_device_pool_t(const stash::device_pool_config& c) : pool(c) {}
  stash::device_pool pool;
};

struct stash_pinned_pool_t {
  explicit stash_pinned_pool_t(const stash::pinned_pool_config& c) : pool(c) {}
  stash::pinned_pool pool;
};
