// The link benchmark behind the C API (stash.h, "Link"): what `stash bench link` measures
// (runtime/measure/link_bench.h), as the profile's link section.
#include <cstdio>
#include <cstring>

#include "api_boundary.h"
#include "runtime/measure/link_bench.h"
#include "struct_version.h"

using namespace stash;
using stash::api::api_call;

extern "C" {

STASH_API void stash_link_result_init(stash_link_result_t* r) {
  if (!r) return;
  *r = stash_link_result_t{};
  r->struct_size = sizeof *r;
}

STASH_API stash_status_t stash_link_measure(int device, size_t bytes, int sharers,
                                            stash_link_result_t* result) {
  static const char* fn = "stash_link_measure";
  return api_call(fn, [&]() -> status {
    if (!result) return fail(status::invalid_argument, "%s: result is NULL", fn);
    if (const status s = api::check_size(fn, "result", *result); s != status::ok) return s;
    if (device < 0 || sharers < 0) {
      return fail(status::invalid_argument, "%s: device %d and sharers %d must be >= 0", fn,
                  device, sharers);
    }
    measure::link_bench_options o;
    o.device = device;
    if (bytes) o.bytes = bytes;
    o.sharers = sharers;
    o.pageable = false;
    // Its errors are stash::error: CUDA failures (cuda_error) and refused sizes
    // (input_error, invalid_argument), which api_call reports as "<fn>: <what>".
    const measure::link_bench_result r = measure::run_link_bench(o);
    const planner::link_profile l = r.link();
    stash_link_result_t full;
    stash_link_result_init(&full);
    full.h2d_gbps = l.h2d_gbps;
    full.d2h_gbps = l.d2h_gbps;
    full.bidir_gbps = l.bidir_gbps;
    full.local_ranks = l.local_ranks;
    full.sharers = r.sharers;
    full.buffer_bytes = r.buffer_bytes;
    std::snprintf(full.device_name, sizeof full.device_name, "%s", r.device_name.c_str());
    api::write_as_far_as(full, result);  // Note [Versioned structs]
    return status::ok;
  });
}

}  // extern "C"
