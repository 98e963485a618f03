"""The clock fit's steps are timed on: marks on the compute stream (CUDA events) on a GPU,
the host clock on the CPU. The eager measuring step (_fit_measure.py) and the compiled
graph's ticks (_compiled_steps.py) both mark with it."""

from __future__ import annotations

import time
from typing import Any

import torch


class _Clock:
    """Marks on the compute stream (CUDA events) or on the host clock (CPU)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.kind = "cuda-events" if cuda else "host-clock"

    def mark(self) -> Any:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a: Any, b: Any) -> float:
        """From mark a to mark b, in ms; on CUDA it waits for both events (elapsed_time
        raises on one the stream has not reached yet)."""
        if a is None or b is None:
            return 0.0
        if self.cuda:
            a.synchronize()
            b.synchronize()
            return float(a.elapsed_time(b))
        return (b - a) * 1e3  # type: ignore[no-any-return]  # host marks: floats

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
