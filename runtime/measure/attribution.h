// attribution.h: activity records + host scopes -> per-layer and per-tensor GPU time.
//
// Note [Attribution by launch]
// A kernel belongs to the scope that was open on the host thread that LAUNCHED it, not to
// whatever was open when it ran: launches are asynchronous, so a layer's kernels often
// finish after its range has closed on the host, while the next layer is being enqueued.
// The launch is identified by the correlation id CUPTI gives the API call and its kernel:
//   1. kernel.correlation_id -> EXTERNAL_CORRELATION record -> scope id (the thread's
//      innermost scope at the call, Note [One external correlation id per thread]);
//   2. if that record is missing (dropped, or a scope that pushed no external id), the
//      API record of the same correlation id gives the launching thread and time, and the
//      innermost scope open on that thread at that time is taken;
//   3. otherwise the kernel is counted outside every scope.
// Completion times never move a kernel between scopes.
//
// Note [Scope time is GPU busy time]
// A scope's time is the union of the [start, end) intervals of the kernels attributed to
// it or to scopes nested in it: kernels overlapping on several streams count once, and
// gaps where the GPU idles (host overhead) do not count. This is the compute time the
// planner's copy windows and recompute costs mean. Copies are not compute and are left
// out (their bytes are reported).
//
// Note [Nested scopes]
// Tensor scopes give their layer from the nearest enclosing layer scope. A layer scope
// nested inside another layer scope (a forward recomputed inside a backward under
// activation checkpointing) adds its kernels to the outer scope and yields no sample of
// its own: the recomputed forward is part of that backward's time, and the layer's
// forward samples stay those of the real forward.
#pragma once

#include "runtime/measure/measurement.h"
#include "runtime/measure/records.h"

namespace stash::measure {

measurement attribute(const activity_log& log);

}  // namespace stash::measure
