"""stash.torch.fit, the one call of budget mode: its arguments and what it promises
through a training loop; BudgetHandle (_fit.py) is what it returns.

Note [The loops fit lives in]
What a training loop does besides forward, backward and step, and what fit does then:
- an exception anywhere in a step (a block, the loss, backward, optimizer.step(), an
  interrupt, an out-of-memory error) ends the step: it is given back (Note [A step that
  ends early] in _offload_steps.py), report() lists it with why, and the next step runs
  as if the lost one had not (a measuring step is measured again). With the optimizer
  known, a forward after an optimizer step that began and never ended marks that step
  aborted. A forward that finds the gradients the step's backward made gone (set to
  None) with no optimizer step since begins the next step: the loop gave the step up
  between two micro-batches of its accumulation (an error in its data or its loss,
  which no hook of fit's sees) or skipped its optimizer step (a GradScaler that found
  an inf). The step ends where its backward did, a step of the micro-batches that ran,
  judged against its budget; it was taken for the next step's first micro-batch. With
  the gradients zeroed in place instead, nothing tells the two apart: one step;
- eval: blocks in eval mode run as plain forwards, whether grad is on or not, with no
  step, record or warning; the next training step carries on where training left off;
- a Hugging Face key/value cache handed to the blocks in training (use_cache=True) is
  turned off for them, with one warning, as Hugging Face's gradient checkpointing does;
- activation checkpointing around a block leaves fit nothing to plan (the checkpoint's
  hooks take every tensor the block saves), and a share budget was refused with figures
  that named no cause. Hugging Face's gradient checkpointing on a block (enabled before
  fit or after, as a Trainer with gradient_checkpointing=True does) is turned off while
  fit runs, with one warning, and on again at close(); torch.utils.checkpoint around a
  block is refused, naming it. Both are looked for in measuring steps;
- misuse is named at fit(): a single module, a dict or a container of non-modules as
  blocks, the whole decoder as the one block (its repeated blocks are named), a unitless
  budget that could be a share (Note [What a share budget means] in _fit_options.py). A
  refusal's smallest feasible budget is one the same run accepts: at least the measuring
  step's own peak.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, Optional, Sequence, Union

import torch

from ._fit import BudgetHandle
from ._fit_options import FitOptions

__all__ = ["fit"]


def fit(blocks: Iterable[torch.nn.Module], budget: Union[int, str], *,
        optimizer: Optional[torch.optim.Optimizer] = None, solver: str = "greedy",
        cache_dir: Optional[Union[str, "os.PathLike[str]"]] = None, measure_steps: int = 1,
        lookahead: int = 1, max_in_flight_bytes: Optional[Union[int, str]] = None,
        pinned_cap: Optional[Union[int, str]] = None, max_micro_batches: int = 8,
        device: Optional[Union[str, torch.device]] = None,
        link: Optional[Union[str, Dict[str, Any]]] = None, timing: bool = True,
        dist_timeout_s: float = 300.0,
        buckets: Optional[Union[int, Sequence[int]]] = None) -> BudgetHandle:
    """Meets a device-memory budget while training, with nothing else in the loop changed.

    blocks: the model's repeated blocks in order (``model.model.layers`` of a Hugging Face
    decoder, ``model.transformer.h`` of GPT-2, a list of nn.TransformerEncoderLayer), called
    by the model's own forward with any arguments and outputs. budget: bytes, "40GiB", or
    "70%" of the keep-all peak estimated from the measurement (Note [What the budget
    counts] in _fit_steps.py).

    The first step (measure_steps of them) for each shape of block 0's inputs measures the
    model in least-memory mode (Note [The measuring step] in _fit_measure.py); later
    steps run the plan the planner makes from it (solver "greedy", "ilp" or "exact")
    through stash's engine (offload with one-block-ahead prefetch, selective recompute,
    keep). A new input shape
    re-plans from the cache (Note [Re-planning and the cache] in _fit_shape_plans.py);
    cache_dir persists profiles and plans, so a second run of the same script starts
    planned. optimizer: lets fit count its state exactly once it exists and end each step at
    its step().
    link: None or "measure" (measured once per machine and cached), or a dict with
    h2d_gbps, d2h_gbps and bidir_gbps. The engine's knobs are OffloadHandle's
    (lookahead, max_in_flight_bytes, pinned_cap, max_micro_batches; micro-batches through
    handle.micro_batch(i)).
    buckets: for loops whose sequence lengths vary, a plan per bucket of lengths rather than
    per length: an int rounds every length up to a multiple of it (buckets=256: 300 runs
    512's plan), a list of lengths to the smallest at least it (a longer one runs its own);
    the length is block 0's first tensor's next-to-last dimension (Note [Lengths rounded
    up to a bucket] in _fit_shapes.py).

    Under torch.distributed (initialized, more than one rank) every rank measures, the
    ranks' profiles are combined, rank 0 plans and every rank runs that plan; a failure on
    one rank raises StashError on every rank, naming it, within dist_timeout_s seconds
    (Note [Agreeing on a plan across ranks] in _fit_ranks.py). Every rank must call fit
    and train with the same blocks in the same order.

    Returns a :class:`BudgetHandle`: ``report()`` (a dict; ``format_report()`` as text),
    ``plan``, ``profile``, ``write_trace(path)``, ``close()``, and a with-block. Raises
    StashError for a budget that does not parse or cannot hold the parameters, for blocks
    that run out of order or twice per step, for CPU blocks without stash's CPU runtime,
    and, at the first planned step and before anything is planned, for a budget the
    least-memory mode itself does not meet (with the measured peak and the smallest
    feasible budget); the blocks are restored then."""
    options = FitOptions(solver=solver,
                         cache_dir=os.fspath(cache_dir) if cache_dir is not None else None,
                         measure_steps=measure_steps,
                         lookahead=lookahead, max_in_flight_bytes=max_in_flight_bytes,
                         pinned_cap=pinned_cap, max_micro_batches=max_micro_batches,
                         device=device, link=link, timing=timing,
                         dist_timeout_s=dist_timeout_s,
                         buckets=buckets)
    return BudgetHandle(blocks, budget, optimizer=optimizer, options=options)
