// plan_fixtures.h: synthetic profiles, seeded and hand-built, for the planner's tests, the
// CLI tests (tests/cli) and the solve benchmark (tests/benchmarks).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "planner/model/analytic.h"
#include "planner/model/plan.h"

namespace stash::planner::testing {

inline constexpr std::uint64_t kMiB = 1048576;
// 1 MiB per ms, so copy times in hand-built cases are MiB counts.
inline constexpr double kMiBPerMsGbps = kMiB / 1e6;

// A hand-built profile: one layer per entry of fwd/bwd (ms), no tensors yet, a link of
// 1 MiB/ms each way (2 both ways), 1 TiB of device and pinnable memory, no fixed bytes.
inline step_profile hand_profile(std::vector<double> fwd, std::vector<double> bwd) {
  step_profile p;
  p.device_name = "test";
  p.device_memory_bytes = 1ull << 40;
  p.link = {kMiBPerMsGbps, kMiBPerMsGbps, 2 * kMiBPerMsGbps, 1};
  p.pinnable_bytes = 1ull << 40;
  p.fixed_bytes = 0;
  for (std::size_t i = 0; i < fwd.size(); ++i) {
    layer_profile l;
    l.name = "layers." + std::to_string(i);
    l.signature = "block";
    l.fwd_ms = fwd[i];
    l.bwd_ms = bwd[i];
    p.layers.push_back(l);
  }
  return p;
}

// Appends a saved tensor to a hand-built profile's layer.
inline void add_tensor(step_profile& p, std::size_t layer, const std::string& name,
                       std::uint64_t bytes, double recompute_ms = 0.1) {
  tensor_profile t;
  t.name = name;
  t.bytes = bytes;
  t.recompute_ms = recompute_ms;
  p.layers[layer].tensors.push_back(t);
}

// A llama3-8b-like block (bf16, seq 2048, `batch` sequences per micro-batch) with about
// 20 saved tensors whose sizes and recompute times are jittered by the seed. Layer 0's
// input is the embedding output; every layer's input is listed as not recomputable.
inline step_profile llama_like(std::size_t layers, std::uint32_t seed, int batch = 2) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> jitter(0.85, 1.15);
  struct proto {
    const char* name;
    double mib;  // per sequence
    double ms;   // recompute per sequence
    bool recomputable, offloadable, must_keep;
  };
  static const proto kTensors[] = {
      {"input", 16, 0, false, true, false},         {"attn_norm", 16, 0.006, true, true, false},
      {"attn_norm_rstd", 0.008, 0.001, true, false, false},
      {"q_proj", 16, 0.050, true, true, false},     {"k_proj", 4, 0.013, true, true, false},
      {"v_proj", 4, 0.013, true, true, false},      {"q_rope", 16, 0.005, true, true, false},
      {"k_rope", 4, 0.002, true, true, false},      {"attn_out", 16, 0.180, true, true, false},
      {"attn_lse", 0.25, 0.0, false, true, true},   {"o_proj", 16, 0.050, true, true, false},
      {"attn_resid", 16, 0.003, true, true, false}, {"ffn_norm", 16, 0.006, true, true, false},
      {"ffn_norm_rstd", 0.008, 0.001, true, false, false},
      {"gate_proj", 56, 0.170, true, true, false},  {"up_proj", 56, 0.170, true, true, false},
      {"silu", 56, 0.010, true, true, false},       {"silu_mul", 56, 0.010, true, true, false},
      {"down_proj", 16, 0.170, true, true, false},  {"rng_state", 0.001, 0.0, false, false, true},
  };
  step_profile p;
  p.source = profile_source::analytic;
  p.device_name = "synthetic H100";
  p.device_memory_bytes = 80ull << 30;
  p.link = {55.0, 55.0, 100.0, 1};
  p.pinnable_bytes = 512ull << 30;
  p.fixed_bytes = 20ull << 30;
  for (std::size_t i = 0; i < layers; ++i) {
    layer_profile l;
    l.name = "layers." + std::to_string(i);
    l.signature = "llama_block";
    l.fwd_ms = 0.95 * batch;
    l.bwd_ms = 1.95 * batch;
    l.bwd_temp_bytes = static_cast<std::uint64_t>(128 * kMiB * batch);
    for (const proto& t : kTensors) {
      tensor_profile tp;
      tp.name = t.name;
      tp.bytes = static_cast<std::uint64_t>(t.mib * kMiB * batch);
      tp.recompute_ms = t.ms * batch;
      tp.recomputable = t.recomputable;
      tp.offloadable = t.offloadable;
      tp.must_keep = t.must_keep;
      l.tensors.push_back(tp);
    }
    p.layers.push_back(std::move(l));
  }
  // Jitter per tensor kind, shared by every layer, so the signature really is shared
  // (the inner solver stamps one answer on all of them).
  for (std::size_t j = 0; j < p.layers[0].tensors.size(); ++j) {
    const double s = jitter(rng), c = jitter(rng);
    for (auto& l : p.layers) {
      l.tensors[j].bytes = static_cast<std::uint64_t>(static_cast<double>(l.tensors[j].bytes) * s);
      l.tensors[j].recompute_ms *= c;
    }
  }
  return p;
}

// A small random profile: 1..max_layers layers of 1..max_tensors tensors with random
// flags, sizes around the 1 MiB floor and up, random link and a sometimes-binding host cap.
inline step_profile random_profile(std::mt19937& rng, int max_layers, int max_tensors) {
  std::uniform_int_distribution<int> nl(1, max_layers), nt(1, max_tensors);
  std::uniform_real_distribution<double> u(0, 1);
  step_profile p;
  p.source = profile_source::measured;
  p.device_name = "random";
  p.link.d2h_gbps = 5 + 50 * u(rng);
  p.link.h2d_gbps = 5 + 50 * u(rng);
  p.link.bidir_gbps = p.link.d2h_gbps + p.link.h2d_gbps;
  p.fixed_bytes = static_cast<std::uint64_t>(u(rng) * 64 * kMiB);
  const int L = nl(rng);
  std::uint64_t total = 0;
  for (int i = 0; i < L; ++i) {
    layer_profile l;
    l.name = "l" + std::to_string(i);
    l.signature = u(rng) < 0.5 ? "a" : "b";
    l.fwd_ms = 0.05 + u(rng);
    l.bwd_ms = 0.1 + 2 * u(rng);
    l.bwd_temp_bytes = u(rng) < 0.5 ? 0 : static_cast<std::uint64_t>(u(rng) * 32 * kMiB);
    const int T = nt(rng);
    for (int j = 0; j < T; ++j) {
      tensor_profile t;
      t.name = "t" + std::to_string(j);
      const double r = u(rng);
      t.bytes = r < 0.15 ? static_cast<std::uint64_t>(u(rng) * kMiB)  // below the floor
                         : static_cast<std::uint64_t>((1 + 63 * u(rng)) * kMiB);
      t.recompute_ms = u(rng) * 0.5;
      t.recomputable = u(rng) < 0.8;
      t.offloadable = u(rng) < 0.8;
      t.must_keep = u(rng) < 0.1;
      total += t.bytes;
      l.tensors.push_back(t);
    }
    p.layers.push_back(std::move(l));
  }
  p.pinnable_bytes = u(rng) < 0.3 ? static_cast<std::uint64_t>(u(rng) * total) : total * 2;
  p.device_memory_bytes = p.fixed_bytes + 2 * total + (1ull << 30);
  return p;
}

// Every tensor's allowed actions enumerated: the best valid decisions by brute force.
struct brute_force_result {
  bool any_valid = false;
  double best_step = 0;
  std::uint64_t min_peak = 0;  // least peak among decisions that respect the host cap
};

inline brute_force_result brute_force(const step_profile& p, std::uint64_t budget) {
  std::vector<std::pair<std::size_t, std::size_t>> slots;
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    for (std::size_t j = 0; j < p.layers[i].tensors.size(); ++j) slots.push_back({i, j});
  }
  decision_table d = keep_all(p);
  brute_force_result out;
  bool any_host = false;
  std::vector<int> digit(slots.size(), 0);
  static const tensor_action kActs[] = {tensor_action::keep, tensor_action::recompute,
                                        tensor_action::offload};
  while (true) {
    bool ok = true;
    for (std::size_t k = 0; k < slots.size() && ok; ++k) {
      d[slots[k].first][slots[k].second] = kActs[digit[k]];
      ok = allowed(p, slots[k].first, slots[k].second, kActs[digit[k]]);
    }
    if (ok) {
      const evaluation ev = evaluate(p, d, budget);
      if (ev.offloaded_bytes <= p.pinnable_bytes) {
        if (!any_host || ev.peak_bytes < out.min_peak) out.min_peak = ev.peak_bytes;
        any_host = true;
      }
      if (ev.valid && (!out.any_valid || ev.step_ms < out.best_step)) {
        out.best_step = ev.step_ms;
        out.any_valid = true;
      }
    }
    std::size_t k = 0;
    while (k < digit.size() && ++digit[k] == 3) digit[k++] = 0;
    if (k == digit.size()) break;
  }
  return out;
}

// llama3-8b on an H100 at sequence 4096, cut to 12 layers to keep a Pareto sweep quick
// (the shape of the curve is the same): the pareto tests' and the CLI's.
inline step_profile small_llama() {
  analytic_options o;
  o.arch = "llama3-8b";
  o.device = "h100";
  o.batch = 1;
  o.seq = 4096;
  step_profile p = analytic_profile(o);
  p.layers.resize(12);
  return p;
}

}  // namespace stash::planner::testing
