"""stash.torch.fit's meter on CUDA (Note [What the budget counts] in _fit.py): torch's
max_memory_allocated, or stash's pool peak under stash.torch.use_allocator, and a measuring
step's windows over it (Note [The measuring step's windows on CUDA] in _fit.py). A part
the handle owns: it reads and writes a step's record (windows, in_loss,
before_optimizer_peak, optimizer_peak) and nothing of the handle's. It reads one
allocator's peak, the whole process's (Note [Why not torch.cuda.MemPool]).

Note [Why not torch.cuda.MemPool]
torch >= 2.5 can route the allocations made inside a `torch.cuda.use_mem_pool(pool)`
block to a MemPool backed by a pluggable allocator, so stash's pool could serve only the
blocks' activations while torch's caching allocator keeps everything else. fit does not:
(1) the budget is the process's peak, and two allocators that each cache their own free
blocks peak higher together than one that shares them: activations freed in backward
could not be reused by the gradients and optimizer temporaries allocated outside the pool
at that moment, and the reverse; (2) the saved tensors are created by the blocks' own ops,
some in backward (the prefetch buffers, the recompute's outputs), and the autograd engine
runs backward on its own thread, outside any use_mem_pool context set in forward, so a
pool would hold only part of the activations and the peak split between the two would be
harder to predict, not easier. Plans are therefore made and measured against one
allocator: torch's own, or stash's pool for the whole process (stash.torch.use_allocator),
whose peak fit then reads.
"""

from __future__ import annotations

import torch

from ._fit_support import StepRecord


class CudaMeter:
    def __init__(self, device: torch.device, pool: bool) -> None:
        self.device = device
        self.pool = pool  # stash's pool serves the process (use_allocator)

    def peak(self) -> int:
        """The peak since the last reset."""
        if self.pool:
            from . import _allocator
            return int(_allocator.allocator_stats(self.device.index)["peak_bytes"])
        return int(torch.cuda.max_memory_allocated(self.device))

    def reset(self) -> None:
        if self.pool:
            from . import _allocator
            _allocator.reset_peak(self.device.index)
        else:
            torch.cuda.reset_peak_memory_stats(self.device)

    # --- a measuring step's windows (rec.windows is None in every other step) -------------

    def _close(self, rec: StepRecord, name: str) -> None:
        """Closes a window: its peak joins the window's, and the meter starts again."""
        assert rec.windows is not None
        rec.windows[name] = max(rec.windows.get(name, 0), self.peak())
        self.reset()

    def blocks_ended(self, rec: StepRecord) -> None:
        """The last block's forward ended: the loss's window begins."""
        if rec.windows is not None:
            self._close(rec, "blocks")
            rec.in_loss = True

    def loss_ended(self, rec: StepRecord) -> None:
        """The last block's backward began: the blocks' window again."""
        if rec.windows is not None and rec.in_loss:
            self._close(rec, "loss")
            rec.in_loss = False

    def optimizer_begins(self, rec: StepRecord) -> None:
        """optimizer.step() begins: its window of its own."""
        if rec.windows is not None and rec.before_optimizer_peak is None:
            self._close(rec, "loss" if rec.in_loss else "blocks")
            rec.before_optimizer_peak = max(rec.windows.values())

    def step_peak(self, rec: StepRecord) -> int:
        """The step's peak, read when it ends: the largest window in a measuring step (the
        optimizer's is the one open then, when its step began)."""
        peak = self.peak()
        if rec.windows is None:
            return peak
        if rec.before_optimizer_peak is not None:
            rec.optimizer_peak = peak
        else:
            self._close(rec, "loss" if rec.in_loss else "blocks")
        return max([peak] + list(rec.windows.values()))
