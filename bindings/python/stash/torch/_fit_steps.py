"""stash.torch.fit's book of steps: a typed record per training step (StepRecord), begun
where block 0's forward begins a step, marked as the step runs, and closed with its
figures (the peak on the meter, the step's time, exposed copy time, what its plan
predicted) where the step ends; a measuring step's record becomes its shape's profile
(Note [What the budget counts]; Notes [The measuring step] in _fit_measure.py and [The
measuring step's windows on CUDA] in _fit_cuda_meter.py). report() is a function of these records
(_fit_report.fit_report).

A part the handle owns: handed the blocks, the optimizer, the step clock, the measuring
recorder, the training bytes, the shape plans, the meters, what copies (the
OffloadHandle, through Copies) and describe (the profile's device, link and host
sections); it reads nothing of the handle. The handle decides what a step is (where one
begins and ends, its mode); the book keeps what the step did.

Note [What the budget counts]
The budget is the process's device memory at its peak: torch.cuda.max_memory_allocated()
with torch's allocator, or stash's pool peak under stash.torch.use_allocator. On CUDA the
profile's fixed_bytes is calibrated from the measuring step: its measured peak less the
canonical model's activation peak for what the step did. That makes everything that is not
a block activation count: parameters, gradients, cuBLAS workspaces, the allocator's
rounding; the loss's logits and the optimizer step's temporaries are read in windows of
their own (Note [The measuring step's windows on CUDA] in _fit_cuda_meter.py). The
optimizer's state exists only after its first step(): when the measuring step came before
it, its size is added from the optimizer's parameters
(Adam/AdamW: two tensors like each parameter; SGD with momentum: one) and, once the
optimizer has stepped (a post-step hook when fit is given the optimizer), replaced by
the bytes its state really holds, re-planning if that changed anything. On the CPU test
double the meter is c10's CPU allocator, through stash's counting allocator (Note [The CPU
allocator's meter] in _meter.py): a step's peak is what was alive at block 0 plus the most
the allocator held above its level then, read when the step ends. There the fixed bytes
are calibrated position by position rather than from the one peak: at every sample (each
pack, block end, boundary and replay) the allocator's peak since the last one, less what
fit counts then (parameters, gradients as if allocated, optimizer state, and the saved
storages the hooks track by weak reference), is what fit does not track there (the loss's
logits, attention's workspaces); the most of it in the blocks' forwards joins the fixed
bytes, the rest of a block's backward its backward temporaries, the loss's (the head and
its backward) the profile's loss_bytes, a position of its own (Note [The loss's position]
in planner/model/plan.h), and the optimizer step's, when no activation is alive, its
optimizer_bytes (Note [The optimizer's position] there). A step that begins without
gradients is planned with each gradient counted from where it is made (Note [Gradients
by position] in _fit_gradients.py). Where the counting allocator cannot be built
the peak is fit's own count, which leaves the temporaries out. On both, a measured plan's
run that peaks above its prediction (the temporaries where that plan peaks, which a
least-memory step does not show) adds the difference to the shape's fixed bytes, and the
next step runs the plan made with them; until a run peaks within its prediction, at most
three times (_fit_shape_plans.MAX_CORRECTIONS): the plan made with one correction peaks
where other temporaries live. Under bf16 autocast on the CPU a Mistral's plan of three
192-token micro-batches at "70%" peaked 0.7 MB over its prediction, then 25 KB over it and
its budget on every later step with one correction, and within from its third run with
two; fp32 predicts to the byte. The cause is not fixed: that plan's run peaked in the
head and loss (16.08 MB against 15.33 predicted there), where autocast's cache still holds
the bf16 copy of every block's weights (1.18 MB on that Mistral). The blocks save those
copies; the least-memory measuring step recomputes them, and its samples count them as
tracked saved storages, alive, so neither the fixed bytes nor (for a recomputed tensor)
the plan's model holds them.
"70%" is a share of the keep-all peak the canonical model gives for the measured profile
(Note [What a share budget means] in _fit_options.py).

Note [A later pass on the CPU meter]
The CPU meter's window opens at the step's first block 0, and its base counts block 0's
inputs then (the embedding's hidden states, the rotary tables), which were made before it
opened: the window sees neither their making nor their freeing. A step of several passes
(gradient accumulation) frees them with its first backward and makes the next pass's
inside the window, so the reading counted both from the second pass on: a Mistral's step
of two 192-token micro-batches read 0.64 KB a token of the first above what c10 held, and
its derived plan, within its prediction, was judged over the budget. A further pass takes
what is gone out of the base (its storages are held by weak reference) after folding the
reading so far into the step's peak; inputs still alive (a micro-batch in flight saved
them) stay counted.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import torch

from .._engine import Engine
from .._lib import StashError
from .._profiler import FORWARD, Profiler
from .._warn import warn
from ._cpu_meter import Window
from ._fit_bytes import TrainingBytes
from ._fit_cuda_meter import CudaMeter, cuda_profile_figures
from ._fit_measure import MeasuringRecorder, fixed_bytes_cpu, measured_profile
from ._fit_shape_plans import ShapePlans
from ._clock import _Clock
from ._fit_support import (ReplaySpan, Span, StepRecord, _compile_events, _gib,
                           _optimizer_state_estimate, _storages, _tensor_bytes)
from ._saved import storage_of

# A profile's device, link and host sections (_record._device_info, the link, pinnable).
Description = Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]


class Copies(Protocol):
    """What the book reads of the OffloadHandle: its engine, and whether the current
    actions copy anything (a step that copies nothing calls no engine, Note [What it
    costs] in _fit.py)."""

    @property
    def engine(self) -> Optional[Engine]: ...

    @property
    def copies(self) -> bool: ...


class StepBook:
    """Every step's record in order; the running one's marks; its figures when it ends."""

    def __init__(self, blocks: Sequence[torch.nn.Module],
                 optimizer: Optional[torch.optim.Optimizer], *, clock: _Clock,
                 recorder: MeasuringRecorder, training: TrainingBytes, plans: ShapePlans,
                 copies: Copies, cuda_meter: Optional[CudaMeter], counting: Optional[Window],
                 describe: Callable[[], Description]) -> None:
        self._blocks = list(blocks)
        self._optimizer = optimizer
        self._clock = clock
        self._recorder = recorder
        self._bytes = training
        self._plans = plans
        self._copies = copies
        self._cuda_meter = cuda_meter  # None: the CPU (the counting window's, or fit's count)
        self._counting = counting
        self._describe = describe
        self._cupti = Profiler()
        # None: CUPTI not tried (CPU); else (used, why not).
        self._cupti_used: Optional[Tuple[bool, Optional[str]]] = None
        self.records: List[StepRecord] = []
        self.running: Optional[StepRecord] = None  # the last step begun, finished or not
        # The optimizer state's bytes the current profile counts (Note [What the budget
        # counts]): set when a step measured, corrected by the handle once the optimizer
        # has stepped.
        self.optimizer_state_counted: Optional[int] = None

    @property
    def timing(self) -> str:
        """The clock the plan's times come from: "host-clock" (CPU) or "cuda-events"."""
        return self._clock.kind

    @property
    def meter(self) -> str:
        """What a step's peak is read from (Note [What the budget counts])."""
        if self._cuda_meter is not None:
            return ("stash pool peak" if self._cuda_meter.pool
                    else "torch.cuda.max_memory_allocated")
        if self._counting is not None:
            return "c10 CPU allocator (stash's counting allocator)"
        return "tracked saved storages + parameters, gradients, optimizer state"

    # --- a step begins and ends -------------------------------------------------------------

    def end_running(self) -> float:
        """The next step begins: closes the running step's figures if it is still open (it
        ends now if nothing ended it before). Returns the milliseconds that took (0.0 when
        none was open); the next step's planning_ms counts them."""
        prev = self.running
        if prev is None or prev.finished:
            return 0.0
        now = self._clock.mark()
        if prev.end is None:
            prev.end = now
        return self._finish(prev)

    def begin(self, key: str, mode: str, inputs: Sequence[torch.Tensor], grads: int,
              planning_ms: float) -> None:
        """A step of shape `key` begins (block 0, micro-batch 0) in `mode` ("measure" or
        "plan"), its actions set. grads: the gradient bytes alive at its start;
        planning_ms: the time spent between the steps choosing its plan and closing the
        previous step's figures."""
        meter = self._cuda_meter
        if meter is not None:
            meter.reset()
        # The step starts after its planning: that time belongs to no step (report()'s
        # planning_ms says how much it was).
        rec = StepRecord(len(self.records), mode, key, self._clock.mark(), pass_keys=[key])
        entry = self._plans.entry
        if mode == "plan" and entry is not None:
            rec.plan_source = ("derived" if entry.get("derived") else
                               "cache_dir" if entry.get("from_disk") else "measured")
            rec.checking = bool(entry.get("derived")) and not entry.get("checked")
        rec.planning_ms = planning_ms
        rec.exposed_before = self._exposed_total()
        if mode == "measure":  # Note [A measuring step that compiled] in _fit_measure.py
            rec.compiles_before = _compile_events()
        self.records.append(rec)
        self.running = rec
        opt = self._optimizer
        if mode == "measure" and opt is not None and not len(opt.state):
            # The optimizer's state its first step makes, not held in this one.
            rec.optimizer_state_missing = _optimizer_state_estimate(opt)
        if mode == "measure" and meter is not None:
            self._cupti_used = self._cupti.start()
            # Note [The measuring step's windows on CUDA] in _fit_cuda_meter.py
            rec.windows = {}
            if not meter.pool:  # Note [What stays the same across shapes] in _fit_shapes.py
                rec.constant_bytes = (int(torch.cuda.memory_allocated(meter.device))
                                      - _tensor_bytes(inputs) + self._bytes.trainable()
                                      - grads + rec.optimizer_state_missing)
        # Note [What it costs] in _fit_passes.py (planned steps): fit tracks storages only where
        # it must, in a measuring step, or on the CPU without the counting allocator.
        self._recorder.begin_step(tracking=meter is None and (
            mode == "measure" or self._counting is None))
        if self._counting is not None:  # Note [The CPU allocator's meter] in _meter.py
            state = self._bytes.state(grads)
            if mode == "measure":
                rec.counted = self._bytes.fixed_counted()
                rec.state_at_start = state
                rec.grads_at_start = grads
            rec.meter_input_refs = _storages(inputs)
            rec.meter_inputs = sum(n for _, n in rec.meter_input_refs)
            rec.meter_base = self._bytes.alive((), state) + rec.meter_inputs
            self._counting.reopen()

    def pass_begins(self, rec: StepRecord) -> None:
        """Note [A later pass on the CPU meter]: block 0's inputs of the step's first pass,
        counted in the meter's base, leave it once they are gone."""
        if self._counting is None or rec.meter_base is None or not rec.meter_input_refs:
            return
        alive = [(r, n) for r, n in rec.meter_input_refs if r is None or not r.expired()]
        gone = rec.meter_inputs - sum(n for _, n in alive)  # a storage with no reference stays
        if not gone:
            return
        self.sample("pass begins")  # a measuring step's figures up to here, by position
        rec.meter_running = max(rec.meter_running, rec.meter_base + self._counting.peak())
        self._counting.reset_peak()
        rec.meter_base -= gone
        rec.meter_inputs -= gone
        rec.meter_input_refs = alive

    def abort(self, rec: StepRecord, reason: str) -> None:
        """Note [A step that ends early] in _offload_steps.py: the record keeps why; a
        measuring step's partial layers are dropped, so the shape is measured again from
        scratch."""
        rec.aborted = reason
        if rec.mode == "measure":
            self._recorder.drop_layers()
            if self._cuda_meter is not None:
                self._cupti.stop()
        self._recorder.forget()

    def settle(self) -> None:
        """Finishes the running step's figures if its backward has ended (its time runs to
        its optimizer step, or to now)."""
        rec = self.running
        if rec is not None and not rec.finished and (rec.backward_done
                                                     or rec.aborted is not None):
            if rec.end is None:
                rec.end = self._clock.mark()
            self._finish(rec)

    def settled(self) -> List[StepRecord]:
        """Every step's record for report(): the running one settled, and the budget of a
        share resolved after its step ran (its plan came later)."""
        self.settle()
        for rec in self.records:
            if rec.finished and rec.budget_bytes is None and rec.aborted is None:
                rec.budget_bytes = self._budget_of(rec, settled=True)
        return self.records

    def _budget_of(self, rec: StepRecord, settled: bool = False) -> Optional[int]:
        """The budget a step is judged against: its shape's, or the largest of its passes'
        shapes' (Note [Micro-batches of other shapes] in _fit_passes.py); None while one of them is
        a share not resolved yet, unless settled (report(): the largest known)."""
        budgets = [self._plans.budget_for(k) for k in rec.shapes]
        known = [b for b in budgets if b is not None]
        if not known or (len(known) < len(budgets) and not settled):
            return None
        return max(known)

    # --- marks as the step runs (Note [What it costs] in _fit_passes.py: a planned step's are its
    # start and end, and where its backward and optimizer step end) --------------------------

    def sample(self, where: str, after: Optional[Tuple[Any, ...]] = None,
               held: int = 0) -> None:
        """The CPU meter's sample at a position of the running step (the recorder's)."""
        if self.running is not None:
            self._recorder.sample(self.running, where, after, held)

    def forward_began(self, i: int, serial: int) -> None:
        rec = self.running
        if rec is not None and rec.mode == "measure":
            rec.fwd[(serial, i)] = Span(self._clock.mark())
            self._cupti.begin(FORWARD, i)

    def forward_ended(self, i: int, serial: int) -> None:
        rec = self.running
        if rec is not None and rec.mode == "measure":
            rec.fwd.setdefault((serial, i), Span()).end = self._clock.mark()
            self._cupti.end()

    def backward_began(self, i: int, serial: int, open_layer: Optional[int]) -> None:
        """Block i's backward begins; open_layer: the block whose backward it ends."""
        rec = self.running
        if rec is not None and rec.mode == "measure":
            m = self._clock.mark()
            if open_layer is not None:
                rec.bwd.setdefault((serial, open_layer), Span()).end = m
            rec.bwd.setdefault((serial, i), Span()).begin = m

    def backward_finished(self, serial: int, last: bool) -> None:
        """A micro-batch's backward through the blocks ended; last: no other micro-batch's
        is running (the step's backward has ended). Without the optimizer known, the
        step ends here."""
        rec = self.running
        if rec is None:
            return
        m = self._clock.mark()
        b = rec.bwd.get((serial, 0))
        if b is not None and b.end is None:
            b.end = m
        if self._recorder.tracking:
            self.sample("backward end", after=("bwd", 0))
        if last:
            rec.backward_done = True
            if self._optimizer is not None and not rec.made_gradients:
                rec.made_gradients = self._bytes.any_gradient()
            rec.bwd_end = m
            if self._optimizer is None:
                self.read_peak(rec)

    def replay_began(self, layer: int, serial: int) -> None:
        rec = self.running
        if rec is not None and rec.mode == "measure":
            rec.replay[(serial, layer)] = ReplaySpan(self._clock.mark())

    def replay_saved(self, layer: int, serial: int, index: int, t: torch.Tensor) -> None:
        """A replay saved recomputable tensor `index` again (Note [Recompute cost as the
        replay pays it] in _fit_measure.py)."""
        rec = self.running
        if rec is None or rec.mode != "measure":
            return
        r = rec.replay.get((serial, layer))
        if r is not None:
            r.marks.append((index, self._clock.mark()))
        self._recorder.track(t, storage_of(t)[1])

    def replay_ended(self, layer: int, serial: int) -> None:
        rec = self.running
        if rec is not None:
            r = rec.replay.get((serial, layer))
            if r is not None:
                r.end = self._clock.mark()
        self.sample(f"backward[{layer}]", after=("bwd", layer))

    def optimizer_begins(self) -> None:
        """optimizer.step() begins (not one whose closure runs the step)."""
        rec = self.running
        if rec is not None and rec.backward_done:
            rec.optimizer_began = True
            # Its window of its own (Note [The measuring step's windows on CUDA] in
            # _fit_cuda_meter.py).
            if self._cuda_meter is not None:
                self._cuda_meter.optimizer_begins(rec)

    def optimizer_stepped(self) -> None:
        """optimizer.step() ended: so did the step."""
        rec = self.running
        if rec is not None and rec.backward_done and rec.end is None:
            rec.end = self._clock.mark()
            if self._recorder.tracking:
                self.sample("optimizer step", after=("opt",))
            self.read_peak(rec)

    def read_peak(self, rec: StepRecord) -> None:
        """The step's peak on the meter (Note [What the budget counts]), read once, when
        the step ends (its optimizer step, or its backward without one), so that what the
        loop does before the next step (the next batch, the embedding) is not counted."""
        if rec.meter_peak is not None:
            return
        if self._cuda_meter is not None:
            rec.meter_peak = self._cuda_meter.step_peak(rec)
        elif self._counting is not None and rec.meter_base is not None:
            rec.meter_peak = max(rec.meter_running, rec.meter_base + self._counting.peak())
        else:
            rec.meter_peak = self._bytes.fixed_counted() + rec.live_peak

    # --- a step's figures ---------------------------------------------------------------------

    def _exposed_total(self) -> float:
        engine = self._copies.engine
        if engine is None or not engine.timing or not self._copies.copies:
            return 0.0  # a step that copies nothing calls no engine (Copies)
        try:
            return float(engine.overlap()["total"]["exposed_ms"])
        except StashError:
            return 0.0

    def _finish(self, rec: StepRecord) -> float:
        """Closes a step's figures; the milliseconds that took. Synchronizes the device once
        per step (event times), so the next step's first kernels are enqueued after the
        previous step has ended."""
        t0 = time.perf_counter()
        self._finish_figures(rec)
        return (time.perf_counter() - t0) * 1e3

    def _finish_figures(self, rec: StepRecord) -> None:
        self._clock.sync()
        rec.finished = True
        if rec.aborted is not None:
            rec.step_ms = self._clock.ms(rec.start, rec.end)
            return
        rec.cupti = self._cupti.stop() if rec.mode == "measure" else None
        self.read_peak(rec)
        rec.peak_bytes = rec.meter_peak if rec.meter_peak is not None else 0
        rec.exposed_ms = max(0.0, self._exposed_total() - rec.exposed_before)
        rec.step_ms = self._clock.ms(rec.start, rec.end)
        plans = self._plans
        entry = plans.cache.get(rec.key)
        keys = rec.shapes
        if len(keys) > 1:
            self._mixed_figures(rec, keys)
            plans.learn_derived(rec)  # Note [What a derived plan leaves free]
            return
        if rec.mode == "plan" and entry is not None:
            rec.predicted_peak = int(entry["figures"]["predicted_peak_bytes"])
            over = entry["profile"].get("step_overhead_ms", 0.0)
            per_pass = entry["figures"]["predicted_step_ms"] - over
            rec.predicted_step = rec.passes * per_pass + over
        else:
            rec.predicted_peak = None
            rec.predicted_step = None
        if rec.mode == "measure":
            self._record_profile(rec)
        rec.budget_bytes = plans.budget_for(rec.key)
        plans.learn_derived(rec)  # Note [What a derived plan leaves free]
        if rec.checking and entry is not None:
            plans.check_derived(rec, entry)
        elif rec.mode == "plan" and entry is not None and not entry.get("corrected"):
            plans.correct_fixed(rec, entry)
        self._warn_over(rec)

    def _mixed_figures(self, rec: StepRecord, keys: List[str]) -> None:
        """Note [Micro-batches of other shapes] in _fit_passes.py: a step whose passes ran plans
        of several shapes is judged against the largest of their budgets (once each is
        known: a share of a shape with no plan yet is resolved for report()), predicted at
        the most of their peaks and the sum of their passes' times, and checks no plan: its
        one peak cannot be laid to one shape (a derived plan is checked at its next step
        of one shape)."""
        plans = self._plans
        entries = [plans.cache.get(k) for k in keys]
        rec.predicted_peak = rec.predicted_step = None
        if rec.mode == "plan" and all(e is not None and "figures" in e for e in entries):
            figures = {k: e["figures"] for k, e in zip(keys, entries) if e is not None}
            rec.predicted_peak = max(int(f["predicted_peak_bytes"]) for f in figures.values())
            over = {k: float(e["profile"].get("step_overhead_ms", 0.0))
                    for k, e in zip(keys, entries) if e is not None}
            rec.predicted_step = over[keys[0]] + sum(
                float(figures[k]["predicted_step_ms"]) - over[k] for k in rec.pass_keys)
        if rec.mode == "measure":
            self._record_profile(rec)
        rec.budget_bytes = self._budget_of(rec)
        self._warn_over(rec)

    def _warn_over(self, rec: StepRecord) -> None:
        if rec.over_budget:
            warn(f"stash.torch.fit: step {rec.index} ({rec.mode}) peaked at "
                 f"{_gib(rec.peak_bytes)}, OVER the budget of {_gib(rec.budget_bytes or 0)}")

    def _record_profile(self, rec: StepRecord) -> None:
        """A finished measuring step as the shape's profile (kept in the cache)."""
        device, link, host = self._describe()
        doc = measured_profile(rec, self._recorder.layers, self._blocks, self._clock,
                               device=device, link=link, host=host, timing=self.timing,
                               cupti=self._cupti_summary)
        counted = self._bytes.fixed_counted()
        self.optimizer_state_counted = _optimizer_state_estimate(self._optimizer)
        if self._cuda_meter is not None:
            counted_state = cuda_profile_figures(doc, rec, self._recorder.actions_seen(),
                                                 counted, self._optimizer)
            if counted_state is not None:
                self.optimizer_state_counted = counted_state
        else:
            doc["fixed_bytes"] = fixed_bytes_cpu(doc, rec, counted, self._bytes.trainable())
        if rec.optimizer_state_missing:  # named where a refusal quotes this step's peak
            doc["measurement"]["optimizer_state_missing_bytes"] = rec.optimizer_state_missing
        compiled = (rec.compiles_before is not None
                    and _compile_events() > rec.compiles_before)
        self._plans.measured(rec.key, {"profile": doc, "measured_peak_bytes": rec.peak_bytes},
                             compiled=compiled)

    def _cupti_summary(self, fwd: List[Dict[str, Any]]) -> Dict[str, Any]:
        """Note [The measuring step] in _fit_measure.py: CUPTI's forward kernel time beside the
        events' span, or why CUPTI did not run."""
        if self._cupti_used is None:
            return {"used": False, "reason": "no CUDA device (the host clock times the step)"}
        used, reason = self._cupti_used
        if used and fwd:
            return {"used": True, "forward": fwd,
                    "kernel_share": sum(f["kernel_ms"] for f in fwd)
                    / max(1e-9, sum(f["span_ms"] for f in fwd))}
        return {"used": False, "reason": reason or self._cupti.reason or "no records"}
