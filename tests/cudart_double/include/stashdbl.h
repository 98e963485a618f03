/* stashdbl.h: the double-only API of stash's CPU test double of libcudart.so.13.
 *
 * The double (tests/cudart_double) is a shared library with soname libcudart.so.13 that
 * implements the CUDA runtime calls stash makes with host semantics. These extra entry
 * points exist only in the double. Test binaries link the REAL cudart, so they never
 * reference these symbols directly: tests/common/double_api.h resolves them with dlsym at
 * run time, and a NULL result means "running on a real runtime" (tests that only make sense
 * on the double then GTEST_SKIP).
 *
 * All functions are thread-safe. Times are virtual milliseconds (see "virtual clock").
 */
#ifndef STASHDBL_H
#define STASHDBL_H

#include <stddef.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Returns 1. Its presence is the probe that tells a test it runs on the double. */
int stashdbl_probe(void);

/* Restores the initial state: no faults, no violations, virtual clock at 0, default
 * device memory (80 GiB total) and bandwidths (h2d = d2h = 50 GB/s, both at once 50 each),
 * all streams resumed, foreign memory as STASHDBL_FOREIGN_IS_DEVICE said at load.
 * Allocations and streams that exist stay valid. */
void stashdbl_reset(void);

/* Foreign memory as device memory, for host frameworks standing in for a device (PyTorch's
 * CPU build handing its tensors to stash as device blocks). Memory the double did not
 * allocate or register is pageable host memory by default; with `on` nonzero it counts as
 * device memory: copy kinds are checked against that, async copies between it and pinned
 * memory are asynchronous, memsets accept it, cudaPointerGetAttributes reports
 * cudaMemoryTypeDevice. The initial value is 1 when the environment has
 * STASHDBL_FOREIGN_IS_DEVICE=1 as the library loads, else 0. Returns the previous value. */
int stashdbl_set_foreign_is_device(int on);

/* Device memory size reported by cudaMemGetInfo / cudaGetDeviceProperties and enforced by
 * cudaMalloc/cudaMallocAsync (cudaErrorMemoryAllocation past it). */
void stashdbl_set_device_memory(size_t total_bytes);

/* Virtual clock.
 * A copy takes bytes / bandwidth (GB/s = 1e9 B/s) of virtual time. H2D and D2H each have
 * one copy engine: copies of one direction serialize across streams. When copies of both
 * directions overlap, each runs at min(its bandwidth, bidir_gbps / 2).
 * An op starts at max(end of the previous op on its stream, completion time of every event
 * its stream waits on, the host's virtual time when it was enqueued) and ends at
 * start + duration. Event records complete at that point; cudaEventElapsedTime reads it.
 * Host-side synchronization (cudaStreamSynchronize, cudaEventSynchronize,
 * cudaDeviceSynchronize, synchronous cudaMemcpy) advances the host's virtual time to the
 * completion time waited for. */
void stashdbl_set_bandwidth(double h2d_gbps, double d2h_gbps, double bidir_gbps);
double stashdbl_host_now_ms(void);
void stashdbl_host_advance_ms(double ms); /* host-side work taking virtual time */

/* Emulated compute: an op on `stream` that takes `ms` of virtual time, reads the ranges
 * reads[i] (sizes read_sizes[i]) and writes writes[i], for the happens-before checker.
 * name appears in violation messages. Pointers may be NULL when the counts are 0. */
cudaError_t stashdbl_enqueue_compute(cudaStream_t stream, double ms, const char* name,
                                     const void* const* reads, const size_t* read_sizes,
                                     size_t n_reads, const void* const* writes,
                                     const size_t* write_sizes, size_t n_writes);

/* Real-time control of a stream's worker, to make work deterministically pending:
 * while paused, enqueued ops wait (cudaStreamQuery/cudaEventQuery report
 * cudaErrorNotReady). Virtual times are unaffected. */
cudaError_t stashdbl_stream_pause(cudaStream_t stream);
cudaError_t stashdbl_stream_resume(cudaStream_t stream);

/* Fault injection: the nth call (1-based, counted from this call) of the runtime API named
 * `api` (e.g. "cudaHostAlloc", "cudaMemcpyAsync") returns `error` without doing anything.
 * Several faults may be armed at once. */
void stashdbl_inject_fault(const char* api, int nth, cudaError_t error);
void stashdbl_clear_faults(void);

/* Happens-before checker.
 * Vector clocks over streams, events and host threads. Every op's device-side reads and
 * writes (copies, memsets, emulated compute) and annotated host accesses are recorded by
 * byte range; any pair of accesses to overlapping bytes, at least one a write, that is not
 * ordered by happens-before is a violation. Frees count as writes of the whole block, so a
 * block reused (or freed) while a copy still reads it is reported. Models: stream order,
 * cudaStreamWaitEvent, event/stream/device synchronize, the legacy default stream's
 * implicit synchronization with blocking streams, cudaMemcpyAsync from pageable memory
 * being synchronous with the host, stream-ordered free (cudaFreeAsync) and reuse. */
void stashdbl_host_access(const void* ptr, size_t bytes, int is_write);
size_t stashdbl_violation_count(void);
/* Copies the i-th violation's text (NUL-terminated, truncated to len) into buf; returns
 * the full length, or 0 when i is out of range. */
size_t stashdbl_violation_text(size_t i, char* buf, size_t len);
void stashdbl_clear_violations(void);

#ifdef __cplusplus
}
#endif
#endif /* STASHDBL_H */
