"""stash's warnings, said at the caller's line (Note [Warnings at the user's line])."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Optional, Tuple, Type

__all__ = ["warn"]

# Note [Warnings at the user's line]
# stash warns from deep inside a step: a pack hook, a block's wrapper, the next step's start
# that closes the last one's figures, all called by torch's module machinery and often by
# a framework's (transformers' model code, a Trainer). A fixed stacklevel named a line of
# stash's or torch's own ("_fit_steps.py:163: ... return self._finish(prev)") whenever the
# path there changed. warn() walks out of the packages that call the model on the user's
# behalf and names the first frame outside them: the user's loop, or trainer.train().
_FRAMEWORKS = ("stash", "torch", "transformers", "accelerate", "lightning",
               "pytorch_lightning", "trl", "peft")


def _framework_dirs() -> Tuple[str, ...]:
    dirs = []
    for name in _FRAMEWORKS:
        module = sys.modules.get(name)
        path: Optional[str] = getattr(module, "__file__", None)
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return tuple(dirs)


def warn(message: str, category: Type[Warning] = UserWarning) -> None:
    """warnings.warn at the first frame outside stash, torch and the frameworks that call
    the model (Note [Warnings at the user's line])."""
    dirs = _framework_dirs()
    frame = sys._getframe(1)
    level = 2  # warn()'s caller
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(dirs):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
