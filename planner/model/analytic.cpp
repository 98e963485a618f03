// analytic.cpp: the FLOP/byte model of analytic.h (Note [Analytic cost model]).
#include "planner/model/analytic.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

namespace stash::planner {

namespace {

constexpr std::uint64_t MiB = 1048576;
constexpr std::uint64_t GiB = 1024 * MiB;

// Link figures: PCIe Gen5 x16 carries 63 GB/s per direction in theory; nvbandwidth
// measures about 55 on H100 and about 100 with both directions busy. GB200's NVLink-C2C
// reaches 300 to 450 GB/s per direction per GPU; we take the middle. Memory sizes are what
// the driver reports (nvidia-smi MiB). Host RAM: DGX H100 / H200 carry 2 TiB for 8 GPUs;
// a GB200 superchip's Grace carries 480 GB of LPDDR5X for 2 GPUs.
const std::vector<device_spec> kDevices = {
    {"h100", "NVIDIA H100 80GB HBM3", 989.4, 3350, 81559 * MiB, 55, 55, 100, 256 * GiB,
     "PCIe Gen5 x16, measured-class figures"},
    {"h200", "NVIDIA H200", 989.4, 4800, 143771 * MiB, 55, 55, 100, 256 * GiB,
     "PCIe Gen5 x16, measured-class figures"},
    {"gb200", "NVIDIA GB200", 2500, 8000, 189471 * MiB, 375, 375, 600, 240000000000ull,
     "NVLink-C2C to Grace, mid-range of 300-450 GB/s per direction"},
};

// Llama 3 8B / 70B (Meta's configs) and Llama 3.2 11B Vision's language model: 40 layers of
// which 8 (3, 8, ..., 38) are gated cross-attention blocks over the image's tokens (4 tiles
// x 1601 patches), with a frozen ~0.9B-parameter vision encoder.
const std::vector<arch_spec> kArchs = {
    {"llama3-8b", 32, 4096, 32, 8, 14336, 128256, -1, 0, 0, 0, "Llama 3 8B"},
    {"llama3-70b", 80, 8192, 64, 8, 28672, 128256, -1, 0, 0, 0, "Llama 3 70B"},
    {"llama3.2-11b-vision", 40, 4096, 32, 8, 14336, 128256, 3, 5, 6404, 0.88e9,
     "Llama 3.2 11B Vision: 32 self-attention + 8 cross-attention blocks"},
};

template <class T>
const T& find(const std::vector<T>& all, const std::string& key, const char* what) {
  for (const T& x : all)
    if (x.key == key) return x;
  std::string known;
  for (const T& x : all) known += (known.empty() ? "" : ", ") + x.key;
  throw input_error(std::string("unknown ") + what + " \"" + key + "\" (known: " + known + ")");
}

double round_ms(double ms) { return std::round(ms * 1e6) / 1e6; }

// Costs of one layer's operations on one device.
struct op_costs {
  const device_spec& dev;
  double gemm_ms(double m, double n, double k) const {
    return 2 * m * n * k / (dev.bf16_tflops * 1e12 * kGemmEfficiency) * 1e3;
  }
  double mem_ms(double bytes) const { return bytes / (dev.hbm_gbps * 1e9 * kMemEfficiency) * 1e3; }
  double attn_flops(double b, double sq, double skv, double h, bool causal) const {
    return 4 * b * sq * skv * h * (causal ? 0.5 : 1.0);
  }
  double attn_fwd_ms(double flops) const {
    return flops / (dev.bf16_tflops * 1e12 * kAttnFwdEfficiency) * 1e3;
  }
  double attn_bwd_ms(double flops) const {
    return 2.5 * flops / (dev.bf16_tflops * 1e12 * kAttnBwdEfficiency) * 1e3;
  }
};

bool is_cross(const arch_spec& a, int layer) {
  return a.cross_attn_period > 0 && layer >= a.cross_attn_first &&
         (layer - a.cross_attn_first) % a.cross_attn_period == 0;
}

double layer_params(const arch_spec& a) {
  const double h = a.hidden, kvd = double(a.kv_heads) * (a.hidden / a.heads);
  return 2 * h * h + 2 * h * kvd + 3 * h * a.ffn + 2 * h;  // q, o, k, v, MLP, two norms
}

// One block, self- or cross-attention. Records the forward and backward as it lists the
// saved tensors, so each producer's cost is written once.
layer_profile block(const arch_spec& a, const op_costs& c, int index, double b, double s) {
  const bool cross = is_cross(a, index);
  const double T = b * s, h = a.hidden, f = a.ffn, d = h / a.heads;
  const double kvd = a.kv_heads * d;
  const double Tkv = cross ? b * a.vision_tokens : T;  // rows that k and v come from
  layer_profile l;
  l.name = "layers." + std::to_string(index);
  l.signature = cross ? "cross_attn_block" : "llama_block";
  double fwd = 0, gemm_fwd = 0, mem_fwd = 0;
  auto saved = [&](const std::string& name, double bytes, double producer_ms,
                   bool recomputable = true) {
    tensor_profile t;
    t.name = name;
    t.bytes = static_cast<std::uint64_t>(bytes);
    t.recompute_ms = round_ms(recomputable ? producer_ms : 0);
    t.recomputable = recomputable;
    l.tensors.push_back(t);
  };
  auto gemm = [&](double m, double n, double k) {
    const double ms = c.gemm_ms(m, n, k);
    gemm_fwd += ms;
    return ms;
  };
  auto mem = [&](double bytes) {
    const double ms = c.mem_ms(bytes);
    mem_fwd += ms;
    return ms;
  };
  const double norm_ms = c.mem_ms(2 * T * h * 2);  // read x, write y (rstd is noise)
  saved("input", T * h * 2, 0, false);
  saved("attn_norm.rstd", T * 4, norm_ms);
  saved("attn_norm.out", T * h * 2, mem(2 * T * h * 2));
  // q (and k in self-attention) get RoPE, in cross-attention a per-head RMSNorm instead:
  // either is one more read and write.
  saved("attn.q", T * h * 2, gemm(T, h, h) + mem(2 * T * h * 2));
  saved("attn.k", Tkv * kvd * 2, gemm(Tkv, kvd, h) + mem(2 * Tkv * kvd * 2));
  saved("attn.v", Tkv * kvd * 2, gemm(Tkv, kvd, h));
  const double attn_flops = c.attn_flops(b, s, cross ? a.vision_tokens : s, h, !cross);
  const double attn_ms = c.attn_fwd_ms(attn_flops);
  saved("attn.out", T * h * 2, attn_ms);  // also o_proj's saved input
  saved("attn.lse", b * a.heads * s * 4, attn_ms);
  // Residual after attention (gated by tanh(g) in cross-attention blocks).
  saved("ffn_norm.in", T * h * 2, gemm(T, h, h) + mem(3 * T * h * 2));
  saved("ffn_norm.rstd", T * 4, norm_ms);
  saved("ffn_norm.out", T * h * 2, mem(2 * T * h * 2));
  saved("mlp.gate", T * f * 2, gemm(T, f, h));
  saved("mlp.up", T * f * 2, gemm(T, f, h));
  saved("mlp.act", T * f * 2, mem(2 * T * f * 2));       // silu(gate)
  saved("mlp.down_in", T * f * 2, mem(3 * T * f * 2));   // silu(gate) * up
  gemm(T, h, f);                                          // down_proj
  mem(3 * T * h * 2);                                     // residual add: the layer output
  fwd = gemm_fwd + mem_fwd + attn_ms;
  l.fwd_ms = round_ms(fwd);
  l.bwd_ms = round_ms(2 * gemm_fwd + 2 * mem_fwd + c.attn_bwd_ms(attn_flops));
  const double mlp_temp = 3 * T * f * 2 + T * h * 2;
  const double attn_temp = (T * h + 2 * Tkv * kvd) * 2 + T * h * 4 + T * h * 2;
  l.bwd_temp_bytes = static_cast<std::uint64_t>(std::max(mlp_temp, attn_temp));
  return l;
}

}  // namespace

const std::vector<device_spec>& analytic_devices() { return kDevices; }
const std::vector<arch_spec>& analytic_archs() { return kArchs; }
const device_spec& find_device(const std::string& key) { return find(kDevices, key, "device"); }
const arch_spec& find_arch(const std::string& key) { return find(kArchs, key, "architecture"); }

double trainable_params(const arch_spec& a) {
  return a.layers * layer_params(a) + 2.0 * a.vocab * a.hidden + a.hidden;
}

// Note [FSDP shard count]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Neither 8B nor 70B trains with Adam on one GPU (16 bytes per parameter), so the profile
// assumes FSDP over `shard` ranks. Auto picks the smallest power of two that brings the
// sharded weights, gradients and optimizer state under a quarter of the device memory,
// leaving the rest to activations, which is how such jobs are sized in practice.
int analytic_shard(const analytic_options& o) {
  if (o.shard > 0) return o.shard;
  const double states = 16 * trainable_params(find_arch(o.arch));
  const double room = 0.25 * static_cast<double>(find_device(o.device).memory_bytes);
  int n = 1;
  while (states / n > room && n < 4096) n *= 2;
  return n;
}

step_profile analytic_profile(const analytic_options& o) {
  const arch_spec& a = find_arch(o.arch);
  const device_spec& dev = find_device(o.device);
  if (o.batch < 1) throw input_error("batch must be a positive integer");
  if (o.seq < 1) throw input_error("seq must be a positive integer");
  if (o.shard < 0) throw input_error("shard must be a positive integer (0: auto)");
  const int shard = analytic_shard(o);
  const op_costs c{dev};
  step_profile p;
  p.source = profile_source::analytic;
  p.device_name = dev.name;
  p.device_memory_bytes = dev.memory_bytes;
  p.link = {dev.h2d_gbps, dev.d2h_gbps, dev.bidir_gbps, 1};
  p.pinnable_bytes = static_cast<std::uint64_t>(kPinnableFraction * dev.host_bytes_per_gpu);
  const double T = double(o.batch) * o.seq;
  double fixed = 16 * trainable_params(a) / shard + 2 * a.frozen_params / shard;
  if (shard > 1) fixed += 3 * 2 * layer_params(a);  // two gathered layers + a grad bucket
  fixed += double(GiB);                              // cuBLAS / NCCL workspace
  fixed += T * a.vocab * 4;                          // bf16 logits and their gradient
  fixed += double(o.batch) * a.vision_tokens * a.hidden * 2;  // cross-attention states
  p.fixed_bytes = static_cast<std::uint64_t>(fixed);
  for (int i = 0; i < a.layers; ++i) p.layers.push_back(block(a, c, i, o.batch, o.seq));
  return p;
}

std::string profile_json_text(const step_profile& p) {
  // The canonical serialization, re-laid out: schema first, then one line per tensor.
  const nlohmann::json j = profile_to_json(p);
  nlohmann::ordered_json head;
  for (const char* key : {"schema", "source", "device", "link", "host", "fixed_bytes"})
    head[key] = j.at(key);
  std::string out = head.dump(2);
  out.erase(out.rfind('}'));  // reopen the object to append the layers
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  out += ",\n  \"layers\": [\n";
  const nlohmann::json& layers = j.at("layers");
  for (std::size_t i = 0; i < layers.size(); ++i) {
    nlohmann::ordered_json l;
    for (const char* key : {"name", "signature", "fwd_ms", "bwd_ms", "bwd_temp_bytes"})
      l[key] = layers[i].at(key);
    // Optional, and written by profile_to_json only when not 0 (the model never sets it).
    if (layers[i].contains("bwd_recompute_temp_bytes"))
      l["bwd_recompute_temp_bytes"] = layers[i].at("bwd_recompute_temp_bytes");
    std::string lh = l.dump();
    lh.pop_back();
    out += "    " + lh + ", \"tensors\": [\n";
    const nlohmann::json& tensors = layers[i].at("tensors");
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      nlohmann::ordered_json t;
      for (const char* key : {"name", "bytes", "recompute_ms", "offloadable", "recomputable", "must_keep"})
        t[key] = tensors[k].at(key);
      out += "      " + t.dump() + (k + 1 < tensors.size() ? ",\n" : "\n");
    }
    out += std::string("    ]}") + (i + 1 < layers.size() ? ",\n" : "\n");
  }
  return out + "  ]\n}\n";
}

}  // namespace stash::planner
