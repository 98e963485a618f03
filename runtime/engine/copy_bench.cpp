// copy_bench.cpp: Note [What the copy benchmark compares] (copy_bench.h).
#include "copy_bench.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>

#include "cuda_prim.h"
#include "device_pool.h"
#include "prefetch_engine.h"

namespace stash::engine {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Owns plain cudaMalloc / cudaHostAlloc buffers for the baseline.
struct plain_buffers {
  std::vector<void*> device, host;
  ~plain_buffers() {
    for (void* p : device) prim::device_free(p);
    for (void* p : host) prim::host_free(p);
  }
};

prim::event_owner make_event() { return prim::make_event(/*timing=*/true); }

float elapsed(const prim::event_owner& from, const prim::event_owner& to) {
  STASH_CUDA_TRY(prim::event_synchronize(to.get()));
  float ms = 0;
  STASH_CUDA_TRY(prim::event_elapsed(&ms, from.get(), to.get()));
  return ms;
}

void check(status s) {
  if (s != status::ok) throw_last_error(s);
}

double gbps(std::size_t bytes, float ms) { return ms > 0 ? bytes / (ms * 1e6) : 0.0; }

struct round_rates {
  double d2h = 0, h2d = 0;
};

round_rates plain_round(const std::vector<std::size_t>& sizes, std::size_t total,
                        const plain_buffers& buf, cudaStream_t d2h, cudaStream_t h2d) {
  prim::event_owner a = make_event(), b = make_event(), c = make_event(), d = make_event();
  STASH_CUDA_TRY(prim::event_record(a.get(), d2h));
  for (std::size_t i = 0; i < sizes.size(); ++i)
    STASH_CUDA_TRY(prim::copy_d2h(buf.host[i], buf.device[i], sizes[i], d2h));
  STASH_CUDA_TRY(prim::event_record(b.get(), d2h));
  const float d2h_ms = elapsed(a, b);
  STASH_CUDA_TRY(prim::event_record(c.get(), h2d));
  for (std::size_t i = 0; i < sizes.size(); ++i)
    STASH_CUDA_TRY(prim::copy_h2d(buf.device[i], buf.host[i], sizes[i], h2d));
  STASH_CUDA_TRY(prim::event_record(d.get(), h2d));
  const float h2d_ms = elapsed(c, d);
  return {gbps(total, d2h_ms), gbps(total, h2d_ms)};
}

round_rates engine_round(const std::vector<std::size_t>& sizes, std::size_t total,
                         prefetch_engine& engine, device_pool& pool, cudaStream_t compute) {
  const auto n = static_cast<std::uint32_t>(sizes.size());
  std::vector<void*> blocks(n, nullptr);
  for (std::uint32_t i = 0; i < n; ++i) check(pool.allocate(sizes[i], compute, &blocks[i]));
  // The pool's blocks are the compute stream's; make sure their allocation is behind us.
  STASH_CUDA_TRY(prim::stream_synchronize(compute));

  prim::event_owner a = make_event(), b = make_event(), c = make_event(), d = make_event();
  STASH_CUDA_TRY(prim::event_record(a.get(), compute));
  for (std::uint32_t i = 0; i < n; ++i) {
    check(engine.forward_begin(0, i));
    check(engine.offload({0, i, 0}, blocks[i], sizes[i], compute));
    check(engine.forward_end(0, i));
  }
  STASH_CUDA_TRY(prim::event_record(b.get(), engine.d2h_stream()));
  const float d2h_ms = elapsed(a, b);

  STASH_CUDA_TRY(prim::event_record(c.get(), compute));
  for (std::uint32_t i = n; i-- > 0;) {
    check(engine.backward_begin(0, i));
    void* p = nullptr;
    check(engine.acquire({0, i, 0}, compute, &p));
    if (i == 0) STASH_CUDA_TRY(prim::event_record(d.get(), engine.h2d_stream()));
    check(engine.release({0, i, 0}));
    check(engine.backward_end(0, i));
  }
  const float h2d_ms = elapsed(c, d);
  check(engine.synchronize());
  STASH_CUDA_TRY(prim::stream_synchronize(compute));
  return {gbps(total, d2h_ms), gbps(total, h2d_ms)};
}

}  // namespace

std::vector<std::size_t> default_copy_mix() {
  std::vector<std::size_t> mix;
  for (int rep = 0; rep < 2; ++rep)
    for (std::size_t mib : {1, 4, 16, 64, 256}) mix.push_back(mib * kMiB);
  return mix;
}

copy_bench_result run_copy_bench(const copy_bench_options& options) {
  const std::vector<std::size_t> sizes =
      options.sizes.empty() ? default_copy_mix() : options.sizes;
  if (std::find(sizes.begin(), sizes.end(), std::size_t{0}) != sizes.end())
    throw error(status::invalid_argument, "a tensor size is 0");
  if (options.samples < 1 || options.warmups < 0)
    throw error(status::invalid_argument,
                "samples must be >= 1 and warmups >= 0");
  copy_bench_result r;
  r.tensors = sizes.size();
  r.bytes = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
  r.samples = options.samples;
  r.warmups = options.warmups;
  const std::size_t largest = *std::max_element(sizes.begin(), sizes.end());

  // Baseline buffers.
  plain_buffers buf;
  for (std::size_t s : sizes) {
    void* d = nullptr;
    void* h = nullptr;
    STASH_CUDA_TRY(prim::device_alloc(&d, s));
    buf.device.push_back(d);
    STASH_CUDA_TRY(prim::host_alloc(&h, s));
    buf.host.push_back(h);
  }
  prim::stream_owner plain_d2h = prim::make_stream(), plain_h2d = prim::make_stream(),
                     compute = prim::make_stream();

  // The engine, as training configures it, with room for the whole mix in flight.
  device_pool_config dc;
  device_pool pool(dc);
  engine_config ec;
  ec.compute = compute.get();
  ec.pool = &pool;
  ec.pinned.cap_bytes = r.bytes + sizes.size() * ec.pinned.alignment + 64 * kMiB;
  ec.pinned.slab_bytes = std::max(largest, ec.pinned.growth_bytes);
  ec.pinned.report_progress = false;
  prefetch_engine engine(ec);
  std::vector<std::size_t> per(sizes.size(), 1);
  std::vector<tensor_action> actions(sizes.size(), tensor_action::offload);
  check(engine.set_plan(engine_plan::from_actions(per.size(), per.data(), actions.data())));

  std::vector<double> pd, ph, ed, eh;
  for (int round = 0; round < options.warmups + options.samples; ++round) {
    // Alternate which side goes first, so neither always runs on a warmer link.
    const bool plain_first = round % 2 == 0;
    round_rates p, e;
    if (plain_first) p = plain_round(sizes, r.bytes, buf, plain_d2h.get(), plain_h2d.get());
    e = engine_round(sizes, r.bytes, engine, pool, compute.get());
    if (!plain_first) p = plain_round(sizes, r.bytes, buf, plain_d2h.get(), plain_h2d.get());
    if (round < options.warmups) continue;
    pd.push_back(p.d2h);
    ph.push_back(p.h2d);
    ed.push_back(e.d2h);
    eh.push_back(e.h2d);
  }
  r.plain_d2h = stash::summarize_rates(pd);
  r.plain_h2d = stash::summarize_rates(ph);
  r.engine_d2h = stash::summarize_rates(ed);
  r.engine_h2d = stash::summarize_rates(eh);
  r.ratio_d2h = r.plain_d2h.median_gbps > 0 ? r.engine_d2h.median_gbps / r.plain_d2h.median_gbps : 0;
  r.ratio_h2d = r.plain_h2d.median_gbps > 0 ? r.engine_h2d.median_gbps / r.plain_h2d.median_gbps : 0;
  return r;
}

std::string format_copy_table(const copy_bench_result& r) {
  char line[256];
  std::string out;
  std::snprintf(line, sizeof line,
                "copy bench: %zu tensors, %.1f MiB per direction, median of %d (after %d "
                "warm-up)\n",
                r.tensors, r.bytes / double(kMiB), r.samples, r.warmups);
  out += line;
  out += "  direction  plain cudaMemcpyAsync GB/s   engine GB/s   engine/plain\n";
  auto row = [&](const char* dir, const stash::rate_summary& p, const stash::rate_summary& e,
                 double ratio) {
    std::snprintf(line, sizeof line, "  %-9s  %8.2f [%.2f..%.2f]   %8.2f [%.2f..%.2f]   %.4f\n",
                  dir, p.median_gbps, p.min_gbps, p.max_gbps, e.median_gbps, e.min_gbps,
                  e.max_gbps, ratio);
    out += line;
  };
  row("d2h", r.plain_d2h, r.engine_d2h, r.ratio_d2h);
  row("h2d", r.plain_h2d, r.engine_h2d, r.ratio_h2d);
  // Issue 7's target for the engine's copies, judged from this run.
  const bool ok = r.ratio_d2h >= 0.95 && r.ratio_h2d >= 0.95;
  std::snprintf(line, sizeof line,
                "target: the engine's bandwidth >= 95%% of plain in both directions: %s\n",
                ok ? "PASS" : "FAIL");
  out += line;
  return out;
}

nlohmann::json copy_bench_to_json(const copy_bench_result& r) {
  auto rate = [](const stash::rate_summary& x) {
    return nlohmann::json{{"median_gbps", x.median_gbps}, {"min_gbps", x.min_gbps},
                          {"max_gbps", x.max_gbps}};
  };
  return {{"tensors", r.tensors},
          {"bytes_per_direction", r.bytes},
          {"samples", r.samples},
          {"warmups", r.warmups},
          {"plain", {{"d2h", rate(r.plain_d2h)}, {"h2d", rate(r.plain_h2d)}}},
          {"engine", {{"d2h", rate(r.engine_d2h)}, {"h2d", rate(r.engine_h2d)}}},
          {"ratio", {{"d2h", r.ratio_d2h}, {"h2d", r.ratio_h2d}}}};
}

}  // namespace stash::engine
