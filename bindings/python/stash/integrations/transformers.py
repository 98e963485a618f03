"""stash in Hugging Face's Trainer (TRL's trainers subclass it; they are not tested here).

    from stash.integrations.transformers import StashCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[StashCallback(budget="70%")])

Note [fit in a Trainer]
At on_train_begin the callback finds the model's decoder layers (find_blocks; blocks=
for other models), turns the model's key/value cache off for training (as the Trainer
does under gradient checkpointing), and enters stash.torch.fit with the Trainer's own
optimizer (the torch optimizer inside accelerate's wrapper, so that fit ends each step at
its step() and counts its state). Gradient accumulation needs nothing: the Trainer runs
gradient_accumulation_steps forwards and backwards of micro-batch 0 per optimizer step,
which fit prices as one step of that many passes. Evaluation runs in eval mode, which fit
lets through. cache_dir defaults to <output_dir>/stash, so a run resumed from a checkpoint
in the same output_dir starts planned. At on_train_end the blocks are restored;
``callback.handle`` keeps the report.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

import torch
from transformers import TrainerCallback

from .. import torch as stash_torch
from ._blocks import _unwrapped, find_blocks

__all__ = ["StashCallback"]


class StashCallback(TrainerCallback):
    """Trains under :func:`stash.torch.fit` at `budget` (bytes, "40GiB" or "70%"). blocks:
    the model's repeated blocks (default: found, Note [fit in a Trainer]); cache_dir:
    default <output_dir>/stash; every other keyword is fit's."""

    def __init__(self, budget: Union[int, str], *,
                 blocks: Optional[Sequence[torch.nn.Module]] = None,
                 cache_dir: Optional[str] = None, **fit_options: Any):
        # Checked now, so that a wrong argument fails before the Trainer starts.
        from ..torch._fit_options import Budget, FitOptions

        Budget.parse(budget)
        FitOptions(**fit_options)
        self.budget = budget
        self.blocks = blocks
        self.cache_dir = cache_dir
        self.fit_options = fit_options
        self.handle: Optional[stash_torch.BudgetHandle] = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if model is None:
            return
        inner = _unwrapped(model)
        config = getattr(inner, "config", None)
        if getattr(config, "use_cache", False):
            config.use_cache = False
        blocks = self.blocks if self.blocks is not None else find_blocks(model)
        opt = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer
        cache_dir = self.cache_dir or os.path.join(args.output_dir, "stash")
        self.handle = stash_torch.fit(blocks, self.budget, optimizer=opt, cache_dir=cache_dir,
                                      **self.fit_options)

    def on_train_end(self, args, state, control, **kwargs):
        if self.handle is not None:
            self.handle.close()
