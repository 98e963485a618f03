#include "cuda_calls.h"

#include <nvtx3/nvToolsExtCudaRt.h>

#include "cuda_prim.h"

namespace stash::engine::cuda {

namespace {
using prim::tolerate_unloading;
cudaError_t clear_not_ready(cudaError_t err) noexcept {
  if (err == cudaErrorNotReady) cudaGetLastError();
  return err;
}
}  // namespace

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

cudaError_t event_create(cudaEvent_t* out, bool timing) noexcept {
  return cudaEventCreateWithFlags(out, timing ? cudaEventDefault : cudaEventDisableTiming);
}
cudaError_t event_destroy(cudaEvent_t ev) noexcept {
  return tolerate_unloading(cudaEventDestroy(ev));
}
cudaError_t event_record(cudaEvent_t ev, cudaStream_t s) noexcept {
  return cudaEventRecord(ev, s);
}
cudaError_t event_query(cudaEvent_t ev) noexcept { return clear_not_ready(cudaEventQuery(ev)); }
cudaError_t event_synchronize(cudaEvent_t ev) noexcept {
  return tolerate_unloading(cudaEventSynchronize(ev));
}
cudaError_t event_elapsed(float* ms, cudaEvent_t from, cudaEvent_t to) noexcept {
  return clear_not_ready(cudaEventElapsedTime(ms, from, to));
}

cudaError_t copy_d2h(void* host, const void* device, size_t bytes, cudaStream_t s) noexcept {
  return cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, s);
}
cudaError_t copy_h2d(void* device, const void* host, size_t bytes, cudaStream_t s) noexcept {
  return cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, s);
}

status fail(cudaError_t err, const char* call, const char* file, int line) noexcept {
  cudaGetLastError();  // a failed call on purpose must not poison the caller's checks
  return ::stash::prim::record_cuda_error(err, call, file, line);
}

stream_owner& stream_owner::operator=(stream_owner&& o) noexcept {
  if (this != &o) {
    reset();
    s_ = o.s_;
    o.s_ = nullptr;
  }
  return *this;
}
void stream_owner::reset() noexcept {
  if (s_) stream_destroy(s_);
  s_ = nullptr;
}

event_owner& event_owner::operator=(event_owner&& o) noexcept {
  if (this != &o) {
    reset();
    e_ = o.e_;
    o.e_ = nullptr;
  }
  return *this;
}
void event_owner::reset() noexcept {
  if (e_) event_destroy(e_);
  e_ = nullptr;
}

void name_stream(cudaStream_t s, const char* name) noexcept { nvtxNameCudaStreamA(s, name); }

}  // namespace stash::engine::cuda
