// session.h: everything one run of the workload needs, wired as stash.h asks: a compute
// stream, one device pool, a prefetch engine that takes offloaded blocks from and prefetches
// into that pool, and the model on top. Destroyed in the reverse order (model, engine, pool,
// stream), which is the order their contracts require.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tools/demo/driver/model.h"
#include "stash.h"

namespace stash::workload {

struct session_options {
  cudaStream_t stream = nullptr;  // the compute stream; nullptr: a new non-blocking one
  std::size_t pool_alignment = 512;
  std::size_t pool_budget_bytes = 0;  // 0: no budget
  std::size_t pinned_cap_bytes = 0;   // the engine's pinned pool; 0: its default
  int lookahead = 1;
  bool timing = true;  // engine timing: traces and the overlap report
};

class session {
 public:
  // Throws as model's constructor does.
  session(const model_config& c, backend_kind kind, const session_options& o = {},
          std::function<std::unique_ptr<backend>(std::unique_ptr<backend>)> wrap = {});
  ~session();
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  // actions: layers * 5, layer by layer, in saved-tensor order (model.h).
  void set_plan(const std::vector<stash_action_t>& actions);
  // A stash.plan/1 file (stash plan -o).
  void load_plan(const std::string& path);

  model& workload() { return *model_; }
  stash_engine_t* engine() { return engine_; }
  stash_device_pool_t* pool() { return pool_; }
  cudaStream_t stream() const { return stream_; }
  stash_engine_stats_t engine_stats();

 private:
  void teardown() noexcept;
  cudaStream_t stream_ = nullptr;
  bool own_stream_ = false;
  stash_device_pool_t* pool_ = nullptr;
  stash_engine_t* engine_ = nullptr;
  std::unique_ptr<model> model_;
  int layers_ = 0;
};

// Convenience: one action for every tensor (keep-all, all-offload; all-recompute keeps the
// inputs, which cannot be recomputed).
std::vector<stash_action_t> uniform_plan(int layers, stash_action_t a);

}  // namespace stash::workload
