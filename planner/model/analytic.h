// analytic.h: profiles from a FLOP/byte model of named architectures on named devices
// (`stash profile-model`), for planning before (or without) a measurement.
//
// Note [Analytic cost model]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Time of an operation on device D (bf16 training, T = batch * seq tokens):
//   * a GEMM m x n x k costs 2mnk FLOPs at kGemmEfficiency of D's dense bf16 peak;
//   * flash attention forward costs 4 * b * s_q * s_kv * h FLOPs (halved when causal) at
//     kAttnFwdEfficiency, its backward 2.5x those FLOPs at kAttnBwdEfficiency (it recomputes
//     the probabilities);
//   * elementwise work (norms, RoPE, SiLU, products, residual adds) is bandwidth-bound:
//     bytes read + written at kMemEfficiency of D's HBM bandwidth.
// Backward of a layer = 2x its GEMM FLOPs + the attention backward + 2x its elementwise
// bytes. A tensor's recompute_ms is the cost of its own producer from its inputs (the
// planner's per-tensor model is additive; recomputing q and k charges both GEMMs), and
// attn.out and attn.lse each carry the attention forward: either needs the whole kernel.
//
// Saved tensors follow what PyTorch autograd keeps for a Llama block in bf16 with flash
// attention and SwiGLU: the layer input (recomputable: false), the RMSNorm output and its
// fp32 rstd (T * 4 bytes, under the 1 MiB offload floor at ordinary sizes), q and k after
// RoPE and v (flash saves them), the attention output (also o_proj's input) and the fp32
// logsumexp, the residual after attention (ffn_norm's input), the second norm's output and
// rstd, the gate and up projections, silu(gate) and silu(gate) * up (down_proj's input).
// bwd_temp_bytes is the larger of the MLP backward's live gradients (three T x ffn plus one
// T x hidden) and the attention backward's (dq, dk, dv, flash's fp32 dq accumulator, and
// the incoming gradient).
//
// fixed_bytes: trainable parameters at 16 bytes each (bf16 weights and gradients, fp32
// master weights and Adam m and v), divided by the FSDP shard count, plus (when sharded)
// the all-gathered bf16 weights of two layers and one layer's bf16 gradient buffer, plus
// 1 GiB of cuBLAS / NCCL workspace, plus the loss: bf16 logits and their gradient
// (T * vocab * 4 bytes) — the output head is not a planned layer. Frozen parameters (the
// vision encoder of the two-signature model) count 2 bytes each, sharded the same way,
// and its cross-attention states (batch * vision_tokens * hidden, bf16) stay resident.
// pinnable_bytes is kPinnableFraction of the host memory per GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/model/profile.h"

namespace stash::planner {

// Achieved fractions of peak; the values that plans here are calibrated against.
inline constexpr double kGemmEfficiency = 0.60;     // large bf16 GEMMs (cuBLAS, Hopper)
inline constexpr double kAttnFwdEfficiency = 0.50;  // flash attention forward
inline constexpr double kAttnBwdEfficiency = 0.40;  // flash attention backward
inline constexpr double kMemEfficiency = 0.80;      // streaming elementwise kernels
inline constexpr double kPinnableFraction = 0.75;   // of host RAM per GPU

struct device_spec {
  std::string key;   // CLI name: h100 | h200 | gb200
  std::string name;  // as the profile's device.name
  double bf16_tflops = 0;  // dense peak, 1e12 FLOP/s
  double hbm_gbps = 0;     // 1e9 B/s
  std::uint64_t memory_bytes = 0;
  double h2d_gbps = 0, d2h_gbps = 0, bidir_gbps = 0;  // host link per GPU
  std::uint64_t host_bytes_per_gpu = 0;
  std::string link_note;
};

struct arch_spec {
  std::string key;  // llama3-8b | llama3-70b | llama3.2-11b-vision
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0;
  // Two-signature models: every cross_attn_period-th layer, starting at
  // cross_attn_first, is a cross-attention block over vision_tokens per sample.
  int cross_attn_first = -1, cross_attn_period = 0, vision_tokens = 0;
  double frozen_params = 0;  // e.g. a frozen vision encoder
  std::string note;
};

const std::vector<device_spec>& analytic_devices();
const std::vector<arch_spec>& analytic_archs();
// Throw input_error listing the known names.
const device_spec& find_device(const std::string& key);
const arch_spec& find_arch(const std::string& key);

struct analytic_options {
  std::string arch, device;
  int batch = 1, seq = 4096;
  int shard = 0;  // FSDP shard count; 0 = auto (Note [FSDP shard count] in analytic.cpp)
};

// The shard count analytic_profile uses for these options.
int analytic_shard(const analytic_options& o);
// Trainable parameters of the architecture (layers + embedding + output head).
double trainable_params(const arch_spec& a);
// Throws input_error for unknown names or non-positive batch / seq / shard.
step_profile analytic_profile(const analytic_options& o);

// profile_to_json rendered compactly for shipping: one line per tensor.
std::string profile_json_text(const step_profile& p);

}  // namespace stash::planner
