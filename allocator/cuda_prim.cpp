#include "cuda_prim.h"

namespace stash::prim {

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

cudaError_t event_create(cudaEvent_t* out) noexcept {
  return cudaEventCreateWithFlags(out, cudaEventDisableTiming);
}
cudaError_t event_destroy(cudaEvent_t ev) noexcept {
  return tolerate_unloading(cudaEventDestroy(ev));
}
cudaError_t event_record(cudaEvent_t ev, cudaStream_t stream) noexcept {
  return cudaEventRecord(ev, stream);
}
cudaError_t event_query(cudaEvent_t ev) noexcept {
  const cudaError_t err = cudaEventQuery(ev);
  // cudaErrorNotReady is not sticky, but it is reported by cudaGetLastError; clear it so
  // that the caller's own error checks do not see it.
  if (err == cudaErrorNotReady) cudaGetLastError();
  return err;
}

cudaError_t event_synchronize(cudaEvent_t ev) noexcept {
  return tolerate_unloading(cudaEventSynchronize(ev));
}

cudaError_t stream_capturing(cudaStream_t stream, bool* capturing) noexcept {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(stream, &st);
  *capturing = (err == cudaSuccess && st != cudaStreamCaptureStatusNone) ||
               err == cudaErrorStreamCaptureImplicit || err == cudaErrorStreamCaptureUnsupported;
  if (err != cudaSuccess) cudaGetLastError();
  return err;
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

void clear_runtime_error() noexcept { cudaGetLastError(); }

status record_cuda_error(cudaError_t err, const char* call, const char* file,
                         int line) noexcept {
  const char* name = cudaGetErrorName(err);
  const char* text = cudaGetErrorString(err);
  cudaGetLastError();  // the failure is reported through stash's status; unstick it
  return fail(status::cuda_error, "%s:%d: %s failed: %s (%s)", file, line, call,
              name ? name : "cudaError?", text ? text : "");
}

}  // namespace stash::prim
