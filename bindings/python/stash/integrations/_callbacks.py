"""What the trainer callbacks share: their fit() arguments, checked when a callback is made
(so that a wrong argument fails before the trainer starts rather than at its first step),
and fit entered on the model, made ready for it, when training starts (FitArguments)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Optional, Sequence, Union

import torch

from .. import torch as stash_torch
from .._lib import StashError
from .._warn import warn
from ..torch._fit_options import Budget, FitOptions
from ._blocks import find_blocks


@dataclasses.dataclass(frozen=True)
class FitArguments:
    """A callback's arguments to stash.torch.fit, checked when the callback is made."""

    who: str
    budget: Union[int, str]
    blocks: Optional[Sequence[torch.nn.Module]]
    cache_dir: Optional[Union[str, "os.PathLike[str]"]]
    fit_options: Dict[str, Any]

    def __post_init__(self) -> None:
        checked_fit_arguments(self.who, self.budget, self.cache_dir, self.fit_options)

    def enter(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer],
              root_dir: str) -> "stash_torch.BudgetHandle":
        """fit on `model`'s blocks (blocks=, else find_blocks) with the trainer's optimizer,
        its key/value cache and activation checkpointing off; cache_dir defaults to
        <root_dir>/stash, beside the trainer's checkpoints."""
        turn_kv_cache_off(model)
        turn_activation_checkpointing_off(model, self.who)
        blocks = self.blocks if self.blocks is not None else find_blocks(model)
        cache_dir = (self.cache_dir if self.cache_dir is not None
                     else os.path.join(root_dir, "stash"))
        return stash_torch.fit(blocks, self.budget, optimizer=optimizer, cache_dir=cache_dir,
                               **self.fit_options)


def checked_fit_arguments(who: str, budget: Union[int, str],
                          cache_dir: Optional[Union[str, "os.PathLike[str]"]],
                          fit_options: Dict[str, Any]) -> None:
    """Raises StashError naming the fix for a budget that does not parse, an option fit
    does not have, an optimizer (the callback hands fit the trainer's own) or an option's
    bad value (FitOptions' own checks)."""
    Budget.parse(budget)
    if "optimizer" in fit_options:
        raise StashError(f"stash: {who} hands stash.torch.fit the trainer's own optimizer; "
                         "drop optimizer=")
    known = {f.name for f in dataclasses.fields(FitOptions)} - {"cache_dir"}
    unknown = sorted(set(fit_options) - known)
    if unknown:
        raise StashError(f"stash: {who} got {', '.join(map(repr, unknown))}, which "
                         f"stash.torch.fit does not take (its options: "
                         f"{', '.join(sorted(known))}; and blocks=, cache_dir=)")
    FitOptions(cache_dir=os.fspath(cache_dir) if cache_dir is not None else None,
               **fit_options)


def turn_kv_cache_off(model: torch.nn.Module) -> None:
    """Sets use_cache False on every Hugging Face config in `model` (a LightningModule may
    hold the model anywhere), as the Trainer does under gradient checkpointing: a training
    forward has no use for the cache, and fit would otherwise turn it off for the blocks
    with a warning (Note [The loops fit lives in] in stash/torch/_fit_api.py)."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and getattr(config, "use_cache", False):
            config.use_cache = False


def turn_activation_checkpointing_off(model: torch.nn.Module, who: str) -> None:
    """Turns Hugging Face activation (gradient) checkpointing off in `model`, with a warning:
    fit chooses per saved tensor what to keep, recompute or offload, and a checkpointed
    block saves only its input, which leaves fit nothing to plan (its smallest feasible
    budget is then its keep-all peak, and any share below 100% is refused). TRL's configs turn
    checkpointing on by default, so a TRL user gets here without asking for it."""
    for module in model.modules():
        # transformers 5 names it activation checkpointing (the old names warn); 4 named it
        # gradient checkpointing.
        new_names = hasattr(module, "activation_checkpointing_disable")
        prefix = "activation" if new_names else "gradient"
        if getattr(module, f"is_{prefix}_checkpointing", False) is not True:
            continue
        getattr(module, f"{prefix}_checkpointing_disable")()
        warn(
            f"stash: {who} turns {type(module).__name__}'s activation checkpointing off: "
            "stash.torch.fit chooses what each block keeps, recomputes or offloads within the "
            "budget, and a checkpointed block leaves it nothing to choose; leave checkpointing "
            "off to silence this (activation_checkpointing=False in TrainingArguments, "
            "gradient_checkpointing=False in TRL's configs, which default to True)")
