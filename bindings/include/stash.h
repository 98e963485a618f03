/* stash.h: the public C API of stash, a CUDA runtime memory manager.
 *
 * This header is the only public header and the documentation of the API. C99; usable
 * from C++. Link with -lstash (libstash.so), which links the CUDA runtime (libcudart.so.13)
 * as a shared library.
 *
 * Conventions
 *  - Every function returns a stash_status_t (except the few documented otherwise) and
 *    delivers results through out-parameters. STASH_OK is 0.
 *  - On failure, stash_last_error() returns a message for the calling thread that names
 *    the problem (for CUDA errors: source file:line, the call and the CUDA error name).
 *  - No C++ exception ever crosses this API; no function aborts on bad input.
 *  - Handles are opaque. Each stash_*_destroy accepts NULL and does nothing then.
 *  - Sizes are in bytes. Every symbol starts with stash_ / STASH_.
 *  - "Since" gives the version in which a declaration appeared.
 *  - Every enum has a *_FORCE_INT_ member: not a value, it keeps the type int-sized.
 *
 * Versioned structs
 *  - Every struct passed in or filled in starts with struct_size; configs and options then
 *    have version. Fill them with their _init function. Fields are only ever added at the
 *    end, each with its "since"; each struct lists its fields per version.
 *  - A program may run against a newer libstash.so than its stash.h. So the library
 *    accepts any struct_size from the struct's first size (the offset just past its last
 *    field in the version where it appeared, which may be less than that version's sizeof)
 *    up to the library's own sizeof. Fields past the caller's struct_size take their _init
 *    defaults (configs, options) or are not written (results, statistics). Statistics
 *    accept any struct_size that holds struct_size itself.
 *  - A struct_size below the first size, one above this library's sizeof (a program built
 *    against a newer stash.h: compare stash_version()), or a version this library does not
 *    know gives STASH_ERROR_VERSION_MISMATCH; the message names the struct, the size and
 *    the sizes accepted.
 *
 * Thread safety is stated per handle below. Process-wide functions (version, status
 * strings, last error) are always thread-safe.
 */
#ifndef STASH_H
#define STASH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define STASH_API __attribute__((visibility("default")))
#else
#define STASH_API
#endif

/* ---------------------------------------------------------------------------------------
 * Version (since 0.1.0)
 * ------------------------------------------------------------------------------------- */
#define STASH_VERSION_MAJOR 0
#define STASH_VERSION_MINOR 3
#define STASH_VERSION_PATCH 0
#define STASH_VERSION_NUMBER \
  (STASH_VERSION_MAJOR * 10000 + STASH_VERSION_MINOR * 100 + STASH_VERSION_PATCH)
#define STASH_VERSION_STRING "0.3.0"

/* The library's STASH_VERSION_NUMBER, which may differ from the header's when a program
 * runs against a newer libstash.so. */
STASH_API unsigned stash_version(void);
/* The library's version as "MAJOR.MINOR.PATCH"; a static string. */
STASH_API const char* stash_version_string(void);

/* ---------------------------------------------------------------------------------------
 * Status codes and errors (since 0.1.0). The numbers never change; new codes are added at
 * the end of their range. 1..99: common errors. 100..199: reserved for the plan and
 * engine API (context, plans, offload/prefetch). 200..299: reserved for the profiler.
 * ------------------------------------------------------------------------------------- */
typedef enum stash_status_t {
  STASH_OK = 0,
  STASH_ERROR_INVALID_ARGUMENT = 1, /* NULL where a value is required, zero size, bad config */
  STASH_ERROR_OUT_OF_MEMORY = 2,    /* cap or budget reached; the message has the pool's stats */
  STASH_ERROR_CUDA = 3,             /* a CUDA runtime call failed; the message names it */
  STASH_ERROR_TIMEOUT = 4,          /* a bounded wait ran out */
  STASH_ERROR_UNKNOWN_POINTER = 5,  /* foreign pointer, double free, or inside a block */
  STASH_ERROR_VERSION_MISMATCH = 6, /* a config struct of an unknown size or version */
  STASH_ERROR_INTERNAL = 7,         /* a bug in stash, or host memory exhausted */
  /* 100..199: the prefetch engine (since 0.1.0) */
  STASH_ERROR_NO_PLAN = 100,            /* the engine has no plan loaded */
  STASH_ERROR_BAD_PLAN = 101,           /* a plan file that is not valid stash.plan/1 */
  STASH_ERROR_UNKNOWN_TENSOR = 102,     /* a tensor key outside the plan */
  STASH_ERROR_ILLEGAL_TRANSITION = 103, /* acquire before offload, double release, ... */
  STASH_ERROR_TENSOR_FAILED = 104,      /* this tensor's copy failed earlier; the message
                                           names the CUDA error */
  /* the planner (since 0.3.0) */
  STASH_ERROR_BAD_PROFILE = 105,        /* a profile that is not valid stash.profile/1, or
                                           a budget that does not parse; the message
                                           names the field */
  STASH_ERROR_INFEASIBLE_BUDGET = 106,  /* no valid plan at this budget; the message and
                                           stash_plan_result_t give the smallest one */
  /* the engine under CUDA graphs (new after 0.3.0) */
  STASH_ERROR_CAPTURE = 107,            /* a call a graph capture forbids (a host wait, a
                                           pinned or event allocation, a re-plan), or a
                                           replay of a step captured under another plan;
                                           the message names the call */
  /* 200..299: the profiler (since 0.1.0; in this enum since 0.3.0, same numbers) */
  STASH_ERROR_PROFILING_UNAVAILABLE = 200, /* CUPTI cannot start */
  STASH_ERROR_PROFILER_STATE = 201,        /* not started / started twice */
  STASH_STATUS_FORCE_INT_ = 0x7fffffff /* not a status: keeps the type int-sized, so
                                          any int a caller stores in it is valid */
} stash_status_t;

/* A static, human-readable name for a status ("out of memory"); never NULL, also for
 * numbers that are not a stash_status_t ("unknown status"). */
STASH_API const char* stash_status_string(stash_status_t status);

/* The message of the calling thread's most recent failed stash call ("" if none). The
 * string is thread-local and valid until this thread's next stash call. Successful calls
 * do not clear it. */
STASH_API const char* stash_last_error(void);

/* ---------------------------------------------------------------------------------------
 * Byte counts (since 0.3.0)
 *
 * The one syntax every stash reader of a byte count takes (the planner's budgets, the
 * CLI's size options, the preload library's environment, stash.parse_bytes in Python):
 * optional space, digits, an optional "." and digits, optional space, an optional unit,
 * optional space. Units: B, KB, MB, GB, TB (powers of 1000) and KiB, MiB, GiB, TiB
 * (powers of 1024), in any case. No sign, no exponent, no bare-letter units ("8G"); a
 * fraction needs a unit ("1.5" is not a count). The value is truncated to whole bytes,
 * never rounded up; "0.1GB" is exactly 100000000. At most 2^64 - 1.
 *
 * Thread-safe: no shared state; neither function reads the locale.
 * ------------------------------------------------------------------------------------- */

/* *bytes = the count `text` (NUL-terminated) says: "85899345920", "80GiB", "85.9GB",
 * " 1.5 tib ". Text that is not a count (also one of 2^64 bytes or more):
 * STASH_ERROR_INVALID_ARGUMENT, and stash_last_error() quotes the text and says what is
 * wrong ("unknown unit \"G\" (use B, KB, ...)"). text or bytes NULL:
 * STASH_ERROR_INVALID_ARGUMENT. On failure *bytes (when not NULL) is 0. */
STASH_API stash_status_t stash_parse_bytes(const char* text, uint64_t* bytes);

/* Writes `bytes` as stash's messages print it, NUL-terminated, into buf[0..size): two
 * decimals in the largest binary unit the count reaches ("80.00 GiB", "1.50 KiB"), whole
 * bytes below 1 KiB ("17 B"). The text never exceeds STASH_FORMAT_BYTES_SIZE - 1
 * characters. buf NULL or size too small for the text: STASH_ERROR_INVALID_ARGUMENT
 * (then buf, when not NULL and size > 0, holds ""). */
#define STASH_FORMAT_BYTES_SIZE 32
STASH_API stash_status_t stash_format_bytes(uint64_t bytes, char* buf, size_t size);

/* A CUDA stream. This is the CUDA runtime's cudaStream_t; pass one directly. NULL is the
 * legacy default stream. */
typedef struct CUstream_st* stash_stream_t;

/* ---------------------------------------------------------------------------------------
 * Statistics (since 0.1.0), shared by both pools. All figures are exact. "Bytes" of a block
 * are its size as carved: the request rounded up to the pool's alignment (nothing else).
 * Fields: 0.1.0 all. stash_engine_stats_t holds one by value, so this layout cannot grow
 * (the engine's later fields sit right after it): new pool figures need a new struct.
 * ------------------------------------------------------------------------------------- */
typedef struct stash_pool_stats_t {
  size_t struct_size;            /* in: sizeof(stash_pool_stats_t), set by _init */
  uint64_t current_count;        /* blocks allocated and not yet freed */
  uint64_t peak_count;           /* since creation or the last reset_peak */
  uint64_t total_count;          /* allocations ever made */
  uint64_t current_bytes;
  uint64_t peak_bytes;
  uint64_t total_bytes;
  uint64_t requested_bytes;      /* sum of the requests behind current_bytes */
  uint64_t pending_count;        /* freed, waiting for streams that used them */
  uint64_t pending_bytes;
  uint64_t reserved_bytes;       /* obtained from CUDA (pinned or cudaMalloc'd) */
  uint64_t peak_reserved_bytes;
  uint64_t slab_count;
  uint64_t largest_free_bytes;   /* largest block an allocation could get without growing */
  uint64_t limit_bytes;          /* the cap (pinned) or budget (device; 0: none) */
  uint64_t failed_count;         /* allocations that returned an error */
} stash_pool_stats_t;

/* Sets struct_size; the other fields to 0. NULL: no-op. */
STASH_API void stash_pool_stats_init(stash_pool_stats_t* stats);

/* ---------------------------------------------------------------------------------------
 * Pinned host pool (since 0.1.0)
 *
 * Page-locked host memory for copies to and from the GPU, carved from large pinned slabs
 * by best fit with split and coalesce (no power-of-two rounding). Slabs are pinned up
 * front (reserve_bytes) or when no slab has room; allocation never pins once the
 * reservation covers it. Slabs are placed on the GPU's NUMA node when the machine has
 * several. A block freed together with the streams that used it is handed out again only
 * after the work enqueued on those streams is done.
 *
 * Thread safety: a stash_pinned_pool_t may be used from any number of threads at once,
 * except stash_pinned_pool_destroy, which must not race with other calls on that pool.
 * ------------------------------------------------------------------------------------- */
typedef struct stash_pinned_pool_t stash_pinned_pool_t;

/* What an allocation does when the cap is reached and no free block fits. The engine has
 * its own policy for its pinned pool, stash_pinned_exhausted_t, with the same numbers and
 * the same wait; both exist because what the caller gets differs. A pool has nowhere else
 * for the bytes, so not waiting fails the allocation; the engine still holds the tensor's
 * device block, so not waiting keeps the tensor there and succeeds. One name could not
 * describe both (STASH_EXHAUSTED_FAIL on an engine would return STASH_OK). */
typedef enum stash_exhaustion_t {
  STASH_EXHAUSTED_FAIL = 0, /* return STASH_ERROR_OUT_OF_MEMORY with the pool's statistics */
  STASH_EXHAUSTED_WAIT = 1, /* wait up to wait_timeout_ms for pending blocks; then TIMEOUT */
  STASH_EXHAUSTED_FORCE_INT_ = 0x7fffffff /* not a policy; keeps the type int-sized */
} stash_exhaustion_t;

#define STASH_PINNED_POOL_CONFIG_VERSION 1

/* Fields: 0.1.0 all, through wait_timeout_ms (the first size). */
typedef struct stash_pinned_pool_config_t {
  size_t struct_size;   /* sizeof(stash_pinned_pool_config_t), set by _init */
  unsigned version;     /* STASH_PINNED_POOL_CONFIG_VERSION, set by _init */
  int device;           /* GPU the memory feeds (its NUMA node); -1: the current device */
  size_t cap_bytes;     /* hard cap on pinned bytes; 0: 0.8 x the host memory really
                           available (MemAvailable, cgroup memory.max headroom), divided by
                           LOCAL_WORLD_SIZE */
  size_t slab_bytes;    /* largest single pin, and so the largest block; default 1 GiB */
  size_t growth_bytes;  /* smallest slab pinned on demand; default 32 MiB */
  size_t alignment;     /* power of two, 256 B..2 MiB; default 4096 (the page size) */
  size_t reserve_bytes; /* pinned at creation and kept; default 0 */
  int reserve_in_background; /* nonzero: reserve on a thread, progress on stderr if
                                report_progress; allocations wait for it, never pin */
  int report_progress;  /* default 1 */
  int numa_placement;   /* nonzero (default): bind slabs to the GPU's NUMA node */
  stash_exhaustion_t on_exhausted; /* default STASH_EXHAUSTED_FAIL */
  unsigned wait_timeout_ms;        /* for STASH_EXHAUSTED_WAIT; default 1000 */
} stash_pinned_pool_config_t;

/* Fills *config with the defaults above, struct_size and version. NULL: no-op. */
STASH_API void stash_pinned_pool_config_init(stash_pinned_pool_config_t* config);

/* Creates a pool. config NULL: the defaults. A config not filled by
 * stash_pinned_pool_config_init (a struct_size or version this library does not know, see
 * "Versioned structs") gives STASH_ERROR_VERSION_MISMATCH. out NULL:
 * STASH_ERROR_INVALID_ARGUMENT. On failure *out is NULL and nothing stays pinned. With a
 * synchronous reservation this call pins reserve_bytes first (slow: ~ms per GiB). */
STASH_API stash_status_t stash_pinned_pool_create(const stash_pinned_pool_config_t* config,
                                                  stash_pinned_pool_t** out);

/* Waits for copies still using freed blocks, then unpins everything. Blocks still
 * allocated become invalid. NULL: no-op. */
STASH_API void stash_pinned_pool_destroy(stash_pinned_pool_t* pool);

/* The cap a pinned pool gets when its config leaves cap_bytes 0 (since 0.3.0): 0.8 x the
 * host memory really available (MemAvailable, or less under a cgroup v1/v2 memory limit)
 * divided by LOCAL_WORLD_SIZE, as read now. A profile's host.pinnable_bytes for this rank.
 * bytes NULL: STASH_ERROR_INVALID_ARGUMENT. Thread-safe. */
STASH_API stash_status_t stash_pinned_default_cap(size_t* bytes);

/* *out = a block of at least `bytes`, aligned to the pool's alignment. bytes == 0, bytes >
 * slab_bytes, pool or out NULL: STASH_ERROR_INVALID_ARGUMENT. Cap reached:
 * STASH_ERROR_OUT_OF_MEMORY or STASH_ERROR_TIMEOUT per on_exhausted. On failure *out is
 * NULL (when out is not NULL). */
STASH_API stash_status_t stash_pinned_alloc(stash_pinned_pool_t* pool, size_t bytes,
                                            void** out);

/* Frees a block. streams[0..n_streams): the streams whose already-enqueued work (copies)
 * uses the block; it is reused only when that work is done. n_streams == 0: the caller
 * guarantees no pending work uses it. ptr NULL: no-op (STASH_OK). A pointer this pool did
 * not return, or one already freed: STASH_ERROR_UNKNOWN_POINTER, and nothing changes. */
STASH_API stash_status_t stash_pinned_free(stash_pinned_pool_t* pool, void* ptr,
                                           const stash_stream_t* streams, size_t n_streams);

/* Pins `bytes` more now (kept for the pool's life), within the cap. */
STASH_API stash_status_t stash_pinned_reserve(stash_pinned_pool_t* pool, size_t bytes);

/* Blocks until a background reservation has finished; its outcome. */
STASH_API stash_status_t stash_pinned_wait_reserved(stash_pinned_pool_t* pool);

/* Unpins slabs pinned on demand that are entirely free. *released_bytes (may be NULL). */
STASH_API stash_status_t stash_pinned_release_cached(stash_pinned_pool_t* pool,
                                                     size_t* released_bytes);

/* Fills *stats (whose struct_size must be set, e.g. by stash_pool_stats_init; smaller
 * older structs are filled as far as they go). */
STASH_API stash_status_t stash_pinned_stats(stash_pinned_pool_t* pool,
                                            stash_pool_stats_t* stats);

/* Sets the peaks to the current values. */
STASH_API stash_status_t stash_pinned_reset_peak(stash_pinned_pool_t* pool);

/* ---------------------------------------------------------------------------------------
 * Device pool (since 0.1.0)
 *
 * A stream-ordered caching allocator over cudaMalloc'd slabs: a block allocated for a
 * stream may be reused by that stream as soon as it is freed; other streams that used it
 * are named at free and are waited for with events. A byte budget bounds the memory
 * reserved; an allocation past it fails with a report (requested, in use, reserved, peak,
 * largest free block). Safe during CUDA graph capture: no event queries, no growth.
 *
 * Thread safety: as for the pinned pool.
 * ------------------------------------------------------------------------------------- */
typedef struct stash_device_pool_t stash_device_pool_t;

#define STASH_DEVICE_POOL_CONFIG_VERSION 1

/* Fields: 0.1.0 all, through alignment (the first size). */
typedef struct stash_device_pool_config_t {
  size_t struct_size;  /* sizeof(stash_device_pool_config_t), set by _init */
  unsigned version;    /* STASH_DEVICE_POOL_CONFIG_VERSION, set by _init */
  int device;          /* -1: the current device */
  size_t budget_bytes; /* cap on bytes reserved from cudaMalloc; 0: no budget */
  size_t slab_bytes;   /* smallest slab cudaMalloc'd on demand; default 32 MiB */
  size_t alignment;    /* power of two, 256 B..2 MiB; default 512 */
} stash_device_pool_config_t;

STASH_API void stash_device_pool_config_init(stash_device_pool_config_t* config);

/* As stash_pinned_pool_create. */
STASH_API stash_status_t stash_device_pool_create(const stash_device_pool_config_t* config,
                                                  stash_device_pool_t** out);

/* Frees every slab (cudaFree). NULL: no-op. */
STASH_API void stash_device_pool_destroy(stash_device_pool_t* pool);

/* *out = a block of at least `bytes` for use on `stream`. bytes == 0, pool or out NULL:
 * STASH_ERROR_INVALID_ARGUMENT. Budget exceeded or cudaMalloc out of memory:
 * STASH_ERROR_OUT_OF_MEMORY with the report in stash_last_error(). */
STASH_API stash_status_t stash_device_alloc(stash_device_pool_t* pool, size_t bytes,
                                            stash_stream_t stream, void** out);

/* Frees a block. streams[0..n_streams): streams other than its allocation stream whose
 * enqueued work uses it (at most 16). ptr NULL: no-op. Foreign pointer or double free:
 * STASH_ERROR_UNKNOWN_POINTER, and nothing changes. */
STASH_API stash_status_t stash_device_free(stash_device_pool_t* pool, void* ptr,
                                           const stash_stream_t* streams, size_t n_streams);

/* Gives entirely free slabs back to CUDA (cudaFree synchronizes the device). */
STASH_API stash_status_t stash_device_release_cached(stash_device_pool_t* pool,
                                                     size_t* released_bytes);

STASH_API stash_status_t stash_device_stats(stash_device_pool_t* pool,
                                            stash_pool_stats_t* stats);
STASH_API stash_status_t stash_device_reset_peak(stash_device_pool_t* pool);

/* ---------------------------------------------------------------------------------------
 * Planner (since 0.3.0)
 *
 * What `stash plan` does, in process: a profile (stash.profile/1 JSON text) and a budget
 * give a plan (stash.plan/1 JSON text) that stash_engine_load_plan, `stash check` and
 * `stash simulate` accept, or the status and message the CLI would print. For custom
 * runtimes that measure their own step and want a plan without a second process.
 *
 * Thread safety: the functions share no state; any number of threads may plan at once.
 * ------------------------------------------------------------------------------------- */

typedef enum stash_solver_t {
  STASH_SOLVER_GREEDY = 0, /* per distinct layer: cheapest recompute cost per byte first */
  STASH_SOLVER_ILP = 1,    /* per distinct layer: a GLPK MIP (time limit, gap) */
  STASH_SOLVER_EXACT = 2,  /* one MIP over the whole model: the reference, small models */
  STASH_SOLVER_FORCE_INT_ = 0x7fffffff /* not a solver; keeps the type int-sized */
} stash_solver_t;

/* Fields: 0.3.0 all, through polish (the first size). */
#define STASH_PLAN_OPTIONS_VERSION 1
typedef struct stash_plan_options_t {
  size_t struct_size;     /* sizeof(stash_plan_options_t), set by _init */
  unsigned version;       /* STASH_PLAN_OPTIONS_VERSION, set by _init */
  stash_solver_t solver;  /* default STASH_SOLVER_GREEDY */
  double time_limit_s;    /* exact: the whole MIP; ilp: each per-layer problem (default 60) */
  double mip_gap;         /* relative gap at which exact and ilp may stop (default 0) */
  int polish;             /* nonzero: local improvement after rounding (default 1) */
} stash_plan_options_t;

/* The figures of one planning call, also when it fails for the budget. Fields: 0.3.0 all,
 * through predicted_step_ms (the first size). */
typedef struct stash_plan_result_t {
  size_t struct_size;              /* in: sizeof(stash_plan_result_t), set by _init */
  uint64_t budget_bytes;           /* the budget as parsed ("70%" resolved) */
  uint64_t keep_all_peak_bytes;    /* the profile's peak when every tensor is kept */
  uint64_t min_feasible_bytes;     /* STASH_ERROR_INFEASIBLE_BUDGET: the smallest budget
                                      with a valid plan; else 0 */
  int min_feasible_proved;         /* 0 when the host cap binds and the minimum-peak MIP
                                      hit its time limit (min_feasible_bytes still works) */
  uint64_t predicted_peak_bytes;   /* STASH_OK: the plan's peak under the canonical model */
  double predicted_step_ms;        /* STASH_OK: its step time */
} stash_plan_result_t;

STASH_API void stash_plan_options_init(stash_plan_options_t* options);
STASH_API void stash_plan_result_init(stash_plan_result_t* result);

/* Plans `profile_json` (NUL-terminated stash.profile/1 text) under `budget`: bytes
 * ("85899345920"), units ("80GiB", "85.9GB") or a share of the profile's keep-all peak
 * ("70%"). options NULL: the defaults. On STASH_OK *plan_json is a NUL-terminated
 * stash.plan/1 document allocated by the library: free it with stash_free. On failure
 * *plan_json is NULL and:
 *  - STASH_ERROR_BAD_PROFILE: the profile or the budget text is malformed; the message
 *    names the field (JSON path) or the text;
 *  - STASH_ERROR_INFEASIBLE_BUDGET: no valid plan exists, a budget below the profile's
 *    fixed bytes included (as `stash plan` says it, exit 1): result->min_feasible_bytes
 *    holds the smallest budget that has one, and the message says it in bytes and GiB
 *    and, for a budget below the fixed bytes, that it is;
 *  - STASH_ERROR_INVALID_ARGUMENT: NULL profile_json, budget or plan_json, or bad
 *    options (unknown solver, non-positive time limit, negative gap: the message is the
 *    planner's one check of them, as `stash plan` words it, after "options: ");
 *  - STASH_ERROR_VERSION_MISMATCH: options or result with a struct_size (or options with a
 *    version) this library does not know ("Versioned structs").
 * result may be NULL. */
STASH_API stash_status_t stash_plan_make(const char* profile_json, const char* budget,
                                         const stash_plan_options_t* options,
                                         char** plan_json, stash_plan_result_t* result);

/* Prices `plan_json` (stash.plan/1 text) on `profile_json` with the canonical cost model,
 * as `stash check` does: result->predicted_peak_bytes and predicted_step_ms, under
 * budget_bytes (0: the plan's own budget). STASH_ERROR_BAD_PROFILE / STASH_ERROR_BAD_PLAN
 * for malformed input (the message names the field); STASH_ERROR_INFEASIBLE_BUDGET when
 * the plan is well formed but violates a constraint under the budget (the message names
 * every violated constraint; result is filled all the same). */
STASH_API stash_status_t stash_plan_evaluate(const char* profile_json, const char* plan_json,
                                             uint64_t budget_bytes, stash_plan_result_t* result);

/* Checks `profile_json` (NUL-terminated text) as stash_plan_make and `stash plan` read it,
 * without planning: STASH_OK when it is valid stash.profile/1; else
 * STASH_ERROR_BAD_PROFILE, and stash_last_error() names the first bad field by its JSON
 * path ("stash_profile_validate: layers[0].tensors[1].name: duplicate tensor name ...")
 * or says where the text stops being JSON. profile_json NULL:
 * STASH_ERROR_INVALID_ARGUMENT. Since 0.3.0. */
STASH_API stash_status_t stash_profile_validate(const char* profile_json);

/* The smallest budget at which `profile_json` (NUL-terminated stash.profile/1 text) has a
 * valid plan: the figure stash_plan_make's STASH_ERROR_INFEASIBLE_BUDGET names
 * (result->min_feasible_bytes), without asking for a plan. *min_feasible_bytes on
 * STASH_OK; *proved (may be NULL) 0 when the host cap binds and the minimum-peak MIP hit
 * its time limit: the figure then works but may not be the least. STASH_ERROR_BAD_PROFILE
 * as stash_profile_validate; STASH_ERROR_INVALID_ARGUMENT for a NULL profile_json or
 * min_feasible_bytes. Since 0.3.0. */
STASH_API stash_status_t stash_plan_min_feasible(const char* profile_json,
                                                 uint64_t* min_feasible_bytes, int* proved);

/* Frees memory the library allocated for the caller (stash_plan_make's plan text);
 * NULL is a no-op. */
STASH_API void stash_free(void* ptr);

/* ---------------------------------------------------------------------------------------
 * Link (since 0.3.0)
 *
 * What `stash bench link` measures: pinned host <-> device bandwidth as stash's offloads
 * use it (cudaMemcpyAsync on non-blocking streams, timed with CUDA events, the median of
 * several runs), per rank, as a profile's "link" section takes it. Takes seconds; cache the
 * answer per machine. Not thread-safe against other CUDA work on the device: it wants the
 * link to itself.
 * ------------------------------------------------------------------------------------- */

/* Fields: 0.3.0 all, through device_name (the first size). */
typedef struct stash_link_result_t {
  size_t struct_size;     /* in: sizeof(stash_link_result_t), set by _init */
  double h2d_gbps;        /* per rank, 1e9 B/s */
  double d2h_gbps;        /* per rank */
  double bidir_gbps;      /* both directions at once, aggregate, per rank */
  int local_ranks;        /* LOCAL_WORLD_SIZE (1 when unset) */
  int sharers;            /* ranks assumed to copy at once (the per-rank share) */
  size_t buffer_bytes;    /* the buffer each copy moved */
  char device_name[256];  /* cudaDeviceProp::name */
} stash_link_result_t;

STASH_API void stash_link_result_init(stash_link_result_t* result);

/* Measures the link of `device`. bytes 0: 512 MiB, shrunk to what the device has free;
 * below 64 MiB free the run is refused (STASH_ERROR_INVALID_ARGUMENT). sharers 0:
 * LOCAL_WORLD_SIZE; k > 1 measures k copies at once and reports the per-rank share. CUDA
 * failures: STASH_ERROR_CUDA naming the call. */
STASH_API stash_status_t stash_link_measure(int device, size_t bytes, int sharers,
                                            stash_link_result_t* result);

/* ---------------------------------------------------------------------------------------
 * Profiler (since 0.1.0)
 *
 * Layer and tensor scopes for kernel-time profiling. A scope opens an NVTX range in domain
 * "stash" named "stash:layer:<layer>:fwd", "stash:layer:<layer>:bwd" or
 * "stash:tensor:<name>", so Nsight Systems shows it and `stash profile` (CUPTI injection)
 * attributes the kernels launched inside it. While this library's own profiler runs
 * (stash_profiler_start), the scope also pushes a CUPTI external correlation id, which ties
 * every kernel launched inside it to the scope even when it finishes after the scope ends.
 * Nest tensor scopes inside the layer scope whose forward produces the tensor.
 *
 * Thread safety: scopes are per thread (begin and end on the same thread, properly nested);
 * any number of threads may use them at once. stash_profiler_start/stop must not race with
 * each other.
 * ------------------------------------------------------------------------------------- */

/* Status codes of the profiler: STASH_ERROR_PROFILING_UNAVAILABLE and
 * STASH_ERROR_PROFILER_STATE (200..299, in stash_status_t). */

typedef enum stash_scope_kind_t {
  STASH_SCOPE_FORWARD = 0,  /* "stash:layer:<layer>:fwd"; name unused (may be NULL) */
  STASH_SCOPE_BACKWARD = 1, /* "stash:layer:<layer>:bwd"; name unused (may be NULL) */
  STASH_SCOPE_TENSOR = 2,   /* "stash:tensor:<name>"; layer unused */
  STASH_SCOPE_FORCE_INT_ = 0x7fffffff /* not a kind; keeps the type int-sized */
} stash_scope_kind_t;

/* Opens a scope on the calling thread. layer < 0 for a layer scope, NULL or "" name for a
 * tensor scope, or an unknown kind: STASH_ERROR_INVALID_ARGUMENT, and nothing opens.
 * Cheap when no tool is attached (an NVTX no-op). */
STASH_API stash_status_t stash_profile_scope_begin(stash_scope_kind_t kind, int layer,
                                                   const char* name);
/* Closes the calling thread's innermost scope opened by stash_profile_scope_begin; none
 * open: STASH_ERROR_INVALID_ARGUMENT. */
STASH_API stash_status_t stash_profile_scope_end(void);

/* Starts the in-process CUPTI profiler (kernels, copies, runtime and driver calls). When
 * CUPTI cannot start (no driver, no device, libcupti missing, or another CUPTI client such
 * as Nsight Systems), returns STASH_ERROR_PROFILING_UNAVAILABLE with stash_last_error() =
 * "profiling unavailable: <reason>" and changes nothing: the program can continue
 * unprofiled. Already running: STASH_ERROR_PROFILER_STATE. Do not combine with
 * `stash profile`, which profiles the process from its injection library instead. */
STASH_API stash_status_t stash_profiler_start(void);

/* Nonzero while the in-process profiler runs. */
STASH_API int stash_profiler_active(void);

/* Stops the profiler and writes output_path: a stash.profile/1 filled from the scopes'
 * median kernel times when skeleton_path names a skeleton profile (a stash.profile/1 that
 * lists each layer's tensors), else per-layer times only (not plannable yet). output_path
 * NULL or a bad skeleton: STASH_ERROR_INVALID_ARGUMENT (the profiler is stopped anyway).
 * Not running: STASH_ERROR_PROFILER_STATE. */
STASH_API stash_status_t stash_profiler_stop(const char* skeleton_path, const char* output_path);

/* ---------------------------------------------------------------------------------------
 * Prefetch engine (since 0.1.0)
 *
 * Carries out a plan (stash.plan/1, from `stash plan`) on a compute stream. For each saved
 * activation the plan says keep, recompute or offload. The caller reports layer
 * boundaries and hands over each saved tensor when it is produced; the engine then
 *  - copies offload tensors to pinned host memory on its own stream "stash d2h", after an
 *    event recorded on the producer stream, and hands the device block back (to a stash
 *    device pool, or through the caller's release callback) as soon as it is free for the
 *    compute stream: right after the compute stream's wait for its copy (blocks allocated
 *    and produced on the compute stream), or once the copy is seen complete. The host never
 *    waits for a copy to free memory;
 *  - keeps no more than one layer's copies in flight and, during backward, starts the
 *    host-to-device copies of the layers `lookahead` ahead on its stream "stash h2d", into
 *    device blocks allocated for the compute stream. The layer hooks below say which
 *    waits and copies each enqueues: the planner's schedule (Note [The step's schedule],
 *    planner/model/schedule.h in stash's source), which `stash simulate` replays;
 *  - on acquire, makes the consumer stream wait for that one tensor and returns its device
 *    pointer.
 * Keep and recompute tensors pass through untouched (recompute is the caller's job).
 * Tensors are keyed by (micro-batch, layer, index), so several micro-batches may run their
 * forwards before their backwards (gradient accumulation, pipeline schedules).
 *
 * Tensor states: ON_DEVICE -> OFFLOADING -> ON_HOST -> PREFETCHING -> READY -> RELEASED.
 * A keep/recompute tensor goes ON_DEVICE -> READY -> RELEASED. Acquire or release before
 * offload, offloading twice and releasing twice return STASH_ERROR_ILLEGAL_TRANSITION; a
 * key outside the plan STASH_ERROR_UNKNOWN_TENSOR. A CUDA failure while copying a tensor
 * (its offload returns STASH_ERROR_CUDA, or backward_begin does for a prefetch) is kept on
 * that tensor: its data stays where it was, its acquire returns STASH_ERROR_TENSOR_FAILED
 * with the original message, its release frees it; no other tensor is affected.
 *
 * NVTX: every offload, prefetch and wait is a range in domain "stash"; the streams are
 * named "stash d2h" and "stash h2d". Timing: with `timing` on, every engine operation is
 * timed with CUDA events; stash_engine_write_trace writes the Chrome/Perfetto trace in the
 * format `stash simulate` writes, and stash_engine_overlap reports copy time, copy time
 * hidden under compute and exposed waits of the compute stream, per layer and in total.
 *
 * Thread safety: a stash_engine_t may be called from any thread; calls are serialized by
 * a mutex. The device-side order of work is the order of the calls: call the hooks from
 * the thread that enqueues the layer's work. stash_engine_destroy must not race with other
 * calls. Release callbacks run inside engine calls, on the calling thread (never on a CUDA
 * callback thread), and must not call the engine.
 * ------------------------------------------------------------------------------------- */
typedef struct stash_engine_t stash_engine_t;

typedef enum stash_action_t {
  STASH_ACTION_KEEP = 0,
  STASH_ACTION_RECOMPUTE = 1,
  STASH_ACTION_OFFLOAD = 2,
  STASH_ACTION_FORCE_INT_ = 0x7fffffff /* not an action; keeps the type int-sized */
} stash_action_t;

/* The action's name as stash.plan/1 spells it ("keep", "recompute", "offload"), a static
 * string; NULL for a number that is not an action. Bindings check the numbers they use
 * against it. Thread-safe. Since 0.3.0. */
STASH_API const char* stash_action_name(stash_action_t action);

typedef enum stash_tensor_state_t {
  STASH_TENSOR_NOT_OFFERED = -1, /* the key is in the plan; offload was not called yet */
  STASH_TENSOR_ON_DEVICE = 0,    /* keep/recompute, or offload kept on the device */
  STASH_TENSOR_OFFLOADING = 1,
  STASH_TENSOR_ON_HOST = 2,
  STASH_TENSOR_PREFETCHING = 3,
  STASH_TENSOR_READY = 4,        /* acquired */
  STASH_TENSOR_RELEASED = 5,
  STASH_TENSOR_FORCE_INT_ = 0x7fffffff /* not a state; keeps the type int-sized */
} stash_tensor_state_t;

typedef struct stash_tensor_key_t {
  uint32_t micro_batch; /* any number; at most max_micro_batches live at once */
  uint32_t layer;       /* the plan's layer index */
  uint32_t index;       /* the tensor's index within the layer, as in the plan */
} stash_tensor_key_t;

/* What the engine does when its pinned pool cannot hold another tensor. Data is never
 * dropped: the tensor stays on the device (the engine frees it at release) and is counted
 * in stash_engine_stats_t.kept_on_device_count. The engine's pinned pool runs with
 * STASH_EXHAUSTED_WAIT under STASH_PINNED_WAIT and STASH_EXHAUSTED_FAIL otherwise; see
 * stash_exhaustion_t for why the two enums are not one. */
typedef enum stash_pinned_exhausted_t {
  STASH_PINNED_KEEP_ON_DEVICE = 0, /* keep it and return STASH_OK */
  STASH_PINNED_WAIT = 1, /* wait up to pinned_wait_timeout_ms for pinned blocks still held by
                            in-flight copies; if none frees up, keep it and return
                            STASH_ERROR_OUT_OF_MEMORY or STASH_ERROR_TIMEOUT */
  STASH_PINNED_FORCE_INT_ = 0x7fffffff /* not a policy; keeps the type int-sized */
} stash_pinned_exhausted_t;

/* The caller's allocator (used instead of a stash device pool). alloc: *out = a block of
 * `bytes` usable on `stream` in stream order; return 0 on success. release: the block may
 * be reused by work enqueued on `stream` from now on (free it stream-ordered there). */
typedef int (*stash_device_alloc_fn)(void** out, size_t bytes, stash_stream_t stream,
                                     void* user);
typedef void (*stash_device_release_fn)(void* ptr, size_t bytes, stash_stream_t stream,
                                        void* user);

#define STASH_ENGINE_CONFIG_VERSION 1

/* Fields: 0.1.0 all, through max_micro_batches (the first size). */
typedef struct stash_engine_config_t {
  size_t struct_size;            /* sizeof(stash_engine_config_t), set by _init */
  unsigned version;              /* STASH_ENGINE_CONFIG_VERSION, set by _init */
  stash_stream_t compute_stream; /* where layers run and prefetched blocks belong; NULL:
                                    the legacy default stream */
  int lookahead;                 /* prefetch layer i when backward of i+lookahead begins;
                                    default 1 */
  size_t max_in_flight_bytes;    /* device-to-host bytes in transit; 0 (default): no cap. An
                                    offload past it blocks the host until older copies end */
  size_t max_in_flight_count;    /* copies in transit; 0 (default): no cap */
  size_t pinned_cap_bytes;       /* the engine's pinned pool cap; 0: the pool's default */
  size_t pinned_reserve_bytes;   /* pinned at creation; default 0 */
  stash_pinned_exhausted_t on_pinned_exhausted; /* default STASH_PINNED_KEEP_ON_DEVICE */
  unsigned pinned_wait_timeout_ms;              /* default 1000 */
  stash_device_pool_t* device_pool; /* offloaded tensors come from this pool and prefetches
                                       go to it; or NULL and both callbacks below */
  stash_device_alloc_fn device_alloc;
  stash_device_release_fn device_release;
  void* device_user;             /* passed to the callbacks */
  int timing;                    /* nonzero (default): time operations for trace/overlap */
  unsigned max_micro_batches;    /* live at once; default 8 */
} stash_engine_config_t;

/* Fills *config with the defaults above, struct_size and version. NULL: no-op. */
STASH_API void stash_engine_config_init(stash_engine_config_t* config);

/* Creates an engine with its two streams and its pinned pool. Neither or both of
 * device_pool and the callbacks, lookahead < 1: STASH_ERROR_INVALID_ARGUMENT. A config not
 * from stash_engine_config_init (a struct_size or version this library does not know):
 * STASH_ERROR_VERSION_MISMATCH. On failure *out is NULL.
 * The device pool, if any, must outlive the engine. */
STASH_API stash_status_t stash_engine_create(const stash_engine_config_t* config,
                                             stash_engine_t** out);

/* Waits for the engine's copies, hands every block it holds back (pool or callback),
 * destroys its streams and pinned pool. NULL: no-op. */
STASH_API void stash_engine_destroy(stash_engine_t* engine);

/* Loads a stash.plan/1 file (only the actions and tensor names are read: validate it
 * against its profile with `stash check`). Malformed: STASH_ERROR_BAD_PLAN, the message
 * naming the file, the JSON path and the problem ("plan.json: layers[3].tensors[2].action:
 * unknown action ..."). A plan cannot change while tensors are live
 * (STASH_ERROR_ILLEGAL_TRANSITION). */
STASH_API stash_status_t stash_engine_load_plan(stash_engine_t* engine, const char* path);

/* Builds the plan through the API: n_layers layers, layer i has tensors_per_layer[i]
 * tensors, `actions` holds them all, layer by layer. */
STASH_API stash_status_t stash_engine_set_plan(stash_engine_t* engine, size_t n_layers,
                                               const size_t* tensors_per_layer,
                                               const stash_action_t* actions);

/* Reads `plan_json` (NUL-terminated stash.plan/1 text) as stash_engine_load_plan reads a
 * plan file, with the same reader and checks, into the arrays stash_engine_set_plan takes:
 * *n_layers = the plan's layers and *n_actions = its tensors (either pointer may be NULL);
 * the first layer_capacity per-layer tensor counts go to tensors_per_layer and the first
 * action_capacity actions, layer by layer, to actions (an array may be NULL when its
 * capacity is 0). Call once with capacities 0 for the sizes, then with arrays that large.
 * Nothing is written on failure:
 *  - STASH_ERROR_BAD_PLAN: not JSON, or not valid stash.plan/1; the message names the JSON
 *    path and the problem ("layers[3].tensors[2].action: unknown action ...");
 *  - STASH_ERROR_INVALID_ARGUMENT: plan_json NULL, or a NULL array with a nonzero capacity.
 * Thread-safe: no shared state. Since 0.3.0. */
STASH_API stash_status_t stash_plan_read_actions(const char* plan_json, size_t* n_layers,
                                                 size_t* tensors_per_layer,
                                                 size_t layer_capacity, size_t* n_actions,
                                                 stash_action_t* actions,
                                                 size_t action_capacity);

/* *out = the plan's decision for tensor (layer, index); so the caller knows what to
 * recompute. */
STASH_API stash_status_t stash_engine_action(stash_engine_t* engine, uint32_t layer,
                                             uint32_t index, stash_action_t* out);

/* Layer hooks. Call forward_begin before enqueueing a layer's forward on the compute
 * stream and forward_end after; likewise backward_begin (before the layer's recompute and
 * its acquires) and backward_end. Stream semantics: forward_begin(i) enqueues a wait of
 * the compute stream for layer i-2's copies; the first backward_begin of a micro-batch
 * enqueues a wait for all its copies; backward_begin(i) enqueues the prefetches of layers
 * i-1 .. i-lookahead, ordered after this point of the compute stream. None blocks the
 * host. Finishing backward of layer 0 ends the micro-batch's step. */
STASH_API stash_status_t stash_engine_forward_begin(stash_engine_t* engine,
                                                    uint32_t micro_batch, uint32_t layer);
STASH_API stash_status_t stash_engine_forward_end(stash_engine_t* engine,
                                                  uint32_t micro_batch, uint32_t layer);
STASH_API stash_status_t stash_engine_backward_begin(stash_engine_t* engine,
                                                     uint32_t micro_batch, uint32_t layer);
STASH_API stash_status_t stash_engine_backward_end(stash_engine_t* engine,
                                                   uint32_t micro_batch, uint32_t layer);

/* Hands over a saved tensor right after its producer's work was enqueued on
 * `producer_stream`. Call it for every saved tensor of the plan. Offload tensors: the
 * engine owns the device block from now on (it must be the start of a block of the
 * configured device pool, or one the release callback can free) and the caller must not
 * touch it again; the copy is enqueued, the call returns at once (except under the
 * in-flight cap). Keep/recompute: recorded only; the block stays the caller's. */
STASH_API stash_status_t stash_engine_offload(stash_engine_t* engine, stash_tensor_key_t key,
                                              void* device_ptr, size_t bytes,
                                              stash_stream_t producer_stream);

/* *out = the tensor's device pointer, valid for work enqueued on `consumer_stream` after
 * this call: the consumer waits for this tensor's copy only. Issues the prefetch now if
 * backward_begin has not. Valid until release. On failure *out is NULL. */
STASH_API stash_status_t stash_engine_acquire(stash_engine_t* engine, stash_tensor_key_t key,
                                              stash_stream_t consumer_stream, void** out);

/* Gives the tensor's blocks back: the device block stream-ordered after the consumer's
 * work enqueued so far, the pinned block once the copies that used it are done. */
STASH_API stash_status_t stash_engine_release(stash_engine_t* engine, stash_tensor_key_t key);

/* The tensor's state, and in *error the failure kept on it (STASH_OK if none); either
 * pointer may be NULL. */
STASH_API stash_status_t stash_engine_tensor_state(stash_engine_t* engine,
                                                   stash_tensor_key_t key,
                                                   stash_tensor_state_t* state,
                                                   stash_status_t* error);

/* Blocks until the engine's copies are done and runs pending release callbacks. */
STASH_API stash_status_t stash_engine_synchronize(stash_engine_t* engine);

/* CUDA graphs (new after 0.3.0; docs/engine.md, "Under CUDA graphs"). A plan is static, so a
 * whole step (every forward_begin to the last release, with the caller's work on the
 * compute stream) can be captured once and replayed:
 *   stash_engine_capture_begin(e, pinned_bytes);   waits for the engine's copies, pins
 *                                                  what is missing for pinned_bytes to be
 *                                                  free (0: nothing), reserves events,
 *                                                  begins a global-mode capture of the
 *                                                  compute stream
 *   ... the step's calls and work, as eagerly ...  recorded, not run
 *   stash_engine_capture_end(e);                   the step's graph, held by the engine
 *   stash_engine_replay(e);                        per step: one cudaGraphLaunch on the
 *                                                  compute stream
 * Run the step eagerly once first (it sizes the device and pinned pools, which may not
 * grow under capture), and give pinned_bytes for every micro-batch's offloaded bytes when
 * a step has several. During the capture, calls that would do what capture forbids (a
 * host wait: the in-flight cap, stash_engine_synchronize; pinning or creating events; an
 * offload whose producer is not the compute stream; stash_engine_set_plan) fail with
 * STASH_ERROR_CAPTURE naming the call, without invalidating the CUDA capture;
 * capture_end then discards the graph and returns that refusal. A captured plan is fixed:
 * stash_engine_set_plan drops the graph, and replay then fails with STASH_ERROR_CAPTURE
 * until the step is captured again. Replays are not traced (write_trace and overlap
 * cover eager steps) and stats count a captured step once, at capture. */
STASH_API stash_status_t stash_engine_capture_begin(stash_engine_t* engine,
                                                    size_t pinned_bytes);
STASH_API stash_status_t stash_engine_capture_end(stash_engine_t* engine);
STASH_API stash_status_t stash_engine_replay(stash_engine_t* engine);
/* A capture begun by the caller (new after 0.3.0; Note [Capture begun by the caller] in
 * runtime/engine/prefetch_engine.h): a framework that captures the step itself
 * (torch.cuda.graph captures a stream of its own and replays the graph itself) runs the
 * engine's step inside its capture:
 *   cudaStreamBeginCapture(s, mode);               the caller's
 *   stash_engine_capture_join(e, s);               s is the engine's compute stream until
 *                                                  settled: its copies fork from s and
 *                                                  join back into it by event record and
 *                                                  wait; nothing is begun or ended
 *   ... the step's calls, with producer and consumer s ...
 *   cudaStreamEndCapture(s, &graph);               the caller's graph; the caller replays it
 *   stash_engine_capture_settle(e);                leaves capture mode; the verdict
 * join: s must be capturing (STASH_ERROR_CAPTURE otherwise) and no micro-batch may hold
 * tensors (STASH_ERROR_ILLEGAL_TRANSITION); it waits for the engine's earlier copies,
 * reserves events and freezes the pinned pool, so run the step eagerly once first. The
 * calls capture forbids are refused as above, without invalidating the caller's capture.
 * stash_engine_forward_begin joins by itself when the configured compute stream is
 * capturing, and an offload whose producer is capturing while the engine is not in
 * capture mode fails with STASH_ERROR_CAPTURE naming capture_join.
 * settle: STASH_ERROR_CAPTURE while s still captures (nothing changes), or when the
 * captured step is not usable (a call was refused, a tensor is still held or failed:
 * the message says which). Engine calls made after the caller ended the capture settle it
 * by themselves, dropping the verdict. The pinned blocks a caller's capture used stay held
 * for the graph's life (its replays copy into them; the engine never sees a replay):
 * stash_engine_capture_release gives back those of every settled capture, ordered after
 * the compute stream's work so far (finish or enqueue the replays there first);
 * *released_bytes (may be NULL) says how many bytes. stash_engine_destroy frees them; the
 * engine must outlive the caller's graphs. graph_state's capturing covers a joined
 * capture, and captures counts settled caller captures that were usable. */
STASH_API stash_status_t stash_engine_capture_join(stash_engine_t* engine,
                                                   stash_stream_t stream);
STASH_API stash_status_t stash_engine_capture_settle(stash_engine_t* engine);
STASH_API stash_status_t stash_engine_capture_release(stash_engine_t* engine,
                                                      size_t* released_bytes);
/* Each out pointer may be NULL. ready: a captured step can be replayed. */
STASH_API stash_status_t stash_engine_graph_state(stash_engine_t* engine, int* capturing,
                                                  int* ready, uint64_t* captures,
                                                  uint64_t* replays);

/* Fields: 0.1.0 through pinned; 0.2.0 ordered_handback_count and ordered_handback_bytes.
 * Filled as far as struct_size goes (any size that holds struct_size). */
typedef struct stash_engine_stats_t {
  size_t struct_size;              /* in: sizeof(stash_engine_stats_t), set by _init */
  uint64_t offloaded_count, offloaded_bytes;   /* device-to-host copies enqueued */
  uint64_t prefetched_count, prefetched_bytes; /* host-to-device copies enqueued */
  uint64_t kept_on_device_count, kept_on_device_bytes; /* pinned pool was exhausted */
  uint64_t keep_count, recompute_count;        /* pass-through tensors handed over */
  uint64_t failed_count;                       /* tensors whose copy failed */
  uint64_t released_count;
  uint64_t in_flight_count, in_flight_bytes;   /* copies not yet seen complete */
  uint64_t peak_in_flight_count, peak_in_flight_bytes;
  uint64_t cap_waits;                          /* host waits under the in-flight cap */
  uint64_t release_callbacks;                  /* blocks given to device_release */
  stash_pool_stats_t pinned;                   /* the engine's pinned pool */
  /* since 0.2.0: offloaded blocks handed back in compute-stream order, right after the
   * compute stream's wait for their copies, rather than once the host saw the copy end */
  uint64_t ordered_handback_count, ordered_handback_bytes;
} stash_engine_stats_t;

/* Sets struct_size (and pinned.struct_size); the other fields to 0. NULL: no-op. It
 * writes the struct as this library has it, since it cannot know the caller's: a program
 * built against 0.1.0 (16 bytes smaller) must set struct_size itself instead when it may
 * run against 0.2.0 or later. */
STASH_API void stash_engine_stats_init(stash_engine_stats_t* stats);
STASH_API stash_status_t stash_engine_stats(stash_engine_t* engine, stash_engine_stats_t* stats);

/* Waits for the engine's timed work and writes the trace (Chrome/Perfetto JSON: tracks
 * "compute", "stash d2h", "stash h2d", a "pinned bytes" counter and, when the engine runs
 * on a stash device pool, a "device bytes" counter of that pool's held bytes whose maximum
 * is its peak). Timing off: STASH_ERROR_INVALID_ARGUMENT. */
STASH_API stash_status_t stash_engine_write_trace(stash_engine_t* engine, const char* path);

typedef struct stash_overlap_t {
  int layer;         /* -1 in the total */
  double copy_ms;    /* device-to-host plus host-to-device copy time of its tensors */
  double hidden_ms;  /* the part of copy_ms that ran under compute */
  double exposed_ms; /* time the compute stream waited for its copies */
} stash_overlap_t;

/* The overlap report of everything timed so far: *total, and per layer (ascending; only
 * layers with copies or waits) up to `capacity` entries in per_layer (may be NULL when
 * capacity is 0); *n_layers (may be NULL) = how many layers the report has. */
STASH_API stash_status_t stash_engine_overlap(stash_engine_t* engine, stash_overlap_t* total,
                                              stash_overlap_t* per_layer, size_t capacity,
                                              size_t* n_layers);

/* The engine's streams (for nsys correlation, or to order other work after its copies). */
STASH_API stash_status_t stash_engine_streams(stash_engine_t* engine, stash_stream_t* d2h,
                                              stash_stream_t* h2d);

#ifdef __cplusplus
} /* extern "C" */
#endif
#endif /* STASH_H */
