"""The peak-memory meter of `python -m stash.bench.peers`: one meter for every system of a
run, so their peaks compare.

Note [One meter for every row]
On CUDA the meter is torch's caching allocator: max_memory_allocated() and
max_memory_reserved() over every step, reset before each, after the previous run's memory
went back (gc, empty_cache, and torch's pinned host cache emptied). This is also what
stash.torch.fit's budget counts (Note [What the budget counts] in
stash/torch/_fit_steps.py), so a peer's peak handed to fit as a budget means the same bytes.
fit resets the peak itself when block 0 starts a step, so a stash row's reading leaves out
the part of the step before block 0 (the embedding lookup); that part never holds the step's
peak: nothing is saved yet, and the optimizer's temporaries come after the blocks.

On the CPU there is no device allocator; the meter is c10's CPU allocator (Note [The CPU
allocator's meter]): over every step, the most bytes it held above its level when the
step began, on top of what was alive then (parameters, gradients, optimizer state and the
batch, counted from their storages). On stash's CPU test double this counts what stands
for device memory: torch's CPU tensors, while the double's pinned host memory is its own
malloc and does not count; so save_on_cpu, whose copies are CPU tensors too, shows at
least keep-all's peak, and stash's offloads show as the bytes they free. There is no
reserved figure on the CPU.

Note [The CPU allocator's meter]
c10 keeps no statistics of its CPU allocator. stash counts them with a counting allocator
in front of it (_cpu_meter.py), which costs a relaxed atomic per allocation, so every
step is watched and timed alike. Where that allocator cannot be built (no C++ compiler),
the meter falls back to torch.profiler's memory events over the last step only (about
+60% on a step, so that step is never timed), and stash.torch.fit to its own count of the
storages it tracks, which leaves out the step's temporaries; report()["memory"] says
which. stash.torch.fit reads the same meter: on the CPU its budget is checked on it at
every step, and its measuring step calibrates the fixed bytes from it exactly as on CUDA
(Note [What the budget counts] in _fit_steps.py).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, ContextManager, Dict, Iterator, Optional, Union

from ._fit_support import _tensor_bytes

if TYPE_CHECKING:
    import torch

    from ._cpu_meter import Window


def live_training_bytes(model: torch.nn.Module, optimizer: Any, batch: Any) -> int:
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

    def step(self, step: int, steps: int, model: torch.nn.Module, optimizer: Any,
             batch: Any) -> ContextManager[None]:
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
    def step(self, step: int, steps: int, model: torch.nn.Module, optimizer: Any,
             batch: Any) -> Iterator[None]:
        import torch

        torch.cuda.reset_peak_memory_stats()
        yield
        torch.cuda.synchronize()
        self._note(int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved()))


class CpuAllocatorMeter(Meter):
    source = ("c10 CPU allocator (stash's counting allocator), every step, on top of the "
              "parameters, gradients, optimizer state and batch alive at its start")

    def __init__(self, window: Window) -> None:
        self.window = window

    @contextlib.contextmanager
    def step(self, step: int, steps: int, model: torch.nn.Module, optimizer: Any,
             batch: Any) -> Iterator[None]:
        base = live_training_bytes(model, optimizer, batch)
        self.window.reopen()
        yield
        self._note(base + self.window.peak(), None)


class CpuProfilerMeter(Meter):
    source = ("c10 CPU allocator via torch.profiler memory events, last step, on top of "
              "the parameters, gradients, optimizer state and batch alive at its start")

    def watches(self, step: int, steps: int) -> bool:
        return step == steps - 1

    @contextlib.contextmanager
    def step(self, step: int, steps: int, model: torch.nn.Module, optimizer: Any,
             batch: Any) -> Iterator[None]:
        if not self.watches(step, steps):
            yield
            return
        from torch.profiler import ProfilerActivity, profile

        base = live_training_bytes(model, optimizer, batch)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            yield
        self._note(base + peak_delta(prof), None)


def peak_delta(prof: Any) -> int:
    """The most bytes the CPU allocator held above its level when profiling began."""
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == _cpu_device_type()]
    events.sort(key=lambda e: e.start_ns())
    level = peak = 0
    for e in events:
        level += e.nbytes()
        peak = max(peak, level)
    return peak


def _cpu_device_type() -> Any:
    from torch.autograd import DeviceType  # type: ignore[attr-defined]

    return DeviceType.CPU


def meter_for(device: Union[str, torch.device]) -> Meter:
    import torch

    if torch.device(device).type == "cuda":
        return CudaMeter()
    from ._cpu_meter import window

    w = window()
    return CpuAllocatorMeter(w) if w is not None else CpuProfilerMeter()
