"""stash.torch.fit's step starts: whether block 0's forward begins a step or a further pass
of the running one (Note [The loops fit lives in] in _fit_api.py), the shape it runs,
and the actions the blocks then run under (the mode, the layers kept whole, the blocks
run lean).

Note [Micro-batches of other shapes]
Gradient accumulation over batches padded each to its own longest sequence (a Hugging
Face Trainer with a padding collator and gradient_accumulation_steps) gives one optimizer
step passes of different shapes. Each pass after the first, where no micro-batch holds
tensors (not in flight), runs its own shape's plan: cached, or derived from the measured
shapes with the gradients alive (ShapePlans.choose). Before this every pass ran the
first's plan: a Qwen3 in a Trainer at "70%" ran 4 of its 6 steps over the budget, one by
36%, when a longer micro-batch followed a shorter one. A pass with no plan (its shape not
measured, none to derive it from; a later pass cannot be a measuring step) runs at least
memory on the skeleton of the pass before, as a derived plan runs (its layers
_DerivedLayer). So does a pass whose shape no plan fits at the budget: refused there, in
the middle of a step whose earlier passes ran, it stopped training (a Qwen2 under bf16
autocast at "60%", lengths 24-200 in threes); the refusal is the record's check and a
warning, and a step that begins with that shape is refused before it runs
(ShapePlans.choose_for_pass). Such a step is judged against the largest of its passes'
budgets (a share of a shape with no plan yet is resolved when it has one, for report())
and checks no plan (_fit_steps.StepBook._mixed_figures); on the CPU its peak is the c10
meter's over the whole step, as for any step (Note [A later pass on the CPU meter] in
_fit_steps.py). Across ranks a
later pass keeps the step's plan, as before: choosing a plan there is agreed by every
rank, whose micro-batches need not have the same lengths (not built).

Note [A longer micro-batch in flight]
A micro-batch whose forward begins while others hold tensors (handle.micro_batch(i), the
forwards before the backwards) runs the step's plan: the engine takes a new plan only
where no micro-batch holds tensors. With lengths drawn per micro-batch, a later one can
be longer than the shape that plan was made for, and its saved tensors grow past what the
plan priced: two Mistral micro-batches of 52 and 119 tokens a row at "80%" read 19.54 MB
against a 17.84 MB budget. Such a micro-batch now runs a variant of the plan for itself
and the ones after it in the step: every tensor the profile marks recomputable (and not
must_keep) recomputed, every offload where the plan has it, so that the engine's offload
slots stay as they are (OffloadHandle.set_hook_actions refuses any other change); the
hooks read a block's actions as its forward begins and the micro-batches before keep
theirs. The next step begins with the plan again. One warning says how to avoid it (the
longest micro-batch first, or buckets). The same step read 13.82 MB after, and [37, 64],
within before (15.21 MB), 11.69: a longer micro-batch pays recompute even where the plan
had room, since what the plan left free is not known while the step runs.

Note [What it costs]
A planned step should cost what its plan costs and no more. So, outside measuring steps:
fit takes no per-block marks (only the step's start and end), tracks no storage (the
meter is the allocator's), hands the engine only the tensors it copies (as OffloadHandle
does: Note [Offload hooks] in _offload_hooks.py), makes no engine call at all while the
plan copies nothing (not even for the report's exposed copy time), and runs a layer whose
plan keeps everything without saved-tensor hooks, as plain training. The measuring step
keeps every mark and sample: its times and bytes are the plan's inputs. The engine's own
timing events (fit(timing=True), the default) are recorded in every step that copies:
the report's exposed copy time and write_trace read them. What a step counts at its
start (the gradients and optimizer state alive, for the CPU meter's base) is counted
once; the parameter list is kept between steps; the optimizer's state is counted again
only when it changes shape (_fit_support._optimizer_state_bytes), and a shape's key is
hashed once. A
block that runs without hooks in a step that copies nothing has no backward boundary but
the last block's (Note [Backward boundaries by a tensor hook] in _boundary.py says what a
boundary costs), and the middle ones run as bare calls (Note [Lean blocks] in
_offload_hooks.py). On the CPU peers' tiny Llama, a keep-everything plan cost 4% over plain
training before these, 1.2-1.7% after (BENCHMARKS.md): most of what is left is the step's
start at block 0 (about 270 us) and the last block's boundary (about 180 us).
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch

from .._engine import KEEP, OFFLOAD, RECOMPUTE
from .._warn import warn
from ._fit_bytes import TrainingBytes
from ._fit_measure import MeasuringRecorder
from ._fit_ranks import Ranks
from ._fit_shape_plans import ShapePlans
from ._fit_shapes import bucket_shape, shape_family, shape_tokens
from ._fit_steps import StepBook
from ._fit_support import StepRecord, _DerivedLayer, _MeasureLayer, _signature
from ._offload import OffloadHandle
from ._offload_policy import LayerActions
from ._saved import tensors_in


class StepStarts:
    """The start of each step and pass, and the actions the blocks run under from there.
    Made before the OffloadHandle, whose policy asks keeps_everything and the mode while it
    is made; handed the handle and the step book once they exist (attach)."""

    def __init__(self, blocks: List[torch.nn.Module],
                 optimizer: Optional[torch.optim.Optimizer], plans: ShapePlans,
                 training: TrainingBytes, ranks: Optional[Ranks]) -> None:
        self.blocks = blocks
        self.optimizer = optimizer
        self._n = len(blocks)
        self._plans = plans
        self._bytes = training
        self._ranks = ranks
        self.mode = "measure"
        self.plain_layers: Set[int] = set()  # ids of a plan's layers that keep everything
        self.lean: Optional[List[bool]] = None  # Note [Lean blocks]; None outside a plan
        self._offload: Optional[OffloadHandle] = None
        self._book: Optional[StepBook] = None
        self._recorder: Optional[MeasuringRecorder] = None
        self._buckets: Dict[str, Optional[str]] = {}  # shape key -> its bucket's key

    def attach(self, offload: OffloadHandle, book: StepBook,
               recorder: MeasuringRecorder) -> None:
        self._offload, self._book, self._recorder = offload, book, recorder

    def keeps_everything(self, actions: LayerActions) -> bool:
        """Note [What it costs]: a measured plan's layer that keeps every
        tensor."""
        return (self.mode == "plan" and getattr(actions, "exact", True)
                and id(actions) in self.plain_layers)

    def starting(self, mb: int, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        """Block 0's forward of micro-batch `mb` begins (the step policy's
        on_step_starting)."""
        book, offload = self._book, self._offload
        assert book is not None and offload is not None  # attached before any forward
        rec = book.running
        in_flight = offload.steps_in_flight
        if (rec is not None and not rec.finished and rec.aborted is None
                and rec.optimizer_began and rec.end is None):
            # Note [A step that ends early] in _offload_steps.py: its optimizer step raised.
            book.abort(rec, "optimizer.step() raised")
        grads: Optional[int] = None  # the gradient bytes alive, where known already
        if (rec is not None and not rec.finished and rec.aborted is None and mb == 0
                and rec.backward_done and not in_flight and rec.end is None
                and rec.made_gradients and not self._bytes.any_gradient()):
            # Note [The loops fit lives in] in _fit_api.py: the loop dropped the step's
            # gradients; the step ends where its backward did, and this forward begins the
            # next one (with none alive: not walked again).
            rec.end = rec.bwd_end
            grads = 0
        # A further forward of the running step: another micro-batch, a forward of micro-
        # batch 0 before the others' backwards, or (with the optimizer known) any forward
        # before its step(). The plan can change only where no micro-batch holds tensors.
        if rec is not None and not rec.finished and rec.aborted is None and (
                mb != 0 or not rec.backward_done or in_flight
                or (self.optimizer is not None and rec.end is None)):
            rec.passes += 1
            if in_flight:  # Note [Micro-batches in flight] in _fit_plan.py
                rec.in_flight = max(rec.in_flight, in_flight + 1)
                # It runs the step's plan, and counts as the shape of the pass before.
                rec.pass_keys.append(rec.pass_keys[-1])
                self._longer_in_flight(mb, args)
                return
            book.pass_begins(rec)  # Note [A later pass on the CPU meter] in _fit_steps.py
            self._pass_begins(rec, args, kwargs)
            return
        key, inputs = self._shape_key(args, kwargs)
        self._begin_step(key, inputs, grads, self._bucket_of(key, args))

    def _longer_in_flight(self, mb: int, args: Tuple[Any, ...]) -> None:
        """Note [A longer micro-batch in flight]: micro-batch `mb` begins while others hold
        tensors, with more tokens than the running plan was made for."""
        offload = self._offload
        entry = self._plans.entry
        if (offload is None or self.mode != "plan" or entry is None or "profile" not in entry
                or self._plans.key is None):
            return
        tokens = shape_tokens(args)
        planned = self._plans.shapes.get(self._plans.key, ("", None))[1]
        if tokens is None or planned is None or tokens <= planned:
            return
        offload.set_hook_actions(_least_memory(entry["profile"], offload.actions))
        self.plain_layers, self.lean = set(), None
        offload.warn_once(("longer-in-flight",), (
            f"micro-batch {mb} ({tokens} tokens) began while others held tensors, longer "
            f"than the running plan's shape ({planned} tokens): it recomputes all it can; "
            "run the longest micro-batch first, or use fit(buckets=...)"))

    def _shape_key(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]
                   ) -> Tuple[str, List[torch.Tensor]]:
        """Block 0's shape key (Note [Re-planning and the cache] in _fit_shape_plans.py)
        and its tensor arguments."""
        training = self.blocks[0].training
        inputs = list(tensors_in((args, kwargs)))
        key = _signature(inputs, kwargs, training)
        shapes = self._plans.shapes
        if key not in shapes:
            shapes[key] = (shape_family(args, kwargs, training), shape_tokens(args))
        return key, inputs

    def _bucket_of(self, key: str, args: Tuple[Any, ...]) -> Optional[str]:
        """Note [Lengths rounded up to a bucket] in _fit_shapes.py: the key of the bucket a
        step of shape `key` runs the plan of, or None (its own shape's)."""
        buckets = self._plans.options.buckets
        if buckets is None or self._ranks is not None:
            return None
        if key in self._buckets:
            return self._buckets[key]
        found = bucket_shape(args, self._plans.shapes[key][0], buckets)
        bucket = None
        if found is not None:
            bucket, tokens = found
            self._plans.shapes[bucket] = (self._plans.shapes[key][0], tokens)
            self._plans.buckets.add(bucket)
        self._buckets[key] = bucket
        return bucket

    def _pass_begins(self, rec: StepRecord, args: Tuple[Any, ...],
                     kwargs: Dict[str, Any]) -> None:
        """Note [Micro-batches of other shapes]: a further pass of the running step, with
        no micro-batch holding tensors: it runs its own shape's plan."""
        key, _ = self._shape_key(args, kwargs)
        bucket = self._bucket_of(key, args)
        if rec.mode != "plan" or self._ranks is not None or self._plans.key in (key, bucket):
            rec.pass_keys.append(bucket if bucket is not None and self._plans.key == bucket
                                  else key)
            return
        before = (self._plans.key, self._plans.entry)
        if bucket is not None:
            entry, _ = self._plans.choose_for_pass(bucket)
            if entry is not None:
                rec.pass_keys.append(bucket)
                self._switch(entry["actions"], "plan")
                return
            self._plans.key, self._plans.entry = before
        rec.pass_keys.append(key)
        # Gradients are alive: the plan counts them.
        entry, refused = self._plans.choose_for_pass(key)
        if entry is not None:
            self._switch(entry["actions"], "plan")
            return
        # No plan for it without a measuring step, which a later pass cannot be, or none at
        # its budget (refused where a step of that shape begins, not here: the step's
        # earlier passes ran): it runs at least memory, on the skeleton of the pass before
        # (as a derived plan runs).
        if refused is not None:
            why = refused.split(" The blocks are restored")[0].removeprefix("stash.torch.fit: ")
            rec.check = f"pass {rec.passes}: {why} It ran at least memory."
            warn(f"stash.torch.fit: step {rec.index}, {rec.check}")
        self._plans.key, self._plans.entry = before
        if before[1] is not None and "profile" in before[1]:
            self._switch(_least_memory(before[1]["profile"]), "plan")

    def _begin_step(self, key: str, inputs: Sequence[torch.Tensor],
                    grads: Optional[int], bucket: Optional[str]) -> None:
        """A new step begins (block 0, micro-batch 0): close the previous one, choose the
        step's mode and plan (its bucket's, where it has one), and begin its record."""
        book, recorder = self._book, self._recorder
        assert book is not None and recorder is not None
        finish_ms = book.end_running()
        t0 = time.perf_counter()
        if grads is None:
            grads = self._bytes.gradients_alive()
        key, mode = self._choose(key, bucket, without_gradients=grads == 0)
        setup_ms = (time.perf_counter() - t0) * 1e3  # planning (and a first link measurement)
        book.begin(key, mode, inputs, grads, planning_ms=setup_ms + finish_ms)

    def _choose(self, key: str, bucket: Optional[str], without_gradients: bool
                ) -> Tuple[str, str]:
        """The key and mode of a step with this shape key and bucket
        (_fit_shape_plans.ShapePlans.choose): the bucket's plan, else the shape's own, else
        a measuring step of the shape's own."""
        # A shape measured in this run runs its own plan, which is exact (one measured fewer
        # than measure_steps times measures again); any other tries its bucket first.
        own = self._plans.measured_for.get(key, 0) > 0
        for k in [key] if bucket is None else [key, bucket] if own else [bucket, key]:
            entry = self._plans.choose(k, without_gradients)
            if entry is not None:
                self._switch(entry["actions"], "plan")
                return k, "plan"
        assert self._recorder is not None
        self._recorder.measure(key)
        self._switch([_MeasureLayer() for _ in self.blocks], "measure")
        return key, "measure"

    def _switch(self, actions: List[LayerActions], mode: str) -> None:
        offload = self._offload
        assert offload is not None
        if mode == self.mode and actions is offload.actions:
            return
        # Note [What it costs]: a plan that copies nothing leaves the engine idle
        # (set_actions), and a layer that keeps everything runs without hooks.
        offload.set_actions(actions)
        self.mode = mode
        self.plain_layers = ({id(a) for a in actions
                               if all(a[j] == KEEP for j in range(len(a)))}
                              if mode == "plan" else set())
        # Note [Lean blocks] in _offload_hooks.py: a middle block kept whole in a plan that
        # copies nothing (block 0 begins the step, the last one has its boundary).
        lean = [0 < i < self._n - 1 and self.keeps_everything(a)
                and not offload.copies for i, a in enumerate(actions)]
        self.lean = lean if any(lean) else None


def _least_memory(profile: Dict[str, Any], running: Optional[Sequence[LayerActions]] = None
                  ) -> List[LayerActions]:
    """A profile's layers at least memory, on its skeleton (as a derived plan runs): every
    tensor it marks recomputable and not must_keep recomputed, the rest kept; with the
    `running` actions, what they offload stays offloaded, so the engine's slots stay (Note
    [A longer micro-batch in flight])."""
    least: List[LayerActions] = []
    for i, layer in enumerate(profile["layers"]):
        now = running[i] if running is not None else None
        least.append(_DerivedLayer([
            OFFLOAD if now is not None and now[j] == OFFLOAD
            else RECOMPUTE if t["recomputable"] and not t.get("must_keep") else KEEP
            for j, t in enumerate(layer["tensors"])]))
    return least
