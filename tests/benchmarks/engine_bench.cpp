// engine_bench: CPU cost of the offload submit path (prefetch_engine::offload), per tensor.
//
// Run on the test double, from the build directory:
//   LD_LIBRARY_PATH=cudart_double tests/benchmarks/runtime_engine_bench
//       --benchmark_repetitions=10 --benchmark_report_aggregates_only=true
// The engine's copy stream is paused while a batch of 64 offloads is submitted, so the
// figure is the submit path only (stash's bookkeeping plus the runtime calls it makes),
// not copies competing for the CPU. BM_runtime_calls_only makes the same runtime calls
// per tensor without stash: the difference is stash's own work. On a GPU the same binary
// (without LD_LIBRARY_PATH) measures the submit path with the real runtime.
#include <chrono>
#include <memory>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include "device_pool.h"
#include "prefetch_engine.h"

namespace {

using namespace stash;
using namespace stash::engine;

constexpr uint32_t kBatch = 64;
constexpr size_t kBytes = 64 << 10;

using pause_fn = cudaError_t (*)(cudaStream_t);
pause_fn double_fn(const char* name) {
  return reinterpret_cast<pause_fn>(dlsym(RTLD_DEFAULT, name));
}

void BM_offload_submit(benchmark::State& state) {
  cudaStream_t compute;
  cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
  device_pool pool{device_pool_config{}};
  engine_config c;
  c.compute = compute;
  c.pool = &pool;
  c.timing = state.range(0) != 0;
  c.pinned.cap_bytes = size_t{256} << 20;
  c.pinned.reserve_bytes = size_t{64} << 20;
  c.pinned.numa_placement = false;
  prefetch_engine e(c);
  std::vector<size_t> per = {kBatch, 0};
  std::vector<tensor_action> actions(kBatch, tensor_action::offload);
  if (e.set_plan(engine_plan::from_actions(2, per.data(), actions.data())) != status::ok) {
    state.SkipWithError(last_error());
    return;
  }
  const pause_fn pause = double_fn("stashdbl_stream_pause");
  const pause_fn resume = double_fn("stashdbl_stream_resume");
  std::vector<void*> blocks(kBatch);
  uint32_t step = 0;
  for (auto _ : state) {
    for (auto& b : blocks) pool.allocate(kBytes, compute, &b);
    e.forward_begin(step, 0);
    if (pause) pause(e.d2h_stream());
    const auto t0 = std::chrono::steady_clock::now();
    for (uint32_t j = 0; j < kBatch; ++j) {
      if (e.offload({step, 0, j}, blocks[j], kBytes, compute) != status::ok) {
        state.SkipWithError(last_error());
        break;
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count() / kBatch);
    if (resume) resume(e.d2h_stream());
    e.forward_end(step, 0);
    e.backward_begin(step, 1);
    e.backward_end(step, 1);
    e.backward_begin(step, 0);
    for (uint32_t j = 0; j < kBatch; ++j) e.release({step, 0, j});
    e.backward_end(step, 0);
    e.synchronize();
    ++step;
  }
  state.counters["tensors"] = static_cast<double>(state.iterations() * kBatch);
}
BENCHMARK(BM_offload_submit)->Arg(0)->Arg(1)->ArgName("timing")->UseManualTime()
    ->Iterations(200)->Unit(benchmark::kMicrosecond);

// The runtime calls the submit path makes per tensor with timing off, without stash:
// producer event, stream wait, copy, done event, layer event, the device pool's guard
// event, and the event queries of the engine's, the device pool's and the pinned pool's
// non-blocking completion checks.
void BM_runtime_calls_only(benchmark::State& state) {
  cudaStream_t compute, d2h;
  cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&d2h, cudaStreamNonBlocking);
  void *dev = nullptr, *host = nullptr;
  cudaMalloc(&dev, kBytes);
  cudaHostAlloc(&host, kBytes, 0);
  cudaEvent_t ev[5];
  for (auto& e : ev) cudaEventCreate(&e);
  const pause_fn pause = double_fn("stashdbl_stream_pause");
  const pause_fn resume = double_fn("stashdbl_stream_resume");
  for (auto _ : state) {
    if (pause) pause(d2h);
    const auto t0 = std::chrono::steady_clock::now();
    for (uint32_t j = 0; j < kBatch; ++j) {
      cudaEventRecord(ev[0], compute);
      cudaStreamWaitEvent(d2h, ev[0], 0);
      cudaEventRecord(ev[1], d2h);
      cudaMemcpyAsync(host, dev, kBytes, cudaMemcpyDeviceToHost, d2h);
      cudaEventRecord(ev[2], d2h);
      cudaEventRecord(ev[3], d2h);
      cudaEventRecord(ev[4], d2h);
      cudaEventQuery(ev[2]);
      cudaEventQuery(ev[3]);
      cudaEventQuery(ev[4]);
    }
    const auto t1 = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count() / kBatch);
    if (resume) resume(d2h);
    cudaStreamSynchronize(d2h);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  cudaFreeHost(host);
  cudaFree(dev);
  cudaStreamDestroy(d2h);
  cudaStreamDestroy(compute);
}
BENCHMARK(BM_runtime_calls_only)->UseManualTime()->Iterations(200)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
