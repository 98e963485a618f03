// session.cpp: stream, pool, engine and model for one run (session.h).
#include "tools/demo/driver/session.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "tools/demo/driver/model_detail.h"

namespace stash::workload {

using detail::check_stash;

session::session(const model_config& c, backend_kind kind, const session_options& o,
                 std::function<std::unique_ptr<backend>(std::unique_ptr<backend>)> wrap)
    : layers_(c.layers) {
  try {
    if (o.stream) {
      stream_ = o.stream;
    } else {
      STASH_CUDA_TRY(prim::stream_create(&stream_));
      own_stream_ = true;
    }
    stash_device_pool_config_t pc;
    stash_device_pool_config_init(&pc);
    pc.alignment = o.pool_alignment;
    pc.budget_bytes = o.pool_budget_bytes;
    check_stash(stash_device_pool_create(&pc, &pool_), "stash_device_pool_create");
    stash_engine_config_t ec;
    stash_engine_config_init(&ec);
    ec.compute_stream = stream_;
    ec.device_pool = pool_;
    ec.lookahead = o.lookahead;
    ec.timing = o.timing ? 1 : 0;
    if (o.pinned_cap_bytes) ec.pinned_cap_bytes = o.pinned_cap_bytes;
    check_stash(stash_engine_create(&ec, &engine_), "stash_engine_create");
    runtime_handles rt;
    rt.pool = pool_;
    rt.engine = engine_;
    rt.stream = stream_;
    rt.pool_alignment = o.pool_alignment;
    model_ = std::make_unique<model>(c, kind, rt, std::move(wrap));
  } catch (...) {
    teardown();
    throw;
  }
}

session::~session() { teardown(); }

void session::teardown() noexcept {
  model_.reset();
  stash_engine_destroy(std::exchange(engine_, nullptr));
  stash_device_pool_destroy(std::exchange(pool_, nullptr));
  if (own_stream_ && stream_) prim::stream_destroy(stream_);
  stream_ = nullptr;
}

void session::set_plan(const std::vector<stash_action_t>& actions) {
  if (actions.size() != std::size_t(layers_) * kSavedPerBlock)
    throw std::invalid_argument("stash workload: a plan needs " +
                                std::to_string(layers_ * kSavedPerBlock) + " actions, got " +
                                std::to_string(actions.size()));
  const std::vector<std::size_t> per(layers_, kSavedPerBlock);
  check_stash(stash_engine_set_plan(engine_, per.size(), per.data(), actions.data()),
              "stash_engine_set_plan");
}

void session::load_plan(const std::string& path) {
  check_stash(stash_engine_load_plan(engine_, path.c_str()), "stash_engine_load_plan");
}

stash_engine_stats_t session::engine_stats() {
  stash_engine_stats_t s;
  stash_engine_stats_init(&s);
  check_stash(stash_engine_stats(engine_, &s), "stash_engine_stats");
  return s;
}

std::vector<stash_action_t> uniform_plan(int layers, stash_action_t a) {
  std::vector<stash_action_t> v(std::size_t(layers) * kSavedPerBlock, a);
  if (a == STASH_ACTION_RECOMPUTE)
    for (int l = 0; l < layers; ++l)
      v[std::size_t(l) * kSavedPerBlock + kInput] = STASH_ACTION_KEEP;
  return v;
}

}  // namespace stash::workload
