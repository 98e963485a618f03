/* engine_example.c: offload a layer's activation and fetch it back through stash.h. */
#include <stdio.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "stash.h"

#define CHECK(call) do { stash_status_t s_ = (call); if (s_ != STASH_OK) { \
  fprintf(stderr, "%s: %s\n", #call, stash_last_error()); return 1; } } while (0)

enum { N = 1 << 20 };
static unsigned char host[N], back[N];

int main(void) {
  cudaStream_t compute; stash_device_pool_t* pool; stash_engine_t* eng; void* act; void* p;
  cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
  CHECK(stash_device_pool_create(NULL, &pool));
  stash_engine_config_t cfg; stash_engine_config_init(&cfg);
  cfg.compute_stream = compute; cfg.device_pool = pool; cfg.pinned_cap_bytes = 64 << 20;
  CHECK(stash_engine_create(&cfg, &eng));
  size_t per_layer[2] = {1, 0};  /* layer 0 saves one tensor, which the plan offloads */
  stash_action_t actions[1] = {STASH_ACTION_OFFLOAD};  /* or stash_engine_load_plan(eng, "plan.json") */
  CHECK(stash_engine_set_plan(eng, 2, per_layer, actions));
  stash_tensor_key_t key = {0, 0, 0};  /* micro-batch 0, layer 0, tensor 0 */
  memset(host, 7, N);
  CHECK(stash_engine_forward_begin(eng, 0, 0));
  CHECK(stash_device_alloc(pool, N, compute, &act));  /* the layer's forward produces act */
  cudaMemcpyAsync(act, host, N, cudaMemcpyHostToDevice, compute);
  CHECK(stash_engine_offload(eng, key, act, N, compute));  /* D2H on "stash d2h"; act freed after */
  CHECK(stash_engine_forward_end(eng, 0, 0));
  CHECK(stash_engine_forward_begin(eng, 0, 1)); CHECK(stash_engine_forward_end(eng, 0, 1));
  CHECK(stash_engine_backward_begin(eng, 0, 1));  /* prefetches layer 0 on "stash h2d" */
  CHECK(stash_engine_backward_end(eng, 0, 1));
  CHECK(stash_engine_backward_begin(eng, 0, 0));
  CHECK(stash_engine_acquire(eng, key, compute, &p));  /* compute waits for this tensor only */
  cudaMemcpyAsync(back, p, N, cudaMemcpyDeviceToHost, compute);  /* layer 0's backward reads p */
  cudaStreamSynchronize(compute);
  CHECK(stash_engine_release(eng, key)); CHECK(stash_engine_backward_end(eng, 0, 0));
  stash_overlap_t total; CHECK(stash_engine_overlap(eng, &total, NULL, 0, NULL));
  CHECK(stash_engine_write_trace(eng, "engine_example_trace.json"));
  printf("round trip %s; copies %.3f ms, exposed %.3f ms\n", memcmp(host, back, N) ? "BROKEN" : "ok",
         total.copy_ms, total.exposed_ms);
  stash_engine_destroy(eng); stash_device_pool_destroy(pool); cudaStreamDestroy(compute);
  return memcmp(host, back, N) != 0;
}
