"""A model's repeated blocks, found the way a trainer's user would point at them."""

from __future__ import annotations

from typing import Iterable, List, cast

import torch

from .._lib import StashError
from ..torch._fit_support import _repeated_blocks_in

# Wrappers whose wrapped model is an attribute: DDP and FSDP1 (.module), torch.compile
# (._orig_mod), peft (.base_model.model, reached through get_base_model()).
_WRAPPED = ("module", "_orig_mod")


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    for _ in range(8):
        if hasattr(model, "get_base_model") and callable(model.get_base_model):
            inner = model.get_base_model()
            if inner is not model:
                model = inner
                continue
        inner = next((getattr(model, a) for a in _WRAPPED
                      if isinstance(getattr(model, a, None), torch.nn.Module)), None)
        if inner is None:
            return model
        model = inner
    return model


def find_blocks(model: torch.nn.Module) -> List[torch.nn.Module]:
    """The first ModuleList or Sequential of two or more modules of one class in `model`
    (``model.model.layers`` of a Hugging Face decoder, ``transformer.h`` of GPT-2), after
    unwrapping DDP, torch.compile and peft. StashError when there is none: pass the blocks
    yourself then."""
    inner = _unwrapped(model)
    name = _repeated_blocks_in(inner)
    if name is None:
        raise StashError(f"stash: no repeated blocks found in {type(inner).__name__} (no "
                         "ModuleList of two or more modules of one class); pass blocks=")
    found = inner if name == "(the module itself)" else inner.get_submodule(name)
    return list(cast(Iterable[torch.nn.Module], found))  # a ModuleList or Sequential
