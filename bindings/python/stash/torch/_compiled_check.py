"""stash.torch's whole-model compile: the check of each compiled plan's first run, and
what a failed one does (CompiledState, _compiled.py, calls check_first_run at a step's
end: Note [The step's tail under whole-model compile] in _compiled_fit.py).

Note [A compiled plan's first run]
The first run of each plan, per shape, is checked on the meter against its budget (its
report() entry's "check"), each micro-batch position of it (the gradient bytes it began
with: a later micro-batch holds those of the earlier ones) on its own. The model prices
a compiled graph's positions only as well as its calibration (Note [Backward temporaries
of a compiled block] in _compiled_fit.py): a plan that offloads ran over its prediction
by about the bytes of one offloaded value on the peers' tiny Llama (1.25 MB with five
values offloaded, 0.98 MB with one), which no position of the model explained then (the
plans that only recompute were within it). On test_fit_compiled's wide Llama such an
overshoot was the blocks' temporaries priced 0 (fixed there); since then every first
check of the peers' compiled rows has passed, but the tiny Llama's case was not
reproduced to confirm the same cause, and a partly recomputed block can still run above
its figure. So a failed check of a plan that offloads plans again without offload; of
one that does not, adds what the run exceeded its prediction by to the fixed bytes and
plans again (a new serial: every shape's graph recompiles at its next step, planned so),
at most twice a run; after that fit warns once. (A constant correction for an offloading
plan's error would have priced least memory over a budget it had been measured within.)
The failed step itself was over the budget: this is a correction, not a guarantee.
The correction is added after the calibrations of the blocks' temporaries and the
loss's bytes, which read a position's figure as its measured peak less the fixed bytes:
added before (until 2026-12-07) it came off them again, and on OLMo 2 at 70% of
keep-all (q/k norms; its plan ran 10% over its prediction) the same plan was planned
twice more and ran over the budget every step. Corrected, a profile may price every
plan over the budget, least memory included, though least memory was measured within
it: then least memory runs, priced at its measured peak, with a warning
(_compiled_fit._least_memory_measured), rather than a refusal mid-backward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._compiled_shapes import ShapePlan
from ._compiled_steps import StepTimes
from ._fit_plan import BudgetRefused
from ._fit_support import _gib
from .._warn import warn

if TYPE_CHECKING:
    from ._compiled import CompiledState

__all__ = ["check_first_run"]


def check_first_run(state: CompiledState, step: StepTimes, peak: int) -> None:
    """Note [A compiled plan's first run]: the first run of each plan and shape."""
    # Per micro-batch position too: one that begins with the gradients of those before
    # it alive runs higher (Note [Micro-batches under whole-model compile]).
    key = (step.serial, step.shape, step.grads)
    sp = step.shape_plan
    if sp is not None and sp.unplanned:
        _check_unplanned(state, step, sp, peak)
        return
    if sp is not None and sp.figures is not None:
        # Note [A new shape across graphs] in _compiled_shapes.py: priced once its last
        # graph was partitioned, after its first step began.
        step.figures = sp.figures
    figures = step.figures
    if key in state.checked or figures is None:
        return
    state.checked.add(key)
    budget = int(figures["budget_bytes"])
    step.check = "passed" if peak <= budget else "failed"
    if sp is not None:
        sp.check = step.check
    if step.check == "passed":
        return
    if state.replans < 2:
        state.replans += 1
        acts = sp.actions if sp is not None else state.actions
        if any(a == "offload" for layer in acts or [] for a in layer):
            state.offload = False
        else:
            state.correction += peak - int(figures["predicted_peak_bytes"])
        state.actions = state.plan_actions()
        state.serial += 1
        state.shapes.plans.clear()
        return
    if not state.check_warned:
        state.check_warned = True
        warn(
            f"stash.torch.fit: the compiled graph for shape {list(step.shape)} peaked at "
            f"{peak} bytes, over its budget of {budget} bytes, after {state.replans} "
            "corrections of its plan; give a budget with that margin, or use per-block "
            "compile or eager mode.")


def _check_unplanned(state: CompiledState, step: StepTimes, sp: ShapePlan, peak: int) -> None:
    """Note [A graph break among the blocks] in _compile_plan.py: the first run of a
    shape that ran at least memory, unplanned. Over the budget, no plan of stash's
    trains it within it: its next step is refused (as an eager shape whose measuring
    step peaked over the budget is), naming the peak."""
    if sp.check is not None or state.figures is None:
        return
    budget = int(state.figures["budget_bytes"])
    sp.check = step.check = "passed" if peak <= budget else "failed"
    if sp.check == "passed":
        return
    sp.refusal = BudgetRefused(
        f"stash.torch.fit: shape {list(sp.shape)} ran its compiled graphs at least memory "
        f"(every block recomputed: a graph break splits the compiled blocks, and no plan "
        f"across the graphs was found within the budget) and peaked at {_gib(peak)} "
        f"({peak} bytes), over the budget of {_gib(budget)} ({budget} bytes), so no plan "
        "trains it within the budget. Give a budget of at least that peak, train shorter "
        "inputs, or remove the break (TORCH_LOGS=graph_breaks names it). The blocks are "
        "restored; this step did not run.")
