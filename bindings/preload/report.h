// report.h: the JSON usage report (STASH_REPORT=path), schema "stash.preload_report/1".
//
// Note [When the report is written]
// At exit, from an atexit handler registered right after the first allocation a pool
// served. By then the runtime has initialized (the pool called it), and since atexit
// handlers run in reverse order of registration, ours runs before the runtime's own
// teardown, while the pools' statistics can still be read. A process in which no pool
// ever served (STASH_DISABLE=1, or no allocation) gets its report from this library's
// destructor instead, which reads only the counters. Written with open/snprintf/write
// into a fixed buffer: no heap, no stdio.
#pragma once

namespace stash::preload {

// Registers the at-exit report once, if STASH_REPORT is set. Cheap after the first call.
void arm_report_at_exit() noexcept;

// Writes the report to `path` now (0 on success, -1 and errno otherwise), replacing the
// file there whole or not at all (a temporary beside it, then a rename).
int write_report(const char* path) noexcept;

}  // namespace stash::preload
