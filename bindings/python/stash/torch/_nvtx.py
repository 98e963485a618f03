"""The profiling helper: NVTX ranges "stash:layer:<i>:fwd" and "stash:layer:<i>:bwd"
around a model's blocks, the names `stash profile` (CUPTI + NVTX) attributes kernels to.

On a torch without CUDA (the Debian CPU build) NVTX does not exist; the helper then does
nothing and says so once (a warning, and ``active`` is False with ``reason`` set).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Literal, Optional, Tuple

import torch

from .._warn import warn
from ._boundary import at_backward_end, mark_backward

# (start(name) -> handle, end(handle))
Backend = Tuple[Callable[[str], Any], Callable[[Any], Any]]


def _nvtx_backend() -> Tuple[Optional[Backend], Optional[str]]:
    """(start(name) -> handle, end(handle)) over torch.cuda.nvtx, or None and why not."""
    if not torch.cuda.is_available():
        return None, ("torch has no usable CUDA here (a CPU build or no device), so there is "
                      "no NVTX to emit ranges to; stash.torch.nvtx_ranges does nothing")
    nvtx: Any = torch.cuda.nvtx
    if hasattr(nvtx, "range_start") and hasattr(nvtx, "range_end"):
        # Process-wide ranges: backward may end a range on another thread than began it.
        return (nvtx.range_start, nvtx.range_end), None
    return (lambda name: nvtx.range_push(name), lambda _h: nvtx.range_pop()), None


class nvtx_ranges:
    """Wraps `blocks` (a sequence of nn.Module run in order) in NVTX ranges.

    Forward of block i is "stash:layer:<i>:fwd" (forward pre-hook to forward hook).
    Backward of block i is "stash:layer:<i>:bwd": from the gradient reaching block i's
    output (Note [Backward boundaries by an identity Function]) to the gradient reaching
    block i-1's output, or the end of backward for the first block.

    Use as a context manager, or call remove(). `backend` = (start, end) replaces NVTX
    (tests use it to see the ranges on CPU).
    """

    def __init__(self, blocks: Iterable[torch.nn.Module],
                 backend: Optional[Backend] = None) -> None:
        self.blocks = list(blocks)
        if backend is None:
            backend, self.reason = _nvtx_backend()
        else:
            self.reason = None
        self.active = backend is not None
        self._handles: List[torch.utils.hooks.RemovableHandle] = []
        self._open_bwd: Dict[int, Any] = {}  # block index -> range handle
        self._queued = False  # the end-of-backward callback is queued
        if not self.active:
            warn(f"stash.torch.nvtx_ranges: {self.reason}", RuntimeWarning)
            return
        self._start, self._end = backend  # type: ignore[misc]  # not None: active
        for i, block in enumerate(self.blocks):
            self._handles.append(block.register_forward_pre_hook(self._fwd_begin(i)))
            self._handles.append(block.register_forward_hook(self._fwd_end(i)))

    def _fwd_begin(self, i: int) -> Callable[[torch.nn.Module, Any], None]:
        def hook(module: torch.nn.Module, args: Any) -> None:
            self._fwd_handle = self._start(f"stash:layer:{i}:fwd")
        return hook

    def _fwd_end(self, i: int) -> Callable[[torch.nn.Module, Any, Any], Any]:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> Any:
            self._end(self._fwd_handle)
            return mark_backward(output, lambda: self._bwd_begin(i))
        return hook

    def _bwd_begin(self, i: int) -> None:
        # Block i's backward begins where block i+1's ends (gradients flow downward).
        if not self._queued:
            at_backward_end(self._close_all)
            self._queued = True
        if i + 1 in self._open_bwd:
            self._end(self._open_bwd.pop(i + 1))
        self._open_bwd[i] = self._start(f"stash:layer:{i}:bwd")

    def _close_all(self) -> None:
        for i in sorted(self._open_bwd, reverse=True):
            self._end(self._open_bwd.pop(i))
        self._queued = False

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> nvtx_ranges:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.remove()
        return False
