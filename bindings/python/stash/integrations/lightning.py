"""stash in PyTorch Lightning's Trainer.

    from stash.integrations.lightning import StashCallback
    trainer = Trainer(max_steps=1000, callbacks=[StashCallback(budget="70%")])

Note [fit in Lightning]
Construction checks the budget and every fit() keyword (_callbacks), so that a wrong
argument fails before trainer.fit() sets anything up. fit is entered at on_train_start,
not on_fit_start: both come after the strategy has made the optimizers, but
on_train_start also comes after the sanity check's validation and after a checkpoint's
optimizer state was restored, so fit sees the model as it trains and the optimizer state
it really holds, and it pairs with on_train_end, which closes the handle (the blocks are
restored exactly; ``callback.handle`` keeps the report). An exception in training skips
on_train_end, so on_exception closes the handle too: the LightningModule is left as it was
given, whatever happened.

The blocks are the model's decoder layers, found in the LightningModule by find_blocks
(the first ModuleList of two or more modules of one class, through the DDP, peft and
torch.compile wrappers), or blocks= for other models. Every Hugging Face config in the
module gets use_cache False, as Hugging Face's Trainer does under gradient checkpointing:
a training forward has no use for the key/value cache. A Hugging Face model's activation
checkpointing is turned off, with a warning: fit chooses what each block keeps,
recomputes or offloads, and a checkpointed block saves only its input, which leaves it
nothing to choose. fit gets the torch optimizer Lightning steps (trainer.optimizers, the
one configure_optimizers returned, unwrapped from LightningOptimizer), so that it counts
the optimizer's state exactly and ends each step at its step(); a module that configures
several optimizers is refused, since fit ends a step at one optimizer's step().

Lightning calls optimizer.step(closure=...) with the training step, its backward, the
on_before_optimizer_step hooks and gradient clipping inside the closure, which step()
evaluates first thing. fit ends a step's passes at step(), and a forward inside
step(closure) is the step's own (Note [A step that ends early] in
stash/torch/_offload_steps.py): so accumulate_grad_batches=N is N forwards and backwards
per optimizer step, which fit prices as one step of N passes, with nothing of the
callback's in between.

Lightning's closure zeroes the gradients after the training step's forward and before its
backward, so the last step's gradients are alive through the next step's forward. The
measuring step, the first, has none yet, so the first planned step peaks above its
prediction (by the gradients' bytes, in a plain loop that zeroes them there); fit's
check of a plan's first run adds them to the fixed bytes and the plans after it meet the
budget (on the test model: one step 5% over, 17% under accumulate_grad_batches=2; none
after it). A loop that zeroes them after step() does not see this.

Validation runs in eval mode, which fit lets through. cache_dir defaults to
<trainer.default_root_dir>/stash, beside Lightning's checkpoints, so a run resumed from
one (ckpt_path=) in the same root starts planned.

The callback is a Callback of lightning.pytorch and of pytorch_lightning, of each of the
two packages that is installed (the lightning package installs both), so either's Trainer
takes it; importing stash.integrations imports neither.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple, Type, Union, cast

import torch

from .. import torch as stash_torch
from .._lib import StashError
from ._callbacks import FitArguments

__all__ = ["StashCallback"]


def _callback_bases() -> Tuple[Type[Any], ...]:
    """Lightning's Callback classes, one per installed package: lightning.pytorch's and
    pytorch_lightning's are distinct classes, and a Trainer checks isinstance against its
    own (Note [fit in Lightning])."""
    bases: List[Type[Any]] = []
    for package in ("lightning.pytorch", "pytorch_lightning"):
        try:
            module = __import__(package, fromlist=["Callback"])
        except ImportError:
            continue
        bases.append(module.Callback)
    if not bases:
        raise ImportError("stash.integrations.lightning needs PyTorch Lightning: "
                          "pip install pytorch-lightning (or lightning)")
    return tuple(bases)


def _stepped_optimizer(trainer: Any) -> Optional[torch.optim.Optimizer]:
    """The torch optimizer the Trainer steps (None when the module configures none)."""
    optimizers = list(getattr(trainer, "optimizers", []) or [])
    if len(optimizers) > 1:
        raise StashError(
            f"stash: StashCallback: the LightningModule configures {len(optimizers)} "
            "optimizers, and stash.torch.fit ends a training step at one optimizer's step(); "
            "train with one optimizer, or call stash.torch.fit(blocks, budget, optimizer=...) "
            "yourself in on_train_start")
    if not optimizers:
        return None
    optimizer = optimizers[0]
    # LightningOptimizer (._optimizer) and accelerate-style wrappers (.optimizer).
    for attribute in ("_optimizer", "optimizer"):
        inner = getattr(optimizer, attribute, None)
        if isinstance(inner, torch.optim.Optimizer):
            return inner
    return cast(torch.optim.Optimizer, optimizer)  # a duck-typed one: fit counts its state


class StashCallback(*_callback_bases()):  # type: ignore[misc]
    """Trains under :func:`stash.torch.fit` at `budget` (bytes, "40GiB" or "70%"). blocks:
    the model's repeated blocks (default: found, Note [fit in Lightning]); cache_dir:
    default <trainer.default_root_dir>/stash; every other keyword is fit's."""

    def __init__(self, budget: Union[int, str], *,
                 blocks: Optional[Sequence[torch.nn.Module]] = None,
                 cache_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
                 **fit_options: Any):
        super().__init__()
        self.arguments = FitArguments("StashCallback", budget, blocks, cache_dir, fit_options)
        self.handle: Optional[stash_torch.BudgetHandle] = None

    def on_train_start(self, trainer: Any, pl_module: torch.nn.Module) -> None:
        self._close()  # a handle left by an earlier trainer.fit() with this callback
        self.handle = self.arguments.enter(pl_module, _stepped_optimizer(trainer),
                                           trainer.default_root_dir)

    def on_train_end(self, trainer: Any, pl_module: torch.nn.Module) -> None:
        self._close()

    def on_exception(self, trainer: Any, pl_module: torch.nn.Module,
                     exception: BaseException) -> None:
        self._close()

    def _close(self) -> None:
        # The handle stays for its report().
        if self.handle is not None and self.handle.engine is not None:
            self.handle.close()
