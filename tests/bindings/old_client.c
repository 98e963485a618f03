/* old_client.c: a program built against stash 0.1.0's stash.h, run against this library.
 *
 * stash.h promises that a program may run against a newer libstash.so than its header
 * ("Versioned structs"). So this file does not include stash.h: it declares the part of
 * the 0.1.0 header it uses, copied from that release (git show d1d0374:bindings/include/
 * stash.h), and checks that this library reads the 0.1.0 configs at their 0.1.0 offsets
 * and writes the 0.1.0 statistics no further than the 0.1.0 structs reach. Every struct
 * sits in front of a guard tail the library must leave alone. C99, as an old C client.
 *
 * The configs have not grown since 0.1.0: their first size (the end of their last field)
 * is what they are passed with here, which for the pinned pool's config is less than its
 * sizeof (tail padding), a size the library used to refuse. stash_engine_stats_t grew in
 * 0.2.0 (ordered_handback_*): the 0.1.0 layout below is smaller than this library's.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

/* ---- stash.h 0.1.0, in part ------------------------------------------------------- */
typedef enum stash_status_t {
  STASH_OK = 0,
  STASH_ERROR_INVALID_ARGUMENT = 1,
  STASH_ERROR_VERSION_MISMATCH = 6,
  STASH_STATUS_FORCE_INT_ = 0x7fffffff
} stash_status_t;
unsigned stash_version(void);
const char* stash_version_string(void);
const char* stash_last_error(void);

typedef struct CUstream_st* stash_stream_t;

typedef struct stash_pool_stats_t {
  size_t struct_size;
  uint64_t current_count, peak_count, total_count, current_bytes, peak_bytes, total_bytes;
  uint64_t requested_bytes, pending_count, pending_bytes, reserved_bytes, peak_reserved_bytes;
  uint64_t slab_count, largest_free_bytes, limit_bytes, failed_count;
} stash_pool_stats_t;
void stash_pool_stats_init(stash_pool_stats_t* stats);

typedef struct stash_pinned_pool_t stash_pinned_pool_t;
typedef enum stash_exhaustion_t {
  STASH_EXHAUSTED_FAIL = 0,
  STASH_EXHAUSTED_WAIT = 1,
  STASH_EXHAUSTED_FORCE_INT_ = 0x7fffffff
} stash_exhaustion_t;
typedef struct stash_pinned_pool_config_t {
  size_t struct_size;
  unsigned version;
  int device;
  size_t cap_bytes, slab_bytes, growth_bytes, alignment, reserve_bytes;
  int reserve_in_background, report_progress, numa_placement;
  stash_exhaustion_t on_exhausted;
  unsigned wait_timeout_ms;
} stash_pinned_pool_config_t;
void stash_pinned_pool_config_init(stash_pinned_pool_config_t* config);
stash_status_t stash_pinned_pool_create(const stash_pinned_pool_config_t* config,
                                        stash_pinned_pool_t** out);
void stash_pinned_pool_destroy(stash_pinned_pool_t* pool);
stash_status_t stash_pinned_alloc(stash_pinned_pool_t* pool, size_t bytes, void** out);
stash_status_t stash_pinned_free(stash_pinned_pool_t* pool, void* ptr,
                                 const stash_stream_t* streams, size_t n_streams);
stash_status_t stash_pinned_stats(stash_pinned_pool_t* pool, stash_pool_stats_t* stats);

typedef struct stash_device_pool_t stash_device_pool_t;
typedef struct stash_device_pool_config_t {
  size_t struct_size;
  unsigned version;
  int device;
  size_t budget_bytes, slab_bytes, alignment;
} stash_device_pool_config_t;
void stash_device_pool_config_init(stash_device_pool_config_t* config);
stash_status_t stash_device_pool_create(const stash_device_pool_config_t* config,
                                        stash_device_pool_t** out);
void stash_device_pool_destroy(stash_device_pool_t* pool);
stash_status_t stash_device_alloc(stash_device_pool_t* pool, size_t bytes, stash_stream_t stream,
                                  void** out);
stash_status_t stash_device_free(stash_device_pool_t* pool, void* ptr,
                                 const stash_stream_t* streams, size_t n_streams);
stash_status_t stash_device_stats(stash_device_pool_t* pool, stash_pool_stats_t* stats);

typedef struct stash_engine_t stash_engine_t;
typedef enum stash_action_t {
  STASH_ACTION_KEEP = 0,
  STASH_ACTION_RECOMPUTE = 1,
  STASH_ACTION_OFFLOAD = 2
} stash_action_t;
typedef struct stash_tensor_key_t {
  uint32_t micro_batch, layer, index;
} stash_tensor_key_t;
typedef enum stash_pinned_exhausted_t {
  STASH_PINNED_KEEP_ON_DEVICE = 0,
  STASH_PINNED_WAIT = 1
} stash_pinned_exhausted_t;
typedef int (*stash_device_alloc_fn)(void** out, size_t bytes, stash_stream_t stream,
                                     void* user);
typedef void (*stash_device_release_fn)(void* ptr, size_t bytes, stash_stream_t stream,
                                        void* user);
typedef struct stash_engine_config_t {
  size_t struct_size;
  unsigned version;
  stash_stream_t compute_stream;
  int lookahead;
  size_t max_in_flight_bytes, max_in_flight_count, pinned_cap_bytes, pinned_reserve_bytes;
  stash_pinned_exhausted_t on_pinned_exhausted;
  unsigned pinned_wait_timeout_ms;
  stash_device_pool_t* device_pool;
  stash_device_alloc_fn device_alloc;
  stash_device_release_fn device_release;
  void* device_user;
  int timing;
  unsigned max_micro_batches;
} stash_engine_config_t;
void stash_engine_config_init(stash_engine_config_t* config);
stash_status_t stash_engine_create(const stash_engine_config_t* config, stash_engine_t** out);
void stash_engine_destroy(stash_engine_t* engine);
stash_status_t stash_engine_set_plan(stash_engine_t* engine, size_t n_layers,
                                     const size_t* tensors_per_layer,
                                     const stash_action_t* actions);
stash_status_t stash_engine_forward_begin(stash_engine_t* e, uint32_t micro_batch, uint32_t layer);
stash_status_t stash_engine_forward_end(stash_engine_t* e, uint32_t micro_batch, uint32_t layer);
stash_status_t stash_engine_backward_begin(stash_engine_t* e, uint32_t micro_batch, uint32_t layer);
stash_status_t stash_engine_backward_end(stash_engine_t* e, uint32_t micro_batch, uint32_t layer);
stash_status_t stash_engine_offload(stash_engine_t* engine, stash_tensor_key_t key,
                                    void* device_ptr, size_t bytes, stash_stream_t producer);
stash_status_t stash_engine_acquire(stash_engine_t* engine, stash_tensor_key_t key,
                                    stash_stream_t consumer, void** out);
stash_status_t stash_engine_release(stash_engine_t* engine, stash_tensor_key_t key);
stash_status_t stash_engine_synchronize(stash_engine_t* engine);
typedef struct stash_engine_stats_t {
  size_t struct_size;
  uint64_t offloaded_count, offloaded_bytes;
  uint64_t prefetched_count, prefetched_bytes;
  uint64_t kept_on_device_count, kept_on_device_bytes;
  uint64_t keep_count, recompute_count;
  uint64_t failed_count;
  uint64_t released_count;
  uint64_t in_flight_count, in_flight_bytes;
  uint64_t peak_in_flight_count, peak_in_flight_bytes;
  uint64_t cap_waits;
  uint64_t release_callbacks;
  stash_pool_stats_t pinned;
} stash_engine_stats_t;
stash_status_t stash_engine_stats(stash_engine_t* engine, stash_engine_stats_t* stats);
stash_status_t stash_engine_write_trace(stash_engine_t* engine, const char* path);
/* ---- end of stash.h 0.1.0 ----------------------------------------------------------- */

/* Where a struct of this layout ends: the smallest struct_size that holds `field`. */
#define END_OF(T, field) (offsetof(T, field) + sizeof(((T*)0)->field))

/* A struct followed by bytes the library must not touch. */
#define GUARDED(T) struct { T s; unsigned char tail[64]; }
enum { GUARD = 0xA5 };

static int failures = 0;

#define EXPECT(cond) do { if (!(cond)) { \
    fprintf(stderr, "old_client.c:%d: expected %s (last error: %s)\n", __LINE__, #cond, \
            stash_last_error()); ++failures; } } while (0)
#define CHECK(call) do { stash_status_t s_ = (call); if (s_ != STASH_OK) { \
    fprintf(stderr, "old_client.c:%d: %s returned %d: %s\n", __LINE__, #call, (int)s_, \
            stash_last_error()); return 1; } } while (0)

static int tail_intact(const unsigned char* tail, size_t n) {
  size_t i;
  for (i = 0; i < n; ++i)
    if (tail[i] != GUARD) return 0;
  return 1;
}

/* The pinned pool from a 0.1.0 config, at its first size. The _init call also checks
 * that this library's _init writes no more than the 0.1.0 struct holds (Note [Versioned
 * structs] in bindings/struct_version.h: it must not, once the struct grows). */
static int pinned_pool(void) {
  GUARDED(stash_pinned_pool_config_t) cfg;
  GUARDED(stash_pool_stats_t) st;
  stash_pinned_pool_t* pool = NULL;
  void* p = NULL;
  memset(&cfg, GUARD, sizeof cfg);
  stash_pinned_pool_config_init(&cfg.s);
  EXPECT(tail_intact(cfg.tail, sizeof cfg.tail));
  EXPECT(cfg.s.struct_size == sizeof cfg.s);
  EXPECT(cfg.s.alignment == 4096 && cfg.s.wait_timeout_ms == 1000);
  cfg.s.struct_size = END_OF(stash_pinned_pool_config_t, wait_timeout_ms);
  cfg.s.cap_bytes = (size_t)8 << 20;
  cfg.s.alignment = 512;
  CHECK(stash_pinned_pool_create(&cfg.s, &pool));
  CHECK(stash_pinned_alloc(pool, 100, &p));
  memset(&st, GUARD, sizeof st);
  stash_pool_stats_init(&st.s);
  EXPECT(tail_intact(st.tail, sizeof st.tail));
  CHECK(stash_pinned_stats(pool, &st.s));
  EXPECT(tail_intact(st.tail, sizeof st.tail));
  EXPECT(st.s.struct_size == sizeof st.s);
  EXPECT(st.s.limit_bytes == (size_t)8 << 20); /* cap_bytes, read at its 0.1.0 offset */
  EXPECT(st.s.current_bytes == 512);          /* alignment, likewise */
  EXPECT(st.s.requested_bytes == 100);
  CHECK(stash_pinned_free(pool, p, NULL, 0));
  stash_pinned_pool_destroy(pool);

  /* One byte short of the first size: a size no stash.h ever had. */
  cfg.s.struct_size = END_OF(stash_pinned_pool_config_t, wait_timeout_ms) - 1;
  EXPECT(stash_pinned_pool_create(&cfg.s, &pool) == STASH_ERROR_VERSION_MISMATCH);
  EXPECT(pool == NULL);
  EXPECT(strstr(stash_last_error(), "stash_pinned_pool_config_t") != NULL);
  return 0;
}

static int device_pool(stash_device_pool_t** out) {
  GUARDED(stash_device_pool_config_t) cfg;
  GUARDED(stash_pool_stats_t) st;
  void* p = NULL;
  memset(&cfg, GUARD, sizeof cfg);
  stash_device_pool_config_init(&cfg.s);
  EXPECT(tail_intact(cfg.tail, sizeof cfg.tail));
  EXPECT(cfg.s.alignment == 512);
  cfg.s.struct_size = END_OF(stash_device_pool_config_t, alignment);
  cfg.s.budget_bytes = (size_t)64 << 20;
  cfg.s.alignment = 1024;
  CHECK(stash_device_pool_create(&cfg.s, out));
  CHECK(stash_device_alloc(*out, 100, NULL, &p));
  memset(&st, GUARD, sizeof st);
  st.s.struct_size = sizeof st.s;
  CHECK(stash_device_stats(*out, &st.s));
  EXPECT(tail_intact(st.tail, sizeof st.tail));
  EXPECT(st.s.limit_bytes == (size_t)64 << 20);
  EXPECT(st.s.current_bytes == 1024);
  CHECK(stash_device_free(*out, p, NULL, 0));
  return 0;
}

/* The engine from a 0.1.0 config, one tensor offloaded and fetched back, and its 0.1.0
 * statistics, which are 16 bytes shorter than this library's. */
static int engine(stash_device_pool_t* pool) {
  enum { N = 1 << 16 };
  static unsigned char in[N], out[N];
  GUARDED(stash_engine_config_t) cfg;
  GUARDED(stash_engine_stats_t) st;
  stash_engine_t* e = NULL;
  cudaStream_t compute;
  const size_t per_layer[2] = {1, 0};
  const stash_action_t actions[1] = {STASH_ACTION_OFFLOAD};
  const stash_tensor_key_t key = {0, 0, 0};
  void* act = NULL;
  void* back = NULL;
  if (cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) != cudaSuccess) return 1;
  memset(&cfg, GUARD, sizeof cfg);
  stash_engine_config_init(&cfg.s);
  EXPECT(tail_intact(cfg.tail, sizeof cfg.tail));
  EXPECT(cfg.s.lookahead == 1 && cfg.s.timing == 1 && cfg.s.max_micro_batches == 8);
  cfg.s.struct_size = END_OF(stash_engine_config_t, max_micro_batches);
  cfg.s.compute_stream = compute;
  cfg.s.device_pool = pool;
  cfg.s.pinned_cap_bytes = (size_t)4 << 20;
  cfg.s.timing = 0;
  CHECK(stash_engine_create(&cfg.s, &e));
  /* timing, the config's second-to-last 0.1.0 field, was read: no trace without it. */
  EXPECT(stash_engine_write_trace(e, "old_client_trace.json") == STASH_ERROR_INVALID_ARGUMENT);

  CHECK(stash_engine_set_plan(e, 2, per_layer, actions));
  memset(in, 7, N);
  CHECK(stash_engine_forward_begin(e, 0, 0));
  CHECK(stash_device_alloc(pool, N, compute, &act));
  if (cudaMemcpyAsync(act, in, N, cudaMemcpyHostToDevice, compute) != cudaSuccess) return 1;
  CHECK(stash_engine_offload(e, key, act, N, compute));
  CHECK(stash_engine_forward_end(e, 0, 0));
  CHECK(stash_engine_forward_begin(e, 0, 1));
  CHECK(stash_engine_forward_end(e, 0, 1));
  CHECK(stash_engine_backward_begin(e, 0, 1));
  CHECK(stash_engine_backward_end(e, 0, 1));
  CHECK(stash_engine_backward_begin(e, 0, 0));
  CHECK(stash_engine_acquire(e, key, compute, &back));
  if (cudaMemcpyAsync(out, back, N, cudaMemcpyDeviceToHost, compute) != cudaSuccess) return 1;
  cudaStreamSynchronize(compute);
  EXPECT(memcmp(in, out, N) == 0);
  CHECK(stash_engine_release(e, key));
  CHECK(stash_engine_backward_end(e, 0, 0));
  CHECK(stash_engine_synchronize(e));

  /* struct_size by hand, not stash_engine_stats_init: that writes this library's
   * (0.2.0 and later) struct, 16 bytes more than a 0.1.0 program has (the gap Note
   * [Versioned structs] describes). */
  memset(&st, GUARD, sizeof st);
  st.s.struct_size = sizeof st.s;
  st.s.pinned.struct_size = sizeof st.s.pinned;
  CHECK(stash_engine_stats(e, &st.s));
  EXPECT(tail_intact(st.tail, sizeof st.tail)); /* ordered_handback_* not written */
  EXPECT(st.s.struct_size == sizeof st.s);
  EXPECT(st.s.offloaded_count == 1 && st.s.offloaded_bytes == N);
  EXPECT(st.s.prefetched_count == 1 && st.s.prefetched_bytes == N);
  EXPECT(st.s.released_count == 1);
  EXPECT(st.s.pinned.limit_bytes == (size_t)4 << 20); /* pinned_cap_bytes, read */
  EXPECT(st.s.pinned.total_count == 1);

  stash_engine_destroy(e);
  cudaStreamDestroy(compute);
  return 0;
}

int main(void) {
  int devices = 0;
  stash_device_pool_t* pool = NULL;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return 77; /* skip */
  if (stash_version() < 100) {
    fprintf(stderr, "stash_version() is %u: older than 0.1.0?\n", stash_version());
    return 1;
  }
  if (pinned_pool() || device_pool(&pool) || engine(pool)) failures += 1;
  stash_device_pool_destroy(pool);
  printf("a stash 0.1.0 client against libstash %s: %s\n", stash_version_string(),
         failures ? "FAILED" : "ok");
  return failures != 0;
}
