// skeleton.cpp: the workload's profile skeleton (skeleton.h).
#include "tools/demo/driver/skeleton.h"

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "allocator/host_memory.h"
#include "cuda_prim.h"

namespace stash::workload {

planner::link_profile assumed_link() {
  planner::link_profile l;
  l.h2d_gbps = 55.0;
  l.d2h_gbps = 55.0;
  l.bidir_gbps = 100.0;
  l.local_ranks = 1;
  return l;
}

void device_facts(std::string* name, std::uint64_t* memory_bytes) {
  int dev = 0;
  cudaError_t err = prim::current_device(&dev);
  cudaDeviceProp prop{};
  if (err == cudaSuccess) err = cudaGetDeviceProperties(&prop, dev);
  if (err != cudaSuccess)
    prim::throw_cuda_error(err, "stash workload: no CUDA device", __FILE__, __LINE__);
  *name = prop.name;
  *memory_bytes = prop.totalGlobalMem;
}

planner::step_profile make_skeleton(const model_config& c, backend_kind kind,
                                    const skeleton_options& o, std::size_t pool_alignment) {
  if (const std::string p = c.problem(); !p.empty())
    throw std::invalid_argument("stash workload: " + p);
  const memory_layout m = layout_of(c, kind, pool_alignment);
  planner::step_profile p;
  p.source = planner::profile_source::measured;
  p.device_name = o.device_name;
  p.device_memory_bytes = o.device_memory_bytes;
  p.link = o.link ? *o.link : assumed_link();
  // skeleton_options::pinnable_bytes: the pinned pool's own default cap.
  p.pinnable_bytes = o.pinnable_bytes ? o.pinnable_bytes : probe_host_memory().default_cap;
  p.fixed_bytes = m.fixed_bytes();
  const std::string signature = "mlp_block:" + std::to_string(c.hidden) + ":" +
                                std::to_string(c.ffn()) + ":" + std::to_string(c.tokens());
  for (int l = 0; l < c.layers; ++l) {
    planner::layer_profile lp;
    lp.name = "blocks." + std::to_string(l);
    lp.signature = signature;
    lp.bwd_temp_bytes = m.bwd_temp_bytes();
    for (int j = 0; j < kSavedPerBlock; ++j) {
      planner::tensor_profile t;
      t.name = saved_name(j);
      t.bytes = m.saved_bytes[j];
      t.recomputable = j != kInput;
      lp.tensors.push_back(t);
    }
    p.layers.push_back(std::move(lp));
  }
  // Round-trip through the validator: a skeleton that `stash plan` would refuse is a bug here.
  return planner::profile_from_json(planner::profile_to_json(p));
}

nlohmann::json skeleton_json(const planner::step_profile& p, const model_config& c,
                             backend_kind kind, bool link_measured) {
  nlohmann::json j = planner::profile_to_json(p);
  j["workload"] = {{"kind", "stash built-in MLP block (kernels/workload/backend.h)"},
                   {"backend", to_string(kind)},
                   {"layers", c.layers},
                   {"hidden", c.hidden},
                   {"seq", c.seq},
                   {"batch", c.batch},
                   {"ffn_mult", c.ffn_mult},
                   {"micro_batches", c.micro_batches},
                   {"seed", c.seed},
                   {"link", link_measured ? "measured"
                                          : "assumed (PCIe Gen5 x16: 55/55/100 GB/s); measure "
                                            "with stash bench link --profile"},
                   {"times", "0 in a skeleton: filled by stash profile / stash_profiler_stop"}};
  return j;
}

}  // namespace stash::workload
