// The prefetch engine behind the C API (stash.h, "Prefetch engine").
#include <cstring>
#include <string>
#include <type_traits>

#include "api_boundary.h"
#include "handles.h"
#include "device_pool.h"
#include "engine_status.h"
#include "prefetch_engine.h"
#include "struct_version.h"

using namespace stash;
using stash::api::api_call;
namespace eng = stash::engine;

struct stash_engine_t {
  explicit stash_engine_t(const eng::engine_config& c) : engine(c) {}
  eng::prefetch_engine engine;
};

static_assert(static_cast<int>(eng::tensor_action::keep) == STASH_ACTION_KEEP);
static_assert(static_cast<int>(eng::tensor_action::recompute) == STASH_ACTION_RECOMPUTE);
static_assert(static_cast<int>(eng::tensor_action::offload) == STASH_ACTION_OFFLOAD);
static_assert(static_cast<int>(eng::tensor_state::released) == STASH_TENSOR_RELEASED);
static_assert(static_cast<int>(eng::tensor_state::ready) == STASH_TENSOR_READY);
static_assert(static_cast<int>(eng::pinned_exhausted::keep_on_device) ==
              STASH_PINNED_KEEP_ON_DEVICE);
static_assert(static_cast<int>(eng::pinned_exhausted::wait) == STASH_PINNED_WAIT);

namespace {

status no_engine(const char* fn) { return fail(status::invalid_argument, "%s: engine is NULL", fn); }

eng::tensor_key key_of(stash_tensor_key_t k) { return {k.micro_batch, k.layer, k.index}; }

cudaStream_t stream_of(stash_stream_t s) { return reinterpret_cast<cudaStream_t>(s); }

template <class F>
stash_status_t with_engine(const char* fn, stash_engine_t* e, F&& body) noexcept {
  return api_call(fn, [&]() -> status {
    if (!e) return no_engine(fn);
    return body(e->engine);
  });
}

}  // namespace

extern "C" {

STASH_API void stash_engine_config_init(stash_engine_config_t* c) {
  if (!c) return;
  *c = stash_engine_config_t{};
  c->struct_size = sizeof *c;
  c->version = STASH_ENGINE_CONFIG_VERSION;
  c->lookahead = 1;
  c->on_pinned_exhausted = STASH_PINNED_KEEP_ON_DEVICE;
  c->pinned_wait_timeout_ms = 1000;
  c->timing = 1;
  c->max_micro_batches = 8;
}

STASH_API stash_status_t stash_engine_create(const stash_engine_config_t* config,
                                             stash_engine_t** out) {
  static const char* fn = "stash_engine_create";
  return api_call(fn, [&]() -> status {
    if (!out) return fail(status::invalid_argument, "%s: out is NULL", fn);
    *out = nullptr;
    stash_engine_config_t g;  // the caller's config over the defaults
    if (const status s = api::read_config(fn, "config", config, &g); s != status::ok) return s;
    if (g.max_micro_batches == 0)
      return fail(status::invalid_argument, "%s: max_micro_batches is 0", fn);
    eng::engine_config c;
    c.compute = stream_of(g.compute_stream);
    c.lookahead = g.lookahead;
    c.max_in_flight_bytes = g.max_in_flight_bytes;
    c.max_in_flight_count = g.max_in_flight_count;
    c.pinned.cap_bytes = g.pinned_cap_bytes;
    c.pinned.reserve_bytes = g.pinned_reserve_bytes;
    c.pinned.wait_timeout_ms = g.pinned_wait_timeout_ms;
    c.on_pinned_exhausted = static_cast<eng::pinned_exhausted>(g.on_pinned_exhausted);
    c.pool = g.device_pool ? &g.device_pool->pool : nullptr;
    // stash_stream_t is cudaStream_t's struct pointer, so the function types agree.
    c.alloc = reinterpret_cast<eng::device_alloc_fn>(g.device_alloc);
    c.release = reinterpret_cast<eng::device_release_fn>(g.device_release);
    c.user = g.device_user;
    c.timing = g.timing != 0;
    c.max_micro_batches = g.max_micro_batches;
    *out = new stash_engine_t(c);
    return status::ok;
  });
}

// A destructor cannot throw (the engine's is noexcept), so delete needs no api_call.
static_assert(std::is_nothrow_destructible_v<stash_engine_t>);
STASH_API void stash_engine_destroy(stash_engine_t* engine) { delete engine; }

STASH_API stash_status_t stash_engine_load_plan(stash_engine_t* e, const char* path) {
  static const char* fn = "stash_engine_load_plan";
  return with_engine(fn, e, [&](eng::prefetch_engine& x) {
    if (!path) return fail(status::invalid_argument, "%s: path is NULL", fn);
    return x.set_plan(eng::engine_plan::from_file(path));
  });
}

STASH_API stash_status_t stash_engine_set_plan(stash_engine_t* e, size_t n_layers,
                                               const size_t* tensors_per_layer,
                                               const stash_action_t* actions) {
  static const char* fn = "stash_engine_set_plan";
  return with_engine(fn, e, [&](eng::prefetch_engine& x) {
    static_assert(sizeof(stash_action_t) == sizeof(eng::tensor_action));
    return x.set_plan(eng::engine_plan::from_actions(
        n_layers, tensors_per_layer, reinterpret_cast<const eng::tensor_action*>(actions)));
  });
}

STASH_API stash_status_t stash_engine_action(stash_engine_t* e, uint32_t layer, uint32_t index,
                                             stash_action_t* out) {
  return with_engine("stash_engine_action", e, [&](eng::prefetch_engine& x) {
    eng::tensor_action a{};
    const status s = x.action(layer, index, out ? &a : nullptr);
    if (s == status::ok) *out = static_cast<stash_action_t>(a);
    return s;
  });
}

STASH_API stash_status_t stash_engine_forward_begin(stash_engine_t* e, uint32_t mb, uint32_t l) {
  return with_engine("stash_engine_forward_begin", e,
                     [&](eng::prefetch_engine& x) { return x.forward_begin(mb, l); });
}
STASH_API stash_status_t stash_engine_forward_end(stash_engine_t* e, uint32_t mb, uint32_t l) {
  return with_engine("stash_engine_forward_end", e,
                     [&](eng::prefetch_engine& x) { return x.forward_end(mb, l); });
}
STASH_API stash_status_t stash_engine_backward_begin(stash_engine_t* e, uint32_t mb,
                                                     uint32_t l) {
  return with_engine("stash_engine_backward_begin", e,
                     [&](eng::prefetch_engine& x) { return x.backward_begin(mb, l); });
}
STASH_API stash_status_t stash_engine_backward_end(stash_engine_t* e, uint32_t mb, uint32_t l) {
  return with_engine("stash_engine_backward_end", e,
                     [&](eng::prefetch_engine& x) { return x.backward_end(mb, l); });
}

STASH_API stash_status_t stash_engine_offload(stash_engine_t* e, stash_tensor_key_t key,
                                              void* device_ptr, size_t bytes,
                                              stash_stream_t producer) {
  // The hot path: no api_call wrapper needed beyond the NULL check (nothing here throws).
  if (!e) return api::to_c(no_engine("stash_engine_offload"));
  return api::to_c(e->engine.offload(key_of(key), device_ptr, bytes, stream_of(producer)));
}

STASH_API stash_status_t stash_engine_acquire(stash_engine_t* e, stash_tensor_key_t key,
                                              stash_stream_t consumer, void** out) {
  if (!e) {
    if (out) *out = nullptr;
    return api::to_c(no_engine("stash_engine_acquire"));
  }
  return api::to_c(e->engine.acquire(key_of(key), stream_of(consumer), out));
}

STASH_API stash_status_t stash_engine_release(stash_engine_t* e, stash_tensor_key_t key) {
  if (!e) return api::to_c(no_engine("stash_engine_release"));
  return api::to_c(e->engine.release(key_of(key)));
}

STASH_API stash_status_t stash_engine_tensor_state(stash_engine_t* e, stash_tensor_key_t key,
                                                   stash_tensor_state_t* state,
                                                   stash_status_t* error) {
  return with_engine("stash_engine_tensor_state", e, [&](eng::prefetch_engine& x) {
    eng::tensor_info info;
    const status s = x.info(key_of(key), &info);
    if (s != status::ok) return s;
    if (state)
      *state = info.state == eng::tensor_state::absent
                   ? STASH_TENSOR_NOT_OFFERED
                   : static_cast<stash_tensor_state_t>(static_cast<int>(info.state));
    if (error) *error = api::to_c(info.error);
    return status::ok;
  });
}

STASH_API stash_status_t stash_engine_synchronize(stash_engine_t* e) {
  return with_engine("stash_engine_synchronize", e,
                     [&](eng::prefetch_engine& x) { return x.synchronize(); });
}

STASH_API stash_status_t stash_engine_capture_begin(stash_engine_t* e,
                                                    size_t pinned_bytes) {
  return with_engine("stash_engine_capture_begin", e, [&](eng::prefetch_engine& x) {
    return x.begin_capture(pinned_bytes);
  });
}

STASH_API stash_status_t stash_engine_capture_end(stash_engine_t* e) {
  return with_engine("stash_engine_capture_end", e,
                     [&](eng::prefetch_engine& x) { return x.end_capture(); });
}

STASH_API stash_status_t stash_engine_replay(stash_engine_t* e) {
  return with_engine("stash_engine_replay", e,
                     [&](eng::prefetch_engine& x) { return x.replay(); });
}

STASH_API stash_status_t stash_engine_capture_join(stash_engine_t* e, stash_stream_t stream) {
  return with_engine("stash_engine_capture_join", e, [&](eng::prefetch_engine& x) {
    return x.join_capture(stream_of(stream));
  });
}

STASH_API stash_status_t stash_engine_capture_settle(stash_engine_t* e) {
  return with_engine("stash_engine_capture_settle", e,
                     [&](eng::prefetch_engine& x) { return x.settle_capture(); });
}

STASH_API stash_status_t stash_engine_capture_release(stash_engine_t* e,
                                                      size_t* released_bytes) {
  return with_engine("stash_engine_capture_release", e, [&](eng::prefetch_engine& x) {
    return x.release_held(released_bytes);
  });
}

STASH_API stash_status_t stash_engine_graph_state(stash_engine_t* e, int* capturing, int* ready,
                                                  uint64_t* captures, uint64_t* replays) {
  return with_engine("stash_engine_graph_state", e, [&](eng::prefetch_engine& x) {
    const eng::prefetch_engine::graph_state g = x.graph();
    if (capturing) *capturing = g.capturing ? 1 : 0;
    if (ready) *ready = g.ready ? 1 : 0;
    if (captures) *captures = g.captures;
    if (replays) *replays = g.replays;
    return status::ok;
  });
}

STASH_API void stash_engine_stats_init(stash_engine_stats_t* stats) {
  if (!stats) return;
  std::memset(stats, 0, sizeof *stats);
  stats->struct_size = sizeof *stats;
  stats->pinned.struct_size = sizeof stats->pinned;
}

STASH_API stash_status_t stash_engine_stats(stash_engine_t* e, stash_engine_stats_t* out) {
  static const char* fn = "stash_engine_stats";
  return with_engine(fn, e, [&](eng::prefetch_engine& x) {
    if (!out) return fail(status::invalid_argument, "%s: stats is NULL", fn);
    if (const status st = api::check_size(fn, "stats", *out); st != status::ok) return st;
    const eng::engine_stats s = x.stats();
    stash_engine_stats_t full;
    stash_engine_stats_init(&full);
    full.offloaded_count = s.offloaded_count;
    full.offloaded_bytes = s.offloaded_bytes;
    full.prefetched_count = s.prefetched_count;
    full.prefetched_bytes = s.prefetched_bytes;
    full.kept_on_device_count = s.kept_on_device_count;
    full.kept_on_device_bytes = s.kept_on_device_bytes;
    full.keep_count = s.keep_count;
    full.recompute_count = s.recompute_count;
    full.failed_count = s.failed_count;
    full.released_count = s.released_count;
    full.in_flight_count = s.in_flight_count;
    full.in_flight_bytes = s.in_flight_bytes;
    full.peak_in_flight_count = s.peak_in_flight_count;
    full.peak_in_flight_bytes = s.peak_in_flight_bytes;
    full.cap_waits = s.cap_waits;
    full.release_callbacks = s.release_callbacks;
    full.ordered_handback_count = s.ordered_handback_count;
    full.ordered_handback_bytes = s.ordered_handback_bytes;
    status st = api::copy_stats(s.pinned, &full.pinned, fn);
    if (st != status::ok) return st;
    api::write_as_far_as(full, out);  // Note [Versioned structs]
    return status::ok;
  });
}

STASH_API stash_status_t stash_engine_write_trace(stash_engine_t* e, const char* path) {
  static const char* fn = "stash_engine_write_trace";
  return with_engine(fn, e, [&](eng::prefetch_engine& x) {
    if (!path) return fail(status::invalid_argument, "%s: path is NULL", fn);
    try {
      x.write_trace(path);
    } catch (const error&) {
      throw;
    } catch (const std::exception& ex) {  // the writer's I/O errors name the path
      return fail(status::invalid_argument, "%s: %s", fn, ex.what());
    }
    return status::ok;
  });
}

STASH_API stash_status_t stash_engine_overlap(stash_engine_t* e, stash_overlap_t* total,
                                              stash_overlap_t* per_layer, size_t capacity,
                                              size_t* n_layers) {
  static const char* fn = "stash_engine_overlap";
  return with_engine(fn, e, [&](eng::prefetch_engine& x) {
    if (capacity > 0 && !per_layer)
      return fail(status::invalid_argument, "%s: per_layer is NULL", fn);
    const planner::overlap_report r = x.overlap();
    auto conv = [](const planner::layer_overlap& l) {
      return stash_overlap_t{l.layer, l.copy_ms, l.hidden_ms, l.exposed_ms};
    };
    if (total) {
      *total = conv(r.total);
      total->layer = -1;
    }
    for (size_t i = 0; i < capacity && i < r.layers.size(); ++i) per_layer[i] = conv(r.layers[i]);
    if (n_layers) *n_layers = r.layers.size();
    return status::ok;
  });
}

STASH_API stash_status_t stash_engine_streams(stash_engine_t* e, stash_stream_t* d2h,
                                              stash_stream_t* h2d) {
  return with_engine("stash_engine_streams", e, [&](eng::prefetch_engine& x) {
    if (d2h) *d2h = reinterpret_cast<stash_stream_t>(x.d2h_stream());
    if (h2d) *h2d = reinterpret_cast<stash_stream_t>(x.h2d_stream());
    return status::ok;
  });
}

}  // extern "C"
