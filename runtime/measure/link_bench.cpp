#include "runtime/measure/link_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/bytes.h"
#include "cuda_prim.h"
#include "host_memory.h"
#include "pinned_pool.h"

namespace stash::measure {

size_t link_buffer_bytes(size_t requested, size_t free_bytes) {
  const size_t usable = (free_bytes - free_bytes / 8) / 2;
  const size_t b = std::min(requested, usable) / kMiB * kMiB;
  return b < kMinLinkBytes ? 0 : b;
}

planner::link_profile link_bench_result::link() const {
  planner::link_profile l;
  const double k = sharers;
  // Note [Per-rank link share]
  l.h2d_gbps = sharers > 1 ? shared_h2d.median_gbps / k : h2d.median_gbps;
  l.d2h_gbps = sharers > 1 ? shared_d2h.median_gbps / k : d2h.median_gbps;
  l.bidir_gbps = sharers > 1 ? shared_both.median_gbps / k : both_sum.median_gbps;
  l.local_ranks = local_ranks;
  return l;
}

namespace {

struct lane {
  void* dst;
  const void* src;
  size_t bytes;
  cudaMemcpyKind kind;
};

class copy_timer {
 public:
  explicit copy_timer(size_t max_lanes) : streams_(max_lanes), ends_(max_lanes) {
    for (auto& s : streams_) s = prim::make_stream();
    for (auto& e : ends_) e = prim::make_event(/*timing=*/true);
    start_ = prim::make_event(/*timing=*/true);
  }
  // Copies may still run when an error unwinds the benchmark; the buffers they use are
  // released after this (declared earlier), so wait for them first.
  ~copy_timer() {
    for (auto& s : streams_)
      if (s.get()) (void)prim::stream_synchronize(s.get());
    prim::clear_runtime_error();
  }
  copy_timer(const copy_timer&) = delete;
  copy_timer& operator=(const copy_timer&) = delete;

  // One run: every lane waits for one start event, then copies on its own stream. Returns
  // each lane's milliseconds from the common start to its end.
  std::vector<float> run(const std::vector<lane>& lanes) {
    STASH_CUDA_TRY(prim::event_record(start_.get(), streams_[0].get()));
    for (size_t i = 1; i < lanes.size(); ++i) {
      STASH_CUDA_TRY(prim::stream_wait(streams_[i].get(), start_.get()));
    }
    for (size_t i = 0; i < lanes.size(); ++i) {
      const lane& l = lanes[i];
      STASH_CUDA_TRY(cudaMemcpyAsync(l.dst, l.src, l.bytes, l.kind, streams_[i].get()));
      STASH_CUDA_TRY(prim::event_record(ends_[i].get(), streams_[i].get()));
    }
    std::vector<float> ms(lanes.size());
    for (size_t i = 0; i < lanes.size(); ++i) {
      STASH_CUDA_TRY(prim::event_synchronize(ends_[i].get()));
      STASH_CUDA_TRY(prim::event_elapsed(&ms[i], start_.get(), ends_[i].get()));
    }
    return ms;
  }

 private:
  std::vector<prim::stream_owner> streams_;
  std::vector<prim::event_owner> ends_;
  prim::event_owner start_;
};

double gbps(size_t bytes, double ms) { return ms > 0 ? static_cast<double>(bytes) / (ms * 1e6) : 0; }

// Runs `lanes` warm-up + sample times. per_group[g] collects, per sample, the GB/s of the
// lanes whose group is g (bytes of the group over the slowest lane of the group); the
// aggregate is all bytes over the slowest lane.
struct measured {
  std::vector<stash::rate_summary> groups;
  stash::rate_summary aggregate;
};
measured measure(copy_timer& timer, const std::vector<lane>& lanes, const std::vector<int>& group,
                 int n_groups, const link_bench_options& o) {
  for (int i = 0; i < o.warmups; ++i) (void)timer.run(lanes);
  std::vector<std::vector<double>> per_group(n_groups);
  std::vector<double> aggregate;
  for (int s = 0; s < o.samples; ++s) {
    const std::vector<float> ms = timer.run(lanes);
    size_t total = 0;
    double slowest = 0;
    std::vector<size_t> gbytes(n_groups, 0);
    std::vector<double> gslowest(n_groups, 0);
    for (size_t i = 0; i < lanes.size(); ++i) {
      total += lanes[i].bytes;
      slowest = std::max(slowest, static_cast<double>(ms[i]));
      gbytes[group[i]] += lanes[i].bytes;
      gslowest[group[i]] = std::max(gslowest[group[i]], static_cast<double>(ms[i]));
    }
    for (int g = 0; g < n_groups; ++g) per_group[g].push_back(gbps(gbytes[g], gslowest[g]));
    aggregate.push_back(gbps(total, slowest));
  }
  measured m;
  for (auto& v : per_group) m.groups.push_back(stash::summarize_rates(v));
  m.aggregate = stash::summarize_rates(aggregate);
  return m;
}

}  // namespace

link_bench_result run_link_bench(const link_bench_options& o) {
  if (o.samples < 1) throw stash::input_error("--samples: must be at least 1");
  if (o.warmups < 0) throw stash::input_error("--warmups: must not be negative");
  if (o.sharers < 0) throw stash::input_error("--sharers: must not be negative");
  if (o.bytes < kMinLinkBytes) {
    throw stash::input_error("--bytes: " + stash::format_bytes(o.bytes) +
                               " is below the 64 MiB minimum (Note [Link buffer size])");
  }
  link_bench_result r;
  r.device = o.device;
  r.samples = o.samples;
  r.warmups = o.warmups;
  r.requested_bytes = o.bytes;
  r.local_ranks = parse_local_ranks(std::getenv("LOCAL_WORLD_SIZE"));
  r.sharers = o.sharers > 0 ? o.sharers : r.local_ranks;
  r.pageable = o.pageable;

  STASH_CUDA_TRY(prim::set_device(o.device));
  cudaDeviceProp prop{};
  STASH_CUDA_TRY(cudaGetDeviceProperties(&prop, o.device));
  r.device_name = prop.name;
  size_t free_bytes = 0, total_bytes = 0;
  STASH_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
  r.free_bytes = free_bytes;
  r.buffer_bytes = link_buffer_bytes(o.bytes, free_bytes);
  if (r.buffer_bytes == 0) {
    throw stash::input_error(
        "device " + std::to_string(o.device) + " has " + stash::format_bytes(free_bytes) +
        " free: the two device buffers would be below the 64 MiB minimum (Note [Link buffer "
        "size])");
  }
  const size_t b = r.buffer_bytes;

  // Pinned buffers from the pinned pool: slabs bound to the GPU's NUMA node.
  pinned_pool_config pc;
  pc.device = o.device;
  pc.slab_bytes = std::max(pc.slab_bytes, (b + (2 * kMiB - 1)) / (2 * kMiB) * (2 * kMiB));
  pc.report_progress = false;
  pc.numa_placement = true;
  pinned_pool pool(pc);
  r.numa_node = pool.numa_node() >= 0 ? pool.numa_node() : prim::host_numa_node(o.device);
  struct pinned_block {
    pinned_pool& pool;
    void* p = nullptr;
    ~pinned_block() { (void)pool.deallocate(p, nullptr, 0); }
  };
  pinned_block host_src{pool}, host_dst{pool};
  for (pinned_block* blk : {&host_src, &host_dst}) {
    if (pool.allocate(b, &blk->p) != status::ok) {
      throw error(status::cuda_error, std::string("pinned buffer of ") +
                                          stash::format_bytes(b) + ": " + last_error());
    }
  }
  std::memset(host_src.p, 0x5a, b);
  prim::device_buffer dev_dst, dev_src;
  STASH_CUDA_TRY(prim::device_alloc(dev_dst.out(), b));
  STASH_CUDA_TRY(prim::device_alloc(dev_src.out(), b));

  const size_t k = static_cast<size_t>(std::max(1, r.sharers));
  copy_timer timer(std::max<size_t>(2, 2 * k));
  const lane h2d{dev_dst.get(), host_src.p, b, cudaMemcpyHostToDevice};
  const lane d2h{host_dst.p, dev_src.get(), b, cudaMemcpyDeviceToHost};
  r.h2d = measure(timer, {h2d}, {0}, 1, o).aggregate;
  r.d2h = measure(timer, {d2h}, {0}, 1, o).aggregate;
  const measured both = measure(timer, {h2d, d2h}, {0, 1}, 2, o);
  r.both_h2d = both.groups[0];
  r.both_d2h = both.groups[1];
  r.both_sum = both.aggregate;

  if (k > 1) {
    // Note [Per-rank link share]: k copies of b/k bytes in flight per direction.
    const size_t chunk = b / k;
    std::vector<lane> up, down, mixed;
    std::vector<int> g_up, g_mixed;
    for (size_t i = 0; i < k; ++i) {
      const size_t off = i * chunk;
      up.push_back({static_cast<char*>(dev_dst.get()) + off, static_cast<char*>(host_src.p) + off,
                    chunk, cudaMemcpyHostToDevice});
      down.push_back({static_cast<char*>(host_dst.p) + off, static_cast<char*>(dev_src.get()) + off,
                      chunk, cudaMemcpyDeviceToHost});
      g_up.push_back(0);
    }
    mixed = up;
    mixed.insert(mixed.end(), down.begin(), down.end());
    for (size_t i = 0; i < 2 * k; ++i) g_mixed.push_back(i < k ? 0 : 1);
    r.shared_h2d = measure(timer, up, g_up, 1, o).aggregate;
    r.shared_d2h = measure(timer, down, g_up, 1, o).aggregate;
    r.shared_both = measure(timer, mixed, g_mixed, 2, o).aggregate;
  }

  if (o.pageable) {
    // Pageable copies go through the driver's staging buffer: the contrast that shows
    // why offloaded activations live in pinned memory.
    std::unique_ptr<char[]> pageable(new char[b]);
    std::memset(pageable.get(), 0x3c, b);  // fault the pages in before timing
    r.pageable_h2d =
        measure(timer, {{dev_dst.get(), pageable.get(), b, cudaMemcpyHostToDevice}}, {0}, 1, o)
            .aggregate;
    r.pageable_d2h =
        measure(timer, {{pageable.get(), dev_src.get(), b, cudaMemcpyDeviceToHost}}, {0}, 1, o)
            .aggregate;
  }
  return r;
}

namespace {
std::string row(const char* name, const stash::rate_summary& x) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "  %-30s %9.2f %9.2f %9.2f\n", name, x.median_gbps, x.min_gbps,
                x.max_gbps);
  return buf;
}
// Event timers resolve ~0.5 us; digits past 1e-4 GB/s are float noise in the file.
double tidy(double gbps) { return std::round(gbps * 1e4) / 1e4; }
nlohmann::json rate_json(const stash::rate_summary& x) {
  return {{"median_gbps", tidy(x.median_gbps)}, {"min_gbps", tidy(x.min_gbps)},
          {"max_gbps", tidy(x.max_gbps)}};
}
}  // namespace

std::string format_link_table(const link_bench_result& r) {
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof buf, "link: %s (device %d), pinned buffers on NUMA node %s\n",
                r.device_name.c_str(), r.device,
                r.numa_node >= 0 ? std::to_string(r.numa_node).c_str() : "(single node / unknown)");
  s += buf;
  std::snprintf(buf, sizeof buf,
                "buffer %s (asked %s, %s free), %d warm-ups, median of %d samples; GB/s = 1e9 B/s\n\n",
                stash::format_bytes(r.buffer_bytes).c_str(),
                stash::format_bytes(r.requested_bytes).c_str(),
                stash::format_bytes(r.free_bytes).c_str(), r.warmups, r.samples);
  s += buf;
  std::snprintf(buf, sizeof buf, "  %-30s %9s %9s %9s\n", "copy (GB/s)", "median", "min", "max");
  s += buf;
  s += row("pinned H2D", r.h2d);
  s += row("pinned D2H", r.d2h);
  s += row("both at once: H2D", r.both_h2d);
  s += row("both at once: D2H", r.both_d2h);
  s += row("both at once: aggregate", r.both_sum);
  if (r.sharers > 1) {
    const std::string k = std::to_string(r.sharers);
    s += row((k + " copies at once: H2D aggregate").c_str(), r.shared_h2d);
    s += row((k + " copies at once: D2H aggregate").c_str(), r.shared_d2h);
    s += row((k + "+" + k + " copies: both aggregate").c_str(), r.shared_both);
  }
  if (r.pageable) {
    s += row("pageable H2D", r.pageable_h2d);
    s += row("pageable D2H", r.pageable_d2h);
  }
  const planner::link_profile l = r.link();
  std::snprintf(buf, sizeof buf,
                "\nper rank (%d rank%s sharing the link, Note [Per-rank link share]): h2d %.2f, "
                "d2h %.2f, both %.2f GB/s\n",
                r.sharers, r.sharers == 1 ? "" : "s", l.h2d_gbps, l.d2h_gbps, l.bidir_gbps);
  s += buf;
  return s;
}

nlohmann::json link_bench_to_json(const link_bench_result& r) {
  const planner::link_profile l = r.link();
  nlohmann::json bench{{"device", r.device},
                       {"device_name", r.device_name},
                       {"numa_node", r.numa_node},
                       {"requested_bytes", r.requested_bytes},
                       {"buffer_bytes", r.buffer_bytes},
                       {"free_bytes", r.free_bytes},
                       {"samples", r.samples},
                       {"warmups", r.warmups},
                       {"sharers", r.sharers},
                       {"pinned_h2d", rate_json(r.h2d)},
                       {"pinned_d2h", rate_json(r.d2h)},
                       {"both_h2d", rate_json(r.both_h2d)},
                       {"both_d2h", rate_json(r.both_d2h)},
                       {"both_aggregate", rate_json(r.both_sum)}};
  if (r.sharers > 1) {
    bench["shared_h2d_aggregate"] = rate_json(r.shared_h2d);
    bench["shared_d2h_aggregate"] = rate_json(r.shared_d2h);
    bench["shared_both_aggregate"] = rate_json(r.shared_both);
  }
  if (r.pageable) {
    bench["pageable_h2d"] = rate_json(r.pageable_h2d);
    bench["pageable_d2h"] = rate_json(r.pageable_d2h);
  }
  return {{"link",
           {{"h2d_gbps", tidy(l.h2d_gbps)},
            {"d2h_gbps", tidy(l.d2h_gbps)},
            {"bidir_gbps", tidy(l.bidir_gbps)},
            {"local_ranks", static_cast<std::uint64_t>(l.local_ranks)}}},
          {"link_bench", std::move(bench)}};
}

}  // namespace stash::measure
