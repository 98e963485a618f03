"""stash.torch.fit: budget mode. One call measures the model during the user's own first
training step, plans in process through the C API, and applies the plan from the next
step on, re-planning from a cache when the blocks' inputs change shape.
"""

from __future__ import annotations

import contextlib
import os
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Literal,
                    NoReturn, Optional, Sequence, Tuple, Union)

import torch

from .._engine import KEEP, OFFLOAD, Engine
from .._lib import StashError
from .._link import cached_link
from ._clock import _Clock
from ._fit_support import (MEASURE_SLOTS, MIN_OFFLOAD_BYTES, _allocator_state, _checked_blocks,
                           _gib, _MeasureLayer, _model_digest,
                           _optimizer_state_estimate, _tensor_bytes)
from ._fit_options import Budget, FitOptions
from ._fit_shape_plans import ShapePlans
from ._fit_bytes import TrainingBytes
from ._fit_cache import ShapeCache
from ._fit_calls import BlockCalls
from ._fit_cuda_meter import CudaMeter
from ._fit_passes import StepStarts
from ._fit_plan import link_section, warn_closed
from ._fit_measure import MeasuringRecorder
from ._fit_ranks import Ranks, link_across_ranks
from ._fit_report import fit_report, format_report
from ._fit_steps import Description, StepBook
from ._offload import OffloadHandle, _compiled_block
from ._offload_policy import EngineLayer, LayerActions, StepPolicy, offload_slots
from ._compiled import CompiledState
from ._compiled_fit import compiled_meter, fit_compiled_state
from ._cpu_meter import window as cpu_window
from . import _record
from ._recompute import Frame, Replay
from ._saved import SaveOrder, storage_of
from ._step import _Step

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

# _record.py is not under strict mypy yet (issue 22): its two readers as fit calls them.
_device_info: Callable[[torch.device], Dict[str, Any]] = _record._device_info
_pinnable_bytes: Callable[[], int] = _record._pinnable_bytes

__all__ = ["BudgetHandle"]


class BudgetHandle(StepPolicy):
    """Returned by :func:`fit`; see there. A context manager: leaving it closes.

    It owns an OffloadHandle, made with itself as the step policy (Note [The step policy] in
    _offload_policy.py): the hooks carry out the actions this handle chooses per step and
    tell it what the step does; the on_* methods and the questions above them are that
    seam's, called by the hooks, not by the training loop. They decide where a step begins
    and ends and how it runs: StepStarts (_fit_passes.py) where a step or a further pass
    begins and the actions its blocks run under; the StepBook (_fit_steps.py) keeps each
    step's record and figures, which report() gives."""

    who = "stash.torch.fit"
    observes_saves = True  # every new storage is recorded or sampled (Note [What it costs])

    def __init__(self, blocks: Iterable[torch.nn.Module], budget: Union[int, str, Budget], *,
                 optimizer: Optional[torch.optim.Optimizer] = None,
                 options: FitOptions = FitOptions()) -> None:
        self.budget = Budget.parse(budget)
        self.options = options
        if optimizer is not None and not all(
                hasattr(optimizer, a) for a in ("step", "param_groups", "state")):
            raise StashError(f"stash.torch.fit: optimizer must be a torch.optim.Optimizer (its "
                             f"state is counted and its step() ends a step); got "
                             f"{type(optimizer).__name__}")
        blocks = _checked_blocks(blocks)  # a list from here on
        self.optimizer = optimizer
        self._n = len(blocks)
        # Note [A compiled block's saved tensors in the CPU meter's window] in
        # _fit_measure.py: per block compiled with torch.compile, the bytes it saved in
        # the running forward (None: an eager block).
        self._packed: List[Optional[int]] = [0 if _compiled_block(b) else None for b in blocks]
        self._digest = _model_digest(blocks)
        params = _tensor_bytes(p for b in blocks for p in b.parameters())
        grads = _tensor_bytes(p for b in blocks for p in b.parameters() if p.requires_grad)
        nbytes = self.budget.nbytes
        if nbytes is not None and nbytes < params + grads:
            raise StashError(
                f"stash.torch.fit: budget {_gib(nbytes)} is below the blocks' "
                f"parameters and gradients alone ({_gib(params + grads)}); no plan can meet it")
        # State before the OffloadHandle, which asks initial_actions and compiled_state.
        self._bytes = TrainingBytes(blocks, optimizer)  # what is not an activation
        # Note [Agreeing on a plan across ranks]: None outside torch.distributed.
        self._ranks = Ranks.current(options.dist_timeout_s)
        self._plans = ShapePlans(
            ShapeCache(options.cache_dir, self._digest, self.budget, options.solver),
            self.budget, options, self._ranks, self._fail, self._bytes.fixed_counted)
        self._starts = StepStarts(blocks, optimizer, self._plans, self._bytes, self._ranks)
        self._offload = OffloadHandle(blocks, None, policy=self, **options.engine_kwargs())
        self._cuda = self._offload.cuda
        self._calls = BlockCalls(self._offload.blocks, self._offload.warn_once)
        # Note [The CPU allocator's meter] in _meter.py: None on CUDA, or where it cannot be
        # built (fit then counts the storages it tracks).
        self._counting = None if self._cuda else cpu_window()
        self._recorder = MeasuringRecorder(self._n, self._counting, self._bytes.state)
        pool = self._cuda and getattr(_allocator_state(), "installed", False)
        self._cuda_meter = CudaMeter(self.device, pool) if self._cuda else None
        self._book = StepBook(blocks, optimizer, clock=_Clock(self._cuda),
                              recorder=self._recorder, training=self._bytes, plans=self._plans,
                              copies=self._offload, cuda_meter=self._cuda_meter,
                              counting=self._counting, describe=self._describe)
        self._starts.attach(self._offload, self._book, self._recorder)
        self._opt_hook: Optional[Tuple[RemovableHandle, RemovableHandle]] = None
        self.link_cached = False
        try:
            # Measured now, before the training step allocates anything, and once per
            # machine (cached): it needs free device memory for its buffers.
            self._link_section = self._link()
        except BaseException:
            self._offload.close()
            raise
        if optimizer is not None and hasattr(optimizer, "register_step_post_hook"):
            self._opt_hook = (optimizer.register_step_pre_hook(self._before_optimizer_step),
                              optimizer.register_step_post_hook(self._after_optimizer_step))

    # --- the step policy's questions (Note [The step policy] in _offload_policy.py) ----------

    def initial_actions(self, n_blocks: int) -> Optional[List[LayerActions]]:
        return [_MeasureLayer() for _ in range(n_blocks)]

    def engine_layer(self, actions: LayerActions) -> EngineLayer:
        # Note [The measuring step] in _fit_measure.py: which index is offloaded is known
        # only as the block saves it, so engine slot j is index j.
        if isinstance(actions, _MeasureLayer):
            return [OFFLOAD] * MEASURE_SLOTS, None
        return offload_slots(actions)

    def unrecomputable_action(self, i: int, j: int, t: torch.Tensor, nbytes: int,
                              first_input: Any) -> Optional[int]:
        rec = self._book.running
        if self._starts.mode != "measure" and rec is not None and rec.checking:
            # Note [A derived plan's first run] in _fit_shape_plans.py: the skeleton was not
            # this shape's.
            rec.check = (f"block {i} tensor {j} is not recomputable in this shape (the "
                         "derived skeleton differs)")
            return KEEP
        if self._starts.mode != "measure":
            return None  # the hooks keep it, counted, with a warning
        # Note [The measuring step] in _fit_measure.py: the hidden-state input is
        # offloaded, the rest kept.
        if (first_input is not None and first_input == storage_of(t)[0]
                and nbytes >= MIN_OFFLOAD_BYTES and j < MEASURE_SLOTS and i < self._n - 1
                and t.device == self.device and self._recorder.holder(i, t) is None):
            return OFFLOAD
        return KEEP

    def keeps_everything(self, i: int, actions: LayerActions) -> bool:
        # Note [What it costs]: a measured plan's layer that keeps every tensor.
        return self._starts.keeps_everything(actions)

    def needs_boundary(self, i: int, plain: bool) -> bool:
        # Note [What it costs]: in a planned step that copies nothing, a block run without
        # hooks needs no boundary (no per-block marks, nothing to prefetch or check), but
        # the last block's: it starts the step's backward, queues its end and holds the
        # step's token (Note [A step that ends early] in _offload_steps.py).
        return not (plain and not self._offload.copies and i != self._n - 1
                    and self._starts.mode == "plan")

    def lean_blocks(self) -> Optional[Sequence[bool]]:
        # Note [Lean blocks] in _offload_hooks.py: a planned step that tracks nothing and
        # hands the blocks their arguments as they are sees nothing of a plain middle
        # block (on_forward_began/ended/released mark, sample or read only in a measuring
        # step, while tracking, or at the last block).
        lean = self._starts.lean  # None outside a plan
        if lean is None or self._recorder.tracking or self._calls.kv_cache:
            return None
        return lean

    def passes_through(self) -> bool:
        # Blocks in eval mode (an eval loop, with or without grad) run as plain forwards:
        # fit plans training steps, and an eval forward is none (Note [The loops fit lives
        # in]).
        return not self.blocks[0].training

    def call_arguments(self, i: int, args: Tuple[Any, ...], kwargs: Dict[str, Any]
                       ) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        # Note [The loops fit lives in] in _fit_api.py: a key/value cache off,
        # checkpointing off or refused.
        return self._calls.arguments(i, args, kwargs, self._starts.mode == "measure")

    # --- what the hooks tell ---------------------------------------------------------------

    def on_step_starting(self, mb: int, args: Tuple[Any, ...], kwargs: Dict[str, Any]
                         ) -> None:
        # Note [Micro-batches of other shapes] in _fit_passes.py
        self._starts.starting(mb, args, kwargs)

    def on_step_aborted(self, step: _Step, reason: str) -> None:
        rec = self._book.running
        if rec is not None and not rec.finished and rec.aborted is None:
            self._book.abort(rec, f"micro-batch {step.mb}: {reason}")

    def on_forward_began(self, i: int, step: _Step) -> None:
        if self._packed[i]:  # a forward that raised before its end
            self._packed[i] = 0
        self._book.forward_began(i, step.serial)

    def on_saved(self, i: int, j: int, t: torch.Tensor, nbytes: int, action: int) -> None:
        rec = self._book.running
        if rec is None:
            return
        if rec.checking and rec.passes == 1:
            rec.saved_counts[i] = max(rec.saved_counts.get(i, 0), j + 1)
        if self._starts.mode == "measure":
            self._recorder.saved(i, j, t, nbytes, action,
                                 first_micro_batch=self._offload.micro_batch_index == 0)
        if self._recorder.tracking:
            self._recorder.track(t, nbytes)
            packed = self._packed[i]
            if packed is None:
                self._book.sample(f"forward[{i}]")
            else:  # sampled once its forward ends, with these in the window
                self._packed[i] = packed + nbytes

    def on_forward_ended(self, i: int, step: _Step, order: Optional[SaveOrder]) -> None:
        rec = self._book.running
        self._book.forward_ended(i, step.serial)
        if (rec is not None and rec.mode == "measure" and self._starts.mode == "measure"
                and self._offload.micro_batch_index == 0):
            assert order is not None  # a measuring step hooks every block
            self._recorder.forward_ended(i, order.entries)
        if self._recorder.tracking:  # Note [What it costs]: no sample to build otherwise
            held = self._packed[i] or 0
            if held:
                self._packed[i] = 0
            self._book.sample(f"forward[{i}]",
                              after=("loss",) if i == self._n - 1 else ("fwd", i), held=held)
        if (self._cuda_meter is not None and rec is not None and i == self._n - 1
                and not step.captured):
            # Note [The measuring step's windows on CUDA] in _fit_cuda_meter.py
            self._cuda_meter.blocks_ended(rec)

    def on_forward_released(self, i: int, step: _Step) -> None:
        # Note [What the budget counts] in _fit_steps.py: a window of its own from here, so
        # that what the step holds after the block's recompute storages went (the loss's
        # temporaries, after the last block) is measured against what is tracked then.
        rec = self._book.running
        if (rec is not None and rec.mode == "measure" and self._starts.mode == "measure"
                and self._offload.micro_batch_index == 0):
            self._recorder.forward_released(i)
        if self._recorder.tracking:
            self._book.sample(f"forward[{i}] released")

    def on_backward_began(self, step: _Step, i: int) -> None:
        rec = self._book.running
        if rec is None:
            return
        self._book.backward_began(i, step.serial, step.backward_open)
        if self._recorder.tracking:
            self._book.sample(f"backward[{i}]", after=("bwd", i))
        if self._cuda_meter is not None and i == self._n - 1:
            # Note [The measuring step's windows on CUDA] in _fit_cuda_meter.py
            self._cuda_meter.loss_ended(rec)

    def on_backward_finished(self, step: _Step) -> None:
        # Every micro-batch's backward has ended when no step holds tensors.
        self._book.backward_finished(step.serial, last=not self._offload.steps_in_flight)

    def on_replay_began(self, frame: Frame) -> None:
        self._book.replay_began(frame.layer, frame.step.serial)

    def on_replay_saved(self, frame: Frame, pos: int, seen: Optional[Tuple[int, bool]],
                        t: torch.Tensor) -> None:
        if seen is not None and seen[1]:  # a recomputable tensor's first save
            self._book.replay_saved(frame.layer, frame.step.serial, seen[0], t)

    def on_replay_ended(self, frame: Frame, replay: Replay) -> None:
        self._book.replay_ended(frame.layer, frame.step.serial)

    def on_buffer_allocated(self, buf: torch.Tensor, nbytes: int) -> None:
        if self._recorder.tracking:
            self._recorder.track(buf, nbytes)
            self._book.sample("prefetch")

    @property
    def budget_bytes(self) -> Optional[int]:
        """The budget in bytes of the current shape: as given, or a share resolved once the
        shape has a plan (Note [What a share budget means])."""
        return self._plans.budget_bytes

    # --- planning (_fit_plan.py's functions, handed what they need) ----------------------

    def _link(self) -> Dict[str, Any]:
        def measure() -> Dict[str, Any]:
            dev = self.device.index if self._cuda else 0
            name = f"{_device_info(self.device)['name']}-{dev}"
            nbytes = 0 if self._cuda else 64 << 20
            if self._ranks is not None:
                link, self._link_windows = link_across_ranks(self._ranks, name, dev, nbytes,
                                                             self.options.cache_dir)
                return link
            return cached_link(name, dev, nbytes, 0, self.options.cache_dir)

        link = link_section(self.options.link, measure=measure, local_ranks=(
            self._ranks.local_world if self._ranks is not None else 1))
        self.link_cached = link.pop("cached", False)
        return link

    def compiled_state(self, handle: OffloadHandle) -> Optional[CompiledState]:
        # Note [Planning the compiled graph] in _compiled.py. Asked while `handle` (this
        # handle's OffloadHandle) is made: the meter's closures run only later.
        meter, segment = compiled_meter(lambda: self._cuda_meter, lambda: self._counting,
                                        self._bytes.alive)
        opt = self.optimizer
        state = fit_compiled_state(
            handle.blocks, budget=self.budget, solver=self.options.solver,
            describe=self._describe,
            meter=meter, segment=segment, clock=_Clock(handle.cuda),
            counted=self._bytes.fixed_counted, refused=self.close,
            gradients=self._bytes.gradients_alive, grouped=opt is not None,
            missing=lambda: (_optimizer_state_estimate(opt)
                             if opt is not None and not len(opt.state) else 0))
        # Note [Offload in the compiled graph] in _compiled_offload.py
        state.moves = handle.compiled_moves(state.id)
        return state

    def _describe(self) -> Description:
        """A profile's device, link and host sections (the link measured at fit())."""
        return (_device_info(self.device), self._link_section,
                {"pinnable_bytes": _pinnable_bytes()})

    def _fail(self, error: StashError) -> NoReturn:
        # Nothing here keeps `error`: its traceback holds the loop's frames, and through
        # their tensors' autograd graph stash's hooks, this handle and the model, a cycle
        # the garbage collector cannot see (test_a_refused_budget_lets_the_model_go).
        ranks = getattr(self, "_ranks", None)
        if ranks is not None:
            ranks.fail(str(error))  # every other rank raises with it
        self.close()
        warn_closed(error)
        raise error

    def _before_optimizer_step(self, opt: torch.optim.Optimizer, args: Tuple[Any, ...],
                               kwargs: Dict[str, Any]) -> None:
        # step(closure): the closure runs a forward and backward inside step() (Lightning
        # does so for every step), so a forward from here on is the step's, not a sign
        # that the step raised (Note [A step that ends early]).
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args[0]: opt
        if closure is None:
            self._book.optimizer_begins()

    def _after_optimizer_step(self, opt: torch.optim.Optimizer, *_: Any) -> None:
        compiled = self._offload.compiled_state
        if compiled is not None:
            compiled.optimizer_stepped()
        self._book.optimizer_stepped()
        # Note [What the budget counts] in _fit_steps.py: the optimizer's real state, once
        # it exists.
        counted = self._book.optimizer_state_counted
        if counted is not None:
            real = self._plans.optimizer_stepped(opt, counted)
            if real is not None:
                self._book.optimizer_state_counted = real

    # --- public ---------------------------------------------------------------------------

    def report(self) -> Dict[str, Any]:
        """The budget, one entry per finished step (measured and predicted peak and step
        time, exposed copy time, mode, its shape's budget in bytes; an aborted step says
        why), the plan's summary and how it was measured (_fit_report.fit_report)."""
        records = self._book.settled()
        compiled = self._offload.compiled_state
        if compiled is not None and compiled.steps and not records:
            # Note [Planning the compiled graph] in _compiled.py: the steps ran compiled.
            nbytes = self.budget.nbytes if self.budget.nbytes is not None else (
                int(compiled.figures["budget_bytes"]) if compiled.figures else None)
            r = fit_report([], {"profile": compiled.profile, "plan": compiled.plan},
                           self.budget, nbytes, timing="host-clock (compiled ticks)",
                           meter=self._book.meter, ranks=self._ranks)
            r["steps"] = compiled.step_entries(nbytes)
            return r
        return fit_report(records, self._plans.entry, self.budget, self.budget_bytes,
                          timing=self._book.timing, meter=self._book.meter, ranks=self._ranks)

    def format_report(self) -> str:
        """report() as the table the README shows."""
        return format_report(self.report())

    @property
    def plan(self) -> Optional[Dict[str, Any]]:
        """The stash.plan/1 document for the current shape (None until one was made)."""
        self._book.settle()
        e = self._plans.entry
        return e.get("plan") if e else None

    @property
    def profile(self) -> Optional[Dict[str, Any]]:
        """The stash.profile/1 measured (or read from cache_dir) for the current shape."""
        self._book.settle()
        e = self._plans.entry
        return e.get("profile") if e else None

    def close(self) -> None:
        """Restores the blocks exactly and frees the engine (OffloadHandle.close)."""
        # getattr: a handle whose __init__ stopped part-way may lack them.
        counting = getattr(self, "_counting", None)
        if counting is not None:
            counting.close()
        hooks = getattr(self, "_opt_hook", None)
        if hooks is not None:
            for hook in hooks:
                hook.remove()
            self._opt_hook = None
        offload = getattr(self, "_offload", None)
        if offload is not None:
            offload.close()
        calls = getattr(self, "_calls", None)
        if calls is not None:
            calls.restore()

    # --- the OffloadHandle's public face, as fit's ------------------------------------------

    @property
    def blocks(self) -> List[torch.nn.Module]:
        """The blocks, in order."""
        return self._offload.blocks

    @property
    def device(self) -> torch.device:
        """Where the blocks' activations live."""
        return self._offload.device

    @property
    def engine(self) -> Optional[Engine]:
        """stash's prefetch engine (None once closed)."""
        return self._offload.engine

    @contextlib.contextmanager
    def micro_batch(self, index: int) -> Iterator[BudgetHandle]:
        """Runs the blocks' forwards inside as micro-batch `index` (OffloadHandle.micro_batch):
        several micro-batches may run their forwards before their backwards."""
        with self._offload.micro_batch(index):
            yield self

    def stats(self) -> Dict[str, Any]:
        """The engine's and the hooks' statistics (OffloadHandle.stats)."""
        return self._offload.stats()

    def overlap(self) -> Dict[str, Any]:
        """Copy, hidden and exposed milliseconds, in total and per layer (needs timing)."""
        return self._offload.overlap()

    def write_trace(self, path: Union[str, os.PathLike[str]]) -> None:
        """Writes the engine's Chrome/Perfetto trace (needs timing, fit's default)."""
        self._offload.write_trace(path)

    def synchronize(self) -> None:
        """Waits for the engine's copies and gives back the storages they read."""
        self._offload.synchronize()

    def release_graphs(self) -> int:
        """Gives back the pinned blocks of the CUDA graphs captured through this handle's
        steps, which will not be replayed again (OffloadHandle.release_graphs); their bytes."""
        return self._offload.release_graphs()

    def __enter__(self) -> BudgetHandle:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False
