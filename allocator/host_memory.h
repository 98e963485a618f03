// host_memory.h: how much host memory the pinned pool may pin by default.
//
// Pinned memory cannot be swapped or reclaimed, so pinning past what the machine (or the
// container) really has gets the process OOM-killed rather than an error. The default cap
// of the pinned pool is
//     0.8 × really_available ÷ LOCAL_WORLD_SIZE
// where really_available = min(MemAvailable from /proc/meminfo, headroom of the cgroup),
// the cgroup headroom being memory.max − memory.current (v2; every ancestor level, since
// the kernel enforces each) or memory.limit_in_bytes − memory.usage_in_bytes (v1), when a
// limit is set. LOCAL_WORLD_SIZE (torchrun's count of ranks on this machine, which share
// its memory) defaults to 1. The 0.8 leaves room for the rest of the process and the page
// cache that the job's own data loading needs.
//
// Everything here reads files with open/read into fixed buffers and never allocates, so
// it may run from a preloaded library before main. `root` prefixes every path ("" for the
// real machine) so that tests can point it at a fake /proc and /sys/fs/cgroup.
#pragma once

#include <cstdint>

namespace stash {

struct host_memory {
  uint64_t mem_available = 0;      // MemAvailable, bytes; 0 when unreadable
  uint64_t cgroup_headroom = UINT64_MAX;  // UINT64_MAX: no cgroup limit found
  int cgroup_version = 0;          // 0: none found, 1 or 2
  uint64_t really_available = 0;   // min of the two
  int local_ranks = 1;             // LOCAL_WORLD_SIZE
  uint64_t default_cap = 0;        // 0.8 × really_available ÷ local_ranks
};

host_memory probe_host_memory(const char* root = "") noexcept;

// Parses LOCAL_WORLD_SIZE's value (NULL, empty or invalid: 1).
int parse_local_ranks(const char* value) noexcept;

}  // namespace stash
