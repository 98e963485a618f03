"""stash.torch.offload: apply a plan to a model's blocks through the prefetch engine.

Note [Selective recompute]
stash recomputes exactly the tensors the plan marks recompute, in the manner of torch's
non-reentrant checkpoint (2.x, with early stop), on torch 1.13 and 2.x alike.
- Forward: the pack hook returns a Placeholder (frame, save position) for each save of a
  recompute storage, so autograd holds no reference and the storage is freed when the
  block's forward ends (held until then, as every saved storage: numbering is by
  address). A Frame per block forward and micro-batch records what the recompute needs:
  the block's own forward, its inputs as slots (a storage the plan offloads is rebuilt
  over the fetched buffer, with the input's dtype, shape, strides and offset, so a view
  comes back a view; anything else, kept inputs and inputs the block does not save, is
  held detached), the CPU and CUDA RNG states and the autocast modes at the start of the
  forward, and every save in order (index, first, dtype, shape, device; None for the
  parameters'). The input and whatever existed before the block are not recomputable:
  a plan that recomputes one keeps it, counted, with one warning. A saved view of an
  offloaded storage has that storage's index: it is offloaded with it, never recomputed.
- Backward: the first unpack of a placeholder whose tensor is not captured replays the
  block: inputs restored (offloaded ones acquired from the engine; the engine has them
  prefetched, since the block's backward began), detached so that the replay's graph
  does not reach the outer one, with the forward's requires_grad (which decides what
  autograd saves); RNG and autocast as in the forward; grad enabled; under a nested
  saved_tensors_hooks that numbers saves with SaveOrder as the forward did. Each save is
  checked against the forward's (a block that saves something else the second time,
  e.g. control flow on a call counter, raises a StashError naming both); the saves whose
  placeholders autograd still holds are captured (detached); after the last of them the
  hook raises StopRecompute, which ends the replay, so it costs the forward's prefix up
  to the last recompute tensor, not the whole block. Its own graph keeps nothing (its
  pack hook returns None) and dies with the replay. Later unpacks take their tensor
  from the capture, which drops it: a recomputed tensor lives until its node ran.
- A replay holds every storage it sees until it ends (numbering again), so its peak is
  the block's forward peak up to the stop; the planner counts one block rebuilt at a
  time in backward.
- retain_graph: a placeholder unpacked twice (a second backward through the graph)
  finds nothing captured and replays again; offloaded inputs stay fetched (their
  buffers live with the frame). Several micro-batches have their own frames. A forward
  under no_grad or inference mode saves nothing and makes no frame. Captures left over
  (a save a partial backward did not reach) go with the frame, which dies with the last
  placeholder, i.e. with the graph.
- Whole blocks (every tensor but the input recomputed) take the same path. The reentrant
  torch.utils.checkpoint used before ran the forward without grad (nothing saved, not
  even for the forward's duration) but needs an input that requires grad (else the
  parameters' gradients are cut), cannot take keyword or non-tensor arguments, refuses
  torch.autograd.grad, runs a nested backward (which DDP's hooks see at odd times) and
  recomputes past the last save; torch itself recommends the non-reentrant form. The
  planner already counts a block's own tensors as resident during its forward.
- A replay runs the block's code again, as torch's checkpoint does: a module that
  updates state in forward (BatchNorm's running statistics, a call counter) updates it
  again; one whose saves depend on that state fails the check above.
- CUDA: the replay runs on the stream autograd runs the unpacking node on, as the rest
  of the block's backward; fetched inputs are acquired for that stream (_fetch). A held
  input modified in place since the forward (its version counter moved) is refused:
  the replay would not see the values the forward saw.
- Why not torch's selective activation checkpointing (2.4+): it caches the tensors its
  policy keeps outside saved-tensor hooks, so they could not be offloaded, and its policy
  decides per op call whether to keep that op's outputs, while a plan decides per saved
  storage in save order; the two do not map one to one (one storage is saved by several
  ops, an op's outputs may be saved by none). It does not exist on 1.13 either.

Note [Recompute under FSDP2]
FSDP2 (fully_shard) gathers a block's parameters into storage of its own before the
block's forward and frees it after; it gathers them again when autograd reaches the
block's backward. stash's replay runs the block's forward function itself, not the module
(so FSDP's hooks do not run), and can run before FSDP's pre-backward hook has gathered
them (seen on the CPU with gloo: the replay met the sharded parameters): the replay
first asks FSDP for the block's parameters (FSDPModule.unshard(), the
public call FSDP offers for prefetching by hand; a no-op when they are gathered already;
FSDP's post-backward frees them as usual). Which storages are parameters is read when a
FSDP2 block's forward or replay begins, not once per step: the gathered storages of one
forward are freed and their addresses reused by the next block's activations. Parameters
are never listed as saved tensors (SaveOrder), whatever storage holds them.

Note [Compiled blocks]
A block compiled with torch.compile, as torch.compile(block) (an OptimizedModule whose
forward is the compiled one) or block.compile() (the module's _compiled_call_impl), keeps
its compiled callable; the hooks wrap that callable, not the eager forward inside it, so
they run outside the compiled region: Dynamo never traces them, and the saved-tensor hooks
see what the compiled forward saves for its backward. A compiled forward saves at its end,
so its save order is the compiled graph's (Note [Recompute cost as the replay pays it] in
_fit_measure.py prices that). A forward replaced by anything else is refused: the hooks
could not tell what they would wrap.

Note [Offload hooks] is in _offload_hooks.py, Note [Stream order with torch's allocator]
in _offload_streams.py.
"""

from __future__ import annotations

import contextlib
import os
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Literal,
                    Optional, Sequence, Tuple, TypeVar, Union, cast)

import torch

from .._engine import Engine, plan_actions
from .._lib import StashError, parse_bytes
from ._compiled import CompiledState, compiled_wrapper
from ._compiled_offload import CompiledMoves
from ._offload_hooks import OffloadHooks
from ._offload_policy import FIXED_PLAN, LayerActions, StepPolicy
from ._step import _Fetched
from ._offload_streams import EngineStreams
from ._recompute import FetchedInput, Frame, HeldInput, Placeholder, Replay, map_tensors
from ._saved import SaveOrder, is_fsdp, resident_storages, storage_of, tensors_in

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

__all__ = ["offload", "OffloadHandle"]

# What offload() takes as a plan (plan_actions reads it), where the blocks run, and a byte
# count (an int, or a string such as "8GiB": parse_bytes).
Plan = Union[str, os.PathLike[str], Dict[str, Any], Sequence[Sequence[Union[str, int]]]]
Device = Union[str, int, torch.device]
Bytes = Union[int, str]

_H = TypeVar("_H", bound="OffloadHandle")

_INPUT_SLOTS = (HeldInput, FetchedInput)


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


def _block_device(blocks: Iterable[torch.nn.Module], device: Optional[Device]) -> torch.device:
    if device is not None:
        return torch.device(device)
    for block in blocks:
        for p in block.parameters():
            return p.device
    return torch.device("cpu")


class OffloadHandle(OffloadHooks):
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
        self._fsdp = any(is_fsdp(b) for b in self.blocks)
        if not self.blocks:
            raise ValueError("stash.torch.offload: no blocks")
        first = policy.initial_actions(len(self.blocks))
        self.actions = first if first is not None else self._initial_actions(plan)
        self.device = _block_device(self.blocks, device)
        self._cuda = self.device.type == "cuda"
        self._steps = {}    # micro-batch -> _Step
        # (micro-batch, block) -> the CPU RNG state's buffer (Note [RNG states kept in
        # place] in _recompute.py); micro-batch 0's made now, before any step.
        state = torch.get_rng_state()
        self._rng_buffers = {(0, i): torch.empty_like(state) for i in range(len(self.blocks))}
        self._draws_cuda_rng = {}  # block -> whether an eager forward drew (Note [Recompute
        # under a capture] in _offload_hooks.py)
        self._dropped = []  # steps whose graph died (Note [A step that ends early])
        self._busy = 0      # stash's forward code on the stack: _graph_dropped only queues
        self._micro_batch = 0
        self._warned = set()
        self._hook_error = None
        self._hooks = {"recompute_count": 0, "recompute_bytes": 0, "recompute_forwards": 0,
                       "recompute_stopped_early": 0, "recompute_replayed_saves": 0,
                       "recompute_captured": 0, "recompute_kept_count": 0, "keep_count": 0,
                       "recompute_kept_bytes": 0, "not_on_device_count": 0,
                       "abandoned_micro_batches": 0, "aborted_micro_batches": 0}
        if self._cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        # The compute stream, the engine's callbacks and the engine (Note [Stream order
        # with torch's allocator] in _offload_streams.py).
        self._streams = streams = EngineStreams(self.device, policy)
        try:
            streams.engine = Engine(
                streams.alloc, streams.release, streams.engine_stream(), lookahead=lookahead,
                pinned_cap_bytes=parse_bytes(pinned_cap) if pinned_cap is not None else 0,
                max_in_flight_bytes=(parse_bytes(max_in_flight_bytes)
                                     if max_in_flight_bytes is not None else 0),
                timing=timing, max_micro_batches=max_micro_batches)
            self._set_engine_plan(self.actions)
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
    def cuda(self) -> bool:
        """Whether the blocks' activations are on a CUDA device (else the CPU test double)."""
        return self._cuda

    @property
    def micro_batch_index(self) -> int:
        """The micro-batch the blocks' forwards run as now (micro_batch(i); 0 outside)."""
        return self._micro_batch

    @property
    def steps_in_flight(self) -> int:
        """Micro-batches whose step holds tensors now (forward run, backward not ended)."""
        return len(self._steps)

    @property
    def copies(self) -> bool:
        """Whether the current actions copy anything (else a step makes no engine call)."""
        return self._engine_active

    @property
    def compiled_state(self) -> Optional[CompiledState]:
        """What the handle knows of its blocks' compiled graphs (None once closed)."""
        return self._compiled_st

    def set_actions(self, actions: List[LayerActions]) -> None:
        """Runs these actions from the next step on: the engine takes their plan (it takes
        a new plan only while no micro-batch holds tensors)."""
        self._set_engine_plan(actions)
        self.actions = actions

    def compiled_moves(self, state_id: int) -> CompiledMoves:
        """This handle's engine as a compiled graph's ops drive it (Note [Offload in the
        compiled graph] in _compiled_offload.py)."""
        streams = self._streams
        return CompiledMoves(
            state_id, len(self.blocks), hand_over=streams.hand_over, fetch=streams.fetch,
            set_plan=self._set_engine_plan, engine=lambda: self.engine,
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
        return compiled_wrapper(self._compiled, i, forward, super()._wrap(i, forward))

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
            [type(b).__name__ for b in self.blocks], None, (lambda x: 0, lambda: 0),
            "an offload() plan names the saved tensors of the eager ops, which a compiled "
            "graph does not have (stash.torch.fit plans compiled graphs)")

    # --- recompute (Note [Selective recompute]) ------------------------------------------

    def _cuda_rng_devices(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[int]:
        """Devices whose RNG state a recompute must restore: the blocks' and the inputs'
        (torch's checkpoint takes the inputs' too). None before CUDA is initialized."""
        if not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            return []
        devices = {t.get_device() for t in tensors_in((args, kwargs)) if t.is_cuda}
        if self._cuda:
            assert self.device.index is not None  # set by __init__
            devices.add(self.device.index)
        return sorted(devices)

    def _rng_buffer(self, mb: int, i: int) -> torch.Tensor:
        """The buffer block i's CPU RNG state is kept in for micro-batch mb."""
        buf = self._rng_buffers.get((mb, i))
        if buf is None:
            buf = self._rng_buffers[(mb, i)] = torch.empty_like(torch.get_rng_state())
        return buf

    def _recompute_kept(self, i: int, j: int, nbytes: int) -> None:
        self._hooks["recompute_kept_count"] += 1
        self._hooks["recompute_kept_bytes"] += nbytes
        self.warn_once(("input", i, j), (
            f"the plan recomputes tensor {j} of block {i}, which existed before the block "
            "ran (its input): nothing in the block can produce it again, so it is kept on "
            "the device (counted in stats()['hooks']['recompute_kept_count']). Make the "
            "plan from this model's record pass, which marks it not recomputable."))

    @staticmethod
    def _input_slots(args: Tuple[Any, ...], kwargs: Dict[str, Any], order: SaveOrder,
                     fetched: List[object]) -> Tuple[Any, Any]:
        """Note [Selective recompute]: the block's inputs as its recompute takes them back,
        by the action of the storage each one is in."""
        def slot(t: torch.Tensor) -> Union[FetchedInput, HeldInput]:
            j = order.index.get(storage_of(t)[0])
            f = fetched[j] if j is not None else None
            return FetchedInput(f, t) if isinstance(f, _Fetched) else HeldInput(t)
        return map_tensors(args, slot), map_tensors(kwargs, slot)

    def _unpack_recomputed(self, ph: Placeholder) -> torch.Tensor:
        """Note [Selective recompute]: the captured tensor of a placeholder, after a replay
        of its block when this backward has not run one (the first unpack of the block's
        placeholders, or the first of a later backward through a retained graph)."""
        frame = ph.frame
        t = frame.captured.pop(ph.pos, None)
        if t is None:
            self._replay(frame)
            t = frame.captured.pop(ph.pos, None)
            if t is None:  # Replay captures every live placeholder or raises
                raise StashError(f"stash.torch.offload: recompute of block {frame.layer} did "
                                 f"not capture save {ph.pos}")
        return t

    def _replay(self, frame: Frame) -> None:
        step = frame.step
        if step.abandoned:
            raise StashError(
                f"stash.torch.offload: this backward belongs to a forward of micro-batch "
                f"{step.mb} that a later forward of the same micro-batch replaced; use "
                "handle.micro_batch(i) for forwards that wait for their backward")
        if frame.args is None:
            raise StashError(
                f"stash.torch.offload: a recompute tensor of block {frame.layer} was needed "
                "before the block's forward returned (a gradient taken inside its forward); "
                "keep or offload what that gradient uses")
        # Stale captures of an earlier backward (saves it did not reach) are replaced.
        frame.captured.clear()
        args = map_tensors(frame.args, lambda s: self._restore(frame, s), _INPUT_SLOTS)
        kwargs = map_tensors(frame.kwargs, lambda s: self._restore(frame, s), _INPUT_SLOTS)
        resident = step.resident
        if self._fsdp:  # Note [Recompute under FSDP2]
            block = self.blocks[frame.layer]
            if is_fsdp(block):  # FSDP2 may shard only some of the blocks
                cast("FSDPModule", block).unshard()
            resident = resident_storages(self.blocks)
        replay = Replay(frame, resident,
                        {storage_of(t)[0] for t in tensors_in((args, kwargs))},
                        # no call per save unless the policy listens (stash.torch.fit)
                        self._policy.on_replay_saved if self._policy.observes_saves
                        else None)
        self._hooks["recompute_forwards"] += 1
        self._policy.on_replay_began(frame)
        try:
            replay.run(args, kwargs)
        finally:
            self._hooks["recompute_replayed_saves"] += replay.pos
            self._hooks["recompute_captured"] += replay.captured
            self._policy.on_replay_ended(frame, replay)
        if replay.pos < len(frame.saves):  # saves the forward made after the stop point
            self._hooks["recompute_stopped_early"] += 1

    def _restore(self, frame: Frame, slot: Union[FetchedInput, HeldInput]) -> torch.Tensor:
        """A block input for its replay: detached (the replay's graph must not reach the
        graph that produced it) with the forward's requires_grad (which decides what
        autograd saves, e.g. both operands of a product or only one)."""
        if isinstance(slot, FetchedInput):
            flat = self._streams.fetch(slot.fetched)
            t = flat.view(slot.dtype).as_strided(slot.size, slot.stride, slot.offset)
        elif isinstance(slot, HeldInput):
            if slot.t._version != slot.version:
                raise StashError(
                    f"stash.torch.offload: an input of block {frame.layer} (micro-batch "
                    f"{frame.step.mb}) was modified in place after the block's forward; its "
                    "recompute would not see the values the forward saw")
            t = slot.t
        return t.detach().requires_grad_(slot.requires_grad)

    # --- public ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def micro_batch(self: _H, index: int) -> Iterator[_H]:
        """Runs the blocks' forwards inside as micro-batch `index` (0 outside any): several
        micro-batches may run their forwards before their backwards (gradient accumulation,
        pipeline schedules), up to max_micro_batches at once."""
        if not isinstance(index, int) or index < 0:
            raise ValueError(f"micro-batch index must be a non-negative int, got {index!r}")
        previous, self._micro_batch = self._micro_batch, index
        try:
            yield self
        finally:
            self._micro_batch = previous

    def stats(self) -> Dict[str, Any]:
        """The engine's statistics (stash_engine_stats_t as a dict, the pinned pool under
        "pinned") and the hooks' own under "hooks" (Note [Selective recompute]):
        keep_count: saved storages left in place (kept by the plan, or kept as below);
        recompute_count/bytes: storages replaced by placeholders in forward;
        recompute_forwards: replays run in backward, recompute_stopped_early: those that
        stopped before the forward's last save, recompute_replayed_saves: saves they went
        through (of the forward's, including parameters'), recompute_captured: saved tensors they captured (a storage saved
        twice counts twice); recompute_kept_count/bytes: tensors the plan recomputes that
        cannot be (an input), kept instead; offload tensors not on the device;
        micro-batches whose forward was dropped without a backward (abandoned: replaced by
        a later forward; aborted: ended by an exception or a freed graph, Note [A step that
        ends early])."""
        d = self._live().stats()
        d["hooks"] = dict(self._hooks)
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
        (Note [Steps under CUDA graphs] in _offload_hooks.py). Returns their bytes."""
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
                for step in list(self._steps.values()):
                    step.abandoned = True
                    self._end_step(step)
            finally:
                self._teardown()

    def _teardown(self) -> None:
        engine, self._streams.engine = self._streams.engine, None
        if engine is not None:
            engine.close()  # hands every block back through the streams' release
        self._steps.clear()
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
