// struct_version.h: which struct_size and version of a public struct this library takes.
//
// Note [Versioned structs]
// stash.h promises that a program may run against a newer libstash.so than the stash.h it
// was built with. Every struct that crosses the API starts with struct_size (a config then
// has version), and a struct only ever grows at its end. So, as NCCL does for
// ncclConfig_t, the library takes any struct_size from the struct's first released size up
// to its own sizeof:
//  - a config is copied over its _init defaults as far as struct_size reaches, so the
//    fields the caller's header did not have keep their defaults (read_config);
//  - a result or statistics struct is written as far as struct_size reaches (check_size
//    here, the copy at the call).
// The first released size is the offset just past the struct's last field in the version
// where it appeared (STASH_END_OF), not that version's sizeof: tail padding is the
// compiler's, and a caller may count only the fields. A size below it, a size above this
// library's sizeof (a program built against a newer stash.h) or a version this library
// does not know is refused with STASH_ERROR_VERSION_MISMATCH, the message naming the
// struct, the size and the accepted range. The statistics structs take any size that
// holds struct_size itself (stash.h: "smaller older structs are filled as far as they
// go"), so their first size is sizeof(size_t).
//
// Appending a field to a released struct: give it a "since" note in stash.h and leave its
// min_size below alone (it is the oldest layout a program may still pass). struct_size does
// not cover one thing: each exported _init function writes this library's sizeof, and a
// program built against the older header hands it a smaller object. That already happened
// once: stash_engine_stats_t grew in 0.2.0, so a 0.1.0 program's stash_engine_stats_init
// writes 16 bytes past its struct (stash.h says so there; tests/bindings/old_client.c sets
// struct_size by hand for it). Before another released struct grows, its exported _init
// must stay at the old size and stash.h must reach an init that is told the caller's size
// (say, a macro passing sizeof *config) for the new layout; old_client.c fails otherwise
// for the structs 0.1.0 had.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstring>

#include "stash.h"
#include "core/error.h"

// The smallest struct_size that holds T::field: where a struct ended in the version whose
// last field was `field`.
#define STASH_END_OF(T, field) (offsetof(T, field) + sizeof(T::field))

namespace stash::api {

// One specialisation per public struct: its C name, its _init function (named in
// messages; defaults() runs it), the smallest struct_size taken, and for configs the
// newest version known. The fields per version are listed at each struct in stash.h.
template <class T>
struct struct_version;

template <>
struct struct_version<stash_pinned_pool_config_t> {
  static constexpr const char* name = "stash_pinned_pool_config_t";
  static constexpr const char* init = "stash_pinned_pool_config_init";
  // 0.1.0: every field, through wait_timeout_ms.
  static constexpr std::size_t min_size = STASH_END_OF(stash_pinned_pool_config_t, wait_timeout_ms);
  static constexpr unsigned version = STASH_PINNED_POOL_CONFIG_VERSION;
  static void defaults(stash_pinned_pool_config_t* c) noexcept { stash_pinned_pool_config_init(c); }
};

template <>
struct struct_version<stash_device_pool_config_t> {
  static constexpr const char* name = "stash_device_pool_config_t";
  static constexpr const char* init = "stash_device_pool_config_init";
  // 0.1.0: every field, through alignment.
  static constexpr std::size_t min_size = STASH_END_OF(stash_device_pool_config_t, alignment);
  static constexpr unsigned version = STASH_DEVICE_POOL_CONFIG_VERSION;
  static void defaults(stash_device_pool_config_t* c) noexcept { stash_device_pool_config_init(c); }
};

template <>
struct struct_version<stash_engine_config_t> {
  static constexpr const char* name = "stash_engine_config_t";
  static constexpr const char* init = "stash_engine_config_init";
  // 0.1.0: every field, through max_micro_batches.
  static constexpr std::size_t min_size = STASH_END_OF(stash_engine_config_t, max_micro_batches);
  static constexpr unsigned version = STASH_ENGINE_CONFIG_VERSION;
  static void defaults(stash_engine_config_t* c) noexcept { stash_engine_config_init(c); }
};

template <>
struct struct_version<stash_plan_options_t> {
  static constexpr const char* name = "stash_plan_options_t";
  static constexpr const char* init = "stash_plan_options_init";
  // 0.3.0: every field, through polish.
  static constexpr std::size_t min_size = STASH_END_OF(stash_plan_options_t, polish);
  static constexpr unsigned version = STASH_PLAN_OPTIONS_VERSION;
  static void defaults(stash_plan_options_t* o) noexcept { stash_plan_options_init(o); }
};

template <>
struct struct_version<stash_plan_result_t> {
  static constexpr const char* name = "stash_plan_result_t";
  static constexpr const char* init = "stash_plan_result_init";
  // 0.3.0: every field, through predicted_step_ms.
  static constexpr std::size_t min_size = STASH_END_OF(stash_plan_result_t, predicted_step_ms);
};

template <>
struct struct_version<stash_link_result_t> {
  static constexpr const char* name = "stash_link_result_t";
  static constexpr const char* init = "stash_link_result_init";
  // 0.3.0: every field, through device_name.
  static constexpr std::size_t min_size = STASH_END_OF(stash_link_result_t, device_name);
};

template <>
struct struct_version<stash_pool_stats_t> {
  static constexpr const char* name = "stash_pool_stats_t";
  static constexpr const char* init = "stash_pool_stats_init";
  // Filled as far as any size goes (0.1.0: every field, through failed_count).
  static constexpr std::size_t min_size = sizeof(std::size_t);
};

template <>
struct struct_version<stash_engine_stats_t> {
  static constexpr const char* name = "stash_engine_stats_t";
  static constexpr const char* init = "stash_engine_stats_init";
  // Filled as far as any size goes (0.1.0: through pinned; 0.2.0: ordered_handback_*).
  static constexpr std::size_t min_size = sizeof(std::size_t);
};

// "N" or "N..M", for the messages.
struct range_text {
  range_text(std::size_t lo, std::size_t hi) noexcept {
    if (lo == hi) std::snprintf(text, sizeof text, "%zu", lo);
    else std::snprintf(text, sizeof text, "%zu..%zu", lo, hi);
  }
  char text[48];
};

// The refusal of a struct_size outside lo..hi, the sizes of `name` this library takes.
inline status size_refused(const char* fn, const char* param, const char* name, const char* init,
                           std::size_t size, std::size_t lo, std::size_t hi) noexcept {
  const range_text range(lo, hi);
  if (size < lo) {
    return fail(status::version_mismatch,
                "%s: %s->struct_size is %zu, too small for any %s; stash %s takes struct_size "
                "%s (fill it with %s)",
                fn, param, size, name, STASH_VERSION_STRING, range.text, init);
  }
  return fail(status::version_mismatch,
              "%s: %s->struct_size is %zu, larger than stash %s's %s (a newer stash.h than "
              "the library?); it takes struct_size %s (fill it with %s)",
              fn, param, size, STASH_VERSION_STRING, name, range.text, init);
}

// Checks s.struct_size against the sizes T has had, oldest to this library's.
template <class T>
status check_size(const char* fn, const char* param, const T& s) noexcept {
  using V = struct_version<T>;
  static_assert(V::min_size >= sizeof(std::size_t) && V::min_size <= sizeof(T));
  if (s.struct_size >= V::min_size && s.struct_size <= sizeof(T)) return status::ok;
  return size_refused(fn, param, V::name, V::init, s.struct_size, V::min_size, sizeof(T));
}

// *out = the defaults, then as much of *given as the caller's struct_size holds (given
// NULL: the defaults alone). Refuses a size or version this library does not know.
template <class T>
status read_config(const char* fn, const char* param, const T* given, T* out) noexcept {
  using V = struct_version<T>;
  V::defaults(out);
  if (!given) return status::ok;
  if (const status s = check_size(fn, param, *given); s != status::ok) return s;
  if (given->version == 0 || given->version > V::version) {
    const range_text versions(1, V::version);
    return fail(status::version_mismatch,
                "%s: %s->version is %u, unknown to stash %s, which takes %s version %s "
                "(fill it with %s)",
                fn, param, given->version, STASH_VERSION_STRING, V::name, versions.text, V::init);
  }
  std::memcpy(static_cast<void*>(out), given, given->struct_size);
  out->struct_size = sizeof(T);  // *out is whole now
  return status::ok;
}

// Writes `full` to *out as far as the caller's struct_size goes (a size check_size took),
// leaving out->struct_size the caller's: a result or statistics struct of an older layout.
template <class T>
void write_as_far_as(const T& full, T* out) noexcept {
  T copy = full;
  copy.struct_size = out->struct_size;
  std::memcpy(static_cast<void*>(out), &copy, out->struct_size);
}

}  // namespace stash::api
