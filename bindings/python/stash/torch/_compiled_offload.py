"""Offload under whole-model torch.compile: stash's three ops in the partitioned graphs
and the engine calls they make (Note [Offload in the compiled graph]).

Note [Offload in the compiled graph]
A plan for a compiled graph (Note [Planning the compiled graph] in _compiled.py) may
offload a saved value: a dense tensor of a block, its input included. The partitioner
saves it (MUST_SAVE, as a kept one); then insert_offloads (_compiled_offload_pass.py) rewrites the
partitioned pair:
- forward: token = stash::offload(v) right after v is made, which hands v's storage to the
  engine (the D2H starts after the producer, as in eager mode); then
  token' = stash::offloaded(token, v, tick) placed after the tick of block b+2 (the end
  tick for the last two blocks), and token' replaces v among the forward's outputs. So
  the graph holds v until block b+2 begins, and no longer: Inductor frees or reuses a
  buffer after its last use in the graph, which it decides at compile time and which no
  reference stash holds can delay. By then the engine has made the compute stream wait
  for block b's copies (forward_begin(b+2); the end tick is the loss turn, the last
  block's forward_end, where it waits for all of them), the schedule the planner prices
  (one layer in flight). On the CPU
  the host also waits for that stream there, since the host reuses the memory at once.
- backward: the saved input v becomes the token; v = stash::fetch(token) before its
  first use acquires the prefetched copy (prefetched when block b's backward began: the
  ticks' backward runs the engine's backward_begin) and rebuilds v's view of it, which
  alone holds the buffer: it dies with the graph's last use of v, as a kept value does.
  (The fetched buffers were held until the next step's tick 0: on the peers' tiny Llama
  a plan offloading five 1 MiB values ran 13% over its prediction.)
The ticks run the engine's layer calls: forward tick i ends block i-1's forward and
begins block i's; the end tick ends the last block's forward (the loss turn), and its
backward, once the loss's backward is done, begins the last block's backward; the
backward tick of block i ends its backward and begins block i-1's; that of block 0 ends
the step, giving back whatever the engine still holds.

The guard. Inductor keeps extern kernels (custom ops) in graph order, so stash::offload
of block b runs before block b+2's tick. Should a pass move it later, the wait the tick
enqueued would not cover its copy; stash::offloaded then sees that no tick at or after
block b+2 ran since the offload and synchronizes the engine's copies from the host before
letting v go (counted in `guarded`): slower, never wrong.

A step that ends early (an exception in its forward, a graph dropped) leaves the engine
holding its keys; the next step's tick 0 gives them back. Gradient accumulation runs its
forwards and backwards in turn; two forwards before their backwards are one micro-batch
slot and are not supported under whole-model compile (the second gives the first back).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .._engine import KEEP, OFFLOAD, RECOMPUTE
from .._lib import StashError
from ._offload_policy import offload_slots
from ._step import _Fetched, _Step

__all__ = ["CompiledMoves"]

_CODES = {"keep": KEEP, "offload": OFFLOAD, "recompute": RECOMPUTE}
_moves: "weakref.WeakValueDictionary[int, CompiledMoves]" = weakref.WeakValueDictionary()


def _get(handle: int) -> "CompiledMoves":
    moves = _moves.get(handle)
    if moves is None:
        raise StashError("stash.torch: a compiled graph offloads through a fit handle that "
                         "is closed; its offloaded tensors are gone")
    return moves


@torch.library.custom_op("stash::offload", mutates_args=())
def _offload(v: torch.Tensor, handle: int, block: int, index: int) -> torch.Tensor:
    _get(handle).offload(block, index, v)
    return torch.empty((), dtype=torch.uint8, device=v.device)


@_offload.register_fake
def _offload_fake(v: torch.Tensor, handle: int, block: int, index: int) -> torch.Tensor:
    return torch.empty((), dtype=torch.uint8, device=v.device)


@torch.library.custom_op("stash::offloaded", mutates_args=())
def _offloaded(token: torch.Tensor, v: torch.Tensor, after: torch.Tensor, handle: int,
               block: int, index: int) -> torch.Tensor:
    _get(handle).settle(block, index)
    return torch.empty((), dtype=torch.uint8, device=token.device)


@_offloaded.register_fake
def _offloaded_fake(token: torch.Tensor, v: torch.Tensor, after: torch.Tensor, handle: int,
                    block: int, index: int) -> torch.Tensor:
    return torch.empty((), dtype=torch.uint8, device=token.device)


@torch.library.custom_op("stash::fetch", mutates_args=())
def _fetch_op(token: torch.Tensor, handle: int, block: int, index: int, size: List[int],
              stride: List[int], dtype: torch.dtype) -> torch.Tensor:
    return _get(handle).fetch(block, index, size, stride, dtype)


@_fetch_op.register_fake
def _fetch_fake(token: torch.Tensor, handle: int, block: int, index: int, size: List[int],
                stride: List[int], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(size, stride, dtype=dtype, device=token.device)


class CompiledMoves:
    """A fit handle's engine, as the compiled graph's ops and ticks drive it (Note
    [Offload in the compiled graph]), made by OffloadHandle.compiled_moves. hand_over,
    fetch, set_plan: the handle's (_offload_streams.EngineStreams,
    _offload_hooks.BlockHooks.set_engine_plan); engine: the handle's engine now (None
    once closed); host_wait: on the CPU, the host waits for the compute stream (a no-op
    on CUDA)."""

    def __init__(self, handle_id: int, n: int, *,
                 hand_over: Callable[[_Step, Tuple[int, int, int], int, int, torch.Tensor],
                                     None],
                 fetch: Callable[[_Fetched], torch.Tensor],
                 set_plan: Callable[[Sequence[Sequence[int]]], None],
                 engine: Callable[[], Any], host_wait: Callable[[], None]) -> None:
        self.id, self.n = handle_id, n
        self._hand_over, self._fetch, self._set_plan = hand_over, fetch, set_plan
        self._engine, self._host_wait = engine, host_wait
        self.active = False  # the plan offloads something: the ticks call the engine
        self.slots: List[List[Optional[int]]] = []
        self.step: Optional[_Step] = None
        self.ticks = -1      # the latest forward tick of the running step
        self.at: Dict[Tuple[int, int], Tuple[int, int]] = {}  # (block, index) -> (tick, offset)
        self.offloads = 0
        self.guarded = 0
        self._actions: Optional[Sequence[Sequence[str]]] = None  # what switch() set
        _moves[handle_id] = self

    def plan(self, actions: Sequence[Sequence[str]]) -> None:
        """The compiled plan's actions ("keep", "offload", "recompute"): the engine gets
        their offload slots."""
        codes = [[_CODES[a] for a in layer] for layer in actions]
        self.slots = []
        for layer in codes:  # the eager hooks' numbering (Note [Offload hooks])
            _, slots = offload_slots(layer)
            assert slots is not None  # a list of actions always has its slots
            self.slots.append(slots)
        self.active = any(s is not None for layer in self.slots for s in layer)
        if self.active:
            self._set_plan(codes)

    def switch(self, actions: Sequence[Sequence[str]]) -> None:
        """At a step's tick 0: the plan of the graph running (Note [Every shape under
        whole-model compile] in _compiled_shapes.py), if it is not the one the engine has.
        What a step that ended early still holds is given back first."""
        if actions is self._actions:
            return
        self._give_back()
        self._actions = actions
        self.plan(actions)

    def _key(self, block: int, index: int) -> Tuple[int, int, int]:
        slot = self.slots[block][index] if block < len(self.slots) and index < len(
            self.slots[block]) else None
        if slot is None:
            raise StashError(f"stash.torch: the compiled graph offloads value {index} of "
                             f"block {block}, which the plan does not offload")
        return (0, block, slot)

    # --- the ticks -----------------------------------------------------------------------

    def forward_tick(self, block: int) -> None:
        if not self.active:
            return
        engine = self._engine()
        if block == 0:
            self._give_back()
            self.step = _Step(0, set)
            self.at.clear()
        self.ticks = block
        if engine is None or self.step is None:
            return
        if block > 0:
            # The last block's forward_end is the loss turn: the compute stream waits for
            # every copy, and the loss runs without the sources (Note [The step's
            # schedule] in planner/model/schedule.h).
            engine.forward_end(0, block - 1)
        if block < self.n:
            engine.forward_begin(0, block)

    def backward_tick(self, block: int) -> None:
        engine = self._engine()
        if not self.active or self.step is None or engine is None:
            return
        if block == self.n:
            # The end tick's backward: the loss's backward is done, the last block's
            # begins (and prefetches the block before it). Issued at the end tick's
            # forward, the prefetch held its buffers through the loss.
            engine.backward_begin(0, self.n - 1)
            return
        if block > self.n:
            return
        engine.backward_end(0, block)
        if block > 0:
            engine.backward_begin(0, block - 1)
        else:
            self._end(engine)

    def _end(self, engine: Any) -> None:
        step, self.step = self.step, None
        if step is None:
            return
        for key in sorted(step.live):
            engine.release(key)
        step.live.clear()

    def _give_back(self) -> None:
        """A step that ended early (Note [Offload in the compiled graph]): its keys."""
        engine = self._engine()
        if self.step is not None and engine is not None:
            self.step.abandoned = True
            self._end(engine)
            engine.backward_end(0, 0)
        self.step = None

    # --- the ops -------------------------------------------------------------------------

    def offload(self, block: int, index: int, v: torch.Tensor) -> None:
        step = self.step
        if step is None:
            raise StashError("stash.torch: a compiled graph offloaded a tensor outside a "
                             "step stash began (no tick 0 ran before it)")
        key = self._key(block, index)
        storage = v.untyped_storage()
        self.at[(block, index)] = (self.ticks, int(v.storage_offset()))
        self._hand_over(step, key, storage.data_ptr(), storage.nbytes(), v)
        self.offloads += 1

    def settle(self, block: int, index: int) -> None:
        tick, _ = self.at.get((block, index), (self.ticks, 0))
        due = min(block + 2, self.n)
        if tick >= due or self.ticks < due:
            # The guard (Note [Offload in the compiled graph]): no wait covers this copy.
            self.guarded += 1
            engine = self._engine()
            if engine is not None:
                engine.synchronize()
        self._host_wait()

    def fetch(self, block: int, index: int, size: Sequence[int], stride: Sequence[int],
              dtype: torch.dtype) -> torch.Tensor:
        step = self.step
        if step is None:
            raise StashError("stash.torch: a compiled backward fetched an offloaded tensor "
                             "of a step that was given back (its forward's graph outlived "
                             "the next step's start)")
        # The buffer lives as long as the view the graph holds, and no longer: nothing here
        # keeps it (Note [Offload in the compiled graph]). Each value is fetched once.
        flat = self._fetch(_Fetched(step, self._key(block, index), index))
        _, offset = self.at.get((block, index), (0, 0))
        return flat.view(dtype).as_strided(size, stride, offset)

    def close(self) -> None:
        self._give_back()
        _moves.pop(self.id, None)
