/* stash_preload.h: what a program running under LD_PRELOAD=libstash_preload.so may ask
 * the preload library. C99.
 *
 * These functions live in libstash_preload.so, which a program does not link: look them
 * up at run time, dlsym(RTLD_DEFAULT, "stash_preload_counters"); a null result means the
 * library is not loaded. Every function is thread-safe and allocates nothing.
 * Since 0.1.0.
 */
#ifndef STASH_PRELOAD_H
#define STASH_PRELOAD_H

#include <stddef.h>
#include <stdint.h>

#include "stash.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct stash_preload_counters_t {
  size_t struct_size;          /* in: sizeof(stash_preload_counters_t) */
  int enabled;                 /* 0 under STASH_DISABLE=1 */
  uint64_t device_budget_bytes; /* STASH_DEVICE_BUDGET per device; 0: none */
  /* cudaMalloc, cudaMallocAsync(_ptsz) served by the device pools, and their frees */
  uint64_t device_alloc_count, device_free_count, device_largest_alloc_bytes;
  uint64_t device_budget_refusals; /* refused: the budget would have been exceeded */
  uint64_t device_failed_count;    /* other pool failures, reported as cudaErrorMemoryAllocation */
  uint64_t device_passthrough_alloc_count; /* size 0, during graph capture, no pool */
  uint64_t device_foreign_free_count;      /* frees of pointers stash did not allocate */
  /* cudaMallocHost, cudaHostAlloc served by the pinned pool, and cudaFreeHost */
  uint64_t pinned_alloc_count, pinned_free_count, pinned_largest_alloc_bytes;
  uint64_t pinned_passthrough_alloc_count; /* mapped/write-combined, > slab, cap reached */
  uint64_t pinned_foreign_free_count;
} stash_preload_counters_t;

/* Fills *out as far as out->struct_size reaches. NULL or struct_size 0:
 * STASH_ERROR_INVALID_ARGUMENT. */
STASH_API stash_status_t stash_preload_counters(stash_preload_counters_t* out);

/* The device pool of `device` (out->struct_size set, e.g. by stash_pool_stats_init, which
 * is in libstash.so: set it by hand here). No pool for that device yet:
 * STASH_ERROR_INVALID_ARGUMENT. */
STASH_API stash_status_t stash_preload_device_stats(int device, stash_pool_stats_t* out);

/* The pinned pool; not built yet: STASH_ERROR_INVALID_ARGUMENT. */
STASH_API stash_status_t stash_preload_pinned_stats(stash_pool_stats_t* out);

/* Writes the STASH_REPORT JSON to `path` now (the at-exit report is still written),
 * replacing the file there whole or not at all (a temporary beside it, then a rename).
 * STASH_ERROR_INVALID_ARGUMENT for NULL or a file that cannot be written. */
STASH_API stash_status_t stash_preload_write_report(const char* path);

#ifdef __cplusplus
}
#endif

#endif /* STASH_PRELOAD_H */
