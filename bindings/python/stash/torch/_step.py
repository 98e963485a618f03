"""One micro-batch's step as the offload hooks keep it: the keys the engine holds for it
(_Step), an offloaded storage and its saved views (_Fetched, _Packed), the token its graph
holds (Note [A step that ends early] in _offload_steps.py), and the storage keys of a
block's inputs and outputs. Shared by the eager hooks and the compiled graph's ops
(_compiled_offload.py)."""

from __future__ import annotations

import itertools
import threading
from typing import Any, Dict, Optional, Sequence, Set, Tuple

import torch

from ._saved import storage_of, tensors_in


class _Fetched:
    """One offloaded storage of one micro-batch: the views saved of it share this, and the
    first unpack fetches it. Freed with the last saved view (autograd drops saved tensors
    as their nodes run), which frees the prefetched buffer."""

    __slots__ = ("step", "key", "index", "flat")

    def __init__(self, step: Any, key: Tuple[int, int, int], index: int) -> None:
        # key: the engine's (micro-batch, layer, slot); index: the plan's index in the layer
        self.step, self.key, self.index = step, key, index
        self.flat: Optional[torch.Tensor] = None  # the fetched storage, once fetched


_RECOMPUTE = object()  # fetched[j] of a storage the plan recomputes: saves get placeholders


def _named(e: BaseException) -> str:
    """An exception as a step record names it: its type and the start of its message."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if len(text) > 160:
        text = text[:157] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _input_keys(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Set[Any], Any]:
    """The storage keys of a block's input tensors, and that of its first positional tensor
    argument (None if it has none). One tensor argument, the usual case, takes one
    storage lookup."""
    if not kwargs and len(args) == 1 and type(args[0]) is torch.Tensor:
        key = args[0].untyped_storage().data_ptr()
        return {key}, key
    inputs = {storage_of(t)[0] for t in tensors_in((args, kwargs))}
    first = next(iter(tensors_in(args)), None)
    return inputs, (storage_of(first)[0] if first is not None else None)


def _output_storages(out: Any) -> Set[Any]:
    """The storage keys of a block's output tensors (the chained-call check of _begin_step)."""
    if type(out) is torch.Tensor and out.numel():  # one tensor: its pointer less its offset
        return {out.data_ptr() - out.storage_offset() * out.element_size()}
    return {storage_of(t)[0] for t in tensors_in(out)}


class _Packed:
    """What the pack hook returns for an offload tensor: how to rebuild the view."""

    __slots__ = ("fetched", "dtype", "size", "stride", "offset")

    def __init__(self, fetched: _Fetched, t: torch.Tensor) -> None:
        self.fetched = fetched
        self.dtype, self.size, self.stride = t.dtype, t.size(), t.stride()
        self.offset = t.storage_offset()


class _GraphToken:
    """Held by the autograd graph of one micro-batch's forward (its backward boundaries),
    so that its death says the graph is gone (Note [A step that ends early] in
    _offload_steps.py)."""

    __slots__ = ("__weakref__",)


class _Step:
    """One micro-batch's forward and backward: the keys the engine holds for it."""

    _resident: Any

    @property
    def resident(self) -> Any:
        """The storages never listed (parameters, buffers), taken at the first ask."""
        if callable(self._resident):
            self._resident = self._resident()
        return self._resident

    _serials = itertools.count()

    def __init__(self, mb: int, resident: Any) -> None:
        self.mb = mb
        self.serial = next(self._serials)  # this forward's, among all of the process
        self._resident = resident  # a callable until first asked (plain layers never ask)
        self.next_block = 0
        self.live: Set[Tuple[int, int, int]] = set()  # keys offered and not released
        self.backward_open: Optional[int] = None  # the block whose backward is open
        self.backward_started = False
        self.abandoned = False
        # Strong until a backward boundary holds it, then a weak reference (Note [A step
        # that ends early]).
        self.token: Optional[_GraphToken] = _GraphToken()
        self.token_ref: Optional[Any] = None
        self.last_output: Set[Any] = set()  # storage keys of the last block's output
        self.thread = threading.get_ident()
        # Begun under a CUDA graph capture (Note [Steps under CUDA graphs] in
        # _offload_steps.py): the policy's step seams do not hear of it.
        self.captured = False
        # By block: runs as a bare call in this step (Note [Lean blocks] in
        # _offload_hooks.py); None: every block takes the full path.
        self.lean: Optional[Sequence[bool]] = None
