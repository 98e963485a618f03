/* example.c: stage a GPU buffer into pinned host memory with stash's C API (C99). */
#include <stdio.h>
#include <cuda_runtime_api.h>
#include "stash.h"

#define CHECK(call) do { stash_status_t s_ = (call); if (s_ != STASH_OK) { \
    fprintf(stderr, "%s: %s\n", stash_status_string(s_), stash_last_error()); return 1; } } while (0)

int main(void) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return 77; /* skip */
  stash_pinned_pool_config_t cfg;
  stash_pinned_pool_config_init(&cfg);
  cfg.cap_bytes = (size_t)256 << 20;     /* never pin more than 256 MiB */
  cfg.reserve_bytes = (size_t)64 << 20;  /* pin 64 MiB now: alloc will not pin */
  stash_pinned_pool_t* pinned = NULL;
  stash_device_pool_t* device = NULL;    /* NULL config: the defaults */
  CHECK(stash_pinned_pool_create(&cfg, &pinned));
  CHECK(stash_device_pool_create(NULL, &device));
  cudaStream_t d2h;
  cudaStreamCreate(&d2h);
  void *act = NULL, *host = NULL;
  size_t bytes = (size_t)48 << 20;
  CHECK(stash_device_alloc(device, bytes, d2h, &act));
  CHECK(stash_pinned_alloc(pinned, bytes, &host));
  cudaMemcpyAsync(host, act, bytes, cudaMemcpyDeviceToHost, d2h); /* offload */
  /* Free both now: neither block is reused before the copy on d2h completes. */
  CHECK(stash_device_free(device, act, NULL, 0));
  CHECK(stash_pinned_free(pinned, host, &d2h, 1));
  stash_pool_stats_t st;
  stash_pool_stats_init(&st);
  CHECK(stash_pinned_stats(pinned, &st));
  printf("stash %s: %llu bytes pinned, peak in use %llu\n", stash_version_string(),
         (unsigned long long)st.reserved_bytes, (unsigned long long)st.peak_bytes);
  cudaStreamSynchronize(d2h);
  cudaStreamDestroy(d2h);
  stash_device_pool_destroy(device);
  stash_pinned_pool_destroy(pinned);
  return 0;
}
