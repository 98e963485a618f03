// profiler_api.cpp: the C API's profiler scopes and the in-process CUPTI profiler
// (runtime/measure). Scopes always open an NVTX range in domain "stash"; while the
// in-process profiler runs they are also tracked by it and push an external correlation
// id (Note [Attribution by launch] in runtime/measure/attribution.h).
#include <memory>
#include <string>

#include "api_boundary.h"
#include "core/json_file.h"
#include "planner/model/profile.h"
#include "runtime/measure/attribution.h"
#include "runtime/measure/cupti_profiler.h"
#include "runtime/measure/profile_fill.h"
#include "runtime/measure/scope_name.h"
#include "runtime/nvtx_domain.h"
#include "stash.h"

namespace {

using stash::status;


// Scopes this thread opened and has not closed; end without begin is an error rather
// than a pop of someone else's NVTX range.
thread_local int t_open_scopes = 0;

}  // namespace

STASH_API stash_status_t stash_profile_scope_begin(stash_scope_kind_t kind, int layer,
                                                   const char* name) {
  return stash::api::api_call("stash_profile_scope_begin", [&] {
    std::string text;
    // A C caller may pass any int; compare as one.
    switch (static_cast<int>(kind)) {
      case STASH_SCOPE_FORWARD:
      case STASH_SCOPE_BACKWARD:
        if (layer < 0) return stash::fail(status::invalid_argument, "layer %d is negative", layer);
        text = stash::measure::layer_scope_name(layer, kind == STASH_SCOPE_BACKWARD);
        break;
      case STASH_SCOPE_TENSOR:
        if (!name || !*name) return stash::fail(status::invalid_argument, "a tensor scope needs a name");
        text = stash::measure::tensor_scope_name(name);
        break;
      default:
        return stash::fail(status::invalid_argument, "unknown scope kind %d", static_cast<int>(kind));
    }
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = text.c_str();
    nvtxDomainRangePushEx(stash::nvtx::domain(), &a);
    stash::measure::cupti_profiler::process().scope_push(text);  // no-op while inactive
    ++t_open_scopes;
    return status::ok;
  });
}

STASH_API stash_status_t stash_profile_scope_end(void) {
  return stash::api::api_call("stash_profile_scope_end", [&] {
    if (t_open_scopes == 0) {
      return stash::fail(status::invalid_argument, "no profiler scope is open on this thread");
    }
    --t_open_scopes;
    stash::measure::cupti_profiler::process().scope_pop();
    nvtxDomainRangePop(stash::nvtx::domain());
    return status::ok;
  });
}

STASH_API stash_status_t stash_profiler_start(void) {
  return stash::api::api_call("stash_profiler_start", [&] {
    auto& p = stash::measure::cupti_profiler::process();
    if (p.active()) return stash::fail(status::profiler_state, "the profiler is already running");
    stash::measure::profiler_options o;
    o.follow_nvtx = false;  // our scopes report themselves; NVTX may not reach CUPTI
    o.ask_runtime = true;
    const std::string why = p.start(o);
    if (!why.empty()) {
      return stash::fail(status::profiling_unavailable, "profiling unavailable: %s", why.c_str());
    }
    return status::ok;
  });
}

STASH_API int stash_profiler_active(void) {
  return stash::measure::cupti_profiler::process().active() ? 1 : 0;
}

STASH_API stash_status_t stash_profiler_stop(const char* skeleton_path, const char* output_path) {
  return stash::api::api_call("stash_profiler_stop", [&] {
    auto& p = stash::measure::cupti_profiler::process();
    if (!p.active()) return stash::fail(status::profiler_state, "the profiler is not running");
    const stash::measure::measurement m = stash::measure::attribute(p.stop());
    if (!output_path || !*output_path) {
      return stash::fail(status::invalid_argument, "output_path is NULL or empty");
    }
    try {
      std::unique_ptr<stash::planner::step_profile> skeleton;
      if (skeleton_path && *skeleton_path) {
        skeleton = std::make_unique<stash::planner::step_profile>(
            stash::planner::load_profile(skeleton_path));
      }
      const auto filled = stash::measure::fill_profile(m, skeleton.get(), std::nullopt);
      stash::write_json_file(output_path, filled.json);  // its errors name the path
    } catch (const stash::input_error& e) {
      return stash::fail(status::invalid_argument, "%s", e.what());
    }
    return status::ok;
  });
}
