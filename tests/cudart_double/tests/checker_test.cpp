// The happens-before checker: each kind of planted race is reported, naming both ops,
// and the same pattern with the right event wait or synchronize stays silent.
//
// Note [Planted races]
// The checker judges the program's CUDA-level ordering, not what the worker threads
// happened to do. A planted race whose two ops both touch real memory would also be a
// real data race between two workers (ThreadSanitizer reports it, at random). So each
// planted pair has at most one side that touches memory (emulated compute and host
// annotations touch none), or the test holds one stream paused until the other side
// has run.
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support.h"

namespace stash::test {
namespace {

// Substring assertion without gmock.
#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

class Checker : public OnDouble {
 protected:
  void expect_one_race(const char* later, const char* earlier) {
    const std::vector<std::string> v = take_violations();
    ASSERT_EQ(v.size(), 1u) << (v.empty() ? "no violation" : v[0]);
    EXPECT_CONTAINS(v[0], later);
    EXPECT_CONTAINS(v[0], earlier);
    EXPECT_CONTAINS(v[0], "[0x");
  }
  void expect_silent() {
    const std::vector<std::string> v = take_violations();
    EXPECT_TRUE(v.empty()) << v[0];
  }
  void write_compute(cudaStream_t s, const void* p, size_t n, const char* name) {
    ASSERT_EQ(dbl().enqueue_compute(s, 1.0, name, nullptr, nullptr, 0, &p, &n, 1), cudaSuccess);
  }
  void read_compute(cudaStream_t s, const void* p, size_t n, const char* name) {
    ASSERT_EQ(dbl().enqueue_compute(s, 1.0, name, &p, &n, 1, nullptr, nullptr, 0), cudaSuccess);
  }
};

TEST_F(Checker, WriteWriteAcrossStreams) {
  StreamOwner a, b;
  EventOwner e;
  DeviceBuffer d(1024);
  // Note [Planted races]: the checker sees two unordered writes; in real time a is held
  // back until b's write ran, so the process itself has no data race (TSan stays quiet).
  CUDA_OK(dbl().stream_pause(a));
  CUDA_OK(cudaMemsetAsync(d.p, 1, 1024, a));
  CUDA_OK(cudaMemsetAsync(d.get() + 512, 2, 1024 - 512, b));
  CUDA_OK(cudaStreamSynchronize(b));
  CUDA_OK(dbl().stream_resume(a));
  CUDA_OK(cudaDeviceSynchronize());
  expect_one_race("write by cudaMemsetAsync on stream #", "write by cudaMemsetAsync on stream #");

  CUDA_OK(cudaMemsetAsync(d.p, 1, 1024, a));
  CUDA_OK(cudaEventRecord(e, a));
  CUDA_OK(cudaStreamWaitEvent(b, e, 0));
  CUDA_OK(cudaMemsetAsync(d.p, 2, 1024, b));
  CUDA_OK(cudaDeviceSynchronize());
  expect_silent();
}

TEST_F(Checker, MessageNamesBothOpsAndTheRange) {
  StreamOwner a, b;
  DeviceBuffer d(1024);
  write_compute(a, d.p, 1024, "producer");
  read_compute(b, d.get() + 256, 256, "consumer");
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<std::string> v = take_violations();
  ASSERT_EQ(v.size(), 1u);
  EXPECT_CONTAINS(v[0], "read by consumer on stream #");
  EXPECT_CONTAINS(v[0], "write by producer on stream #");
  EXPECT_CONTAINS(v[0], "(256 bytes)");
}

TEST_F(Checker, ReadThenUnorderedWrite) {
  StreamOwner a, b;
  EventOwner e;
  DeviceBuffer d(4096);
  PinnedBuffer h(4096);
  CUDA_OK(cudaMemcpyAsync(h.p, d.p, 4096, cudaMemcpyDeviceToHost, a));
  write_compute(b, d.p, 4096, "overwrite");
  CUDA_OK(cudaDeviceSynchronize());
  expect_one_race("write by overwrite", "read by cudaMemcpyAsync");

  CUDA_OK(cudaMemcpyAsync(h.p, d.p, 4096, cudaMemcpyDeviceToHost, a));
  CUDA_OK(cudaEventRecord(e, a));
  CUDA_OK(cudaStreamWaitEvent(b, e, 0));
  write_compute(b, d.p, 4096, "overwrite");
  CUDA_OK(cudaDeviceSynchronize());
  expect_silent();
}

TEST_F(Checker, WriteThenUnorderedRead) {
  StreamOwner h2d, compute;
  EventOwner e;
  DeviceBuffer d(4096);
  PinnedBuffer h(4096);
  CUDA_OK(cudaMemcpyAsync(d.p, h.p, 4096, cudaMemcpyHostToDevice, h2d));
  read_compute(compute, d.p, 4096, "consumer");
  CUDA_OK(cudaDeviceSynchronize());
  expect_one_race("read by consumer", "write by cudaMemcpyAsync");

  CUDA_OK(cudaMemcpyAsync(d.p, h.p, 4096, cudaMemcpyHostToDevice, h2d));
  CUDA_OK(cudaEventRecord(e, h2d));
  CUDA_OK(cudaStreamWaitEvent(compute, e, 0));
  read_compute(compute, d.p, 4096, "consumer");
  CUDA_OK(cudaDeviceSynchronize());
  expect_silent();
}

// The offload hazard: a device block is handed to a new producer while the D2H copy that
// offloads it is still pending.
TEST_F(Checker, BlockReusedWhilePausedCopyStillReadsIt) {
  StreamOwner d2h, compute;
  EventOwner copied;
  DeviceBuffer d(1 << 16);
  PinnedBuffer h(1 << 16);
  CUDA_OK(dbl().stream_pause(d2h));
  CUDA_OK(cudaMemcpyAsync(h.p, d.p, 1 << 16, cudaMemcpyDeviceToHost, d2h));
  write_compute(compute, d.p, 1 << 16, "next layer");
  expect_one_race("write by next layer", "read by cudaMemcpyAsync");
  CUDA_OK(dbl().stream_resume(d2h));
  CUDA_OK(cudaDeviceSynchronize());

  CUDA_OK(dbl().stream_pause(d2h));
  CUDA_OK(cudaMemcpyAsync(h.p, d.p, 1 << 16, cudaMemcpyDeviceToHost, d2h));
  CUDA_OK(cudaEventRecord(copied, d2h));
  CUDA_OK(cudaStreamWaitEvent(compute, copied, 0));
  write_compute(compute, d.p, 1 << 16, "next layer");
  EXPECT_EQ(cudaStreamQuery(compute), cudaErrorNotReady) << "the reuse waits for the copy";
  CUDA_OK(dbl().stream_resume(d2h));
  CUDA_OK(cudaDeviceSynchronize());
  expect_silent();
}

TEST_F(Checker, FreeWhilePausedCopyStillReadsIt) {
  StreamOwner d2h;
  PinnedBuffer h(1 << 16);
  void* d = nullptr;
  CUDA_OK(cudaMalloc(&d, 1 << 16));
  CUDA_OK(dbl().stream_pause(d2h));
  CUDA_OK(cudaMemcpyAsync(h.p, d, 1 << 16, cudaMemcpyDeviceToHost, d2h));
  CUDA_OK(cudaFree(d));  // no crash: the pages live until the copy ran
  expect_one_race("write by cudaFree on the host", "read by cudaMemcpyAsync");
  CUDA_OK(dbl().stream_resume(d2h));
  CUDA_OK(cudaStreamSynchronize(d2h));

  CUDA_OK(cudaMalloc(&d, 1 << 16));
  CUDA_OK(cudaMemcpyAsync(h.p, d, 1 << 16, cudaMemcpyDeviceToHost, d2h));
  CUDA_OK(cudaStreamSynchronize(d2h));
  CUDA_OK(cudaFree(d));
  expect_silent();
}

TEST_F(Checker, HostAccessWithoutSync) {
  StreamOwner s;
  DeviceBuffer d(4096);
  PinnedBuffer h(4096);
  // Reading the destination of a D2H copy before synchronizing.
  CUDA_OK(cudaMemcpyAsync(h.p, d.p, 4096, cudaMemcpyDeviceToHost, s));
  dbl().host_access(h.p, 4096, 0);
  expect_one_race("read by host read on the host", "write by cudaMemcpyAsync");
  CUDA_OK(cudaStreamSynchronize(s));
  dbl().host_access(h.p, 4096, 0);
  expect_silent();

  // Refilling the source of an H2D copy before it ran.
  dbl().host_access(h.p, 4096, 1);  // before the enqueue: ordered
  CUDA_OK(cudaMemcpyAsync(d.p, h.p, 4096, cudaMemcpyHostToDevice, s));
  dbl().host_access(h.p, 100, 1);
  expect_one_race("write by host write on the host", "read by cudaMemcpyAsync");
  EventOwner e;
  CUDA_OK(cudaMemcpyAsync(d.p, h.p, 4096, cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaEventRecord(e, s));
  CUDA_OK(cudaEventSynchronize(e));
  dbl().host_access(h.p, 4096, 1);
  expect_silent();
}

TEST_F(Checker, SuccessfulQueryOrdersTheHost) {
  StreamOwner s;
  EventOwner e;
  DeviceBuffer d(4096);
  PinnedBuffer h(4096);
  CUDA_OK(cudaMemcpyAsync(h.p, d.p, 4096, cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaEventRecord(e, s));
  while (cudaEventQuery(e) == cudaErrorNotReady) std::this_thread::yield();
  dbl().host_access(h.p, 4096, 1);
  CUDA_OK(cudaMemcpyAsync(h.p, d.p, 4096, cudaMemcpyDeviceToHost, s));
  while (cudaStreamQuery(s) == cudaErrorNotReady) std::this_thread::yield();
  dbl().host_access(h.p, 4096, 1);
  expect_silent();
}

TEST_F(Checker, FreeAsyncThenReuse) {
  StreamOwner a, b;
  EventOwner allocated, read_done;
  PinnedBuffer h(4096);
  void* p = nullptr;
  CUDA_OK(cudaMallocAsync(&p, 4096, a));
  CUDA_OK(cudaMemsetAsync(p, 3, 4096, a));
  CUDA_OK(cudaEventRecord(allocated, a));
  CUDA_OK(cudaStreamWaitEvent(b, allocated, 0));
  CUDA_OK(dbl().stream_pause(b));
  CUDA_OK(cudaMemcpyAsync(h.p, p, 4096, cudaMemcpyDeviceToHost, b));
  // Freed on a while b's copy still reads it.
  CUDA_OK(cudaFreeAsync(p, a));
  expect_one_race("write by cudaFreeAsync", "read by cudaMemcpyAsync");
  CUDA_OK(dbl().stream_resume(b));
  CUDA_OK(cudaDeviceSynchronize());

  // Ordered: a waits for b's read before freeing; a new block may reuse the address.
  CUDA_OK(cudaMallocAsync(&p, 4096, a));
  CUDA_OK(cudaMemsetAsync(p, 3, 4096, a));
  CUDA_OK(cudaEventRecord(allocated, a));
  CUDA_OK(cudaStreamWaitEvent(b, allocated, 0));
  CUDA_OK(dbl().stream_pause(b));
  CUDA_OK(cudaMemcpyAsync(h.p, p, 4096, cudaMemcpyDeviceToHost, b));
  CUDA_OK(cudaEventRecord(read_done, b));
  CUDA_OK(cudaStreamWaitEvent(a, read_done, 0));
  CUDA_OK(cudaFreeAsync(p, a));
  void* q = nullptr;
  CUDA_OK(cudaMallocAsync(&q, 4096, b));
  CUDA_OK(cudaMemsetAsync(q, 4, 4096, b));
  CUDA_OK(dbl().stream_resume(b));
  CUDA_OK(cudaFreeAsync(q, b));
  CUDA_OK(cudaDeviceSynchronize());
  expect_silent();
}

TEST_F(Checker, AsyncAllocationUsedOnAnotherStreamBeforeOrdering) {
  StreamOwner a, b;
  void* p = nullptr;
  CUDA_OK(cudaMallocAsync(&p, 4096, a));
  CUDA_OK(cudaMemsetAsync(p, 0, 4096, b));
  expect_one_race("write by cudaMemsetAsync", "write by cudaMallocAsync");
  CUDA_OK(cudaFreeAsync(p, b));
  CUDA_OK(cudaDeviceSynchronize());
  take_violations();
}

TEST_F(Checker, LegacyStreamOrdersWithBlockingStreamsOnly) {
  StreamOwner blocking, nonblocking(cudaStreamNonBlocking);
  DeviceBuffer d(4096);
  PinnedBuffer h(4096);
  CUDA_OK(cudaMemsetAsync(d.p, 1, 4096, blocking));
  CUDA_OK(cudaMemcpyAsync(h.p, d.p, 4096, cudaMemcpyDeviceToHost, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  expect_silent();

  CUDA_OK(dbl().stream_pause(nonblocking));  // Note [Planted races]
  CUDA_OK(cudaMemsetAsync(d.p, 1, 4096, nonblocking));
  CUDA_OK(cudaMemcpyAsync(h.p, d.p, 4096, cudaMemcpyDeviceToHost, nullptr));
  CUDA_OK(cudaStreamSynchronize(nullptr));
  CUDA_OK(dbl().stream_resume(nonblocking));
  CUDA_OK(cudaDeviceSynchronize());
  expect_one_race("read by cudaMemcpyAsync on the legacy default stream",
                  "write by cudaMemsetAsync on stream #");
}

TEST_F(Checker, PageableAsyncCopyIsSynchronous) {
  StreamOwner s;
  DeviceBuffer d(4096);
  std::vector<unsigned char> pageable(4096, 9);
  CUDA_OK(cudaMemcpyAsync(d.p, pageable.data(), 4096, cudaMemcpyHostToDevice, s));
  dbl().host_access(pageable.data(), 4096, 1);  // the copy already read it
  CUDA_OK(cudaMemcpyAsync(pageable.data(), d.p, 4096, cudaMemcpyDeviceToHost, s));
  dbl().host_access(pageable.data(), 4096, 0);
  EXPECT_EQ(pageable[4095], 9);
  CUDA_OK(cudaMemcpy(pageable.data(), d.p, 4096, cudaMemcpyDeviceToHost));
  dbl().host_access(pageable.data(), 4096, 0);
  expect_silent();
}

TEST_F(Checker, DisjointRangesAndReadsDoNotConflict) {
  StreamOwner a, b;
  DeviceBuffer d(4096);
  write_compute(a, d.p, 2048, "left");
  write_compute(b, d.get() + 2048, 2048, "right");
  CUDA_OK(cudaDeviceSynchronize());
  read_compute(a, d.p, 4096, "reader a");
  read_compute(b, d.p, 4096, "reader b");
  CUDA_OK(cudaDeviceSynchronize());
  expect_silent();
}

// Long runs stay fast: history is pruned as the host synchronizes and subsumed on reuse.
TEST_F(Checker, HistoryStaysBounded) {
  StreamOwner a, b;
  EventOwner produced, consumed;
  DeviceBuffer d(1024 * 4096);
  for (int i = 0; i < 3000; ++i) {
    // Slots are reused every 1024 iterations: the producer must wait for the consumer.
    const size_t off = static_cast<size_t>(i % 1024) * 4096;
    write_compute(a, d.get() + off, 4096, "produce");
    CUDA_OK(cudaEventRecord(produced, a));
    CUDA_OK(cudaStreamWaitEvent(b, produced, 0));
    read_compute(b, d.get() + off, 4096, "consume");
    CUDA_OK(cudaEventRecord(consumed, b));
    CUDA_OK(cudaStreamWaitEvent(a, consumed, 0));
    if (i % 500 == 499) CUDA_OK(cudaDeviceSynchronize());
  }
  CUDA_OK(cudaDeviceSynchronize());
  expect_silent();
}

}  // namespace
}  // namespace stash::test
