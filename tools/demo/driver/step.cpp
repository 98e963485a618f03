// step.cpp: the training step over the engine (Note [Memory schedule of the step] in
// model.h): forward with hand-over of every saved tensor, the loss turn, backward in
// reverse with prefetch, acquire and recompute, and the SGD update.
#include <stdexcept>
#include <string>
#include <utility>

#include "tools/demo/driver/model.h"
#include "tools/demo/driver/model_detail.h"

namespace stash::workload {

using detail::check_stash;
using detail::profile_scope;

struct model::layer_params {
  float *w1, *b1, *w2, *b2, *gamma, *beta;
};

model::layer_params model::params_of(int layer, float* base) const {
  const detail::layer_offsets o = detail::offsets(config_.hidden, config_.ffn());
  float* p = base + layer_floats_ * layer;
  return {p + o.w1, p + o.b1, p + o.w2, p + o.b2, p + o.gamma, p + o.beta};
}

namespace {
stash_tensor_key_t key(std::uint32_t mb, std::uint32_t layer, int index) {
  return stash_tensor_key_t{mb, layer, static_cast<std::uint32_t>(index)};
}
}  // namespace

void model::read_actions() {
  actions_.assign(std::size_t(config_.layers) * kSavedPerBlock, STASH_ACTION_KEEP);
  for (int l = 0; l < config_.layers; ++l) {
    for (int j = 0; j < kSavedPerBlock; ++j) {
      stash_action_t a = STASH_ACTION_KEEP;
      const stash_status_t st = stash_engine_action(rt_.engine, l, j, &a);
      if (st != STASH_OK) {
        throw error(
            static_cast<status>(st),
            "stash workload: the engine's plan does not fit the model (" +
            std::to_string(config_.layers) + " layers of " + std::to_string(kSavedPerBlock) +
            " tensors: input, ln.stats, ln.out, fc1.out, act.out): " + stash_status_string(st) +
            ": " + stash_last_error());
      }
      if (j == kInput && a == STASH_ACTION_RECOMPUTE)
        throw error(status::invalid_argument,
                    "stash workload: the plan recomputes layer " + std::to_string(l) +
                        "'s input, which is not recomputable (recompute starts from it)");
      actions_[std::size_t(l) * kSavedPerBlock + j] = a;
    }
  }
}

void model::step() {
  read_actions();
  const cudaStream_t s = rt_.stream;
  // Note [Event timing of the step overhead]: the whole step, from before the gradient
  // zeroing to after the update, for the time outside the layer scopes.
  const std::size_t step_timing = timer_ ? timer_->begin_step() : 0;
  backend_->zero(s, grads_, layout_.grads_bytes);
  for (int m = 0; m < config_.micro_batches; ++m) {
    const auto mb = static_cast<std::uint32_t>(m);
    float* x = nullptr;  // the current layer's input; after the last layer, the output
    for (int l = 0; l < config_.layers; ++l) forward(mb, l, x);
    float* dout = nullptr;
    loss_turn(mb, x, dout);
    for (int l = config_.layers - 1; l >= 0; --l) backward(mb, l, dout);
    free(dout);
  }
  const std::size_t n = layer_floats_ * config_.layers;
  backend_->sgd(s, n, config_.lr / config_.micro_batches, grads_, params_);
  if (timer_) timer_->end_step(step_timing, config_.micro_batches);
}

bool model::graph_step() {
  int ready = 0;
  check_stash(stash_engine_graph_state(rt_.engine, nullptr, &ready, nullptr, nullptr),
              "stash_engine_graph_state");
  const bool capture = !ready;
  if (capture) {
    read_actions();  // for pinned_step_bytes(); step() reads them again, under capture
    check_stash(stash_engine_capture_begin(rt_.engine, pinned_step_bytes()),
                "stash_engine_capture_begin");
    try {
      step();
    } catch (...) {
      stash_engine_capture_end(rt_.engine);  // ends the CUDA capture; the graph is discarded
      throw;
    }
    check_stash(stash_engine_capture_end(rt_.engine), "stash_engine_capture_end");
  }
  check_stash(stash_engine_replay(rt_.engine), "stash_engine_replay");
  return capture;
}

std::size_t model::pinned_step_bytes() const {
  constexpr std::size_t kPinnedAlign = 4096;  // Note [Pinned alignment] in allocator/pinned_pool.h
  std::size_t per_mb = 0;
  for (std::size_t i = 0; i < actions_.size(); ++i)
    if (actions_[i] == STASH_ACTION_OFFLOAD)
      per_mb += (layout_.saved_bytes[i % kSavedPerBlock] + 2 * kPinnedAlign - 1) /
                kPinnedAlign * kPinnedAlign;
  return per_mb * std::size_t(config_.micro_batches);
}

void model::hand_over(std::uint32_t mb, std::uint32_t layer, int index, void* p) {
  check_stash(stash_engine_offload(rt_.engine, key(mb, layer, index), p, layout_.saved_bytes[index],
                                   rt_.stream),
              "stash_engine_offload");
  switch (actions_[std::size_t(layer) * kSavedPerBlock + index]) {
    case STASH_ACTION_KEEP:
      saved_[std::size_t(layer) * kSavedPerBlock + index] = p;
      break;
    case STASH_ACTION_RECOMPUTE:
      free(p);
      break;  // rebuilt in backward
    case STASH_ACTION_OFFLOAD:
      break;  // the engine's block from now on
    case STASH_ACTION_FORCE_INT_:
      break;  // not an action: the plan never holds it
  }
}

void model::forward(std::uint32_t mb, std::uint32_t layer, float*& x) {
  const cudaStream_t s = rt_.stream;
  const int T = config_.tokens(), H = config_.hidden, F = config_.ffn();
  const std::size_t TH = std::size_t(T) * H, TF = std::size_t(T) * F;
  const layer_params p = params_of(static_cast<int>(layer), params_);
  check_stash(stash_engine_forward_begin(rt_.engine, mb, layer), "stash_engine_forward_begin");
  float* out = nullptr;
  {
    profile_scope scope(timer_, STASH_SCOPE_FORWARD, static_cast<int>(layer), nullptr);
    if (layer == 0) {
      x = static_cast<float*>(alloc(layout_.saved_bytes[kInput]));
      upload(x, host_data_ + TH * mb, TH * sizeof(float));
    }
    auto* stats = static_cast<float*>(alloc(layout_.saved_bytes[kLnStats]));
    {
      profile_scope t(timer_, STASH_SCOPE_TENSOR, static_cast<int>(layer), saved_name(kLnStats),
                      kLnStats);
      backend_->layernorm_stats(s, T, H, x, stats);
    }
    auto* u = static_cast<float*>(alloc(layout_.saved_bytes[kLnOut]));
    {
      profile_scope t(timer_, STASH_SCOPE_TENSOR, static_cast<int>(layer), saved_name(kLnOut),
                      kLnOut);
      backend_->layernorm_apply(s, T, H, x, stats, p.gamma, p.beta, u);
    }
    hand_over(mb, layer, kLnStats, stats);  // Note [Hand-over after the last forward use]
    auto* h = static_cast<float*>(alloc(layout_.saved_bytes[kFc1Out]));
    {
      profile_scope t(timer_, STASH_SCOPE_TENSOR, static_cast<int>(layer), saved_name(kFc1Out),
                      kFc1Out);
      backend_->gemm(s, false, false, T, F, H, u, p.w1, 0.0f, h);
      backend_->add_bias(s, T, F, p.b1, h);
    }
    hand_over(mb, layer, kLnOut, u);
    auto* a = static_cast<float*>(alloc(layout_.saved_bytes[kActOut]));
    {
      profile_scope t(timer_, STASH_SCOPE_TENSOR, static_cast<int>(layer), saved_name(kActOut),
                      kActOut);
      backend_->gelu(s, TF, h, a);
    }
    hand_over(mb, layer, kFc1Out, h);
    // out = x + (a W2 + b2), built in the output block itself (residual first, then the GEMM
    // with beta = 1, then the bias), so the block needs no temporary of its own.
    out = static_cast<float*>(alloc(layout_.out_bytes));
    STASH_CUDA_TRY(cudaMemcpyAsync(out, x, TH * sizeof(float), cudaMemcpyDeviceToDevice, s));
    backend_->gemm(s, false, false, T, H, F, a, p.w2, 1.0f, out);
    backend_->add_bias(s, T, H, p.b2, out);
    hand_over(mb, layer, kInput, x);
    hand_over(mb, layer, kActOut, a);
  }
  check_stash(stash_engine_forward_end(rt_.engine, mb, layer), "stash_engine_forward_end");
  x = out;
}

void model::loss_turn(std::uint32_t mb, float* out, float*& dout) {
  const cudaStream_t s = rt_.stream;
  const std::size_t TH = std::size_t(config_.tokens()) * config_.hidden;
  auto* target = static_cast<float*>(alloc(layout_.target_bytes));
  upload(target, host_data_ + TH * (config_.micro_batches + mb), TH * sizeof(float));
  dout = static_cast<float*>(alloc(layout_.dout_bytes));
  backend_->mse_loss(s, TH, out, target, losses_ + mb, dout);
  free(target);
  free(out);
}

void model::backward(std::uint32_t mb, std::uint32_t layer, float* dout) {
  const cudaStream_t s = rt_.stream;
  const int T = config_.tokens(), H = config_.hidden, F = config_.ffn();
  const std::size_t TF = std::size_t(T) * F;
  const layer_params p = params_of(static_cast<int>(layer), params_);
  const layer_params g = params_of(static_cast<int>(layer), grads_);
  const stash_action_t* act = &actions_[std::size_t(layer) * kSavedPerBlock];
  void** kept = &saved_[std::size_t(layer) * kSavedPerBlock];

  // backward_begin first: it enqueues the prefetch of layer-1 (and, for the micro-batch's
  // first backward layer, the wait for all its copies) before anything of this layer.
  check_stash(stash_engine_backward_begin(rt_.engine, mb, layer), "stash_engine_backward_begin");
  {
    profile_scope scope(timer_, STASH_SCOPE_BACKWARD, static_cast<int>(layer), nullptr);
    float* t[kSavedPerBlock] = {};
    for (int j = 0; j < kSavedPerBlock; ++j) {
      if (act[j] == STASH_ACTION_RECOMPUTE) continue;
      void* ptr = nullptr;
      check_stash(stash_engine_acquire(rt_.engine, key(mb, layer, j), s, &ptr),
                  "stash_engine_acquire");
      t[j] = static_cast<float*>(ptr);
    }
    // Recompute from what is available, in dependency order: stats <- x; u <- x, stats;
    // h <- u; a <- h. The input is never recomputed (read_actions refuses such a plan).
    float* x = t[kInput];
    if (act[kLnStats] == STASH_ACTION_RECOMPUTE) {
      t[kLnStats] = static_cast<float*>(alloc(layout_.saved_bytes[kLnStats]));
      backend_->layernorm_stats(s, T, H, x, t[kLnStats]);
    }
    if (act[kLnOut] == STASH_ACTION_RECOMPUTE) {
      t[kLnOut] = static_cast<float*>(alloc(layout_.saved_bytes[kLnOut]));
      backend_->layernorm_apply(s, T, H, x, t[kLnStats], p.gamma, p.beta, t[kLnOut]);
    }
    if (act[kFc1Out] == STASH_ACTION_RECOMPUTE) {
      t[kFc1Out] = static_cast<float*>(alloc(layout_.saved_bytes[kFc1Out]));
      backend_->gemm(s, false, false, T, F, H, t[kLnOut], p.w1, 0.0f, t[kFc1Out]);
      backend_->add_bias(s, T, F, p.b1, t[kFc1Out]);
    }
    if (act[kActOut] == STASH_ACTION_RECOMPUTE) {
      t[kActOut] = static_cast<float*>(alloc(layout_.saved_bytes[kActOut]));
      backend_->gelu(s, TF, t[kFc1Out], t[kActOut]);
    }

    // out = x + a W2 + b2: dout flows to x unchanged (the residual) and into the MLP.
    backend_->bias_grad(s, T, H, dout, g.b2);
    backend_->gemm(s, true, false, F, H, T, t[kActOut], dout, 1.0f, g.w2);  // dW2 += a^T dout
    auto* da = static_cast<float*>(alloc(layout_.da_bytes));
    backend_->gemm(s, false, true, T, F, H, dout, p.w2, 0.0f, da);  // da = dout W2^T
    auto* dh = static_cast<float*>(alloc(layout_.dh_bytes));
    backend_->gelu_backward(s, TF, da, t[kFc1Out], dh);
    free(da);
    backend_->bias_grad(s, T, F, dh, g.b1);
    backend_->gemm(s, true, false, H, F, T, t[kLnOut], dh, 1.0f, g.w1);  // dW1 += u^T dh
    auto* du = static_cast<float*>(alloc(layout_.du_bytes));
    backend_->gemm(s, false, true, T, H, F, dh, p.w1, 0.0f, du);  // du = dh W1^T
    free(dh);
    // dx = dout (residual) + layernorm backward of du: accumulated into dout in place, which
    // becomes the previous layer's dout.
    backend_->layernorm_backward(s, T, H, du, x, t[kLnStats], p.gamma, dout, g.gamma, g.beta);
    free(du);

    // The layer's saved tensors go when its backward ends (the planner's model): the
    // engine's blocks through release, ours stream-ordered.
    for (int j = 0; j < kSavedPerBlock; ++j) {
      check_stash(stash_engine_release(rt_.engine, key(mb, layer, j)), "stash_engine_release");
      if (act[j] == STASH_ACTION_KEEP) free(std::exchange(kept[j], nullptr));
      if (act[j] == STASH_ACTION_RECOMPUTE) free(t[j]);
    }
  }
  check_stash(stash_engine_backward_end(rt_.engine, mb, layer), "stash_engine_backward_end");
}

}  // namespace stash::workload
