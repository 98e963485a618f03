"""stash in Hugging Face's Trainer, and in TRL's trainers (they subclass it).

    from stash.integrations.transformers import StashCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[StashCallback(budget="70%")])

Note [fit in a Trainer]
Construction checks the budget and every fit() keyword (_callbacks), so that a wrong
argument fails before the Trainer is built. At on_train_begin (after the Trainer has
turned on activation checkpointing, where it does) the callback finds the model's decoder
layers (find_blocks; blocks= for other models), turns the model's key/value cache off for
training (as the Trainer does under gradient checkpointing), turns activation
checkpointing off with a warning (fit chooses what each block recomputes, and a
checkpointed block saves only its input, leaving it nothing to choose; TRL's configs turn
it on by default), and enters stash.torch.fit with the Trainer's own
optimizer (the torch optimizer inside accelerate's wrapper, so that fit ends each step at
its step() and counts its state). Gradient accumulation needs nothing: the Trainer runs
gradient_accumulation_steps forwards and backwards of micro-batch 0 per optimizer step,
which fit prices as one step of that many passes. Evaluation runs in eval mode, which fit
lets through. cache_dir defaults to <output_dir>/stash, so a run resumed from a checkpoint
in the same output_dir starts planned. At on_train_end the blocks are restored;
``callback.handle`` keeps the report. TRL's SFTTrainer, with its defaults (activation
checkpointing on), is tested like the Trainer (tests/python/test_integrations_trl.py).
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

import torch
from transformers import TrainerCallback

from .. import torch as stash_torch
from ._blocks import _unwrapped
from ._callbacks import FitArguments

__all__ = ["StashCallback"]


class StashCallback(TrainerCallback):
    """Trains under :func:`stash.torch.fit` at `budget` (bytes, "40GiB" or "70%"). blocks:
    the model's repeated blocks (default: found, Note [fit in a Trainer]); cache_dir:
    default <output_dir>/stash; every other keyword is fit's."""

    def __init__(self, budget: Union[int, str], *,
                 blocks: Optional[Sequence[torch.nn.Module]] = None,
                 cache_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
                 **fit_options: Any):
        self.arguments = FitArguments("StashCallback", budget, blocks, cache_dir, fit_options)
        self.handle: Optional[stash_torch.BudgetHandle] = None

    def on_train_begin(self, args: Any, state: Any, control: Any,
                       model: Optional[torch.nn.Module] = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        if model is None:
            return
        opt = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer
        self.handle = self.arguments.enter(_unwrapped(model), opt, args.output_dir)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.handle is not None:
            self.handle.close()
