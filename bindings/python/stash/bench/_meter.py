"""The peak-memory meter of `python -m stash.bench.peers`: one meter for every system of a
run, so their peaks compare.

Note [One meter for every row]
On CUDA the meter is torch's caching allocator: max_memory_allocated() and
max_memory_reserved() over every step, reset before each, after the previous run's memory
went back (gc, empty_cache, and torch's pinned host cache emptied). This is also what
stash.torch.fit's budget counts (Note [What the budget counts] in stash/torch/_fit.py), so
a peer's peak handed to fit as a budget means the same bytes. fit resets the peak itself
when block 0 starts a step, so a stash row's reading leaves out the part of the step
before block 0 (the embedding lookup); that part never holds the step's peak: nothing is
saved yet, and the optimizer's temporaries come after the blocks.

On the CPU there is no device allocator. The meter is then c10's CPU allocator, read
through torch.profiler's memory events (profile_memory=True) over one step (the last, so
the optimizer's state exists): the most bytes allocated during the step on top of what
was alive when it began (parameters, gradients, optimizer state and the batch, counted
from their storages). The profiler slows the step it watches, so that step is never
timed. On stash's CPU test double this counts what stands for device memory: torch's CPU
tensors, while the double's pinned host memory is its own malloc and does not count; so
save_on_cpu, whose copies are CPU tensors too, shows at least keep-all's peak, and stash's
offloads show as the bytes they free. stash.torch.fit's own CPU budget
check is its own count (parameters, gradients, optimizer state and the saved tensors it
tracks), which leaves out the step's temporaries: on the CPU a stash row can be within
fit's budget yet above it on this meter. The table shows both; on CUDA they are one.
There is no reserved figure on the CPU.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Optional

from ..torch._fit_support import _tensor_bytes


def live_training_bytes(model, optimizer, batch) -> int:
    """Parameters, gradients, buffers, optimizer state and the batch, by storage."""
    tensors = list(model.parameters()) + [p.grad for p in model.parameters()]
    tensors += list(model.buffers())
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if hasattr(v, "untyped_storage")]
    tensors.append(batch)
    return _tensor_bytes(tensors)


class Meter:
    """step(i, ...) is a context manager around one training step; after it, last holds
    {"allocated": bytes or None, "reserved": bytes or None}; peak() the run's maximum."""

    source = ""

    def begin_run(self) -> None:
        self.allocated: Optional[int] = None
        self.reserved: Optional[int] = None
        self.last: Dict[str, Optional[int]] = {}

    def watches(self, step: int, steps: int) -> bool:
        """Whether the meter watches this step (it then must not be timed)."""
        return False

    def step(self, step: int, steps: int, model, optimizer, batch):
        return contextlib.nullcontext()

    def _note(self, allocated: Optional[int], reserved: Optional[int]) -> None:
        self.last = {"allocated": allocated, "reserved": reserved}
        if allocated is not None:
            self.allocated = max(self.allocated or 0, allocated)
        if reserved is not None:
            self.reserved = max(self.reserved or 0, reserved)


class CudaMeter(Meter):
    source = "torch.cuda.max_memory_allocated / max_memory_reserved, every step"

    def begin_run(self) -> None:
        import gc

        import torch

        super().begin_run()
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        # The pinned blocks save_on_cpu and torchtune leave in torch's host cache would
        # otherwise count against the next run's pinned memory (stash's pool sizes itself
        # from the host's available memory).
        if hasattr(torch._C, "_host_emptyCache"):
            torch._C._host_emptyCache()

    @contextlib.contextmanager
    def step(self, step, steps, model, optimizer, batch):
        import torch

        torch.cuda.reset_peak_memory_stats()
        yield
        torch.cuda.synchronize()
        self._note(int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved()))


class CpuProfilerMeter(Meter):
    source = ("c10 CPU allocator via torch.profiler memory events, last step, on top of "
              "the parameters, gradients, optimizer state and batch alive at its start")

    def watches(self, step, steps):
        return step == steps - 1

    @contextlib.contextmanager
    def step(self, step, steps, model, optimizer, batch):
        if not self.watches(step, steps):
            yield
            return
        from torch.profiler import ProfilerActivity, profile

        base = live_training_bytes(model, optimizer, batch)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            yield
        self._note(base + peak_delta(prof), None)


def peak_delta(prof) -> int:
    """The most bytes the CPU allocator held above its level when profiling began."""
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == _cpu_device_type()]
    events.sort(key=lambda e: e.start_ns())
    level = peak = 0
    for e in events:
        level += e.nbytes()
        peak = max(peak, level)
    return peak


def _cpu_device_type():
    from torch.autograd import DeviceType

    return DeviceType.CPU


def meter_for(device) -> Meter:
    import torch

    return CudaMeter() if torch.device(device).type == "cuda" else CpuProfilerMeter()
