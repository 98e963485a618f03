// The virtual clock: copies take bytes / bandwidth, compute takes its declared time,
// overlap gives max not sum, one engine per direction, exact event elapsed times.
// Sizes are chosen so that every expected time is exact in binary floating point.
#include "support.h"

namespace stash::test {
namespace {

constexpr size_t kTenMB = 10'000'000;  // 1 ms at 10 GB/s

class Clock : public OnDouble {
 protected:
  void SetUp() override {
    OnDouble::SetUp();
    if (IsSkipped()) return;
    dbl().set_bandwidth(10.0, 5.0, 20.0);  // H2D 1 ms and D2H 2 ms per 10 MB
  }
  float elapsed(cudaEvent_t a, cudaEvent_t b) {
    float ms = -1.0f;
    EXPECT_EQ(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
    return ms;
  }
  void compute(cudaStream_t s, double ms) {
    ASSERT_EQ(dbl().enqueue_compute(s, ms, "kernel", nullptr, nullptr, 0, nullptr, nullptr, 0),
              cudaSuccess);
  }
};

TEST_F(Clock, CopyTakesBytesOverBandwidth) {
  StreamOwner s;
  EventOwner e0, e1, e2;
  DeviceBuffer d(kTenMB);
  PinnedBuffer h(kTenMB);
  CUDA_OK(cudaEventRecord(e0, s));
  CUDA_OK(cudaMemcpyAsync(d.p, h.p, kTenMB, cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaEventRecord(e1, s));
  CUDA_OK(cudaMemcpyAsync(h.p, d.p, kTenMB, cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaEventRecord(e2, s));
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(elapsed(e0, e1), 1.0f);
  EXPECT_EQ(elapsed(e1, e2), 2.0f);
  EXPECT_EQ(elapsed(e0, e2), 3.0f);
  EXPECT_EQ(dbl().host_now_ms(), 3.0);
}

TEST_F(Clock, ComputeTakesItsDeclaredTime) {
  StreamOwner s;
  EventOwner e0, e1;
  CUDA_OK(cudaEventRecord(e0, s));
  compute(s, 3.5);
  compute(s, 0.25);
  CUDA_OK(cudaEventRecord(e1, s));
  CUDA_OK(cudaEventSynchronize(e1));
  EXPECT_EQ(elapsed(e0, e1), 3.75f);
  EXPECT_EQ(dbl().host_now_ms(), 3.75);
}

TEST_F(Clock, CopyOverlapsComputeOnAnotherStream) {
  StreamOwner compute_stream, d2h_stream;
  DeviceBuffer d(kTenMB);
  PinnedBuffer h(kTenMB);
  compute(compute_stream, 5.0);
  CUDA_OK(cudaMemcpyAsync(h.p, d.p, kTenMB, cudaMemcpyDeviceToHost, d2h_stream));  // 2 ms
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(dbl().host_now_ms(), 5.0) << "max(5, 2), not the sum";
}

TEST_F(Clock, SameDirectionCopiesSerializeAcrossStreams) {
  StreamOwner a, b;
  EventOwner b0, b1;
  DeviceBuffer d1(kTenMB), d2(kTenMB);
  PinnedBuffer h1(kTenMB), h2(kTenMB);
  CUDA_OK(cudaMemcpyAsync(d1.p, h1.p, kTenMB, cudaMemcpyHostToDevice, a));
  CUDA_OK(cudaEventRecord(b0, b));
  CUDA_OK(cudaMemcpyAsync(d2.p, h2.p, kTenMB, cudaMemcpyHostToDevice, b));
  CUDA_OK(cudaEventRecord(b1, b));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(elapsed(b0, b1), 2.0f) << "waited 1 ms for the H2D engine";
  EXPECT_EQ(dbl().host_now_ms(), 2.0);
}

TEST_F(Clock, OppositeDirectionsOverlapAtSharedBandwidth) {
  StreamOwner a, b;
  DeviceBuffer d1(kTenMB), d2(kTenMB);
  PinnedBuffer h1(kTenMB), h2(kTenMB);
  dbl().set_bandwidth(10.0, 10.0, 20.0);  // both at once: 10 each, no slowdown
  CUDA_OK(cudaMemcpyAsync(d1.p, h1.p, kTenMB, cudaMemcpyHostToDevice, a));
  CUDA_OK(cudaMemcpyAsync(h2.p, d2.p, kTenMB, cudaMemcpyDeviceToHost, b));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(dbl().host_now_ms(), 1.0);

  // Both at once: 5 GB/s each. The D2H copy moves 5 MB during the H2D copy's
  // millisecond, then the other 5 MB at full speed in 0.5 ms.
  dbl().set_bandwidth(10.0, 10.0, 10.0);
  EventOwner a0, a1, b0, b1;
  CUDA_OK(cudaEventRecord(a0, a));
  CUDA_OK(cudaMemcpyAsync(d1.p, h1.p, kTenMB, cudaMemcpyHostToDevice, a));
  CUDA_OK(cudaEventRecord(a1, a));
  CUDA_OK(cudaEventRecord(b0, b));
  CUDA_OK(cudaMemcpyAsync(h2.p, d2.p, kTenMB, cudaMemcpyDeviceToHost, b));
  CUDA_OK(cudaEventRecord(b1, b));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(elapsed(a0, a1), 1.0f);
  EXPECT_EQ(elapsed(b0, b1), 1.5f);
}

TEST_F(Clock, OpsStartNoEarlierThanTheHost) {
  StreamOwner s;
  EventOwner e0, e1;
  CUDA_OK(cudaEventRecord(e0, s));
  dbl().host_advance_ms(10.0);
  EXPECT_EQ(dbl().host_now_ms(), 10.0);
  compute(s, 1.0);
  CUDA_OK(cudaEventRecord(e1, s));
  CUDA_OK(cudaEventSynchronize(e1));
  EXPECT_EQ(elapsed(e0, e1), 11.0f);
  EXPECT_EQ(dbl().host_now_ms(), 11.0);
}

TEST_F(Clock, StreamWaitEventDelaysTheWaiter) {
  StreamOwner a, b;
  EventOwner done_a, b0, b1;
  CUDA_OK(cudaEventRecord(b0, b));
  compute(a, 4.0);
  CUDA_OK(cudaEventRecord(done_a, a));
  CUDA_OK(cudaStreamWaitEvent(b, done_a, 0));
  compute(b, 1.0);
  CUDA_OK(cudaEventRecord(b1, b));
  CUDA_OK(cudaStreamSynchronize(b));
  EXPECT_EQ(elapsed(b0, b1), 5.0f);
}

TEST_F(Clock, LegacyStreamWaitsForBlockingStreamsInVirtualTime) {
  StreamOwner blocking, nonblocking(cudaStreamNonBlocking);
  EventOwner l0, l1;
  CUDA_OK(cudaEventRecord(l0, nullptr));
  compute(nonblocking, 7.0);
  compute(nullptr, 1.0);  // independent of the non-blocking stream
  CUDA_OK(cudaEventRecord(l1, nullptr));
  CUDA_OK(cudaEventSynchronize(l1));
  EXPECT_EQ(elapsed(l0, l1), 1.0f);

  compute(blocking, 3.0);  // starts at 1 (after the legacy stream's work): ends at 4
  compute(nullptr, 1.0);   // waits for it: ends at 5
  CUDA_OK(cudaEventRecord(l1, nullptr));
  CUDA_OK(cudaEventSynchronize(l1));
  EXPECT_EQ(elapsed(l0, l1), 5.0f);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(dbl().host_now_ms(), 7.0);
}

TEST_F(Clock, SynchronousCopyAdvancesTheHost) {
  DeviceBuffer d(kTenMB);
  PinnedBuffer h(kTenMB);
  CUDA_OK(cudaMemcpy(d.p, h.p, kTenMB, cudaMemcpyHostToDevice));
  EXPECT_EQ(dbl().host_now_ms(), 1.0);
}

TEST_F(Clock, ElapsedTimeErrors) {
  StreamOwner s;
  EventOwner timed0, timed1, untimed(cudaEventDisableTiming), never;
  float ms = 0;
  CUDA_OK(cudaEventRecord(timed0, s));
  CUDA_OK(cudaEventRecord(untimed, s));
  CUDA_OK(dbl().stream_pause(s));
  CUDA_OK(cudaEventRecord(timed1, s));
  EXPECT_EQ(cudaEventElapsedTime(&ms, timed0, timed1), cudaErrorNotReady);
  CUDA_OK(dbl().stream_resume(s));
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(cudaEventElapsedTime(&ms, timed0, untimed), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventElapsedTime(&ms, timed0, never), cudaErrorInvalidResourceHandle);
  CUDA_OK(cudaEventElapsedTime(&ms, timed0, timed1));
  EXPECT_EQ(ms, 0.0f);
  cudaGetLastError();
}

TEST_F(Clock, ResetRewindsTheClock) {
  StreamOwner s;
  compute(s, 2.0);
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(dbl().host_now_ms(), 2.0);
  dbl().reset();
  EXPECT_EQ(dbl().host_now_ms(), 0.0);
  EventOwner e0, e1;
  CUDA_OK(cudaEventRecord(e0, s));
  compute(s, 1.0);
  CUDA_OK(cudaEventRecord(e1, s));
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(elapsed(e0, e1), 1.0f);
  EXPECT_EQ(dbl().host_now_ms(), 1.0);
}

}  // namespace
}  // namespace stash::test
