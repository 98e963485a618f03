/* struct_layout.c: prints, as JSON, the layout of every stash.h struct the Python package
 * mirrors with ctypes (size, and each field's offset and size) and the enum values it
 * uses, as this compiler lays them out from the header. test_package.py compares the
 * ctypes mirrors against it, field by field. C99, so it sees exactly what a C client does. */
#include <stddef.h>
#include <stdio.h>

#include "stash.h"

static int first;

static void begin(const char* name, size_t size) {
  printf("%s\n  \"%s\": {\"size\": %zu, \"fields\": {", first ? "" : ",", name, size);
  first = 0;
}
static int field_first;
static void field(const char* name, size_t offset, size_t size) {
  printf("%s\"%s\": [%zu, %zu]", field_first ? "" : ", ", name, offset, size);
  field_first = 0;
}
static void end(void) { printf("}}"); }

#define STRUCT(T) (field_first = 1, begin(#T, sizeof(T)))
#define FIELD(T, f) field(#f, offsetof(T, f), sizeof(((T*)0)->f))

int main(void) {
  first = 1;
  printf("{\"structs\": {");
  STRUCT(stash_pool_stats_t);
  FIELD(stash_pool_stats_t, struct_size); FIELD(stash_pool_stats_t, current_count);
  FIELD(stash_pool_stats_t, peak_count); FIELD(stash_pool_stats_t, total_count);
  FIELD(stash_pool_stats_t, current_bytes); FIELD(stash_pool_stats_t, peak_bytes);
  FIELD(stash_pool_stats_t, total_bytes); FIELD(stash_pool_stats_t, requested_bytes);
  FIELD(stash_pool_stats_t, pending_count); FIELD(stash_pool_stats_t, pending_bytes);
  FIELD(stash_pool_stats_t, reserved_bytes); FIELD(stash_pool_stats_t, peak_reserved_bytes);
  FIELD(stash_pool_stats_t, slab_count); FIELD(stash_pool_stats_t, largest_free_bytes);
  FIELD(stash_pool_stats_t, limit_bytes); FIELD(stash_pool_stats_t, failed_count);
  end();
  STRUCT(stash_engine_config_t);
  FIELD(stash_engine_config_t, struct_size); FIELD(stash_engine_config_t, version);
  FIELD(stash_engine_config_t, compute_stream); FIELD(stash_engine_config_t, lookahead);
  FIELD(stash_engine_config_t, max_in_flight_bytes);
  FIELD(stash_engine_config_t, max_in_flight_count);
  FIELD(stash_engine_config_t, pinned_cap_bytes);
  FIELD(stash_engine_config_t, pinned_reserve_bytes);
  FIELD(stash_engine_config_t, on_pinned_exhausted);
  FIELD(stash_engine_config_t, pinned_wait_timeout_ms);
  FIELD(stash_engine_config_t, device_pool); FIELD(stash_engine_config_t, device_alloc);
  FIELD(stash_engine_config_t, device_release); FIELD(stash_engine_config_t, device_user);
  FIELD(stash_engine_config_t, timing); FIELD(stash_engine_config_t, max_micro_batches);
  end();
  STRUCT(stash_engine_stats_t);
  FIELD(stash_engine_stats_t, struct_size);
  FIELD(stash_engine_stats_t, offloaded_count); FIELD(stash_engine_stats_t, offloaded_bytes);
  FIELD(stash_engine_stats_t, prefetched_count); FIELD(stash_engine_stats_t, prefetched_bytes);
  FIELD(stash_engine_stats_t, kept_on_device_count);
  FIELD(stash_engine_stats_t, kept_on_device_bytes);
  FIELD(stash_engine_stats_t, keep_count); FIELD(stash_engine_stats_t, recompute_count);
  FIELD(stash_engine_stats_t, failed_count); FIELD(stash_engine_stats_t, released_count);
  FIELD(stash_engine_stats_t, in_flight_count); FIELD(stash_engine_stats_t, in_flight_bytes);
  FIELD(stash_engine_stats_t, peak_in_flight_count);
  FIELD(stash_engine_stats_t, peak_in_flight_bytes);
  FIELD(stash_engine_stats_t, cap_waits); FIELD(stash_engine_stats_t, release_callbacks);
  FIELD(stash_engine_stats_t, pinned);
  FIELD(stash_engine_stats_t, ordered_handback_count);
  FIELD(stash_engine_stats_t, ordered_handback_bytes);
  end();
  STRUCT(stash_tensor_key_t);
  FIELD(stash_tensor_key_t, micro_batch); FIELD(stash_tensor_key_t, layer);
  FIELD(stash_tensor_key_t, index);
  end();
  STRUCT(stash_overlap_t);
  FIELD(stash_overlap_t, layer); FIELD(stash_overlap_t, copy_ms);
  FIELD(stash_overlap_t, hidden_ms); FIELD(stash_overlap_t, exposed_ms);
  end();
  STRUCT(stash_plan_options_t);
  FIELD(stash_plan_options_t, struct_size); FIELD(stash_plan_options_t, version);
  FIELD(stash_plan_options_t, solver); FIELD(stash_plan_options_t, time_limit_s);
  FIELD(stash_plan_options_t, mip_gap); FIELD(stash_plan_options_t, polish);
  end();
  STRUCT(stash_plan_result_t);
  FIELD(stash_plan_result_t, struct_size); FIELD(stash_plan_result_t, budget_bytes);
  FIELD(stash_plan_result_t, keep_all_peak_bytes);
  FIELD(stash_plan_result_t, min_feasible_bytes);
  FIELD(stash_plan_result_t, min_feasible_proved);
  FIELD(stash_plan_result_t, predicted_peak_bytes);
  FIELD(stash_plan_result_t, predicted_step_ms);
  end();
  STRUCT(stash_link_result_t);
  FIELD(stash_link_result_t, struct_size); FIELD(stash_link_result_t, h2d_gbps);
  FIELD(stash_link_result_t, d2h_gbps); FIELD(stash_link_result_t, bidir_gbps);
  FIELD(stash_link_result_t, local_ranks); FIELD(stash_link_result_t, sharers);
  FIELD(stash_link_result_t, buffer_bytes); FIELD(stash_link_result_t, device_name);
  end();
  printf("},\n \"enums\": {\"STASH_ACTION_KEEP\": %d, \"STASH_ACTION_RECOMPUTE\": %d, "
         "\"STASH_ACTION_OFFLOAD\": %d, \"STASH_SOLVER_GREEDY\": %d, \"STASH_SOLVER_ILP\": %d, "
         "\"STASH_SOLVER_EXACT\": %d, \"STASH_ERROR_BAD_PLAN\": %d, "
         "\"STASH_ERROR_UNKNOWN_TENSOR\": %d, "
         "\"STASH_ERROR_BAD_PROFILE\": %d, \"STASH_ERROR_INFEASIBLE_BUDGET\": %d, "
         "\"STASH_TENSOR_RELEASED\": %d, \"STASH_TENSOR_READY\": %d, "
         "\"STASH_ENGINE_CONFIG_VERSION\": %d, \"STASH_PLAN_OPTIONS_VERSION\": %d}}\n",
         STASH_ACTION_KEEP, STASH_ACTION_RECOMPUTE, STASH_ACTION_OFFLOAD, STASH_SOLVER_GREEDY,
         STASH_SOLVER_ILP, STASH_SOLVER_EXACT, STASH_ERROR_BAD_PLAN, STASH_ERROR_UNKNOWN_TENSOR,
         STASH_ERROR_BAD_PROFILE, STASH_ERROR_INFEASIBLE_BUDGET, STASH_TENSOR_RELEASED,
         STASH_TENSOR_READY, STASH_ENGINE_CONFIG_VERSION, STASH_PLAN_OPTIONS_VERSION);
  return 0;
}
