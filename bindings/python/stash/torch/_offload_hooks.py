"""Saved-tensor hooks of stash.torch.offload: numbering what each block saves, the pack
and unpack hooks and the block boundaries in backward: BlockHooks, a part
_offload.OffloadHandle owns, with the steps in flight its StepTable's (_offload_steps.py).

Note [Offload hooks]
Each block's forward runs under torch.autograd.graph.saved_tensors_hooks. The pack hook
numbers what the block saves exactly as stash.torch.record does (_saved.SaveOrder:
parameters and buffers pass through unnumbered, views of one storage share one index, the
block's input comes first), so tensor (layer i, index j) of a plan made from a recorded
profile is the tensor the hook sees. Keys are (micro-batch, block, index).
- Only offload tensors reach the engine. Its plan lists each layer's offload slots and
  nothing else (StepPolicy.engine_layer: slot k of layer i is the layer's k-th offload
  tensor in plan order), so the C API's rule, hand over every tensor of the engine's plan
  (stash_engine_offload), holds while keep and recompute tensors cost no engine call.
  Keep tensors pass through: the hook returns the tensor (Note [The keep path]). Recompute
  tensors get a placeholder (Note [Selective recompute] in _offload_replay.py); their
  storage is freed when the forward ends.
- The engine's block calls (forward_begin/end, backward_begin/end) run only while the plan
  copies something (_engine_active): a plan of keeps and recomputes makes no engine call
  at all. Timing (CUDA events on every engine operation, which only write_trace and
  overlap read) is off unless asked for: offload(..., timing=True).
- An offload tensor's storage goes to the engine: its data pointer and the storage's bytes.
  The hook keeps a reference to the storage until the engine's release callback hands it
  back (Note [Stream order with torch's allocator] in _offload_streams.py); dropping it
  then lets torch's allocator reuse the memory. The hook returns only a small record (key,
  dtype, shape, strides, offset).
- The storages a block saves are held until that block's forward ends, even when their
  copy finished earlier, because saved tensors are numbered by storage address: a freed
  address handed to a later tensor of the same block would look like a view of the first.
  The planner's peak counts a block's own tensors as resident during its forward anyway.
- Backward: an identity autograd.Function at each block's output (_boundary.py) fires
  when the gradient reaches it, i.e. when backward of that block begins: it ends the
  backward of the block above (backward_end) and calls backward_begin, which prefetches
  the block below (lookahead 1) into buffers the engine allocates through our allocator
  callback (torch.empty(bytes, dtype=uint8) on the compute stream, held by pointer). The
  unpack hook acquires the tensor, releases it in the engine at once (our release callback
  drops our reference; the saved tensor rebuilt over the buffer keeps it alive for as long
  as autograd needs it), and returns a view with the saved dtype, shape, strides and
  storage offset: no copy. Several views of one storage share one fetched buffer.
- When the whole backward pass ends, everything of the micro-batch still held by the
  engine (keep tensors, offloads never unpacked) is released and the micro-batch's step
  ends; its next forward starts a new one.

Note [The keep path]
A kept tensor should cost what torch's own hook dispatch costs and little more: it is most
of what a plan saves. Per saved tensor the pack hook does, for a plain tensor (type
torch.Tensor: never a Parameter), one storage pointer and one dict lookup (SaveOrder.see),
and for a new storage its bytes and two list appends; the layer's actions, the engine
slots and the bound methods it uses are looked up once per block, and a keep costs no
method call beyond see() unless the policy observes saves (on_saved: stash.torch.fit does).
A kept tensor is returned detached when it has a grad_fn (t.is_leaf is False; is_leaf
reads it without making its Python node): a node that saves its own output and gets back
the output itself (with its grad_fn, that node) holds a cycle through autograd's C++ graph
that Python's collector cannot see, so a graph never backwarded (Note [A step that ends
early]) would never be freed. Detached, it shares the storage and version counter, and
nothing else. The unpack hook hands a tensor back as it is. Per block: the input's storage
key (_input_keys), the parameters' and buffers' storages once per step
(resident_storages), and the backward boundary.

Note [Lean blocks]
A block whose plan keeps everything runs without saved-tensor hooks (Note [What it costs]
in _fit_passes.py), but its call still went through the whole wrapper: the policy's
questions, the step's order check, the forward began/ended seams, the boundary question.
After a block's compute the interpreter's caches are cold, and each of those calls cost
10-70x its hot time there: 45-50 us before and 30-35 us after every middle block of the
CPU peers' tiny Llama (BENCHMARKS.md, "fit at keep-all's peak"). So when a step begins
(block 0, not captured, the engine idle) the policy says once which blocks may run bare
for the step (StepPolicy.lean_blocks: kept whole, no boundary, nothing it listens to, the
arguments as given), and such a block's wrapper only checks that it is the step's next
block, calls the forward, and keeps what the order checks need (the next block, the
output's storages); an exception aborts the step as the full path does. A block out of
order, or with grad off, takes the full path, which raises or passes it through as before.
Measured there after (tests/benchmarks/fit_block_cost.py): 8-10 us before and 13-17 us
after a middle block.

Note [Fetched buffers die with their last view]
A fetched buffer is held by its _Fetched, which the saved views (_Packed) share; autograd
drops each saved view as its node runs, so the buffer goes with the last node that saved
the storage, as a kept or recomputed tensor goes. The block's list of them (fetched, by
index) is what pack consults for a storage saved again, and pack's closure lives as long
as any of the block's saved tensors: so the list is emptied when the forward ends.
Before, it held every fetched buffer of a block until the block's last node ran. On the
peers' tiny Llama at 55% the MLP's product (1 MiB, offloaded, saved by down_proj alone,
whose backward runs first) stayed alive through the block's whole backward, where the
measuring step (which recomputes it) had seen it freed: the plan's first run peaked 1.05
MB above its prediction, and 1.05 MB lower with the list emptied. The prefetch buffers of
a block not yet unpacked stay with the engine (step.live) until their first unpack.

Note [Recompute under a capture]
A recompute puts back the RNG state its block's forward began with, so that dropout draws
the same masks in the replay: torch.cuda.get_rng_state, which raises during a capture.
A block whose forward draws nothing from the CUDA RNG needs no state: its replay computes
the same whatever the generator holds. So every eager forward of a block the plan
recomputes (the measuring step recomputes every block) compares the CUDA generators'
offsets (Generator.get_offset) before and after it, and remembers whether the block ever
drew. Under a capture a block that never drew is recomputed without a CUDA RNG state; a
plan that recomputes a block that drew, or one no eager forward has shown, is refused at
block 0 with a StashError that names the blocks. (A model in training with dropout 0, as
Hugging Face decoders are by default, draws nothing.) The check costs two offset reads per
recomputing block in eager steps, on CUDA only.
"""

from __future__ import annotations

import weakref
from typing import (Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple,
                    Union, cast)

import torch

from .._engine import KEEP, OFFLOAD, RECOMPUTE, Engine
from .._lib import StashError
from ._boundary import at_backward_end, mark_backward
from ._offload_policy import LayerActions, StepPolicy
from ._offload_replay import BlockReplays
from ._offload_steps import StepTable
from ._offload_streams import EngineStreams
from ._recompute import ForwardState, Frame, Placeholder
from ._saved import SaveOrder, resident_storages
from ._step import (_RECOMPUTE, _Fetched, _GraphToken, _input_keys, _named, _output_storages,
                    _Packed, _Step)


class BlockHooks:
    """The forward wrapper, pack and unpack hooks and block boundaries of an OffloadHandle
    (Note [Offload hooks]), a part the handle owns. It owns what a step is made of: the
    steps in flight (its StepTable), the micro-batch the forwards run as, the engine plan's
    slots, the hooks' error and the CUDA RNG draws (Note [Recompute under a capture]); it
    is handed the rest: the blocks and their actions, where they run, whether any is FSDP2,
    the policy (what the actions are and who listens: Note [The step policy] in
    _offload_policy.py), the engine's side (EngineStreams), the recompute side
    (BlockReplays, Note [Selective recompute] in _offload_replay.py), counts (the handle's
    stats()["hooks"], which it adds to) and warn_once (the handle's). The handle wraps each
    block with wrap(), runs its actions through set_engine_plan and actions, its
    micro-batches through micro_batch, and at close ends the steps in flight (end_steps)."""

    def __init__(self, blocks: Sequence[torch.nn.Module], actions: List[LayerActions],
                 device: torch.device, fsdp: bool, policy: StepPolicy, streams: EngineStreams,
                 replays: BlockReplays, counts: Dict[str, int],
                 warn_once: Callable[[Tuple[object, ...], str], None]) -> None:
        self._blocks = blocks
        # The actions of each block's saved tensors, by index (the handle's set_actions).
        self.actions = actions
        self._device = device
        self._cuda = device.type == "cuda"
        self._fsdp = fsdp
        self._policy = policy  # Note [The step policy] in _offload_policy.py
        self._streams = streams  # the engine's side, a part of the handle's
        self._counts = counts
        self._warn_once = warn_once
        # The recompute side's calls, bound once (the forward and unpack hooks call them).
        self._cuda_rng_devices = replays.cuda_rng_devices
        self._rng_buffer = replays.rng_buffer
        self._input_slots = replays.input_slots
        self._unpack_recomputed = replays.unpack
        self._recompute_kept = replays.kept_input
        # The micro-batch the blocks' forwards run as now (the handle's micro_batch(i)).
        self.micro_batch = 0
        # The steps in flight and how they begin and end (Note [A step that ends early] in
        # _offload_steps.py); its dict, bound once.
        self._table = StepTable(blocks, streams, policy, counts, warn_once,
                                self._capture_starting)
        self._steps = self._table.steps
        # block -> whether an eager forward drew (Note [Recompute under a capture])
        self._draws_cuda_rng: Dict[int, bool] = {}
        self._hook_error: Optional[StashError] = None
        # False while the plan copies nothing: the engine then has no work in a step, and
        # the hooks make no engine call at all (Note [Offload hooks]; set_engine_plan).
        self._engine_active = True
        # Per layer: the engine slot of each plan index that offloads (None elsewhere), or
        # None where slot j is index j (StepPolicy.engine_layer).
        self._engine_slots: List[Optional[List[Optional[int]]]] = []

    @property
    def engine(self) -> Optional[Engine]:
        """stash's prefetch engine, the streams' (None once closed)."""
        return self._streams.engine

    @property
    def copies(self) -> bool:
        """Whether the current actions copy anything (else a step makes no engine call)."""
        return self._engine_active

    @property
    def steps(self) -> Mapping[int, _Step]:
        """The steps in flight by micro-batch: forward run, backward not ended."""
        return self._steps

    def set_engine_plan(self, actions: Sequence[LayerActions]) -> None:
        """Gives the engine the plan for these per-layer actions: offload slots only, and
        no engine call in a step while none copies anything."""
        layers = [self._policy.engine_layer(a) for a in actions]
        assert self.engine is not None
        self.engine.set_plan([plan for plan, _ in layers])
        self._engine_slots = [slots for _, slots in layers]
        # A layer that decides its actions as it goes (not exact) may copy.
        self._engine_active = self._table.engine_active = any(len(plan) > 0
                                                              for plan, _ in layers)

    def end_steps(self) -> None:
        """The handle closes: every step in flight is given back, abandoned (a backward
        through it raises)."""
        self._table.end_all()

    def forget_steps(self) -> None:
        """After the engine closed (which gave every block back)."""
        self._table.forget()

    def _resident(self, step: _Step) -> Any:
        """The storages never listed (parameters and buffers): taken once per step, or, for
        FSDP2 blocks, now (Note [Recompute under FSDP2] in _offload_replay.py)."""
        return resident_storages(self._blocks) if self._fsdp else step.resident

    def _layer_actions(self, i: int) -> LayerActions:
        """The actions of block i's saved tensors, by index (a list; see _MeasureLayer)."""
        return self.actions[i]

    def _capture_starting(self, stream: int) -> None:
        """Block 0 of a step captured on `stream` (Note [Steps under CUDA graphs] in
        _offload_steps.py): refuses a plan that is not final, else the engine joins the
        capture."""
        if any(not getattr(a, "exact", True) for a in self.actions):
            raise StashError(
                f"{self._policy.who}: this step is being captured into a CUDA graph, but its plan "
                "is not final: stash.torch.fit measures the first step of a shape (timed "
                "with events and device syncs, recomputing every block) and checks the "
                "first run of a derived plan, and neither can run under capture. Run steps "
                "eagerly until fit runs its plan (the measuring step, then one planned step: "
                "the warm-up torch.cuda.graph asks for), then capture; a captured step "
                "replays the plan of the last eager step")
        # Note [Recompute under a capture]
        drawing = [i for i, a in enumerate(self.actions) if self._cuda
                   and RECOMPUTE in cast(Iterable[int], a)
                   and self._draws_cuda_rng.get(i, True)]
        if drawing:
            raise StashError(
                f"{self._policy.who}: this step is being captured into a CUDA graph, and its plan "
                f"recomputes block(s) {drawing}, whose eager forward drew from the CUDA RNG "
                "(dropout) or has not run eagerly under this plan: a recompute must restore "
                "the RNG state that forward saw, which torch cannot read during capture "
                "(torch.cuda.get_rng_state). Run the plan eagerly once before capturing, "
                "turn dropout off in the blocks, or raise the budget until the plan "
                "recomputes none of them")
        if self._engine_active:
            self._streams.join_capture(stream)

    # --- forward -------------------------------------------------------------------------

    def wrap(self, i: int, forward: Callable[..., Any]) -> Callable[..., Any]:
        """Block i's `forward` under the hooks: a bare call where the step runs the block
        lean (Note [Lean blocks]), the forward itself with grad off, a closed handle or a
        policy that passes it through, else the hooked forward."""
        steps = self._steps

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            step = steps.get(self.micro_batch)
            if (step is not None and step.lean is not None and step.next_block == i
                    and step.lean[i] and torch.is_grad_enabled()):
                return self._lean_forward(i, step, forward, args, kwargs)
            if not torch.is_grad_enabled() or self.engine is None or self._policy.passes_through():
                return forward(*args, **kwargs)
            args, kwargs = self._policy.call_arguments(i, args, kwargs)
            return self._forward(i, forward, args, kwargs)
        setattr(wrapped, "__wrapped__", forward)
        setattr(wrapped, "_stash_wrapped", True)
        return wrapped

    def _lean_forward(self, i: int, step: _Step, forward: Callable[..., Any],
                      args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """Note [Lean blocks]: block i of `step` as a bare call, in order."""
        self._table.busy += 1
        try:
            out = forward(*args, **kwargs)
        except BaseException as e:
            # Note [A step that ends early] in _offload_steps.py, as _forward_block does.
            if self._steps.get(step.mb) is step:
                self._table.abort(step, f"block {i}'s forward raised {_named(e)}")
            raise
        finally:
            self._table.busy -= 1
        step.next_block = i + 1
        step.last_output = _output_storages(out)
        return out

    def _forward(self, i: int, forward: Callable[..., Any], args: Tuple[Any, ...],
                 kwargs: Dict[str, Any]) -> Any:
        self._table.busy += 1
        try:
            return self._forward_block(i, forward, args, kwargs)
        finally:
            self._table.busy -= 1

    def _forward_block(self, i: int, forward: Callable[..., Any], args: Tuple[Any, ...],
                       kwargs: Dict[str, Any]) -> Any:
        step = self._table.begin(i, self.micro_batch, args, kwargs)
        mb, engine = step.mb, self.engine
        assert engine is not None  # the wrapper runs the hooks only while the handle is open
        self._policy.on_forward_began(i, step)
        if self._engine_active:
            engine.forward_begin(mb, i)
        actions = self._layer_actions(i)
        exact = getattr(actions, "exact", True)  # False: _MeasureLayer (no tensor count)
        n_plan = len(actions)
        slots = self._engine_slots[i] if self._engine_slots else None
        # Note [What it costs]: a layer whose plan keeps everything needs no saved-tensor
        # hooks at all (nothing to number, copy or replace): it runs as plain training.
        plain = self._policy.keeps_everything(i, actions)
        # by index: _Fetched (offload), _RECOMPUTE, or None (the tensor itself)
        fetched: List[object] = []
        order: Optional[SaveOrder] = None
        frame: Optional[Frame] = None
        # (device, CUDA generator offset) before an eager recomputing forward
        offsets: List[Tuple[int, int]] = []
        first_input: Any = None
        if not plain:
            inputs, first_input = _input_keys(args, kwargs)
            order = SaveOrder(self._resident(step), inputs, inputs)
            # Note [Selective recompute]: taken before the block runs (its dropout draws
            # next).
            if RECOMPUTE in cast(Iterable[int], actions):
                # Note [Recompute under a capture]: a captured block draws nothing.
                rng = [] if step.captured else self._cuda_rng_devices(args, kwargs)
                frame = Frame(i, step, forward, ForwardState(rng, self._rng_buffer(mb, i)))
                if rng and self._cuda:
                    offsets = [(d, torch.cuda.default_generators[d].get_offset())
                               for d in rng]
        # Note [The keep path]: what the hook needs, bound once per block.
        # order is set unless plain, and these are used only then (pack does not run in a
        # plain layer).
        see = cast(Callable[[torch.Tensor], Optional[Tuple[int, bool]]],
                   order.see if order is not None else None)
        saves = cast(SaveOrder, order)
        place = frame.place if frame is not None else None
        observed = self._policy.observes_saves
        first_save = self._first_save

        def pack(t: torch.Tensor) -> Any:
            # The pack hook must not reference args or kwargs: torch keeps a saved tensor's
            # pack hook (with its closure) as long as the graph, and the inputs would live
            # as long.
            try:
                seen = see(t)
                if seen is None:
                    if place is not None:
                        place(None)
                    return t
                j, first = seen
                pos = None if place is None else place(
                    (j, first, t.dtype, t.shape, t.device))
                if first:  # order holds t until the forward ends (Note [Offload hooks])
                    if j >= n_plan:
                        if exact:
                            during = (", during a CUDA graph capture" if step.captured
                                      else "")
                            raise StashError(f"stash.torch.offload: block {i} saves more "
                                             f"than the {n_plan} tensors the plan lists for "
                                             f"layer {i} (the first beyond them: "
                                             f"{tuple(t.shape)} {t.dtype} on {t.device}"
                                             f"{during})")
                        action = RECOMPUTE
                    else:
                        action = actions[j]
                    if action == KEEP and not observed:  # Note [The keep path]
                        fetched.append(None)
                        return t if t.is_leaf else t.detach()  # Note [The keep path]
                    f = first_save(i, j, t, action, step, saves, slots, first_input)
                    fetched.append(f)
                else:
                    f = fetched[j]
                if f is None:
                    return t if t.is_leaf else t.detach()  # Note [The keep path]
                if f is _RECOMPUTE:  # only a layer that recomputes has a frame and places
                    return cast(Frame, frame).placeholder(cast(int, pos))
                return _Packed(cast(_Fetched, f), t)
            except StashError as e:
                # torch reports an exception of a pack hook as a RuntimeError; _forward
                # raises this one instead.
                self._hook_error = e
                raise

        try:
            try:
                if plain:
                    out = forward(*args, **kwargs)
                else:
                    with torch.autograd.graph.saved_tensors_hooks(pack, self.unpack):
                        out = forward(*args, **kwargs)
                if exact and not plain and len(saves) != n_plan:
                    raise StashError(f"stash.torch.offload: block {i} saved {len(saves)} "
                                     f"tensors, but the plan lists {n_plan} for layer {i}; make "
                                     "the plan from this model's record pass "
                                     "(stash.torch.record)")
                if not plain:
                    self._counts["keep_count"] += fetched.count(None)
                if offsets:
                    self._draws_cuda_rng[i] = self._draws_cuda_rng.get(i, False) or any(
                        torch.cuda.default_generators[d].get_offset() != o
                        for d, o in offsets)
                if frame is not None and frame.wanted:
                    frame.args, frame.kwargs = self._input_slots(args, kwargs, saves, fetched)
                self._policy.on_forward_ended(i, step, order)
                if self._engine_active:
                    engine.forward_end(mb, i)
            except RuntimeError as e:
                error, self._hook_error = self._hook_error, None
                if error is not None:
                    raise error from e
                raise
            finally:
                if order is not None:
                    order.release()
                # Note [Fetched buffers die with their last view]: pack's closure lives as
                # long as any of the block's saved tensors; the list must not.
                fetched.clear()
        except BaseException as e:
            # Note [A step that ends early] in _offload_steps.py: whatever raised (the
            # block, a hook, an interrupt, an out-of-memory error), the step is given back
            # now.
            if self._steps.get(mb) is step:
                self._table.abort(step, f"block {i}'s forward raised {_named(e)}")
            raise
        step.next_block = i + 1
        step.last_output = _output_storages(out)
        self._policy.on_forward_released(i, step)
        if not self._policy.needs_boundary(i, plain):
            return out
        # The boundaries hold the token (Note [A step that ends early] in _offload_steps.py).
        token = (step.token if step.token is not None
                 else cast("weakref.ref[_GraphToken]", step.token_ref)())

        def boundary(token: Optional[_GraphToken] = token) -> None:
            self._backward_boundary(step, i)
        return mark_backward(out, boundary,
                             on_marked=(None if step.token is None
                                        else lambda: self._table.graph_holds_token(step)))

    def _first_save(self, i: int, j: int, t: torch.Tensor, action: int, step: _Step,
                    order: SaveOrder, slots: Optional[List[Optional[int]]],
                    first_input: Any) -> Optional[object]:
        """Block i saved a new storage, index j, whose plan action is `action`: what its
        saves are packed as (None: the tensor itself; _RECOMPUTE; or its _Fetched)."""
        nbytes = order.size(j)
        if action == RECOMPUTE and not order.recomputable(j):
            chosen = self._policy.unrecomputable_action(i, j, t, nbytes, first_input)
            if chosen is None:
                self._recompute_kept(i, j, nbytes)
                chosen = KEEP
            action = chosen
        if action == OFFLOAD and (t.device != self._device or t.layout != torch.strided):
            # A host scalar in a CUDA model, a sparse tensor: nothing to copy.
            self._counts["not_on_device_count"] += 1
            self._policy.on_saved(i, j, t, nbytes, KEEP)
            return None
        self._policy.on_saved(i, j, t, nbytes, action)
        if action == OFFLOAD:  # the only tensors the engine sees (Note [Offload hooks])
            slot = j if slots is None else slots[j]
            assert slot is not None  # an offload index has an engine slot
            key = (step.mb, i, slot)
            self._streams.hand_over(step, key, order.keys[j], nbytes, t)
            return _Fetched(step, key, j)
        if action == RECOMPUTE:
            self._counts["recompute_count"] += 1
            self._counts["recompute_bytes"] += nbytes
            return _RECOMPUTE
        return None

    # --- backward ------------------------------------------------------------------------

    def unpack(self, packed: Union[torch.Tensor, Placeholder, _Packed]) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        if isinstance(packed, Placeholder):
            return self._unpack_recomputed(packed)
        flat = self._streams.fetch(packed.fetched)
        return flat.view(packed.dtype).as_strided(packed.size, packed.stride, packed.offset)

    # --- block boundaries ----------------------------------------------------------------

    def _backward_boundary(self, step: _Step, i: int) -> None:
        # Raised here rather than in the unpack hook: torch passes an exception of an
        # autograd.Function's backward through as it is, one of a hook as a RuntimeError.
        if step.abandoned:
            raise StashError(
                f"stash.torch.offload: this backward belongs to a forward of micro-batch "
                f"{step.mb} that a later forward of the same micro-batch replaced (its "
                "offloaded tensors are gone); use handle.micro_batch(i) for forwards that "
                "wait for their backward")
        if self.engine is None:
            raise StashError("stash.torch.offload: backward after the handle was closed; the "
                             "offloaded tensors of its forward are gone")
        if not step.backward_started:
            step.backward_started = True
            at_backward_end(lambda: self._table.finish_backward(step))
        if step.backward_open is not None and self._engine_active:
            self.engine.backward_end(step.mb, step.backward_open)
        self._policy.on_backward_began(step, i)
        if self._engine_active:
            self.engine.backward_begin(step.mb, i)
        step.backward_open = i

