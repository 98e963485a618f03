"""The compiled steps a handle ran: each forward's ticks and peaks on the meter
(StepTimes), in the order they began and grouped by optimizer step (StepLog), and what
is read of them: the measured profile's layers and the report's entries. A CompiledState
(_compiled.py) owns one StepLog.

Note [Micro-batches under whole-model compile]
A loop that accumulates gradients by hand (two forwards and backwards per optimizer
step) runs one compiled graph for every micro-batch, so one plan must hold for the
micro-batch that begins with gradients alive: the second one's peak is the first's plus
the gradients the first left (on a 3-layer Qwen2, hidden 128, exactly those 2.04 MB). A
plan calibrated on the first alone ran 0.13% over the budget on every step. So a forward
that begins with more gradient bytes than every complete measuring forward did measures
too (it runs the measuring graph anyway: the plan takes effect at the next compile), and
the plan comes at the next tick 0, calibrated on the measuring forward that needed the
most (peak plus the optimizer state missing then): its blocks' temporaries from its
segments (Note [Backward temporaries of a compiled block] in _compiled_fit.py). A plain loop
(gradients set to None) plans one forward after
its measuring one, as before; an accumulating one two. Should a planned step later begin
with more gradients than the plan was calibrated on (a loop that starts accumulating),
fit warns once: that graph may run over the budget by up to the difference.
With the optimizer known, report() lists one entry per optimizer step (its forwards are
its micro-batches; a forward that never reached block 0's backward ends its step, as
aborted); without it, one per forward.

Note [Recompute cost in a compiled block]
The ticks time each block's forward and backward on a measured run of the compiled
step (the measuring step's backward recomputes the whole block, so its backward less its
forward is the backward proper): on the CPU on the host clock, on a GPU with a CUDA
event each tick records on the current stream, read when the plan is made. The host
clock there would time the launches: a tick runs when the host reaches it in the
compiled graph's code, and Inductor's kernels for a block are queued in microseconds
that the GPU then runs for milliseconds (until 2026-12-07 the ticks read it on CUDA
too). A compiled block's kernels cannot be timed one by one from Python, so a saved
value's recompute_ms is the
block's measured forward split by cost: its chain (the nodes of the block it needs that
are neither saved nor the block's input) over the whole block's, costing a matmul or
attention node its FLOPs and any other node its output's bytes. The planner's total is
then the measured forward, and a value that shares a chain with another is priced as if
recomputed alone (an upper bound).

Note [A step of two serials]
Dynamo reads the plan's serial when it enters a compiled frame (its guard), and a graph
break makes each block after it a frame of its own, entered as the forward reaches it.
So a serial changed at a step's tick 0 (the plan made there) reached that step's later
graphs but not its first: on a 12-layer Llama split by a break before block 1, the step
that planned ran block 0 measuring and blocks 1-11 planned, was logged as a measuring
step, peaked at 26.5 MB against 6.8 MB for the first measuring step (a least-memory
step, as every block of it recomputed), and fed a later correction's calibration: that
correction's plan was priced at 27.9 MB and ran 11.9. Under graph breaks the serial now
changes at the step's end (the optimizer's step, when fit knows the optimizer; else the
next tick 0, which still leaves that next step mixed). A step whose later tick carries
another serial than its tick 0 is marked mixed: it is not a measuring forward, and its
peak checks no plan. Without breaks one graph holds every tick, the serial is read once
per step, and it changes at tick 0 as before.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from ._clock import _Clock
from ._compile_plan import SavedValue, layer_doc
from ._compiled_graph import Shape
from ._compiled_shapes import ShapePlan

__all__ = ["StepLog", "StepTimes", "measured_layers"]


class StepTimes:
    """One compiled step's ticks (marks of the handle's clock: CUDA events on a GPU, the
    host clock on the CPU) and peak on the meter."""

    def __init__(self, serial: int, n: int, clock: _Clock) -> None:
        self.serial = serial
        self.clock = clock
        self.fwd: List[Any] = [None] * (n + 1)
        self.bwd: List[Any] = [None] * (n + 1)
        self.peak: Optional[int] = None
        self.base = 0
        # Note [What a compiled step holds at tick 0] in _compiled_fit.py: what the base
        # counts above fit's count at tick 0 (None: the base is fit's count alone)
        self.held: Optional[int] = None
        self.missing = 0  # optimizer state that did not exist when it began
        # Note [Backward temporaries of a compiled block] in _compiled_fit.py: per block, the
        # peak during its backward (the meter's scale); the most of any segment so far.
        self.bwd_peak: List[Optional[int]] = [None] * n
        self.seg_max = 0
        # Note [The loss under whole-model compile] in _compiled_fit.py: the peak from the
        # step's start to the end tick's backward (the forwards, the head, the loss and its
        # backward), above the base; CPU measuring steps only.
        self.head_peak: Optional[int] = None
        # Note [The step's tail under whole-model compile] in _compiled_fit.py: the peak
        # after block 0's backward tick to the step's end, above the base (measuring
        # steps); whether the step's end was read.
        self.tail_peak: Optional[int] = None
        self.ended = False
        # Note [A step of two serials]: a later graph of it ran another plan serial
        self.mixed = False
        # Note [A compiled plan's first run] in _compiled_check.py
        self.check: Optional[str] = None
        self.figures: Optional[Dict[str, Any]] = None  # its plan's, as it began
        # Note [Every shape under whole-model compile] in _compiled_shapes.py: block 0's
        # input; its plan, if the shape is not the measured one
        self.shape: Shape = ()
        self.shape_plan: Optional[ShapePlan] = None
        # Note [Micro-batches under whole-model compile]
        self.grads = 0    # gradient bytes alive when it began
        self.group = 0    # its optimizer step's index

    def _ms(self, a: Any, b: Any) -> Optional[float]:
        return None if a is None or b is None else self.clock.ms(a, b)

    def fwd_ms(self, i: int) -> Optional[float]:
        return self._ms(self.fwd[i], self.fwd[i + 1])

    def bwd_ms(self, i: int) -> Optional[float]:
        return self._ms(self.bwd[i + 1], self.bwd[i])

    def step_ms(self) -> Optional[float]:
        """From tick 0 to block 0's backward tick: the blocks' forwards and backwards."""
        return self._ms(self.fwd[0], self.bwd[0])


class StepLog:
    """A handle's compiled forwards, in the order they began, with the optimizer step
    each belongs to (Note [Micro-batches under whole-model compile]). n: its blocks;
    grouped: report() groups forwards by optimizer step (the optimizer is known)."""

    def __init__(self, n: int, grouped: bool) -> None:
        self.n = n
        self.grouped = grouped
        self.group = 0  # optimizer steps (and aborted ones) so far
        self.steps: List[StepTimes] = []

    def forward_begins(self) -> Optional[StepTimes]:
        """A forward begins: the one before it, whose step it ends if that one never
        reached block 0's backward."""
        last = self.steps[-1] if self.steps else None
        if last is not None and last.peak is None:
            self.group += 1
        return last

    def optimizer_stepped(self) -> None:
        """The optimizer stepped: the forwards since its last step were one step's."""
        if self.steps and self.steps[-1].group == self.group:
            self.group += 1

    def measuring_forwards(self) -> List[StepTimes]:
        """The complete forwards (and backwards) of the measuring graph (serial 0, every
        tick)."""
        return [s for s in self.steps
                if s.serial == 0 and not s.mixed and s.peak is not None
                and all(v is not None for v in s.fwd)
                and all(v is not None for v in s.bwd)]

    def measured(self) -> Optional[StepTimes]:
        """The measuring step whose times make the profile: the first complete one."""
        m = self.measuring_forwards()
        return m[0] if m else None

    def times(self) -> List[Dict[str, Any]]:
        """Per forward its plan serial, peak on the meter and block times."""
        return [{"serial": s.serial, "peak_bytes": s.peak,
                 "fwd_ms": [s.fwd_ms(i) for i in range(self.n)],
                 "bwd_ms": [s.bwd_ms(i) for i in range(self.n)]}
                for s in self.steps]

    def step_entries(self, budget_bytes: Optional[int]) -> List[Dict[str, Any]]:
        """The compiled steps as fit's report() lists steps (_fit_report.step_entry): a
        step's time is its blocks' forward and backward (tick 0 to the backward tick of
        block 0, summed over its forwards); a step whose backward never reached block 0 is
        aborted. Grouped by optimizer step when the optimizer is known (Note [Micro-batches
        under whole-model compile]), else one per forward."""
        groups: List[List[StepTimes]] = []
        for s in self.steps:
            if groups and (s.group == groups[-1][-1].group if self.grouped else False):
                groups[-1].append(s)
            else:
                groups.append([s])
        out = []
        for k, forwards in enumerate(groups):
            sp = next((s.shape_plan for s in forwards if s.shape_plan is not None), None)
            figures = next((s.figures for s in forwards if s.figures is not None), None)
            planned = all(s.serial > 0 for s in forwards) and figures is not None
            done = all(s.peak is not None for s in forwards)
            if not done and forwards[-1] is self.steps[-1] and forwards[-1].peak is None:
                continue  # running now
            peak = max((s.peak or 0) for s in forwards)
            ms = sum(s.step_ms() or 0.0 for s in forwards)
            out.append({
                "step": k, "mode": "plan" if planned else "measure",
                "shape": list(forwards[0].shape),
                "measured_peak_bytes": peak if done else 0, "measured_peak_at": None,
                "predicted_peak_bytes": (int(figures["predicted_peak_bytes"])
                                         if planned and figures else None),
                "budget_bytes": (int(figures["budget_bytes"]) if planned and figures
                                 else budget_bytes),
                "step_ms": ms,
                "predicted_step_ms": (float(figures["predicted_step_ms"])
                                      if planned and figures else None),
                "exposed_copy_ms": 0.0, "micro_batches": len(forwards), "planning_ms": 0.0,
                "aborted": None if done else "its backward did not reach block 0",
                "plan_source": ("derived" if sp is not None else "measured") if planned
                else None,
                # Each micro-batch position is checked (Note [A compiled plan's first
                # run] in _compiled_check.py): failed if one failed.
                "check": ("failed" if any(s.check == "failed" for s in forwards)
                          else next((s.check for s in forwards if s.check), None)),
                "over_budget": bool(done and budget_bytes is not None
                                    and peak > (int(figures["budget_bytes"])
                                                if planned and figures else budget_bytes)),
                "compiled": True})
        return out


def measured_layers(m: StepTimes, names: Sequence[str], kinds: Sequence[str],
                    saved: Dict[int, List[SavedValue]],
                    weights: Dict[int, float]) -> List[Dict[str, Any]]:
    """The measured profile's layers (Note [Recompute cost in a compiled block]), from
    the measuring step m and what its shape's graphs save and cost."""
    out = []
    for i in range(len(names)):
        fwd = m.fwd_ms(i) or 0.0
        bwd = max(0.0, (m.bwd_ms(i) or 0.0) - fwd)  # its backward recomputed it all
        out.append(layer_doc(names[i], kinds[i], saved.get(i, []), fwd, bwd,
                             weights.get(i, 0.0)))
    return out
