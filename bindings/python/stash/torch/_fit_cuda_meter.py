"""stash.torch.fit's meter on CUDA (Note [What the budget counts] in _fit_steps.py): torch's
max_memory_allocated, or stash's pool peak under stash.torch.use_allocator, and a measuring
step's windows over it (Note [The measuring step's windows on CUDA]). A part
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

Note [The measuring step's windows on CUDA]
A measuring step's one peak cannot say where it was, and two positions hold what no block
decides and what does not scale as the blocks do:
- the loss's (the head, the loss and their backward, between the last block's forward and
  its backward): the logits over the vocabulary, in float32 where the loss upcasts them.
  Folded into the fixed bytes, they stood beside every block's replayed activations in
  the model, which they never meet (Note [The loss's position] in planner/model/plan.h):
  on an H200 the planner's least memory for a 4-layer Llama-3-8B at sequence 4096 came
  out 0.8 GiB above the measuring step's own peak, and budgets full checkpointing trains
  in were refused;
- optimizer.step()'s: parameters, gradients, the optimizer's state (made by its first
  step) and its temporaries (AdamW's foreach kernels, the default on CUDA, made 0.9 GB
  beside 0.2 GB of bf16 parameters). It does not scale with the tokens, so for a short
  shape it can be the step's peak while a long shape's measuring step never shows it (6
  of 10 derived plans of a 6-layer Llama over their budgets on an H200).
So a measuring step reads the meter in windows, resetting it at each border: "blocks"
(the blocks' forwards and backwards), "loss" (from the last block's forward end to its
backward's start) and, with the optimizer given to fit, optimizer.step() alone (its pre-
and post-step hooks). The blocks' window gives the fixed bytes as before, the loss's the
profile's loss_bytes (what it held above the fixed bytes and the activations the model
puts there), the optimizer's its optimizer_bytes (Note [The optimizer's position] there),
which a derived shape keeps as measured. The step's peak in report() is the largest
window. So in a measuring step, and only there, a reading of max_memory_allocated()
after optimizer.step() covers the last window alone; planned steps leave the meter to the
user. The state a first step makes is written as estimated at block 0 in these figures,
and the post-step hook of the next step shifts them by the estimate's error, as for the
fixed bytes alone before.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from ._fit_measure import fixed_bytes_cuda
from ._fit_plan import kept_bytes
from ._fit_support import StepRecord, _optimizer_state_bytes


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


def cuda_profile_figures(doc: Dict[str, Any], rec: StepRecord, actions: List[List[str]],
                         counted: int, optimizer: Optional[torch.optim.Optimizer]
                         ) -> Optional[int]:
    """A measuring step's CUDA windows as its profile's figures (fixed_bytes, loss_bytes,
    optimizer_bytes, the constant and in-flight bytes): Note [The measuring step's windows
    on CUDA]. actions: what the step did per block; counted: the fixed bytes fit counts.
    Returns the optimizer state's bytes the profile counts where this step's
    optimizer.step() made the state (counted as estimated at block 0, as the fixed bytes
    count it; the post-step hook then shifts both by the estimate's error), else None."""
    missing = rec.optimizer_state_missing
    windows = rec.windows or {}
    doc["fixed_bytes"], loss = fixed_bytes_cuda(
        doc, windows.get("blocks", rec.peak_bytes), windows.get("loss"), actions, counted,
        missing)
    if loss:
        doc["loss_bytes"] = loss
    if rec.optimizer_peak is not None:
        real = _optimizer_state_bytes(optimizer) if missing else 0
        doc["optimizer_bytes"] = int(max(0, rec.optimizer_peak - real + missing))
    if rec.constant_bytes is not None:
        doc["measurement"]["constant_bytes"] = int(max(counted, rec.constant_bytes))
    if rec.in_flight > 1:  # Note [Micro-batches in flight] in _fit_plan.py
        doc["measurement"]["in_flight_held_bytes"] = (rec.in_flight - 1) * kept_bytes(
            doc, actions)
    return missing or None
