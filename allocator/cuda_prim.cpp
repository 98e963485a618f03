// cuda_prim.cpp: Note [One CUDA primitive layer] (cuda_prim.h).
#include "cuda_prim.h"

namespace stash::prim {

namespace {
// cudaErrorNotReady is not sticky, but cudaGetLastError reports it; clear it so that the
// caller's own error checks do not see it.
cudaError_t clear_not_ready(cudaError_t err) noexcept {
  if (err == cudaErrorNotReady) cudaGetLastError();
  return err;
}
}  // namespace

cudaError_t tolerate_unloading(cudaError_t err) noexcept {
  if (err == cudaErrorCudartUnloading) {
    cudaGetLastError();
    return cudaSuccess;
  }
  return err;
}

cudaError_t host_alloc(void** out, size_t bytes) noexcept {
  return cudaHostAlloc(out, bytes, cudaHostAllocPortable);
}
cudaError_t host_free(void* p) noexcept { return tolerate_unloading(cudaFreeHost(p)); }
cudaError_t host_register(void* p, size_t bytes) noexcept {
  return cudaHostRegister(p, bytes, cudaHostRegisterPortable);
}
cudaError_t host_unregister(void* p) noexcept {
  return tolerate_unloading(cudaHostUnregister(p));
}
cudaError_t device_alloc(void** out, size_t bytes) noexcept { return cudaMalloc(out, bytes); }
cudaError_t device_free(void* p) noexcept { return tolerate_unloading(cudaFree(p)); }

cudaError_t stream_create(cudaStream_t* out) noexcept {
  return cudaStreamCreateWithFlags(out, cudaStreamNonBlocking);
}
cudaError_t stream_destroy(cudaStream_t s) noexcept {
  return tolerate_unloading(cudaStreamDestroy(s));
}
cudaError_t stream_synchronize(cudaStream_t s) noexcept { return cudaStreamSynchronize(s); }
cudaError_t stream_wait(cudaStream_t waiter, cudaEvent_t ev) noexcept {
  return cudaStreamWaitEvent(waiter, ev, 0);
}
cudaError_t stream_capturing(cudaStream_t stream, bool* capturing) noexcept {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(stream, &st);
  *capturing = (err == cudaSuccess && st != cudaStreamCaptureStatusNone) ||
               err == cudaErrorStreamCaptureImplicit || err == cudaErrorStreamCaptureUnsupported;
  if (err != cudaSuccess) cudaGetLastError();
  return err;
}

cudaError_t event_create(cudaEvent_t* out, bool timing) noexcept {
  return cudaEventCreateWithFlags(out, timing ? cudaEventDefault : cudaEventDisableTiming);
}
cudaError_t event_destroy(cudaEvent_t ev) noexcept {
  return tolerate_unloading(cudaEventDestroy(ev));
}
cudaError_t event_record(cudaEvent_t ev, cudaStream_t stream) noexcept {
  return cudaEventRecord(ev, stream);
}
cudaError_t event_query(cudaEvent_t ev) noexcept { return clear_not_ready(cudaEventQuery(ev)); }
cudaError_t event_synchronize(cudaEvent_t ev) noexcept {
  return tolerate_unloading(cudaEventSynchronize(ev));
}
cudaError_t event_elapsed(float* ms, cudaEvent_t from, cudaEvent_t to) noexcept {
  return clear_not_ready(cudaEventElapsedTime(ms, from, to));
}

relaxed_capture_mode::relaxed_capture_mode() noexcept {
  exchanged_ = cudaThreadExchangeStreamCaptureMode(&previous_) == cudaSuccess;
  if (!exchanged_) clear_runtime_error();
}

relaxed_capture_mode::~relaxed_capture_mode() {
  if (exchanged_ && cudaThreadExchangeStreamCaptureMode(&previous_) != cudaSuccess)
    clear_runtime_error();
}

cudaError_t copy_d2h(void* host, const void* device, size_t bytes, cudaStream_t s) noexcept {
  return cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, s);
}
cudaError_t copy_h2d(void* device, const void* host, size_t bytes, cudaStream_t s) noexcept {
  return cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, s);
}

cudaError_t current_device(int* device) noexcept { return cudaGetDevice(device); }
cudaError_t set_device(int device) noexcept { return cudaSetDevice(device); }

int host_numa_node(int device) noexcept {
  int node = -1;
  if (cudaDeviceGetAttribute(&node, cudaDevAttrHostNumaId, device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return node;
}

std::string device_problem() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  cudaGetLastError();
  if (err != cudaSuccess) return cudaGetErrorString(err);
  if (n == 0) return "no CUDA-capable device is detected";
  return "";
}

void clear_runtime_error() noexcept { cudaGetLastError(); }

status record_cuda_error(cudaError_t err, const char* call, const char* file,
                         int line) noexcept {
  const char* name = cudaGetErrorName(err);
  const char* text = cudaGetErrorString(err);
  cudaGetLastError();  // the failure is reported through stash's status; unstick it
  return fail(status::cuda_error, "%s:%d: %s failed: %s (%s)", file, line, call,
              name ? name : "cudaError?", text ? text : "");
}

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  throw_last_error(record_cuda_error(err, call, file, line));
}

stream_owner make_stream() {
  stream_owner s;
  STASH_CUDA_TRY(stream_create(s.out()));
  return s;
}
event_owner make_event(bool timing) {
  event_owner e;
  STASH_CUDA_TRY(event_create(e.out(), timing));
  return e;
}

}  // namespace stash::prim
