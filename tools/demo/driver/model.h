// model.h: stash's built-in training workload driven through the prefetch engine: L blocks of
// kernels/workload/backend.h (Note [The workload's block]), their parameters, gradients,
// activations and temporaries all carved from one stash device pool, and a training step
// (forward, loss, backward, SGD) that hands every saved tensor to the engine and carries out
// its plan: keep, offload, or recompute in backward.
//
// Note [Memory schedule of the step]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every byte the step uses comes from the device pool, so the pool's figures are the
// workload's. The schedule is the planner's canonical one (docs/planner.md), so that a
// plan's predicted peak is what the pool measures:
//  * fixed (the whole run): all parameters (one block), all gradients (one block), the
//    cuBLAS workspace (CUDA backend only) and one loss value per micro-batch;
//  * forward of layer i allocates its five saved tensors (A_i) and the next layer's input
//    (its output). Each saved tensor is handed to the engine right after its last forward
//    consumer is enqueued (Note [Hand-over after the last forward use]); then a recompute
//    tensor is freed (stream-ordered), an offload tensor belongs to the engine, a keep
//    tensor stays;
//  * the loss turn allocates the target and the output gradient `dout`, frees the target
//    and the last output;
//  * backward of layer i: the engine's prefetch of layer i-1 (backward_begin at lookahead
//    1, Note [The step's schedule] in planner/model/schedule.h), the acquires of layer i's
//    offloaded tensors, the recompute of its recomputed tensors in dependency order, then
//    the temporaries da, dh (F wide) and du, next to dout. Layer i's saved
//    tensors are released or freed when its backward ends, as the planner's model and the
//    simulator assume; so at its widest the backward of layer i holds
//        fixed + kept(< i) + A_i + prefetched(i-1) + (dout + da + dh)
//    which is the canonical backward_i with bwd_temp_i = dout + da + dh
//    (skeleton.h). Forward positions stay at or below the canonical ones (the output block
//    is covered by the next layer's A, and by bwd_temp at the last layer).
// Blocks are counted as the pool carves them (rounded up to its alignment); the skeleton
// uses the same rounding, so the comparison is exact in bytes.
//
// Note [Hand-over after the last forward use]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// stash_engine_offload gives an offloaded block to the engine, which hands it back to the
// pool as the compute stream's memory once the compute stream is ordered after its D2H copy
// (forward_begin two layers on, or the copy seen complete): the pool may then give the
// block to the next allocation on the compute stream. If the forward still had to enqueue
// a read of it after that point, that allocation could receive the block and overwrite it
// before the read runs; the engine promises nothing about reads the caller enqueues after
// offload. So every tensor is handed over right after its *last* forward consumer is
// enqueued (x is read by the residual at the end of the block, u by the fc1 GEMM): for this
// block that is at most two ops after its producer, and the D2H still overlaps the rest of
// the layer and the next.
//
// Note [Gradient accumulation]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A step runs `micro_batches` forward/backward passes (keys carry the micro-batch index),
// accumulating into one gradient block (GEMMs with beta = 1, bias and LayerNorm gradients
// with +=), then one SGD update with lr / micro_batches, so the update is that of the mean
// loss. Gradients read back are the sum over micro-batches of each one's mean-loss gradient.
// The reported loss is the mean of the micro-batch losses.
//
// Note [The step under CUDA graphs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// graph_step() is step() captured once through the engine (Note [Capturing a step] in
// runtime/engine/prefetch_engine.h) and replayed: the first call after a plan is set
// captures step() (nothing runs) and then replays it, later calls only replay. A plan
// change drops the engine's graph, so the next graph_step() captures again: the plan is
// read (read_actions) only at capture, which is the one moment it matters. What makes
// step() capturable: every allocation comes from the device pool, which serves it from
// the blocks the first eager step left cached (it may not grow under capture: run one
// eager step() first), and the step frees everything it allocates, so the pool is as it
// was after every replay; the loss turn and the inputs copy from the pinned host_data_,
// fixed for the model's life; the host backend keeps the closures of ops captured as host
// nodes (Note [Host ops on a stream] in host_backend.cpp). With several micro-batches the
// engine holds pinned memory for all of them during the capture, so capture asks for the
// step's offloaded bytes (pinned_step_bytes()).
//
// Thread safety: none; one thread drives a model (the engine's hooks must be called from the
// thread that enqueues the layer's work anyway).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/workload/backend.h"
#include "tools/demo/driver/scope_timer.h"
#include "stash.h"

namespace stash::workload {

// The five saved tensors of a block, in the profile's and the engine's order.
inline constexpr int kSavedPerBlock = 5;
enum saved_index : int { kInput = 0, kLnStats = 1, kLnOut = 2, kFc1Out = 3, kActOut = 4 };
const char* saved_name(int index);  // "input", "ln.stats", "ln.out", "fc1.out", "act.out"

struct model_config {
  int layers = 4;
  int hidden = 256;
  int seq = 128;
  int batch = 2;
  int ffn_mult = 4;
  int micro_batches = 1;  // per step (gradient accumulation)
  std::uint64_t seed = 1;
  float lr = 1e-3f;

  int tokens() const { return batch * seq; }
  int ffn() const { return ffn_mult * hidden; }
  // Empty when valid, else a message naming the field ("--hidden must be positive").
  std::string problem() const;
};

enum class backend_kind { host, cuda };
const char* to_string(backend_kind k);
// True when this build has the CUDA backend (STASH_BUILD_KERNELS).
bool cuda_backend_built();

// Sizes of everything the step allocates, as the device pool carves them.
struct memory_layout {
  std::size_t alignment = 512;
  std::size_t params_bytes = 0, grads_bytes = 0, workspace_bytes = 0, loss_bytes = 0;
  std::size_t saved_bytes[kSavedPerBlock] = {};  // per block
  std::size_t dout_bytes = 0, da_bytes = 0, dh_bytes = 0, du_bytes = 0;
  std::size_t target_bytes = 0, out_bytes = 0;

  std::size_t fixed_bytes() const {
    return params_bytes + grads_bytes + workspace_bytes + loss_bytes;
  }
  // The widest set of backward temporaries (Note [Memory schedule of the step]).
  std::size_t bwd_temp_bytes() const { return dout_bytes + da_bytes + dh_bytes; }
  std::size_t block_saved_bytes() const;
};
// alignment: the device pool's (stash_device_pool_config_t::alignment, default 512).
memory_layout layout_of(const model_config& c, backend_kind kind, std::size_t alignment = 512);

// What the caller supplies. The engine must be configured with this pool as its
// device_pool and with `stream` as its compute stream; a plan must be loaded before step().
struct runtime_handles {
  stash_device_pool_t* pool = nullptr;
  stash_engine_t* engine = nullptr;
  cudaStream_t stream = nullptr;
  std::size_t pool_alignment = 512;  // the pool's configured alignment
};

// Peaks since the last reset_peaks(). in_use: blocks allocated and not yet freed (the
// pool's peak_bytes: deterministic). held: in use plus blocks freed but still awaited by a
// copy (pending), sampled after each of the step's allocations: the memory that could not
// have been reused, which is what a budget must cover.
struct memory_peaks {
  std::uint64_t in_use_bytes = 0;
  std::uint64_t held_bytes = 0;
};

class model {
 public:
  // wrap: optional decorator around the backend the model creates (tests use it to annotate
  // accesses for the test double's checker). Throws std::invalid_argument for a bad config
  // or handles, stash::error for CUDA or stash errors (with stash_last_error()).
  model(const model_config& config, backend_kind kind, const runtime_handles& rt,
        std::function<std::unique_ptr<backend>(std::unique_ptr<backend>)> wrap = {});
  ~model();
  model(const model&) = delete;
  model& operator=(const model&) = delete;

  // Enqueues one training step on the stream (does not wait). The engine's plan is read at
  // the start of each step (stash_engine_action), so a new plan may be loaded between steps.
  void step();
  // Note [The step under CUDA graphs]. Returns true when this call captured.
  bool graph_step();
  // Pinned bytes the engine holds during one captured step: every offloaded tensor of
  // every micro-batch, at the pinned pool's 4 KiB alignment, plus one alignment each.
  std::size_t pinned_step_bytes() const;
  // The mean loss of the last step's micro-batches (waits for the stream).
  float last_loss();

  // Copies to the host (wait for the stream). Packed layout: per layer W1 [H][F], b1 [F],
  // W2 [F][H], b2 [H], gamma [H], beta [H], each padded to 64 floats.
  std::vector<float> read_gradients();
  std::vector<float> read_params();
  // FNV-1a 64 of the gradient bytes: equal checksums mean bitwise-equal gradients.
  std::uint64_t gradient_checksum();

  // Times every profiler scope of later steps with CUDA events into `timer` (not owned;
  // nullptr stops). The fallback when CUPTI is unavailable (scope_timer.h).
  void set_scope_timer(scope_timer* timer) { timer_ = timer; }

  void reset_peaks();
  memory_peaks peaks();

  const model_config& config() const { return config_; }
  const memory_layout& layout() const { return layout_; }
  backend_kind kind() const { return kind_; }
  const char* backend_name() const { return backend_->name(); }
  cudaStream_t stream() const { return rt_.stream; }

 private:
  void release() noexcept;  // waits for the stream, frees every block and the pinned data
  void* alloc(std::size_t bytes);
  void free(void* p);
  void read_actions();
  void forward(std::uint32_t mb, std::uint32_t layer, float*& x);
  void hand_over(std::uint32_t mb, std::uint32_t layer, int index, void* p);
  void loss_turn(std::uint32_t mb, float* out, float*& dout);
  void backward(std::uint32_t mb, std::uint32_t layer, float* dout);
  void upload(float* dst, const float* host, std::size_t bytes);
  // Copies n floats at src to the host on the stream and waits; `what` names them in errors.
  std::vector<float> download(const float* src, std::size_t n, const char* what);
  struct layer_params;
  layer_params params_of(int layer, float* base) const;

  model_config config_;
  backend_kind kind_;
  runtime_handles rt_;
  memory_layout layout_;
  std::unique_ptr<backend> backend_;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  void* workspace_ = nullptr;
  float* losses_ = nullptr;              // one per micro-batch
  std::size_t layer_floats_ = 0;         // padded floats per layer in params_/grads_
  float* host_data_ = nullptr;           // pinned: inputs then targets, per micro-batch
  std::vector<stash_action_t> actions_;  // [layer * 5 + index]
  std::vector<void*> saved_;             // keep tensors: [layer * 5 + index]
  std::uint64_t held_peak_ = 0;
  scope_timer* timer_ = nullptr;
};

// FNV-1a 64 over bytes.
std::uint64_t fnv1a64(const void* data, std::size_t bytes);

}  // namespace stash::workload
