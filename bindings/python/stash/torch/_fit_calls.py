"""What stash.torch.fit calls the blocks with in training (Note [The loops fit lives in] in
_fit_api.py): a Hugging Face key/value cache turned off for them, Hugging Face gradient
checkpointing turned off while fit runs, torch.utils.checkpoint around a block refused.
BlockCalls is a part the handle owns; it answers the step policy's call_arguments."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch

from .._lib import StashError
from ._fit_support import _is_kv_cache

__all__ = ["BlockCalls"]


class BlockCalls:
    """The blocks' arguments in training, and the checkpointing fit turns off."""

    def __init__(self, blocks: Sequence[torch.nn.Module],
                 warn_once: Callable[[Tuple[object, ...], str], None]) -> None:
        self._blocks = blocks
        self._warn_once = warn_once
        self.kv_cache = True  # block 0 of the running forward got a key/value cache
        self._checkpointed: List[torch.nn.Module] = []  # turned off by checkpointing_off

    def arguments(self, i: int, args: Tuple[Any, ...], kwargs: Dict[str, Any],
                  measuring: bool) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        """Block i's arguments: a key/value cache passed to the blocks in training is turned
        off for them, as Hugging Face's gradient checkpointing does. A decoder hands every
        block the same keywords, so block 0 decides for the forward (Note [What it costs]
        in _fit_passes.py). Checkpointing is looked for in measuring steps."""
        if measuring:
            self.checkpointing_off(i)
        if i == 0:
            self.kv_cache = any(_is_kv_cache(v) for v in kwargs.values())
        if not self.kv_cache:
            return args, kwargs
        if i == 0:
            self._warn_once(("kv-cache",), (
                "the blocks are called with a key/value cache in training (use_cache=True); "
                "stash turns it off for them, as gradient checkpointing does: set "
                "model.config.use_cache = False to silence this"))
        return args, {k: (None if _is_kv_cache(v) else v) for k, v in kwargs.items()}

    def checkpointing_off(self, i: int) -> None:
        """Hugging Face's gradient checkpointing on block i is turned off (on again at
        restore()); torch.utils.checkpoint around it is refused."""
        block = self._blocks[i]
        if (getattr(block, "gradient_checkpointing", False) is True
                and hasattr(block, "_gradient_checkpointing_func")):
            setattr(block, "gradient_checkpointing", False)
            self._checkpointed.append(block)
            self._warn_once(("checkpointing",), (
                f"Hugging Face gradient checkpointing is on for the blocks ({type(block).__name__}"
                "); stash turns it off for them while it runs: it chooses per saved tensor "
                "what to keep, recompute or offload within the budget, and a checkpointed "
                "block leaves it nothing to choose (model.gradient_checkpointing_disable() "
                "silences this; close() turns it back on)"))
        top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
        hooks = top(False) if top is not None else None
        if hooks is not None and getattr(hooks[0], "__module__", "") == "torch.utils.checkpoint":
            raise StashError(
                f"stash.torch.fit: block {i} ({type(block).__name__}) runs under "
                "torch.utils.checkpoint: stash chooses per saved tensor what to keep, recompute "
                "or offload within the budget, and a checkpointed block leaves it nothing to "
                "choose; call the blocks without checkpoint (stash recomputes what the budget "
                "needs)")

    def restore(self) -> None:
        """Turns the checkpointing turned off back on (fit's close())."""
        for block in self._checkpointed:
            setattr(block, "gradient_checkpointing", True)
        self._checkpointed = []
