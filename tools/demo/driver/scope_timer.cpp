// scope_timer.cpp: CUDA-event timing of profiler scopes (scope_timer.h).
#include "tools/demo/driver/scope_timer.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "tools/demo/driver/model_detail.h"
#include "core/stats.h"

namespace stash::workload {

scope_timer::~scope_timer() {
  for (pair& p : open_) {
    if (p.begin) prim::event_destroy(p.begin);
    if (p.end) prim::event_destroy(p.end);
  }
  for (cudaEvent_t e : spare_) prim::event_destroy(e);
}

cudaEvent_t scope_timer::take() {
  if (!spare_.empty()) {
    cudaEvent_t e = spare_.back();
    spare_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  STASH_CUDA_TRY(prim::event_create(&e, /*timing=*/true));
  return e;
}

std::size_t scope_timer::begin() {
  pair p;
  p.begin = take();
  STASH_CUDA_TRY(prim::event_record(p.begin, stream_));
  open_.push_back(p);
  return open_.size() - 1;
}

void scope_timer::end(std::size_t handle, stash_scope_kind_t kind, int layer, int tensor) noexcept {
  if (handle >= open_.size()) return;
  pair& p = open_[handle];
  p.kind = kind;
  p.layer = layer;
  p.tensor = tensor;
  try {
    p.end = take();
  } catch (...) {
    return;  // the pair stays unclosed: harvest drops it (a missing sample, not a wrong one)
  }
  p.closed = cudaEventRecord(p.end, stream_) == cudaSuccess;
  if (!p.closed) (void)cudaGetLastError();
}

std::size_t scope_timer::begin_step() {
  const std::size_t h = begin();
  open_[h].step = true;
  return h;
}

void scope_timer::end_step(std::size_t handle, int passes) noexcept {
  if (handle >= open_.size() || !open_[handle].step) return;
  open_[handle].passes = passes > 0 ? passes : 1;
  end(handle, STASH_SCOPE_FORWARD, -1, -1);  // kind and layer are unused for a step
}

void scope_timer::harvest() {
  // Note [Event timing of the step overhead]: pairs are in the order they began, so a
  // step's layer scopes follow its own pair until the next step begins.
  struct step_sum {
    double step_ms = 0, layers_ms = 0;
    int passes = 1;
    bool complete = true;
  };
  std::vector<step_sum> steps;
  for (pair& p : open_) {
    float ms = 0;
    const bool timed = p.closed && cudaEventElapsedTime(&ms, p.begin, p.end) == cudaSuccess;
    if (!timed) (void)cudaGetLastError();
    if (p.step) {
      steps.push_back({ms, 0, p.passes, timed});
    } else if (timed) {
      samples_[{p.kind, p.layer, p.tensor}].push_back(ms);
      if (!steps.empty() && p.tensor < 0 &&
          (p.kind == STASH_SCOPE_FORWARD || p.kind == STASH_SCOPE_BACKWARD))
        steps.back().layers_ms += ms;
    } else if (!steps.empty()) {
      steps.back().complete = false;  // a layer scope went untimed: the difference is wrong
    }
    if (p.begin) spare_.push_back(p.begin);
    if (p.end) spare_.push_back(p.end);
  }
  open_.clear();
  for (const step_sum& s : steps)
    if (s.complete) step_overhead_.push_back(std::max(0.0, s.step_ms - s.layers_ms) / s.passes);
}

double scope_timer::step_overhead_median_ms() const {
  if (step_overhead_.empty()) return -1;
  return stash::median(step_overhead_, stash::even_median::upper_middle);
}

double scope_timer::median_ms(stash_scope_kind_t kind, int layer, int tensor) const {
  auto it = samples_.find({kind, layer, tensor});
  if (it == samples_.end() || it->second.empty()) return -1;
  return stash::median(it->second, stash::even_median::upper_middle);
}

std::size_t scope_timer::sample_count(stash_scope_kind_t kind, int layer, int tensor) const {
  auto it = samples_.find({kind, layer, tensor});
  return it == samples_.end() ? 0 : it->second.size();
}

}  // namespace stash::workload
