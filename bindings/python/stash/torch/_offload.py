"""stash.torch.offload: apply a plan to a model's blocks through the prefetch engine.
OffloadHandle is made of parts it owns and hands what they need: the engine's side
(EngineStreams, _offload_streams.py), the recompute side (BlockReplays,
_offload_replay.py) and the hooks that wrap the blocks (BlockHooks, _offload_hooks.py);
what the actions are is its StepPolicy's (_offload_policy.py).

Note [Compiled blocks]
A block compiled with torch.compile, as torch.compile(block) (an OptimizedModule whose
forward is the compiled one) or block.compile() (the module's _compiled_call_impl), keeps
its compiled callable; the hooks wrap that callable, not the eager forward inside it, so
they run outside the compiled region: Dynamo never traces them, and the saved-tensor hooks
see what the compiled forward saves for its backward. A compiled forward saves at its end,
so its save order is the compiled graph's (Note [Recompute cost as the replay pays it] in
_fit_measure.py prices that). A forward replaced by anything else is refused: the hooks
could not tell what they would wrap.

Note [Offload hooks] is in _offload_hooks.py, Note [Selective recompute] in
_offload_replay.py, Note [Stream order with torch's allocator] in _offload_streams.py.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Literal, Optional,
                    Sequence, Set, Tuple, TypeVar, Union)

import torch

from .._engine import Engine, plan_actions
from .._lib import StashError, parse_bytes
from .._warn import warn
from ._compiled import CompiledState
from ._compiled_graph import compiled_wrapper
from ._compiled_offload import CompiledMoves
from ._offload_hooks import BlockHooks
from ._offload_policy import FIXED_PLAN, LayerActions, StepPolicy, offload_slots
from ._offload_replay import BlockReplays
from ._offload_streams import EngineStreams
from ._saved import is_fsdp

__all__ = ["offload", "OffloadHandle"]

# What offload() takes as a plan (plan_actions reads it), where the blocks run, and a byte
# count (an int, or a string such as "8GiB": parse_bytes).
Plan = Union[str, os.PathLike[str], Dict[str, Any], Sequence[Sequence[Union[str, int]]]]
Device = Union[str, int, torch.device]
Bytes = Union[int, str]

_H = TypeVar("_H", bound="OffloadHandle")


def _call_target(i: int, block: torch.nn.Module) -> str:
    """The attribute of `block` that the hooks wrap (Note [Compiled blocks]): "forward",
    or the compiled callable of a block that torch.compile compiled, so that the hooks run
    outside the compiled region."""
    if getattr(block, "_compiled_call_impl", None) is not None:  # block.compile()
        return "_compiled_call_impl"
    current = vars(block).get("forward")
    if current is not None:
        if getattr(current, "_stash_wrapped", False):
            raise StashError(f"stash.torch: block {i} ({type(block).__name__}) is already "
                             "wrapped by stash (offload or fit applied twice?)")
        optimized = getattr(getattr(torch, "_dynamo", None), "eval_frame", None)
        optimized = getattr(optimized, "OptimizedModule", None)
        if optimized is None or not isinstance(block, optimized):  # torch.compile(block)
            raise StashError(f"stash.torch: block {i} ({type(block).__name__}) already has "
                             "its forward replaced by something other than torch.compile")
    return "forward"


def _compiled_block(block: torch.nn.Module) -> bool:
    """Whether torch.compile compiled `block` (block.compile(), or torch.compile(block))."""
    if getattr(block, "_compiled_call_impl", None) is not None:
        return True
    # No block is an OptimizedModule where Dynamo was never imported (nor imported here).
    frames = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(frames, "OptimizedModule", None)
    return optimized is not None and isinstance(block, optimized)


def _block_device(blocks: Iterable[torch.nn.Module], device: Optional[Device]) -> torch.device:
    if device is not None:
        return torch.device(device)
    for block in blocks:
        for p in block.parameters():
            return p.device
    return torch.device("cpu")


class OffloadHandle:
    """Returned by :func:`offload`; see there. A context manager: leaving it closes.

    policy: what decides the actions and listens as steps run (Note [The step policy] in
    _offload_policy.py); offload()'s is the plan as given. stash.torch.fit's BudgetHandle
    owns one of these with itself as the policy, and plan None."""

    def __init__(self, blocks: Iterable[torch.nn.Module], plan: Optional[Plan], *,
                 device: Optional[Device] = None, lookahead: int = 1,
                 pinned_cap: Optional[Bytes] = None,
                 max_in_flight_bytes: Optional[Bytes] = None, timing: bool = False,
                 max_micro_batches: int = 8, policy: StepPolicy = FIXED_PLAN) -> None:
        self._policy = policy
        self.blocks = list(blocks)
        fsdp = any(is_fsdp(b) for b in self.blocks)
        if not self.blocks:
            raise ValueError("stash.torch.offload: no blocks")
        first = policy.initial_actions(len(self.blocks))
        actions = first if first is not None else self._initial_actions(plan)
        self.device = _block_device(self.blocks, device)
        self._cuda = self.device.type == "cuda"
        self._warned: Set[Tuple[object, ...]] = set()
        # stats()["hooks"] (see there): the hooks and the replays count into it.
        self._counts = {"recompute_count": 0, "recompute_bytes": 0, "recompute_forwards": 0,
                        "recompute_stopped_early": 0, "recompute_replayed_saves": 0,
                        "recompute_captured": 0, "recompute_kept_count": 0, "keep_count": 0,
                        "recompute_kept_bytes": 0, "not_on_device_count": 0,
                        "abandoned_micro_batches": 0, "aborted_micro_batches": 0}
        if self._cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        # The compute stream, the engine's callbacks and the engine (Note [Stream order
        # with torch's allocator] in _offload_streams.py).
        self._streams = streams = EngineStreams(self.device, policy)
        # The recompute side (Note [Selective recompute] in _offload_replay.py) and the
        # hooks (Note [Offload hooks] in _offload_hooks.py).
        replays = BlockReplays(self.blocks, self.device, fsdp, policy, streams.fetch,
                               self._counts, self.warn_once)
        self._hooks = hooks = BlockHooks(self.blocks, actions, self.device, fsdp, policy,
                                         streams, replays, self._counts, self.warn_once)
        try:
            streams.engine = Engine(
                streams.alloc, streams.release, streams.engine_stream(), lookahead=lookahead,
                pinned_cap_bytes=parse_bytes(pinned_cap) if pinned_cap is not None else 0,
                max_in_flight_bytes=(parse_bytes(max_in_flight_bytes)
                                     if max_in_flight_bytes is not None else 0),
                timing=timing, max_micro_batches=max_micro_batches)
            hooks.set_engine_plan(actions)
        except BaseException:
            self._teardown()
            raise
        # (block, attribute wrapped, whether the block had its own, its value)
        self._originals: List[Tuple[torch.nn.Module, str, bool, Any]] = []
        # Note [Planning the compiled graph] in _compiled.py
        self._compiled_st: Optional[CompiledState] = None
        try:
            if len({id(b) for b in self.blocks}) != len(self.blocks):
                dup = next(i for i, b in enumerate(self.blocks)
                           if any(b is c for c in self.blocks[:i]))
                raise StashError(f"stash.torch: block {dup} is the same module as an earlier "
                                 "block (shared weights): each block must be a module of its "
                                 "own, run once per forward")
            targets = [_call_target(i, block) for i, block in enumerate(self.blocks)]
        except StashError:
            self._teardown()
            raise
        # Made now, not while Dynamo traces a block (Note [Planning the compiled graph] in
        # _compiled.py).
        self._compiled_st = self._make_compiled_state()
        for i, (block, name) in enumerate(zip(self.blocks, targets)):
            own = vars(block)
            self._originals.append((block, name, name in own, own.get(name)))
            setattr(block, name, self._wrap(i, getattr(block, name)))

    # --- what a policy uses (Note [The step policy] in _offload_policy.py) ---------------

    @property
    def engine(self) -> Optional[Engine]:
        """stash's prefetch engine, the streams' (None once closed)."""
        return self._streams.engine

    @property
    def actions(self) -> List[LayerActions]:
        """The blocks' actions now, by block: each saved tensor's, by index (set_actions)."""
        return self._hooks.actions

    @property
    def cuda(self) -> bool:
        """Whether the blocks' activations are on a CUDA device (else the CPU test double)."""
        return self._cuda

    @property
    def micro_batch_index(self) -> int:
        """The micro-batch the blocks' forwards run as now (micro_batch(i); 0 outside)."""
        return self._hooks.micro_batch

    @property
    def steps_in_flight(self) -> int:
        """Micro-batches whose step holds tensors now (forward run, backward not ended)."""
        return len(self._hooks.steps)

    @property
    def copies(self) -> bool:
        """Whether the current actions copy anything (else a step makes no engine call)."""
        return self._hooks.copies

    @property
    def compiled_state(self) -> Optional[CompiledState]:
        """What the handle knows of its blocks' compiled graphs (None once closed)."""
        return self._compiled_st

    @property
    def hooks(self) -> BlockHooks:
        """The part that wraps the blocks (Note [Offload hooks] in _offload_hooks.py): its
        steps in flight, for tests."""
        return self._hooks

    def warn_once(self, what: Tuple[object, ...], message: str) -> None:
        """Warns once per `what`, prefixed with the policy's name."""
        if what not in self._warned:
            self._warned.add(what)
            warn(f"{self._policy.who}: {message}")

    def set_actions(self, actions: List[LayerActions]) -> None:
        """Runs these actions from the next step on: the engine takes their plan (it takes
        a new plan only while no micro-batch holds tensors)."""
        self._hooks.set_engine_plan(actions)
        self._hooks.actions = actions

    def set_hook_actions(self, actions: List[LayerActions]) -> None:
        """Runs these actions from the next block's forward on, while micro-batches hold
        tensors: they must offload what the engine's plan offloads, in the same places
        (Note [A longer micro-batch in flight] in _fit_passes.py)."""
        def offloaded(layers: List[LayerActions]) -> List[List[int]]:
            return [[j for j, k in enumerate(offload_slots(a)[1] or []) if k is not None]
                    for a in layers]
        if offloaded(actions) != offloaded(self._hooks.actions):
            raise StashError("stash.torch: actions that change the engine's offload slots "
                             "while micro-batches hold tensors")
        self._hooks.actions = actions

    def compiled_moves(self, state_id: int) -> CompiledMoves:
        """This handle's engine as a compiled graph's ops drive it (Note [Offload in the
        compiled graph] in _compiled_offload.py)."""
        streams = self._streams
        return CompiledMoves(
            state_id, len(self.blocks), hand_over=streams.hand_over, fetch=streams.fetch,
            set_plan=self._hooks.set_engine_plan, engine=lambda: self.engine,
            host_wait=streams.host_wait)

    # --- the policy's questions -------------------------------------------------------------

    def _initial_actions(self, plan: Optional[Plan]) -> List[LayerActions]:
        if plan is None:
            raise StashError("stash.torch.offload: no plan (a stash.plan/1 path or dict, or "
                             "per-layer action lists)")
        actions: List[LayerActions] = list(plan_actions(plan))
        if len(actions) != len(self.blocks):
            raise StashError(f"stash.torch.offload: the plan has {len(actions)} layers, but "
                             f"{len(self.blocks)} blocks were given")
        return actions

    def _wrap(self, i: int, forward: Callable[..., Any]) -> Callable[..., Any]:
        """The hooks' wrapper, or, while Dynamo traces the block as part of a larger
        compiled model, the compiled form (Note [Planning the compiled graph] in
        _compiled.py)."""
        return compiled_wrapper(self._compiled, i, forward, self._hooks.wrap(i, forward))

    def _compiled(self) -> CompiledState:
        if self._compiled_st is None:
            self._compiled_st = self._make_compiled_state()
        return self._compiled_st

    def _make_compiled_state(self) -> CompiledState:
        state = self._policy.compiled_state(self)
        if state is not None:
            return state
        return CompiledState(
            len(self.blocks), [str(i) for i in range(len(self.blocks))],
            [type(b).__name__ for b in self.blocks], None, (lambda x: (0, None), lambda: 0, lambda: None),
            "an offload() plan names the saved tensors of the eager ops, which a compiled "
            "graph does not have (stash.torch.fit plans compiled graphs)")

    # --- public ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def micro_batch(self: _H, index: int) -> Iterator[_H]:
        """Runs the blocks' forwards inside as micro-batch `index` (0 outside any): several
        micro-batches may run their forwards before their backwards (gradient accumulation,
        pipeline schedules), up to max_micro_batches at once."""
        if not isinstance(index, int) or index < 0:
            raise ValueError(f"micro-batch index must be a non-negative int, got {index!r}")
        hooks = self._hooks
        previous, hooks.micro_batch = hooks.micro_batch, index
        try:
            yield self
        finally:
            hooks.micro_batch = previous

    def stats(self) -> Dict[str, Any]:
        """The engine's statistics (stash_engine_stats_t as a dict, the pinned pool under
        "pinned") and the hooks' own under "hooks" (Note [Selective recompute]):
        keep_count: saved storages left in place (kept by the plan, or kept as below);
        recompute_count/bytes: storages replaced by placeholders in forward;
        recompute_forwards: replays run in backward, recompute_stopped_early: those that
        stopped before the forward's last save, recompute_replayed_saves: saves they went
        through (of the forward's, including parameters'), recompute_captured: saved
        tensors they captured (a storage saved twice counts twice);
        recompute_kept_count/bytes: tensors the plan recomputes that cannot be (an input),
        kept instead; offload tensors not on the device;
        micro-batches whose forward was dropped without a backward (abandoned: replaced by
        a later forward; aborted: ended by an exception or a freed graph, Note [A step that
        ends early])."""
        d = self._live().stats()
        d["hooks"] = dict(self._counts)
        return d

    def overlap(self) -> Dict[str, Any]:
        """Copy, hidden and exposed milliseconds, in total and per layer (needs
        timing=True)."""
        return self._timed("overlap()").overlap()

    def write_trace(self, path: Union[str, os.PathLike[str]]) -> None:
        """Writes the engine's Chrome/Perfetto trace (needs timing=True)."""
        self._timed("write_trace()").write_trace(path)

    def _timed(self, what: str) -> Engine:
        engine = self._live()
        if not engine.timing:
            raise StashError(f"{self._policy.who}: {what} reads the engine's timing events, "
                             "which are off by default (they cost host time on every engine "
                             f"call): pass timing=True to {self._policy.who}()")
        return engine

    def synchronize(self) -> None:
        """Waits for the engine's copies and gives back the storages they read."""
        self._live().synchronize()

    def release_graphs(self) -> int:
        """The CUDA graphs captured through this handle's steps will not be replayed again
        (they were destroyed, or their replays are finished or enqueued on the compute
        stream): gives back the pinned blocks they copy through, held since their capture
        (Note [Steps under CUDA graphs] in _offload_steps.py). Returns their bytes."""
        return self._streams.release_graphs()

    def _live(self) -> Engine:
        if self.engine is None:
            raise StashError(f"{self._policy.who}: the handle was closed")
        return self.engine

    def close(self) -> None:
        """Restores the blocks exactly as they were (the attribute the hooks wrapped, or
        its absence), drops live micro-batches (their graphs can no longer run backward
        through offloaded tensors) and destroys the engine."""
        compiled = getattr(self, "_compiled_st", None)
        if compiled is not None:
            compiled.close()
        if getattr(self, "_originals", None):
            for block, name, had, value in self._originals:
                if had:
                    setattr(block, name, value)
                else:
                    delattr(block, name)
            self._originals = []
        if self.engine is not None:
            try:
                self._hooks.end_steps()
            finally:
                self._teardown()

    def _teardown(self) -> None:
        engine, self._streams.engine = self._streams.engine, None
        if engine is not None:
            engine.close()  # hands every block back through the streams' release
        self._hooks.forget_steps()
        self._streams.close()

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False


def offload(blocks: Iterable[torch.nn.Module], plan: Plan, *, device: Optional[Device] = None,
            lookahead: int = 1, pinned_cap: Optional[Bytes] = None,
            max_in_flight_bytes: Optional[Bytes] = None, timing: bool = False,
            max_micro_batches: int = 8) -> OffloadHandle:
    """Applies `plan` to `blocks` (nn.Modules run in order, block i's output feeding block
    i+1) through stash's prefetch engine, and returns an :class:`OffloadHandle`.

    plan: a stash.plan/1 file or dict (from ``stash plan`` over a profile made from
    :func:`stash.torch.record`), or one list of actions per block ("keep", "recompute",
    "offload"), indexed like the record pass lists each block's saved tensors.

    While the handle is open, each block's forward under grad hands its saved tensors to
    the engine: offload tensors are copied to pinned host memory in forward and prefetched
    one block ahead in backward; keep tensors stay; recompute tensors are freed after the
    forward and recomputed in backward by a replay of the block's forward that stops after
    the last of them (Note [Selective recompute]). Run the
    blocks on the current CUDA stream at the time of this call (Note [Stream order with
    torch's allocator]). Use ``handle.micro_batch(i)`` when several forwards run before
    their backwards. Raises StashError when the plan does not match the blocks (layer
    count here; tensor counts at the first forward; during backward, a block whose replay
    saves other tensors than its forward did: torch 1.13 reports it as a RuntimeError
    carrying the StashError's text) or the engine fails.

    device: where the blocks' activations live (default: the blocks' parameters'). pinned_cap
    (bytes or "8GiB"): the engine's pinned pool cap. max_in_flight_bytes (bytes or "1GiB";
    default none): bound on device-to-host copies in transit; on CUDA set it to about one
    block's offloaded bytes, so that a host running ahead of the GPU cannot hold more
    offloaded storages than the plan assumes (Note [Stream order with torch's allocator]).
    lookahead: prefetch block i when backward of block i+lookahead begins. timing: record
    CUDA events on every engine operation, for write_trace and overlap (off by default:
    nothing else reads them, and each costs host time; a plan that offloads nothing makes
    no engine call either way, Note [Offload hooks]). max_micro_batches: live at once.

    The engine sees only the offload tensors: stats()'s engine counters (offloaded_count,
    released_count, ...) count those; keep_count and recompute_count there stay 0, and
    stats()["hooks"] counts the kept and recomputed storages."""
    return OffloadHandle(blocks, plan, device=device, lookahead=lookahead,
                         pinned_cap=pinned_cap, max_in_flight_bytes=max_in_flight_bytes,
                         timing=timing, max_micro_batches=max_micro_batches)
