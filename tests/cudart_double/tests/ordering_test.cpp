// Ordering and event semantics: in-order streams, cross-stream waits, the legacy default
// stream, queries while paused, synchronization. Tests without STASH_REQUIRE_DOUBLE also
// run on a real GPU (.gpu variant) and pin the double to the real runtime's behaviour.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "support.h"

namespace stash::test {
namespace {

void append(void* arg) {
  auto* v = static_cast<std::vector<int>*>(arg);
  v->push_back(static_cast<int>(v->size()));
}

TEST(Ordering, StreamRunsOpsInOrder) {
  StreamOwner s;
  DeviceBuffer d(4096);
  PinnedBuffer h(4096);
  std::vector<int> order;
  CUDA_OK(cudaMemsetAsync(d.p, 1, 4096, s));
  CUDA_OK(cudaMemcpyAsync(h.p, d.p, 4096, cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaMemsetAsync(d.p, 2, 4096, s));  // must not overtake the copy
  for (int i = 0; i < 100; ++i) CUDA_OK(cudaLaunchHostFunc(s, append, &order));
  CUDA_OK(cudaStreamSynchronize(s));
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(h.get()[i], 1) << i;
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(Ordering, CopyRoundTripAllKinds) {
  StreamOwner s;
  DeviceBuffer a(1000), b(1000);
  PinnedBuffer h(1000);
  std::vector<unsigned char> src(1000), back(1000);
  for (int i = 0; i < 1000; ++i) src[i] = static_cast<unsigned char>(i * 7);
  CUDA_OK(cudaMemcpy(a.p, src.data(), 1000, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpyAsync(b.p, a.p, 1000, cudaMemcpyDeviceToDevice, s));
  CUDA_OK(cudaMemcpyAsync(h.p, b.p, 1000, cudaMemcpyDefault, s));
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaMemcpy(back.data(), h.p, 1000, cudaMemcpyHostToHost));
  EXPECT_EQ(back, src);
  CUDA_OK(cudaMemset(a.p, 0xab, 10));
  CUDA_OK(cudaMemcpy(back.data(), a.p, 10, cudaMemcpyDefault));
  EXPECT_EQ(back[9], 0xab);
}

class OrderingOnDouble : public OnDouble {};

TEST_F(OrderingOnDouble, QueriesReportNotReadyWhilePaused) {
  StreamOwner s;
  EventOwner e;
  DeviceBuffer d(256);
  CUDA_OK(dbl().stream_pause(s));
  CUDA_OK(cudaMemsetAsync(d.p, 0, 256, s));
  CUDA_OK(cudaEventRecord(e, s));
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "NotReady is not an error";
  CUDA_OK(dbl().stream_resume(s));
  CUDA_OK(cudaEventSynchronize(e));
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
}

TEST_F(OrderingOnDouble, StreamWaitEventIsARealDependency) {
  StreamOwner a, b;
  EventOwner e;
  DeviceBuffer d(4096);
  PinnedBuffer h(4096);
  CUDA_OK(dbl().stream_pause(a));
  CUDA_OK(cudaMemsetAsync(d.p, 7, 4096, a));
  CUDA_OK(cudaEventRecord(e, a));
  CUDA_OK(cudaStreamWaitEvent(b, e, 0));
  CUDA_OK(cudaMemcpyAsync(h.p, d.p, 4096, cudaMemcpyDeviceToHost, b));
  EXPECT_EQ(cudaStreamQuery(b), cudaErrorNotReady) << "b must wait for a's event";
  CUDA_OK(dbl().stream_resume(a));
  CUDA_OK(cudaStreamSynchronize(b));
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(h.get()[i], 7) << i;
}

TEST_F(OrderingOnDouble, WaitOnNeverRecordedEventIsANoOp) {
  StreamOwner s;
  EventOwner e;
  CUDA_OK(cudaStreamWaitEvent(s, e, 0));
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaEventSynchronize(e));
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
}

TEST_F(OrderingOnDouble, LegacyStreamWaitsForBlockingStreams) {
  StreamOwner blocking;
  DeviceBuffer d(256);
  CUDA_OK(dbl().stream_pause(blocking));
  CUDA_OK(cudaMemsetAsync(d.p, 1, 256, blocking));
  std::vector<int> order;
  CUDA_OK(cudaLaunchHostFunc(nullptr, append, &order));
  EXPECT_EQ(cudaStreamQuery(nullptr), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(cudaStreamLegacy), cudaErrorNotReady);
  CUDA_OK(dbl().stream_resume(blocking));
  CUDA_OK(cudaStreamSynchronize(nullptr));
  EXPECT_EQ(order.size(), 1u);
  // And a blocking stream's later work waits for the legacy stream.
  CUDA_OK(dbl().stream_pause(nullptr));
  CUDA_OK(cudaLaunchHostFunc(nullptr, append, &order));
  CUDA_OK(cudaMemsetAsync(d.p, 2, 256, blocking));
  EXPECT_EQ(cudaStreamQuery(blocking), cudaErrorNotReady);
  CUDA_OK(dbl().stream_resume(nullptr));
  CUDA_OK(cudaStreamSynchronize(blocking));
  EXPECT_EQ(order.size(), 2u);
}

TEST_F(OrderingOnDouble, NonBlockingStreamIsIndependentOfLegacyStream) {
  StreamOwner nb(cudaStreamNonBlocking);
  DeviceBuffer d(256);
  CUDA_OK(dbl().stream_pause(nb));
  CUDA_OK(cudaMemsetAsync(d.p, 1, 256, nb));
  std::vector<int> order;
  CUDA_OK(cudaLaunchHostFunc(cudaStreamPerThread, append, &order));  // = legacy stream
  CUDA_OK(cudaStreamSynchronize(nullptr));  // returns although nb is paused
  EXPECT_EQ(order.size(), 1u);
  EXPECT_EQ(cudaStreamQuery(nb), cudaErrorNotReady);
  CUDA_OK(dbl().stream_resume(nb));
  CUDA_OK(cudaStreamSynchronize(nb));
}

TEST_F(OrderingOnDouble, DestroyedStreamStillRunsItsWork) {
  std::atomic<int> ran{0};
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  CUDA_OK(dbl().stream_pause(s));
  CUDA_OK(cudaLaunchHostFunc(
      s, [](void* p) { static_cast<std::atomic<int>*>(p)->fetch_add(1); }, &ran));
  CUDA_OK(cudaStreamDestroy(s));
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(ran.load(), 1);
}

TEST_F(OrderingOnDouble, ManyThreadsManyStreams) {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&failures, t] {
      cudaStream_t s;
      if (cudaStreamCreate(&s) != cudaSuccess) ++failures;
      void* d = nullptr;
      void* h = nullptr;
      if (cudaMalloc(&d, 1 << 16) != cudaSuccess) ++failures;
      if (cudaHostAlloc(&h, 1 << 16, 0) != cudaSuccess) ++failures;
      for (int i = 0; i < 50; ++i) {
        cudaMemsetAsync(d, t + i, 1 << 16, s);
        cudaMemcpyAsync(h, d, 1 << 16, cudaMemcpyDeviceToHost, s);
        cudaStreamSynchronize(s);
        if (static_cast<unsigned char*>(h)[100] != static_cast<unsigned char>(t + i)) ++failures;
      }
      cudaFree(d);
      cudaFreeHost(h);
      cudaStreamDestroy(s);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

// A paused stream with queued work, still alive at exit: the process must exit cleanly
// (no hang, no crash, no leak under LeakSanitizer), as Note [Process exit] in state.h
// promises. Runs in a child process: the parent's TearDown would resume the stream.
TEST_F(OrderingOnDouble, StreamAliveAtExitIsHarmless) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        cudaStream_t s;
        void* d = nullptr;
        if (cudaStreamCreate(&s) != cudaSuccess || cudaMalloc(&d, 256) != cudaSuccess) {
          std::exit(2);
        }
        cudaMemsetAsync(d, 0, 256, s);
        dbl().stream_pause(s);
        cudaMemsetAsync(d, 1, 256, s);  // never runs: dropped at exit
        cudaLaunchHostFunc(s, [](void*) { std::abort(); }, nullptr);
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// A child forked while workers exist (gtest's default "fast" death tests) must be able
// to exit: Note [Fork] in state.cpp.
TEST_F(OrderingOnDouble, ForkedChildExits) {
  StreamOwner s;
  DeviceBuffer d(256);
  CUDA_OK(cudaMemsetAsync(d.p, 0, 256, s));
  CUDA_OK(cudaStreamSynchronize(s));
  GTEST_FLAG_SET(death_test_style, "fast");
  EXPECT_EXIT(std::exit(0), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace stash::test
