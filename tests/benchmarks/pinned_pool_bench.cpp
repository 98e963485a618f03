// Benchmarks of the pinned pool (run on the CPU test double of libcudart, whose
// cudaHostAlloc is an mmap that touches no page, so multi-GiB traces cost no memory):
//
//  BM_PinnedAllocFree/<bytes>[/<holes>]: alloc + free of one block, the pool's own work
//    only: capacity is reserved up front, so no cudaHostAlloc runs in the loop. Reports
//    the median of per-pair latencies (median_ns, measured with steady_clock around each
//    pair, so it includes one clock read) next to Google Benchmark's mean. /holes: the
//    pool first holds that many live blocks with free holes between them, so best fit
//    searches a populated index.
//  BM_ChurnTrace/<trace>: replays a seeded trace of allocations with mixed sizes and
//    lifetimes through stash's pinned pool (growing on demand) and through a model of a
//    power-of-two size-class pool (PyTorch CachingHostAllocator: round up to the next
//    power of two, cache per class, never split), and reports peak reserved ÷ peak live
//    bytes for both. trace 0: sizes log-uniform in 64 KiB..512 MiB; trace 1: the odd
//    tensor sizes of a transformer layer, offloaded layer after layer. growth_MiB is the
//    pool's growth_bytes (default 32). single_heap_ratio: the same trace through one
//    unbounded best-fit heap, the bound for any best fit that cannot move blocks.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "block_map.h"
#include "pinned_pool.h"
#include "core/error.h"

namespace {

constexpr size_t KiB = 1024;
constexpr size_t MiB = 1024 * KiB;
constexpr size_t GiB = 1024 * MiB;

void BM_PinnedAllocFree(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const int holes = static_cast<int>(state.range(1));
  stash::pinned_pool_config c;
  c.cap_bytes = 1 * GiB;
  c.slab_bytes = 512 * MiB;
  c.reserve_bytes = 1 * GiB;  // everything pinned before the loop
  c.report_progress = false;
  stash::pinned_pool pool(c);
  std::vector<void*> live;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2 * holes; ++i) {
    void* p = nullptr;
    if (pool.allocate(4 * KiB + rng() % (64 * KiB), &p) != stash::status::ok) break;
    live.push_back(p);
  }
  for (size_t i = 0; i < live.size(); i += 2) pool.deallocate(live[i], nullptr, 0);
  std::vector<uint32_t> samples;
  samples.reserve(1 << 22);
  using clock = std::chrono::steady_clock;
  for (auto _ : state) {
    const auto t0 = clock::now();
    void* p = nullptr;
    if (pool.allocate(bytes, &p) != stash::status::ok) {
      state.SkipWithError(stash::last_error());
      break;
    }
    pool.deallocate(p, nullptr, 0);
    const auto t1 = clock::now();
    benchmark::DoNotOptimize(p);
    if (samples.size() < samples.capacity()) {
      samples.push_back(static_cast<uint32_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
    }
  }
  if (!samples.empty()) {
    auto mid = samples.begin() + static_cast<ptrdiff_t>(samples.size() / 2);
    std::nth_element(samples.begin(), mid, samples.end());
    state.counters["median_ns"] = *mid;
  }
  const stash::pool_stats s = pool.stats();
  state.counters["slabs"] = static_cast<double>(s.slab_count);
  if (s.reserved_bytes != 1 * GiB) state.SkipWithError("the pool grew inside the loop");
  for (size_t i = 1; i < live.size(); i += 2) pool.deallocate(live[i], nullptr, 0);
}
BENCHMARK(BM_PinnedAllocFree)
    ->ArgsProduct({{4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB}, {0}})
    ->ArgsProduct({{4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB}, {1000}})
    ->ArgNames({"bytes", "holes"});

// One allocation of a trace: its size, and the step after which it is freed.
struct trace_event {
  size_t bytes;
  size_t free_at;
};

std::vector<trace_event> make_trace(int kind, size_t steps) {
  std::mt19937_64 rng(2024);
  std::vector<trace_event> t;
  t.reserve(steps);
  if (kind == 0) {
    // Log-uniform sizes 64 KiB..512 MiB; 70% short-lived (1..8 steps), 30% long-lived
    // (50..400 steps).
    std::uniform_real_distribution<double> log_size(std::log(64.0 * KiB), std::log(512.0 * MiB));
    for (size_t i = 0; i < steps; ++i) {
      const size_t bytes = static_cast<size_t>(std::exp(log_size(rng)));
      const size_t life = rng() % 10 < 7 ? 1 + rng() % 8 : 50 + rng() % 351;
      t.push_back({bytes, i + life});
    }
  } else {
    // A transformer layer's saved activations (batch 8 × seq 2048 × hidden 4096 and
    // kin, bf16), offloaded in forward and freed in backward in reverse layer order;
    // 32 layers per step, then the next step.
    const size_t tensor_bytes[] = {135'790'592, 33'554'432, 48'234'496, 129'500'000,
                                   8'388'608,   67'108'864, 2'097'152,  201'326'592};
    const size_t per_layer = sizeof tensor_bytes / sizeof tensor_bytes[0];
    const size_t layers = 32;
    for (size_t i = 0; i < steps; ++i) {
      const size_t in_step = i % (layers * per_layer);
      const size_t step_start = i - in_step;
      const size_t layer = in_step / per_layer;
      // Freed during backward: layer L's tensors go when backward reaches layer L.
      const size_t free_at = step_start + layers * per_layer + (layers - 1 - layer) * per_layer / 4;
      t.push_back({tensor_bytes[in_step % per_layer] + (rng() % 4) * 4096, free_at});
    }
  }
  return t;
}

// PyTorch CachingHostAllocator's policy, bytes only.
class pow2_pool_model {
 public:
  size_t allocate(size_t bytes) {
    size_t cls = 1;
    while (cls < bytes) cls <<= 1;
    size_t& cached = free_[cls];
    if (cached > 0) {
      --cached;
    } else {
      reserved_ += cls;
      peak_reserved_ = std::max(peak_reserved_, reserved_);
    }
    return cls;
  }
  void deallocate(size_t cls) { ++free_[cls]; }
  size_t peak_reserved() const { return peak_reserved_; }

 private:
  std::map<size_t, size_t> free_;
  size_t reserved_ = 0, peak_reserved_ = 0;
};

// The same trace through one unbounded best-fit heap (a block_map over a single fake
// slab): its address high-water mark over peak live bytes is what best fit without slab
// boundaries would need, a lower bound for any non-moving best-fit pool on the trace.
double single_heap_bound(const std::vector<trace_event>& trace) {
  stash::block_map heap(4096, 1024);
  const uintptr_t base = uintptr_t{1} << 40;
  heap.add_slab(reinterpret_cast<void*>(base), 1024 * GiB, 0, false);
  std::vector<std::pair<size_t, void*>> live;
  size_t live_bytes = 0, peak_live = 0;
  uintptr_t high = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    for (size_t k = 0; k < live.size();) {
      if (trace[live[k].first].free_at <= i) {
        heap.release(live[k].second);
        live_bytes -= trace[live[k].first].bytes;
        live[k] = live.back();
        live.pop_back();
      } else {
        ++k;
      }
    }
    const size_t r = heap.round_up(trace[i].bytes);
    void* p = heap.allocate(r, 0, trace[i].bytes);
    high = std::max(high, reinterpret_cast<uintptr_t>(p) + r - base);
    live.push_back({i, p});
    live_bytes += trace[i].bytes;
    peak_live = std::max(peak_live, live_bytes);
  }
  return static_cast<double>(high) / static_cast<double>(peak_live);
}

void BM_ChurnTrace(benchmark::State& state) {
  const int kind = static_cast<int>(state.range(0));
  const std::vector<trace_event> trace = make_trace(kind, kind == 0 ? 20000 : 256 * 40);
  double stash_ratio = 0, pow2_ratio = 0, peak_live_gib = 0, stash_peak_gib = 0, pow2_peak_gib = 0;
  for (auto _ : state) {
    stash::pinned_pool_config c;
    c.cap_bytes = 512 * GiB;  // virtual on the double; the cap is not what is measured
    c.growth_bytes = static_cast<size_t>(state.range(1)) * MiB;
    c.report_progress = false;
    stash::pinned_pool pool(c);
    pow2_pool_model pow2;
    struct live_block {
      size_t free_at;
      void* p;
      size_t cls;
      size_t bytes;
    };
    std::vector<live_block> live;
    size_t live_bytes = 0, peak_live = 0;
    for (size_t i = 0; i < trace.size(); ++i) {
      // Frees due at this step first, like a program that frees before it allocates.
      for (size_t k = 0; k < live.size();) {
        if (live[k].free_at <= i) {
          pool.deallocate(live[k].p, nullptr, 0);
          pow2.deallocate(live[k].cls);
          live_bytes -= live[k].bytes;
          live[k] = live.back();
          live.pop_back();
        } else {
          ++k;
        }
      }
      void* p = nullptr;
      if (pool.allocate(trace[i].bytes, &p) != stash::status::ok) {
        state.SkipWithError(stash::last_error());
        return;
      }
      live.push_back({trace[i].free_at, p, pow2.allocate(trace[i].bytes), trace[i].bytes});
      live_bytes += trace[i].bytes;
      peak_live = std::max(peak_live, live_bytes);
    }
    for (const live_block& b : live) pool.deallocate(b.p, nullptr, 0);
    const stash::pool_stats s = pool.stats();
    peak_live_gib = static_cast<double>(peak_live) / GiB;
    stash_peak_gib = static_cast<double>(s.peak_reserved_bytes) / GiB;
    pow2_peak_gib = static_cast<double>(pow2.peak_reserved()) / GiB;
    stash_ratio = static_cast<double>(s.peak_reserved_bytes) / static_cast<double>(peak_live);
    pow2_ratio = static_cast<double>(pow2.peak_reserved()) / static_cast<double>(peak_live);
  }
  state.counters["peak_live_GiB"] = peak_live_gib;
  state.counters["stash_peak_reserved_GiB"] = stash_peak_gib;
  state.counters["pow2_peak_reserved_GiB"] = pow2_peak_gib;
  state.counters["stash_ratio"] = stash_ratio;
  state.counters["pow2_ratio"] = pow2_ratio;
  state.counters["single_heap_ratio"] = single_heap_bound(trace);
}
BENCHMARK(BM_ChurnTrace)
    ->ArgsProduct({{0, 1}, {2, 32, 1024}})
    ->ArgNames({"trace", "growth_MiB"})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
