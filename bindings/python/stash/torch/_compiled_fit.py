"""stash.torch.fit's planner for a whole-model compiled graph: the measured profile of a
compiled measuring step, planned as fit plans an eager one, and a derived shape's plan,
wired into a CompiledState (Note [Planning the compiled graph] in _compiled.py). The
CompiledState itself knows nothing of fit's planning or refusals.

Note [Backward temporaries of a compiled block]
A compiled block's backward makes temporaries (its recomputed nodes beyond the saved
values, gradients of its activations) that no saved value accounts for. Calibrating them
all into the fixed bytes at the measuring step's peak loses where they are: a plan whose
peak moves (to the loss, or to another block's backward beside a prefetched value) was
then priced below its run. On the peers' tiny Llama (4 layers, hidden 128, sequence 256)
at compile-0.3's peak, a plan offloading one 1 MiB value ran 3.9% over its prediction
and 2.8% over the budget. So the measuring step reads the handle's meter at
each backward tick (the peak since the last; reset_peak starts the next), and
a block's bwd_temp_bytes is its backward segment's peak above what the model holds there
for the least-memory plan it ran (the fixed bytes, the kept values of the blocks before
it, its own recomputed ones: _compile_plan.calibrated_temporaries); the step's peak is
the most of the segments. The fixed bytes are then what fit counts (parameters,
gradients, buffers, optimizer state): what else the step holds at a position (the
embedding's output, the rotary tables) is read into that position's own figure, the
blocks' temporaries and the loss's bytes (Note [The loss under whole-model compile]);
calibrating the fixed bytes from the step's peak too would count the peak block's
reading twice.
On CUDA the segments reset the meter (max_memory_allocated, or stash's pool's peak under
use_allocator) at each backward tick of a measuring step, as the eager measuring step's
windows do (Note [The measuring step's windows on CUDA] in _fit_cuda_meter.py): there,
and only there, a reading of the meter after the step covers its last segment alone.
Until 2026-12-07 CUDA read no segments, so as not to reset the meter users read mid-step,
and its temporaries stayed in the fixed bytes, calibrated from the step's peak: the
pricing the CPU had dropped for running its plans over their predictions, on the one
device no test of stash's ran it on.
The temporaries were first read as the segment's peak less the bytes alive at its tick.
But Inductor schedules part of a block's backward (the next block's recompute,
gradients) before the tick, so that reading already held it, and every block but the
first to run backward came out 0: test_fit_compiled's wide Llama at "70%" planned for
45.6 MB and its backward[1] ran 46.7 MB (the model said 31.5; backward[0] 35.3 against
28.3). Read against the model, its blocks get 10.3-11.7 MB each, and the plan made with
them is priced 2.2 MB under its run at backward[1] (39.8 against 42.0 MB) and 1.1 MB
over at backward[0], its step 4.1 MB under the prediction. What is left is not one
figure per block: in the least-memory step a block's temporaries include its recompute's
intermediates, which a plan that keeps the block does not make, so a kept block is
priced above its run (that Llama's last block by 8.7 MB), and a partly recomputed one
may hold more than either (block 1 there: 13.8 MB against 11.7). A model of temporaries
that depends on what the plan recomputes needs the planner's support and a second
reading at the plan. A derived shape scales them as its saved bytes.

Note [The loss under whole-model compile]
The measuring step recomputes every block, so its peak is a block's backward, and the
position between the last forward and the last block's backward (the head, the loss and
their backward: the model's loss position, Note [The loss's position] in
planner/model/plan.h) never binds there; its bytes above the kept activations were
priced 0. A plan that keeps more makes that position its peak: with the plan's kept
values really kept (Note [What min-cut keeps] in _compile_plan.py), a 2-layer Llama at
85% of compiled keep-all peaked there 138 KB (2.3%) over its prediction. So the
measuring step also reads the meter from its start to the end tick's backward, and
the profile's loss_bytes are that peak (with the optimizer state missing then) less the
fixed bytes and the least-memory plan's kept activations. A longer shape scales them
with its tokens, a shorter one keeps them: part of them does not shrink with the tokens
(the head's weight gradient; at length 96 of a measured 128, scaled down, a Llama ran
122 KB over its prediction). On CUDA this segment is read as the blocks' are (Note
[Backward temporaries of a compiled block]); until it was, loss_bytes stayed 0 there and
the plan's tags stayed on the values themselves (a kept view or attention output was
recomputed: within the prediction, slower than planned).

Note [The step's tail under whole-model compile]
Block 0's backward tick ends the blocks' backward; the step goes on after it: the
embedding's backward (the gradient of block 0's input, one hidden state) and the
optimizer step, whose temporaries and first state can be a step's peak at a tight
budget. The compiled profile had no figure for them (eager fit's has: optimizer_bytes)
and a plan's first run was checked at that tick. Now a step's end is read when the
optimizer steps (fit(optimizer=...)), or else when the next forward begins: a measuring
step reads the peak since block 0's backward tick (a segment of its own, the meter reset
there as at every backward tick), and the profile's optimizer_bytes are the most of
those, absolute (Note [The optimizer's position] in planner/model/plan.h: a position no
decision moves, which refuses a budget below it); the optimizer's state is made inside
that segment, so nothing is added for it. A planned step's peak runs to its end, and
the first run of its plan is checked there. A derived shape scales the bytes above the
fixed ones with its tokens, when it has more.

Note [What a compiled step holds at tick 0]
The CPU window counts what is allocated after it opens, and it opens at tick 0, after
the compiled graph has run the embedding: the step's base was fit's count of what is
alive there (parameters, gradients, optimizer state, block 0's input). What else the
graph made before tick 0 and still holds (the rotary tables, the mask, the batch) was in
neither the base nor the window, so fit's reading of a compiled step sat below the meter
users read (c10's allocator over the whole step, the tests' and the peers'): on a 2-layer
Llama at 85% of compiled keep-all, 6.17 MB against 6.25 (a budget of 6.26), and a
length of 160 under a graph break 6.21 MB against 6.34, over the budget unseen. So at a
step's end (above) a second window opens, and at the next tick 0 the base is fit's count
without block 0's input plus what that window holds then: what the step made before
tick 0 and still holds. That window's peak, which counts the temporaries freed by then
too, read 21 KB above the users' meter; what it holds, 1 KB (6.2555 MB against 6.2545
for that Llama's plan, whose prediction, 6.22 MB, is under both by 0.5%: the model's
error, unseen before). What the step held before tick 0 at most (the embedding's
forward, below the blocks' positions) is not read.
A micro-batch's step ends at the next one's tick 0, so the window opens there, holding
nothing: what that step holds is unread, and is taken as the last reading at its shape
(CompiledState.held_at). Until 2026-12-07 it was read as nothing: a 4-layer Qwen2 with a
graph break and two micro-batches by hand had its second micro-batch read 53 KB under
the users' meter, and ran 7 KB over its budget every step with its check passed. The
plan lacked those bytes too (every micro-batch of the first optimizer step is unread):
the plan is made at the next step's first tick 0, which now reads them first. And the
check read the first micro-batch alone (now each micro-batch position of a plan's first
run: Note [A compiled plan's first run] in _compiled_check.py).
The run's first step has no step's end before it: its base is fit's count, and the
planner reads it as if it held what a later step held above that count (StepTimes.held,
held_at). A loop without fit(optimizer=...) has its step's end read at the next tick 0
only: the old base. On CUDA, max_memory_allocated reset at tick 0 reads what is
allocated then, and needs none of this.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .._lib import StashError
from .._planner import InfeasibleBudget, evaluate
from .._warn import warn
from ._compile_plan import (calibrated_fixed_bytes, calibrated_loss_bytes,
                            calibrated_temporaries, compiled_profile, least_memory_actions,
                            plan_actions_of, without_offload)
from ._compiled import CompiledState
from ._compiled_steps import StepTimes
from ._clock import _Clock
from ._cpu_meter import Window, window as cpu_window
from ._fit_cuda_meter import CudaMeter
from ._fit_options import Budget
from ._fit_plan import BudgetRefused, derived_refusal, plan_measured, warn_closed
from ._fit_support import _plan_doc

__all__ = ["compiled_meter", "fit_compiled_state"]

Meter = Tuple[Callable[[torch.Tensor], Tuple[int, Optional[int]]], Callable[[], int],
              Callable[[], None]]


def compiled_meter(cuda_meter: Callable[[], Optional[CudaMeter]],
                   counting: Callable[[], Optional[Window]],
                   alive: Callable[[Sequence[torch.Tensor]], int]
                   ) -> Tuple[Meter, Callable[[], int]]:
    """fit's meter as a compiled step reads it: (open, peak, mark) and segment. open(x)
    starts a window at the compiled forward's input x and returns the bytes the window's
    readings are above (0 on CUDA: max_memory_allocated, or stash's pool peak, reads all of
    it); peak() is the most since; mark() at a step's end starts counting what the next
    step holds at its tick 0 (Note [What a compiled step holds at tick 0]). cuda_meter:
    the CUDA meter (None on the CPU), and counting:
    the CPU window (None: fit's own count, which a compiled step cannot see: peak 0), both
    asked when the meter is read: fit makes them after the OffloadHandle that asks for
    this meter."""

    before: List[Optional[Window]] = [None]  # Note [What a compiled step holds at tick 0]

    def meter_mark() -> None:
        # A step's end: count what the next step makes before its tick 0.
        if cuda_meter() is not None or counting() is None:
            return
        if before[0] is None:
            before[0] = cpu_window()
        if before[0] is not None:
            before[0].reopen()

    def meter_open(x: torch.Tensor) -> Tuple[int, Optional[int]]:
        cuda = cuda_meter()
        if cuda is not None:
            cuda.reset()
            return 0, 0
        window = counting()
        if window is not None:
            window.reopen()
        pre = before[0]
        counted = alive([x])
        if window is not None and pre is not None and pre.is_open:
            pre.reset_peak()  # the peak is now what the window holds
            made = pre.peak()
            pre.close()
            if made == 0:
                # Opened at this tick (a micro-batch's step ends at the next one's tick
                # 0, and the graph makes block 0's input after the mark): unread.
                return counted, None
            # At least block 0's input, which the window counts too.
            whole = max(counted, alive([]) + made)
            return whole, whole - counted
        return counted, None

    def meter_peak() -> int:
        cuda = cuda_meter()
        if cuda is not None:
            return cuda.peak()
        window = counting()
        return window.peak() if window is not None else 0

    def meter_segment() -> int:
        # Note [Backward temporaries of a compiled block]: the peak since
        # the last call or the window's start, on meter_open's scale; the peak starts
        # again from now (on CUDA, as the eager measuring step's windows do: Note [The
        # measuring step's windows on CUDA] in _fit_cuda_meter.py).
        cuda = cuda_meter()
        if cuda is not None:
            peak = cuda.peak()
            cuda.reset()
            return peak
        window = counting()
        if window is None:
            return 0
        peak = window.peak()
        window.reset_peak()
        return peak

    return (meter_open, meter_peak, meter_mark), meter_segment


def _least_memory_measured(doc: Dict[str, Any], measured: int, prior: Dict[str, Any]
                           ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Note [A compiled plan's first run] in _compiled_check.py: a corrected profile with
    no plan at the budget prices least memory over it too, though least memory was
    measured within it: least memory is run, at its measured peak, with a warning."""
    budget = int(prior["budget_bytes"])
    plan = dict(_plan_doc(doc, least_memory_actions(doc)), budget_bytes=budget)
    priced = evaluate(doc, plan, 1 << 62, strict=False)
    plan.update(solver="least memory", binding_constraints=[],
                predicted={"peak_bytes": measured, "offloaded_bytes": 0,
                           "step_ms": float(priced["predicted_step_ms"])},
                baselines={"keep_all": {"peak_bytes": int(prior["keep_all_peak_bytes"])}})
    warn(f"stash.torch.fit: the compiled graph's plan ran over its budget of {budget} bytes "
         "even after its correction, and no other plan is priced within it; its steps run "
         f"at least memory (every block recomputed), measured at {measured} bytes. The "
         "cost model misjudges this model's partly recomputed blocks; per-block compile "
         "or eager mode plans it.")
    return plan, dict(prior, predicted_peak_bytes=measured,
                      predicted_step_ms=float(priced["predicted_step_ms"]))


def fit_compiled_state(blocks: Sequence[torch.nn.Module], *, budget: Any, solver: str,
                       describe: Callable[[], Tuple[Dict[str, Any], Dict[str, Any],
                                                    Dict[str, Any]]],
                       meter: Meter,
                       counted: Callable[[], int], missing: Callable[[], int],
                       gradients: Callable[[], int], grouped: bool,
                       refused: Callable[[], None],
                       segment: Optional[Callable[[], int]] = None,
                       clock: Optional[_Clock] = None) -> CompiledState:
    """stash.torch.fit's compiled state: its planner makes the measured profile and plans
    it as fit plans an eager one (Note [Planning the compiled graph]). refused: what the
    handle does before a BudgetRefused propagates (it restores the blocks)."""
    def planner(state: CompiledState) -> List[List[str]]:
        # Note [Micro-batches under whole-model compile] in _compiled_steps.py: calibrated
        # on the measuring forward that needed the most.
        measured = state.log.measuring_forwards()
        assert measured and all(s.peak is not None for s in measured)
        # The least-memory peak with the optimizer state a first step lacked: what a
        # refusal names as the measuring step's (it named the bare first step's, below a
        # budget it refused: 17.7 MiB against a 21.8 MiB budget whose least memory needs
        # 24.3).
        # Note [What a compiled step holds at tick 0]: a step whose base missed what the
        # graph held at tick 0 (the run's first) is read as the others found it.
        held = max([s.held for s in measured if s.held is not None]
                   + [state.held_at.get(m.shape, 0) for m in measured[:1]], default=0)

        def base(s: StepTimes) -> int:
            return s.base + (held if s.held is None else 0)

        top = max(measured, key=lambda s: int(s.peak or 0) - s.base + base(s) + s.missing)
        most = int(top.peak or 0) - top.base + base(top) + top.missing
        device, link, host = describe()
        doc = compiled_profile(state.layers(), device=device, link=link, host=host,
                               timing=state.clock.kind)
        if all(p is not None for p in top.bwd_peak):
            # Note [Backward temporaries of a compiled block]: each position's untracked
            # bytes where it is read.
            doc["fixed_bytes"] = counted()
            for layer, temp in zip(doc["layers"], calibrated_temporaries(
                    doc, [base(top) + int(p or 0) + top.missing for p in top.bwd_peak])):
                layer["bwd_temp_bytes"] = temp
        else:
            doc["fixed_bytes"] = calibrated_fixed_bytes(doc, most, counted(), 0)
        tails = [base(s) + s.tail_peak for s in measured if s.tail_peak is not None]
        if tails:  # Note [The step's tail under whole-model compile]
            doc["optimizer_bytes"] = max(tails)
        heads = [base(s) + s.head_peak + s.missing for s in measured
                 if s.head_peak is not None]
        if heads:  # Note [The loss under whole-model compile]
            doc["loss_bytes"] = calibrated_loss_bytes(doc, max(heads))
        # Note [A compiled plan's first run] in _compiled_check.py: the correction is
        # added after the calibrations, which read each position's figure as its measured
        # peak less the fixed bytes; added before, it came off the temporaries and the
        # loss's bytes again, and a plan 10% over its budget (OLMo 2 at 70%) was planned
        # the same twice.
        doc["fixed_bytes"] = int(doc["fixed_bytes"]) + state.correction
        if not state.offload:  # Note [A compiled plan's first run] in _compiled_check.py
            without_offload(doc["layers"])
        state.profile = doc
        try:
            # The partitioner recomputes each value's own chain (Note [Recompute cost
            # in a compiled block] in _compiled_steps.py): no prefix closure.
            plan, figures = plan_measured(doc, most, budget, solver, replayed=False)
        except BudgetRefused as e:
            prior = state.figures
            if not (state.correction and prior is not None
                    and most <= int(prior["budget_bytes"])):
                refused()
                warn_closed(e)
                raise
            plan, figures = _least_memory_measured(doc, most, prior)
        state.plan, state.figures = plan, figures
        return plan_actions_of(plan)

    def shape_planner(doc: Dict[str, Any], tokens: int, measured: int,
                      nbytes: Optional[int]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        # Note [Every shape under whole-model compile] in _compiled_shapes.py: refused as
        # a new eager shape is (Note [A shape that cannot fit] in _fit_plan.py). nbytes:
        # the budget in bytes a share came to (Note [A new shape across graphs]).
        try:
            within = budget if nbytes is None else Budget(nbytes=nbytes, text=str(nbytes))
            return plan_measured(doc, None, within, solver, replayed=False)
        except BudgetRefused as e:
            cause = e.__cause__
            if isinstance(cause, InfeasibleBudget):
                raise derived_refusal(cause, budget, tokens, [measured]) from cause
            raise

    def refuse(e: StashError) -> None:
        refused()
        warn_closed(e)

    return CompiledState(len(blocks), [f"{type(b).__name__}.{i}" for i, b in enumerate(blocks)],
                         [type(b).__name__ for b in blocks], planner, meter, None, missing,
                         gradients, grouped, shape_planner, refuse, segment, clock)
