"""The recompute side of stash.torch.offload: what a block's forward leaves for its replay
(the RNG state's buffer, the inputs as slots) and the replay itself when backward first
unpacks a placeholder: BlockReplays, a part _offload.OffloadHandle owns. The frame, the
placeholders and the replay's own pack hook are _recompute.py's.

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
  of the block's backward; fetched inputs are acquired for that stream
  (EngineStreams.fetch). A held input modified in place since the forward (its version
  counter moved) is refused:
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

Note [A replay's inputs under autocast]
Autocast caches the cast of a tensor that is a leaf and requires grad (a weight), so
every use in the region shares one copy; the cast of anything else is made again at each
use. A block's hidden-state input is no leaf in the forward (the block before made it),
but detached for the replay it is: under bf16 autocast an OLMo2 block, whose q, k and v
projections each cast that input (no norm before them), saved three copies in its forward
and one copy three times in its replay, and the replay refused it ("now tensor 1 again
(a view of it)") in the measuring step. So an input that was not a leaf comes back as a
view of its detached self: not a leaf, with the same storage (the same index), and its
graph ends there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Sequence, Tuple, Union, cast

import torch

from .._lib import StashError
from ._offload_policy import StepPolicy
from ._recompute import FetchedInput, Frame, HeldInput, Placeholder, Replay, map_tensors
from ._saved import SaveOrder, is_fsdp, resident_storages, storage_of, tensors_in
from ._step import _Fetched

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

_INPUT_SLOTS = (HeldInput, FetchedInput)


class BlockReplays:
    """The recompute side of an OffloadHandle (Note [Selective recompute]), a part the
    handle owns: made with what it uses, the blocks, where they run, whether any is FSDP2,
    the policy, fetch (the streams' fetch: an offloaded input back from the engine),
    counts (the handle's stats()["hooks"], which it adds to) and warn_once (the handle's).
    The hooks call cuda_rng_devices, rng_buffer and input_slots as a recomputing block's
    forward runs, kept_input for a tensor the plan recomputes that existed before the
    block, and unpack for a placeholder in backward."""

    def __init__(self, blocks: Sequence[torch.nn.Module], device: torch.device, fsdp: bool,
                 policy: StepPolicy, fetch: Callable[[_Fetched], torch.Tensor],
                 counts: Dict[str, int],
                 warn_once: Callable[[Tuple[object, ...], str], None]) -> None:
        self._blocks = blocks
        self._device = device
        self._cuda = device.type == "cuda"
        self._fsdp = fsdp
        self._policy = policy  # Note [The step policy] in _offload_policy.py
        self._fetch = fetch
        self._counts = counts
        self._warn_once = warn_once
        # (micro-batch, block) -> the CPU RNG state's buffer (Note [RNG states kept in
        # place] in _recompute.py); micro-batch 0's made now, before any step.
        state = torch.get_rng_state()
        self._rng_buffers = {(0, i): torch.empty_like(state) for i in range(len(blocks))}

    def cuda_rng_devices(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[int]:
        """Devices whose RNG state a recompute must restore: the blocks' and the inputs'
        (torch's checkpoint takes the inputs' too). None before CUDA is initialized."""
        if not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            return []
        devices = {t.get_device() for t in tensors_in((args, kwargs)) if t.is_cuda}
        if self._cuda:
            assert self._device.index is not None  # set by the handle
            devices.add(self._device.index)
        return sorted(devices)

    def rng_buffer(self, mb: int, i: int) -> torch.Tensor:
        """The buffer block i's CPU RNG state is kept in for micro-batch mb."""
        buf = self._rng_buffers.get((mb, i))
        if buf is None:
            buf = self._rng_buffers[(mb, i)] = torch.empty_like(torch.get_rng_state())
        return buf

    def kept_input(self, i: int, j: int, nbytes: int) -> None:
        """Tensor j of block i, which the plan recomputes, existed before the block ran:
        it is kept, counted, with one warning."""
        self._counts["recompute_kept_count"] += 1
        self._counts["recompute_kept_bytes"] += nbytes
        self._warn_once(("input", i, j), (
            f"the plan recomputes tensor {j} of block {i}, which existed before the block "
            "ran (its input): nothing in the block can produce it again, so it is kept on "
            "the device (counted in stats()['hooks']['recompute_kept_count']). Make the "
            "plan from this model's record pass, which marks it not recomputable."))

    @staticmethod
    def input_slots(args: Tuple[Any, ...], kwargs: Dict[str, Any], order: SaveOrder,
                    fetched: List[object]) -> Tuple[Any, Any]:
        """Note [Selective recompute]: the block's inputs as its recompute takes them back,
        by the action of the storage each one is in."""
        def slot(t: torch.Tensor) -> Union[FetchedInput, HeldInput]:
            j = order.index.get(storage_of(t)[0])
            f = fetched[j] if j is not None else None
            return FetchedInput(f, t) if isinstance(f, _Fetched) else HeldInput(t)
        return map_tensors(args, slot), map_tensors(kwargs, slot)

    def unpack(self, ph: Placeholder) -> torch.Tensor:
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
            block = self._blocks[frame.layer]
            if is_fsdp(block):  # FSDP2 may shard only some of the blocks
                cast("FSDPModule", block).unshard()
            resident = resident_storages(self._blocks)
        replay = Replay(frame, resident,
                        {storage_of(t)[0] for t in tensors_in((args, kwargs))},
                        # no call per save unless the policy listens (stash.torch.fit)
                        self._policy.on_replay_saved if self._policy.observes_saves
                        else None)
        self._counts["recompute_forwards"] += 1
        self._policy.on_replay_began(frame)
        try:
            replay.run(args, kwargs)
        finally:
            self._counts["recompute_replayed_saves"] += replay.pos
            self._counts["recompute_captured"] += replay.captured
            self._policy.on_replay_ended(frame, replay)
        if replay.pos < len(frame.saves):  # saves the forward made after the stop point
            self._counts["recompute_stopped_early"] += 1

    def _restore(self, frame: Frame, slot: Union[FetchedInput, HeldInput]) -> torch.Tensor:
        """A block input for its replay: detached (the replay's graph must not reach the
        graph that produced it) with the forward's requires_grad (which decides what
        autograd saves, e.g. both operands of a product or only one)."""
        if isinstance(slot, FetchedInput):
            flat = self._fetch(slot.fetched)
            t = flat.view(slot.dtype).as_strided(slot.size, slot.stride, slot.offset)
        elif isinstance(slot, HeldInput):
            if slot.t._version != slot.version:
                raise StashError(
                    f"stash.torch.offload: an input of block {frame.layer} (micro-batch "
                    f"{frame.step.mb}) was modified in place after the block's forward; its "
                    "recompute would not see the values the forward saw")
            t = slot.t
        out = t.detach().requires_grad_(slot.requires_grad)
        if slot.requires_grad and not slot.leaf:
            # Note [A replay's inputs under autocast]: not a leaf, as in the forward (made
            # with grad on: backward runs without, and a view made so would need none).
            with torch.enable_grad():
                return out.view_as(out)
        return out
