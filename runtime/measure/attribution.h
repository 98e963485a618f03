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
//
// Note [Time outside the layers]
// A training step also runs work in no layer: the loss, the optimizer, data and
// gradient-zeroing kernels. The planner takes it as the profile's step_overhead_ms. A
// kernel counts here when no layer scope encloses the scope it is attributed to (no scope
// at all, a foreign range such as "optimizer", or a tensor scope outside any layer). Steps
// are the outermost forward scopes of layer 0 (one per forward pass, so per micro-batch
// under gradient accumulation, as the layers' samples are): step k is every such kernel
// LAUNCHED (Note [Attribution by launch]; the kernel's start when its API record is missing)
// from the k-th opening of layer 0's forward up to the next, the last step up to the end
// of the log. Kernels launched before the first step (initialisation) belong to no step.
// Each step's sample is the GPU busy time of its kernels (Note [Scope time is GPU busy
// time]); every step yields one, 0 when it has none. Steps are periods, so work a step does
// before its first forward (zeroing gradients) counts in the previous step's sample; at
// the ends, the first step's such work belongs to no step and work after the last step (a
// final evaluation, read-back) lands in the last sample. The median ignores both from
// three steps on. Copies do not count, as for scopes.
#pragma once

#include "runtime/measure/measurement.h"
#include "runtime/measure/records.h"

namespace stash::measure {

measurement attribute(const activity_log& log);

}  // namespace stash::measure
