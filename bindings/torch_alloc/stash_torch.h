/* stash_torch.h: libstash_torch.so, stash's device pool as a PyTorch pluggable allocator.
 * C99. Since 0.1.0.
 *
 *   alloc = torch.cuda.memory.CUDAPluggableAllocator(
 *       "libstash_torch.so", "stash_torch_malloc", "stash_torch_free")
 *   torch.cuda.memory.change_current_allocator(alloc)
 *
 * or, from the Python package, stash.torch.use_allocator(budget="40GiB").
 *
 * One stash device pool per device, built on that device's first allocation, with the
 * budget then in force: stash_torch_set_budget, else STASH_DEVICE_BUDGET from the
 * environment (bytes or units: "40GiB"), else none. Blocks are stream-ordered: a block
 * freed by PyTorch goes back to the free list of the stream it was allocated for.
 *
 * Thread safety: malloc, free, stats and last_error may be called from any thread.
 * stash_torch_set_budget and stash_torch_release_cached must not race with malloc/free
 * on the same device. The pools live until the process exits (never destroyed, since
 * PyTorch may free blocks from its own static destructors).
 */
#ifndef STASH_TORCH_H
#define STASH_TORCH_H

#include <stddef.h>

#include "stash.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The entry points PyTorch calls (the signature CUDAPluggableAllocator expects; the
 * stream is a cudaStream_t). malloc returns NULL on failure (budget exceeded, CUDA out of
 * memory), with the reason in stash_torch_last_error(); PyTorch then raises its
 * OutOfMemoryError. size 0 returns NULL. free of NULL does nothing; free of a pointer the
 * pool does not know is ignored, with the reason in stash_torch_last_error(). */
STASH_API void* stash_torch_malloc(size_t size, int device, stash_stream_t stream);
STASH_API void stash_torch_free(void* ptr, size_t size, int device, stash_stream_t stream);

/* Sets the budget (bytes; 0: none) of `device`'s pool, or of every device when device is
 * -1. A pool not built yet takes it when built; a built pool with no live block is
 * rebuilt with it (its cached slabs are freed); a pool with live blocks keeps its budget
 * and the call returns STASH_ERROR_INVALID_ARGUMENT. */
STASH_API stash_status_t stash_torch_set_budget(int device, size_t bytes);

/* The pool statistics of `device` (stats->struct_size must be set). No pool yet on that
 * device: all figures 0, limit_bytes = the budget it will get, and STASH_OK. */
STASH_API stash_status_t stash_torch_stats(int device, stash_pool_stats_t* stats);

/* Sets the peaks to the current values. */
STASH_API stash_status_t stash_torch_reset_peak(int device);

/* Gives entirely free slabs back to CUDA (synchronizes the device). */
STASH_API stash_status_t stash_torch_release_cached(int device, size_t* released_bytes);

/* The calling thread's most recent error message ("" if none). */
STASH_API const char* stash_torch_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* STASH_TORCH_H */
