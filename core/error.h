// error.h: stash's one error model: the status codes, the thread-local error text behind
// them, and the one exception type, stash::error.
//
// Note [One error model at the bottom]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every part of stash reports failure in the same two shapes:
//  - Hot paths (pool alloc/free/stats, the preload hooks, the engine's submit calls) return
//    a `status` and never throw, allocate or log. Their message goes into a fixed
//    thread-local buffer (1 KiB, no heap), read back with last_error(); fail() writes it.
//  - Cold paths (constructors, loaders, solvers, benchmarks) throw stash::error, which
//    carries a status. input_error (below) and the planner's infeasible_budget derive from
//    it, and so does everything else stash throws on purpose; the C API
//    (bindings/api_boundary.h) turns any of them into that status at its boundary.
// This file sits in core/, the bottom folder (the top-level CMakeLists.txt: each folder
// depends only on those above it, and core/ is first), in the library stash_core, which
// has no dependency a lower layer would mind: the allocator's CPU core and the preload
// library link it without GLPK, and the planner's errors derive from stash::error without
// the allocator ever including the planner. It is plain C++ with no CUDA; the CUDA half of
// the error model (the check macros that turn a cudaError_t into a status or a
// stash::error) is allocator/cuda_prim.h, in the lowest folder that may include the CUDA
// runtime.
//
// Note [The status table]
// ~~~~~~~~~~~~~~~~~~~~~~~
// STASH_STATUS_TABLE below is the one list of status codes: each row is the C++ name, the
// C header's enumerator, its number and its text. `status` and status_name() (which
// stash_status_string() returns) are made from it. bindings/include/stash.h spells the
// same numbers out by hand, as a plain C99 header must (no include of a C++ table, fixed
// numbers a reader can see); the two are held together from both sides:
// bindings/api_boundary.h static_asserts every row against the header's enumerator of that
// name, and tests/bindings/status_table_test.cpp reads the header's enum and requires every
// enumerator to be a row. A new code is a new row and a new enumerator, or the build (a row
// without its enumerator) or that test (an enumerator without its row) fails.
#pragma once

#include <stdexcept>
#include <string>

namespace stash {

// X(id, C enumerator, number, text). Numbers never change (stash.h's promise). 1..99:
// common; 100..199: the engine and the planner; 200..299: the profiler.
#define STASH_STATUS_TABLE(X)                                                          \
  X(ok, STASH_OK, 0, "ok")                                                             \
  X(invalid_argument, STASH_ERROR_INVALID_ARGUMENT, 1, "invalid argument")             \
  X(out_of_memory, STASH_ERROR_OUT_OF_MEMORY, 2, "out of memory")                      \
  X(cuda_error, STASH_ERROR_CUDA, 3, "CUDA error")                                     \
  X(timeout, STASH_ERROR_TIMEOUT, 4, "timed out")                                      \
  X(unknown_pointer, STASH_ERROR_UNKNOWN_POINTER, 5, "unknown pointer")                \
  X(version_mismatch, STASH_ERROR_VERSION_MISMATCH, 6, "version mismatch")             \
  X(internal, STASH_ERROR_INTERNAL, 7, "internal error")                               \
  X(no_plan, STASH_ERROR_NO_PLAN, 100, "no plan loaded")                               \
  X(bad_plan, STASH_ERROR_BAD_PLAN, 101, "bad plan")                                   \
  X(unknown_tensor, STASH_ERROR_UNKNOWN_TENSOR, 102, "unknown tensor")                 \
  X(illegal_transition, STASH_ERROR_ILLEGAL_TRANSITION, 103, "illegal transition")     \
  X(tensor_failed, STASH_ERROR_TENSOR_FAILED, 104, "tensor failed")                    \
  X(bad_profile, STASH_ERROR_BAD_PROFILE, 105, "bad profile")                          \
  X(infeasible_budget, STASH_ERROR_INFEASIBLE_BUDGET, 106, "infeasible budget")        \
  X(capture, STASH_ERROR_CAPTURE, 107, "refused under graph capture")                 \
  X(profiling_unavailable, STASH_ERROR_PROFILING_UNAVAILABLE, 200, "profiling unavailable") \
  X(profiler_state, STASH_ERROR_PROFILER_STATE, 201, "profiler in the wrong state")

enum class status : int {
#define STASH_STATUS_ENUM_(id, c_name, number, text) id = number,
  STASH_STATUS_TABLE(STASH_STATUS_ENUM_)
#undef STASH_STATUS_ENUM_
};

// One row of the table, for code that lists the codes (the header check, the docs).
struct status_entry {
  status code;
  const char* c_name;  // "STASH_ERROR_CUDA"
  const char* text;    // "CUDA error"
};
inline constexpr status_entry status_table[] = {
#define STASH_STATUS_ROW_(id, c_name, number, text) {status::id, #c_name, text},
    STASH_STATUS_TABLE(STASH_STATUS_ROW_)
#undef STASH_STATUS_ROW_
};

// The row's text; "unknown status" for any other number (the underlying type is int, so
// every int is a valid `status` value to pass).
const char* status_name(status s) noexcept;

// Formats into this thread's error buffer (truncates at 1 KiB; never allocates) and
// returns `s`, so that a failing path reads `return fail(status::..., "...", ...);`.
status fail(status s, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));
// Appends to this thread's error buffer (truncating).
void append_error(const char* fmt, ...) noexcept __attribute__((format(printf, 1, 2)));
// The message of this thread's most recent failure ("" when none).
const char* last_error() noexcept;
void clear_last_error() noexcept;

// The one exception type (Note [One error model at the bottom]). Thrown by constructors and
// other cold paths; never by alloc/free/stats.
class error : public std::runtime_error {
 public:
  error(status code, const char* what) : std::runtime_error(what), code_(code) {}
  error(status code, const std::string& what) : std::runtime_error(what), code_(code) {}
  status code() const noexcept { return code_; }

 private:
  status code_;
};

// Thrown for malformed input anywhere (profiles, plans, budgets, byte counts, options, JSON
// files): what() names the offending field or file, with a JSON path such as
// "layers[3].tensors[0].bytes" where there is one. A stash::error with status
// invalid_argument; the C API's planner entry points report it as STASH_ERROR_BAD_PROFILE
// or STASH_ERROR_BAD_PLAN, naming which input was bad, and the CLI exits 2 on it.
class input_error : public error {
 public:
  explicit input_error(const std::string& what) : error(status::invalid_argument, what) {}
  explicit input_error(const char* what) : error(status::invalid_argument, what) {}
};

// Throws stash::error carrying this thread's current error text.
[[noreturn]] void throw_last_error(status s);

}  // namespace stash
