"""Selective recompute for stash.torch.offload: what one block's forward leaves behind for
its recompute, and the recompute's own pack hook (Note [Selective recompute] in
_offload_replay.py, whose BlockReplays runs the replays: fetching offloaded inputs and
counting)."""

from __future__ import annotations

import contextlib
import weakref
from typing import (AbstractSet, Any, Callable, Dict, Iterable, List, Literal, NoReturn, Optional,
                    Tuple, Union)

import torch

from .._lib import StashError
from ._saved import SaveOrder

# One save as the record of a forward holds it: (index, first, dtype, shape, device), or None
# for a tensor SaveOrder does not number.
Save = Optional[Tuple[int, bool, torch.dtype, torch.Size, torch.device]]


class StopRecompute(Exception):
    """Raised by the replay's pack hook once every wanted tensor is captured: the rest of
    the block's forward is not needed. torch 1.13 turns an exception of a hook into a
    RuntimeError, 2.x passes it through; Replay.stopped tells the two apart from a real
    error either way."""


def map_tensors(x: Any, fn: Callable[[Any], Any],
                kind: Union[type, Tuple[type, ...]] = torch.Tensor) -> Any:
    """x with every `kind` object t (tensors; the slots that stand for them) replaced by
    fn(t), through the containers _saved.tensors_in walks (tuples, named tuples, lists,
    dict values), in the same order."""
    if isinstance(x, kind):
        return fn(x)
    if isinstance(x, tuple):
        items = [map_tensors(y, fn, kind) for y in x]
        return type(x)(*items) if hasattr(x, "_fields") else tuple(items)
    if isinstance(x, list):
        return [map_tensors(y, fn, kind) for y in x]
    if isinstance(x, dict):
        return {k: map_tensors(v, fn, kind) for k, v in x.items()}
    return x


def _autocast_mode_any(device_type: str) -> Tuple[bool, torch.dtype]:
    """(enabled, dtype) of autocast for a device type, either API: torch >= 2.4 has one
    API for all, whose older spellings warn there; 1.13 .. 2.3 have one function per
    device."""
    if hasattr(torch, "get_autocast_dtype"):
        try:
            return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
        except TypeError:  # a build between the two APIs: the older one still works there
            pass
    if device_type == "cuda":
        return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()
    return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()


def _one_api() -> bool:
    try:
        torch.is_autocast_enabled("cpu")
        torch.get_autocast_dtype("cpu")
        return True
    except (AttributeError, TypeError):
        return False


if _one_api():  # chosen once: the mode is read at every recompute forward and replay
    def _autocast_mode(device_type: str) -> Tuple[bool, torch.dtype]:
        return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
else:
    _autocast_mode = _autocast_mode_any


class ForwardState:
    """RNG and autocast state at the start of a block's forward, put back for its replay
    (dropout masks and autocast casts come out the same). CUDA RNG states are taken only
    for the devices given, and only when CUDA is initialized: reading one would otherwise
    initialize it.

    Note [RNG states kept in place]
    The CPU RNG state is a 5,056-byte CPU tensor. Taken fresh for each block's forward, it
    lives until the block's replay: on the CPU meter (c10's allocator) that is 5 KB per
    recomputing block that a least-memory measuring step holds for every block, and a
    plan that keeps a block does not: the model came out 20 KB above a keep-everything
    step on the peers' tiny Llama, enough to offload a tensor at a budget of exactly the
    keep-all peak. So the handle's recompute side (BlockReplays, _offload_replay.py)
    keeps one buffer per (micro-batch, block), made before any step for micro-batch 0,
    and the state is copied into it: no step allocates it, on either meter. A buffer is
    reused by the next forward of its micro-batch, which gives the earlier forward back
    (its backward raises before any replay: Note [A step that ends early] in
    _offload_steps.py)."""

    __slots__ = ("cpu_rng", "cuda_rng", "autocast", "autocast_cache")

    def __init__(self, cuda_devices: Iterable[int],
                 cpu_rng: Optional[torch.Tensor] = None) -> None:
        # cpu_rng: a buffer to hold the CPU RNG state in (Note [RNG states kept in place]).
        self.cpu_rng = (torch.get_rng_state() if cpu_rng is None
                        else cpu_rng.copy_(torch.get_rng_state()))
        self.cuda_rng = [(d, torch.cuda.get_rng_state(d)) for d in cuda_devices]
        self.autocast = [(dt,) + _autocast_mode(dt) for dt in ("cpu", "cuda")]
        self.autocast_cache = torch.is_autocast_cache_enabled()

    def restored(self) -> _Restored:
        """A context manager that puts this state back for the replay and the outer RNG
        state back after it."""
        return _Restored(self)


class _Restored:
    """ForwardState.restored(): a plain context manager (a replay enters one per block;
    contextlib's generator and ExitStack cost more than the restore itself)."""

    __slots__ = ("state", "outer_cpu", "outer_cuda", "stack")

    def __init__(self, state: ForwardState) -> None:
        self.state = state

    def __enter__(self) -> _Restored:
        st = self.state
        self.outer_cpu = torch.get_rng_state()
        self.outer_cuda = [(d, torch.cuda.get_rng_state(d)) for d, _ in st.cuda_rng]
        torch.set_rng_state(st.cpu_rng)
        for d, state in st.cuda_rng:
            torch.cuda.set_rng_state(state, d)
        # Only modes that differ from backward's are entered: the common case (no
        # autocast, or autocast in forward only) enters none or one.
        self.stack = None
        try:
            for dt, enabled, dtype in st.autocast:
                if _autocast_mode(dt) != (enabled, dtype):
                    if self.stack is None:
                        self.stack = contextlib.ExitStack()
                    self.stack.enter_context(torch.autocast(
                        dt, dtype=dtype, enabled=enabled, cache_enabled=st.autocast_cache))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        try:
            if self.stack is not None:
                self.stack.close()
        finally:
            torch.set_rng_state(self.outer_cpu)
            for d, state in self.outer_cuda:
                torch.cuda.set_rng_state(state, d)
        return False


class HeldInput:
    """A block input the recompute takes as it was: kept by the plan, not saved by the
    block at all (a mask shared by every block), or not copyable. Held detached, so the
    frame keeps the storage but not the graph that produced it."""

    __slots__ = ("t", "requires_grad", "leaf", "version")

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t.detach()  # shares t's storage and version counter
        self.requires_grad = t.requires_grad
        self.leaf = t.is_leaf  # Note [A replay's inputs under autocast] in _offload_replay.py
        self.version = t._version


class FetchedInput:
    """A block input whose storage the plan offloads: rebuilt over the fetched buffer,
    with the input's own dtype, shape, strides and offset (it may be a view)."""

    __slots__ = ("fetched", "dtype", "size", "stride", "offset", "requires_grad", "leaf")

    def __init__(self, fetched: Any, t: torch.Tensor) -> None:
        self.fetched = fetched
        self.dtype, self.size, self.stride = t.dtype, t.size(), t.stride()
        self.offset = t.storage_offset()
        self.requires_grad = t.requires_grad
        self.leaf = t.is_leaf  # Note [A replay's inputs under autocast] in _offload_replay.py


class Placeholder:
    """What the pack hook returns for a recompute tensor: a save position in its frame.
    Weakly referenced by the frame, so a replay captures only what autograd still holds."""

    __slots__ = ("frame", "pos", "__weakref__")

    def __init__(self, frame: Frame, pos: int) -> None:
        self.frame, self.pos = frame, pos


def describe(save: Save) -> str:
    if save is None:
        return "a parameter, buffer or empty tensor (not numbered)"
    j, first, dtype, shape, device = save
    return (f"tensor {j}{'' if first else ' again (a view of it)'}, {dtype} "
            f"{list(shape)} on {device}")


class Frame:
    """One forward of one block in one micro-batch that saved recompute tensors: what its
    replay needs (the block's own forward, its inputs as slots, the forward state) and
    the sequence of saves to check the replay against. Referenced by its placeholders
    only, so it is freed with the last of them (autograd frees saved tensors as their
    nodes run, or with the graph)."""

    args: Any    # the forward's (as slots), or None until it returns
    kwargs: Any
    saves: List[Save]
    wanted: Dict[int, weakref.ref[Placeholder]]
    captured: Dict[int, torch.Tensor]

    def __init__(self, layer: int, step: Any, forward: Callable[..., Any],
                 state: ForwardState) -> None:
        self.layer, self.step, self.forward, self.state = layer, step, forward, state
        self.args = self.kwargs = None  # set when the forward returns
        self.saves = []     # per pack call, in order: None or (index, first, dtype, shape, device)
        self.wanted = {}    # save position -> weakref to its Placeholder
        self.captured = {}  # save position -> recomputed tensor (detached), until unpacked

    def place(self, save: Save) -> int:
        """Records the forward's next save; returns its position."""
        self.saves.append(save)
        return len(self.saves) - 1

    def placeholder(self, pos: int) -> Placeholder:
        """What the pack hook returns for the save at `pos`, which the plan recomputes."""
        ph = Placeholder(self, pos)
        self.wanted[pos] = weakref.ref(ph)
        return ph

    def mismatch(self, pos: int, got: str, why: str) -> StashError:
        return StashError(
            f"stash.torch.offload: block {self.layer} (micro-batch {self.step.mb}) saved a "
            f"different sequence of tensors when recomputed than in its forward ({why}): save "
            f"{pos} was {describe(self.saves[pos]) if pos < len(self.saves) else 'absent'}"
            f", now {got}. Recompute needs a forward that saves the same tensors each time "
            "from the same inputs, parameters and RNG state (no control flow that depends on "
            "anything else); keep or offload this block's tensors instead")


class Replay:
    """One recompute of a frame: numbers what the block saves again (SaveOrder over the
    restored inputs, as the forward did over the originals), checks each save against the
    forward's, captures the saves whose placeholders are alive, and stops after the last.
    Every storage seen is held (by its SaveOrder) until the replay ends: numbering is by
    address, and a freed address reused by a later tensor would look like a view of the
    first."""

    def __init__(self, frame: Frame, resident: AbstractSet[int], inputs: Iterable[int],
                 on_save: Optional[Callable[[Frame, int, Optional[Tuple[int, bool]],
                                            torch.Tensor], object]] = None) -> None:
        self.frame = frame
        self.on_save = on_save
        self.order = SaveOrder(resident, inputs, inputs)
        self.pos = 0
        self.stopped = False
        self.error: Optional[StashError] = None
        alive = [p for p, ref in frame.wanted.items() if ref() is not None]
        self.want = set(alive)
        self.last = max(alive) if alive else -1
        self.captured = 0

    def pack(self, t: torch.Tensor) -> None:
        try:
            return self._pack(t)
        except StashError as e:
            self.error = e  # torch 1.13 reports it as a RuntimeError; recompute() raises this
            raise

    def _pack(self, t: torch.Tensor) -> None:
        frame, pos = self.frame, self.pos
        self.pos += 1
        seen = self.order.see(t)
        save = None if seen is None else (seen[0], seen[1], t.dtype, t.shape, t.device)
        if pos >= len(frame.saves):
            raise frame.mismatch(pos, describe(save), "it saved more")
        if save != frame.saves[pos]:
            raise frame.mismatch(pos, describe(save), "it saved something else")
        if self.on_save is not None:
            self.on_save(frame, pos, seen, t)
        if pos in self.want:
            frame.captured[pos] = t.detach()
            self.captured += 1
        if pos == self.last:
            self.stopped = True
            raise StopRecompute()
        return None  # the replay's own graph never runs backward: it keeps nothing

    @staticmethod
    def unpack(_: Any) -> NoReturn:
        raise StashError("stash.torch.offload: backward through a recompute's own graph "
                         "(a gradient computed inside a block's forward is not supported "
                         "with recompute)")

    def run(self, args: Any, kwargs: Dict[str, Any]) -> None:
        """Runs the block's forward under the forward's RNG and autocast state, with grad,
        until the last wanted save. Raises StashError when the saves differ."""
        frame = self.frame
        try:
            with frame.state.restored(), torch.enable_grad(), \
                    torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                frame.forward(*args, **kwargs)
        except StopRecompute:
            pass
        except RuntimeError as e:
            if self.error is not None:
                if e is self.error:  # torch 2.x passes it through as it is
                    raise
                raise self.error from e
            if not self.stopped:
                raise
        finally:
            self.order.release()
        # Not stopped: the forward returned before the last wanted save, i.e. it saved
        # fewer tensors than the forward did (every save it made matched).
        if not self.stopped:
            raise frame.mismatch(self.pos, "the end of its forward",
                                 f"it saved {self.pos} tensors, the forward {len(frame.saves)}")
