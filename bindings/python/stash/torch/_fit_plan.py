"""stash.torch.fit's planning step: functions of a profile, the budget and the solver,
handed what they need by the handle. The link section, the budget in bytes of a shape, a
plan from a measured profile and its refusals, a plan from a derived one, both priced as
the replay pays recompute (Note [Recompute cost as the replay pays it] in _fit_measure.py).
The handle decides what a refusal does (it restores the blocks and raises; across ranks
every rank raises).

Note [A refusal is also a warning]
A refusal (BudgetRefused, or any error that closes fit) is raised, and fit has closed: the
blocks are restored and later steps run as plain training. A loop that catches
RuntimeError to skip a bad batch, as loops that skip an out-of-memory batch do, also
catches StashError (a RuntimeError, as torch.OutOfMemoryError is), and would go on
unplanned, over the budget, with nothing said. So the refusal is also a RuntimeWarning,
which such a loop does not swallow.

Note [A shape that cannot fit]
A shape never measured whose derived profile (Note [A profile derived from the measured
shapes] in _fit_shapes.py) has no plan within the budget is refused, not measured: its
measuring step, least memory, would itself peak over the budget (the derived smallest
feasible budget was within 0.4% of the measured least-memory peak on a Phi-3 at lengths
144-200 derived from 128 and 160). The refusal names that shape's smallest feasible
budget. A shape that cannot be derived (one measured shape far from it, or a derived
plan whose first run failed its check) is measured, and its measurement decides.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

from .._lib import StashError
from .._planner import STASH_ERROR_INFEASIBLE_BUDGET, InfeasibleBudget, evaluate, make_plan
from .._warn import warn
from ._fit_cache import Entry
from ._fit_gradients import view
from ._fit_options import Budget
from ._fit_shapes import derive_profile
from ._fit_support import _gib, _min_feasible, _plan_doc

Doc = Dict[str, Any]


class BudgetRefused(StashError):
    """No plan meets the budget (or the measuring step itself did not): the message names
    the smallest budget the same run accepts."""


def warn_closed(error: StashError) -> None:
    """Note [A refusal is also a warning]."""
    warn(f"{error} stash.torch.fit has closed: training that catches this error goes on "
         "without stash, unplanned.", RuntimeWarning)


def _smallest_accepted(min_feasible: int, measured: Optional[int]) -> int:
    """The smallest budget a refusal names: one the same run accepts, so at least what the
    measuring step itself used (it must fit, Note [The measuring step]) as well as the
    planner's smallest feasible one. The planner's figure is raised by 1%: a plan's first
    run can peak a little above its prediction on the meter (what a least-memory step does
    not show, Note [What the budget counts] in _fit_steps.py), and the correction that
    follows would refuse a budget with no room for it."""
    return max(int(min_feasible) + int(min_feasible) // 100, int(measured or 0))


def link_section(option: Any, *, local_ranks: int,
                 measure: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """The profile's link: fit's link= option (a dict of bandwidths; None or "measure":
    `measure()`, which the handle runs on this rank or across ranks)."""
    if isinstance(option, dict):
        try:
            link = {k: float(option[k]) for k in ("h2d_gbps", "d2h_gbps", "bidir_gbps")}
        except (KeyError, TypeError, ValueError) as e:
            raise StashError(f"stash.torch.fit: link needs h2d_gbps, d2h_gbps and "
                             f"bidir_gbps as numbers; got {option!r}") from e
        if not all(v > 0 for v in link.values()):
            raise StashError(f"stash.torch.fit: link bandwidths must be positive, got {link}")
        link["local_ranks"] = int(option.get("local_ranks", local_ranks))
        return link
    if option is not None and option != "measure":
        raise StashError(f"stash.torch.fit: link must be None, 'measure' or a dict with "
                         f"h2d_gbps, d2h_gbps, bidir_gbps; got {option!r}")
    try:
        link = measure()
    except StashError as e:
        raise StashError(f"stash.torch.fit: measuring the host-device link failed ({e}); "
                         "pass link={'h2d_gbps': ..., 'd2h_gbps': ..., 'bidir_gbps': ...} "
                         "(`stash bench link` measures them)", e.status) from e
    return {"h2d_gbps": link["h2d_gbps"], "d2h_gbps": link["d2h_gbps"],
            "bidir_gbps": link["bidir_gbps"], "local_ranks": int(link["local_ranks"]),
            "cached": link.get("cached", False)}


def budget_of(budget: Budget, entry: Optional[Entry]) -> Optional[int]:
    """The budget in bytes of the shape whose cache entry this is (Note [What a share
    budget means]): as given, or a share of its keep-all peak: the plan's, or for a shape
    measured and never planned, the profile's. None: a share with nothing to take it of."""
    if not budget.is_share:
        return budget.nbytes
    if entry is None:
        return None
    if "figures" in entry:
        return int(entry["figures"]["budget_bytes"])
    if "profile" in entry and "share_budget_bytes" not in entry:
        peak = _keep_all_peak(entry["profile"])
        entry["share_budget_bytes"] = int((budget.share or 0.0) / 100 * peak)
    return entry.get("share_budget_bytes")


def _keep_all_peak(doc: Doc) -> int:
    keep = _plan_doc(doc, [["keep"] * len(layer["tensors"]) for layer in doc["layers"]])
    return int(evaluate(doc, keep, 1 << 62, strict=False)["predicted_peak_bytes"])


def _floor(doc: Doc) -> str:
    """What no plan moves, for a refusal: the fixed bytes, and the optimizer step's peak
    where it was measured (Note [The measuring step's windows on CUDA] in
    _fit_cuda_meter.py)."""
    text = (f"; {_gib(int(doc.get('fixed_bytes', 0)))} of every position is not the blocks' "
            "activations (parameters, gradients, optimizer state, workspaces)")
    if doc.get("optimizer_bytes"):
        text += f", and optimizer.step() peaks at {_gib(int(doc['optimizer_bytes']))}"
    return text


def _in_flight_text(doc: Doc) -> str:
    n = int((doc.get("measurement") or {}).get("in_flight", 1))
    return (f"; {n} micro-batches were in flight at once, and each one's kept activations "
            "live through the others' passes (Note [Micro-batches in flight])"
            if n > 1 else "")


def plan_measured(doc: Doc, measured: Optional[int], budget: Budget, solver: str,
                  replayed: bool = True) -> Tuple[Doc, Dict[str, Any]]:
    """(plan, figures) for a measured profile; BudgetRefused when no plan meets the budget
    or the measuring step (least memory) did not. replayed: recompute replays a prefix of
    the block (eager; Note [Recompute cost as the replay pays it] in _fit_measure.py), not
    each value's own chain (a compiled graph's partitioner): the planner is told so
    (replay_priced)."""
    # Note [The measuring step]: least-memory mode must fit before anything is planned.
    # A byte budget is checked against it first; a share is a budget only once the
    # planner has the keep-all peak, so it is checked right after.
    if replayed:
        doc = replay_priced(doc)
    if budget.nbytes is not None and measured is not None and measured > budget.nbytes:
        raise _least_memory_over(doc, measured, budget.nbytes, replayed)
    try:
        plan, figures = _make_plan(doc, budget.planner_text, solver)
    except InfeasibleBudget as e:
        seen = (f"; the measuring step (least memory) peaked at {_gib(measured)}"
                if measured is not None else "")
        if seen:
            seen += _without_state(doc, "counted below")
        smallest = _smallest_accepted(e.min_feasible_bytes, measured)
        raise BudgetRefused(
            f"stash.torch.fit: no plan fits the budget of {_gib(e.budget_bytes)} "
            f"(requested {budget}): the smallest feasible budget for this model "
            f"and shape is {_gib(smallest)} ({smallest} bytes); "
            f"keep-all would peak at {_gib(e.keep_all_peak_bytes)}{seen}{_floor(doc)}"
            f"{_in_flight_text(doc)}. The blocks are restored; nothing was changed.",
            e.status) from e
    if measured is not None and measured > figures["budget_bytes"]:
        raise _least_memory_over(doc, measured, figures["budget_bytes"], replayed)
    return plan, figures


def plan_derived(bases: Sequence[Tuple[int, Doc, int]], tokens: int, budget: Budget,
                 solver: str, without_gradients: bool = False, margin: float = 0.0
                 ) -> Optional[Tuple[Doc, Doc, Dict[str, Any]]]:
    """(profile, plan, figures) for a shape of `tokens` never measured, from the measured
    shapes of its family (Note [A profile derived from the measured shapes]); None when
    there is nothing to derive from (the shape is then measured: the measurement, not a
    derivation, refuses a budget). margin: the share of the budget the plan leaves free
    (Note [What a derived plan leaves free] in _fit_shape_plans.py); the figures' budget
    stays the budget.
    InfeasibleBudget when the derived profile has no plan."""
    measured = {b[0] for b in bases}
    if len(measured) == 1 and max(tokens / min(measured), min(measured) / tokens) >= 1.5:
        # One measured shape gives no exponents: a second, far enough from it to fit them,
        # is measured (Note [A profile derived from the measured shapes]).
        return None
    doc = derive_profile(list(bases), tokens)
    if doc is None:
        return None
    on = replay_priced(view(doc, without_gradients))  # Note [Gradients by position]
    plan, figures = _make_plan(on, budget.planner_text, solver)
    whole = int(figures["budget_bytes"])
    target = int(whole * (1.0 - margin))
    if margin > 0 and int(figures["predicted_peak_bytes"]) > target:
        try:
            plan, figures = _make_plan(on, target, solver)
            figures = dict(figures, budget_bytes=whole)
        except InfeasibleBudget:
            pass  # the plan at the budget itself stands
    return doc, plan, figures


def derived_refusal(e: InfeasibleBudget, budget: Budget, tokens: int,
                    measured: Sequence[int], bucket: bool = False) -> BudgetRefused:
    """Note [A shape that cannot fit]: the refusal of a shape of `tokens` whose profile,
    derived from the measured shapes of these token counts, has no plan. bucket: the shape
    is a bucket's (Note [Lengths rounded up to a bucket] in _fit_shapes.py)."""
    smallest = _smallest_accepted(e.min_feasible_bytes, None)
    lengths = ", ".join(str(t) for t in sorted(set(measured)))
    what = (f"a bucket of lengths rounded up ({tokens} tokens, fit(buckets=...))" if bucket
            else f"a new input shape ({tokens} tokens)")
    return BudgetRefused(
        f"stash.torch.fit: {what} does not fit the budget of "
        f"{_gib(e.budget_bytes)} (requested {budget}): derived from the shapes measured "
        f"so far ({lengths} tokens), its smallest feasible budget is {_gib(smallest)} "
        f"({smallest} bytes), and its measuring step would peak over the budget; give "
        "the budget of the largest shape the run trains. The blocks are restored; "
        "this step did not run.", e.status)


def _without_state(doc: Doc, where: str) -> str:
    """What a quoted measuring step's peak lacked: the optimizer's state, where its first
    step had not made it yet (the smallest feasible budget counts it, `where`)."""
    missing = int((doc.get("measurement") or {}).get("optimizer_state_missing_bytes", 0))
    return (f" without the optimizer's state ({_gib(missing)}, made by its first step, "
            f"{where})" if missing else "")


def _least_memory_over(doc: Doc, measured: int, budget: int,
                       replayed: bool = True) -> BudgetRefused:
    smallest = _smallest_accepted(_min_feasible(doc), measured)
    # Note [The measuring step] in _fit_measure.py; under whole-model compile the graph's blocks
    # are recomputed and nothing is offloaded (Note [Planning the compiled graph]).
    how = ("every block recomputed from its input, inputs offloaded" if replayed else
           "every block of the compiled graph recomputed from its input")
    return BudgetRefused(
        f"stash.torch.fit: the measuring step (least memory: {how}) "
        f"peaked at {_gib(measured)} ({measured} bytes)"
        f"{_without_state(doc, 'which the smallest budget below counts')}, over "
        f"the budget of {_gib(budget)} ({budget} bytes); the smallest feasible budget "
        f"for this model and shape is {_gib(smallest)} ({smallest} bytes). The blocks are "
        "restored; nothing was planned.")


def replay_priced(doc: Doc) -> Doc:
    """The profile with "recompute_cost": "prefix" (Note [Recompute by prefix] in
    planner/model/plan.h): an eager block recomputes by replaying its forward up to the
    last tensor it needs. Profiles measured before the field existed (cache_dir) lack it."""
    return doc if doc.get("recompute_cost") == "prefix" else dict(doc, recompute_cost="prefix")


# Note [Micro-batches in flight]
# With micro-batches whose forwards all run before their backwards (handle.micro_batch(i)),
# the kept activations of every micro-batch but the running one stay alive through its
# forward and backward: (in_flight - 1) times the plan's kept bytes above the one pass the
# canonical model describes (their offloaded tensors are on the host by then, their
# recomputed ones gone). So a profile whose measuring step had several micro-batches in
# flight is planned with more fixed bytes: the least extra E whose plan needs no more than
# E, a plan's need being (in_flight - 1) times its kept bytes less what the fixed bytes
# already hold (on CUDA the measuring step's one peak counted the other micro-batches'
# least-memory kept bytes: measurement.in_flight_held_bytes). A plan made with more fixed
# bytes mostly keeps less, so E is found by bisection between 0 and the need of the plan
# made without it; every plan returned is checked to cover its own need. The budget in
# bytes is resolved once, on the profile as measured (a share is a share of one pass's
# keep-all peak). The search is not monotone in the budget, so a refusal's smallest
# budget is one checked to have a plan, not proved the least. Found once plans kept what
# the budget allows (Note [Recompute by prefix] in planner/model/plan.h): a 3-layer Llama
# at 85% with two micro-batches in flight ran its first plan 17% over the prediction.

def kept_bytes(doc: Doc, actions: Sequence[Sequence[str]]) -> int:
    """The bytes a plan's actions (per layer, per tensor) keep."""
    return sum(int(t["bytes"]) for layer, acts in zip(doc["layers"], actions)
               for t, a in zip(layer["tensors"], acts) if a == "keep")


# Note [A compiled block replays whole]
# A block compiled per block (torch.compile(block)) is recomputed by running its compiled
# forward again, which makes every value it saves, not only the ones the plan recomputes;
# so any recompute in it costs its whole forward (Note [Recompute cost as the replay pays
# it] in _fit_measure.py), and its backward holds, beside that replay, what the plan kept
# or fetched of it: the model's backward_i counts the block's saved bytes once. A
# 3-layer Llama with its blocks compiled, at 60% of keep-all, kept 6.0 of its last
# block's 6.8 MB and recomputed the rest: that block's backward ran 5.1 MB over the
# model (22.9 MB against 17.8), the next block's, which had offloaded 2 MB, 2.2 MB over.
# Keeping or offloading a value of such a block saves no time once the block is
# recomputed at all, so a plan that recomputes any value of it recomputes every value it
# may (the measuring step's profile lists these blocks as measurement.replays_whole); its
# figures are priced again. The model then holds for it: the bytes kept are the ones
# no replay makes (must_keep).

def _replay_whole(doc: Doc, plan: Doc, figures: Dict[str, Any]
                  ) -> Tuple[Doc, Dict[str, Any]]:
    """Note [A compiled block replays whole]: the plan with every recomputable value of a
    block that replays whole recomputed, where it recomputes any; priced again."""
    whole = (doc.get("measurement") or {}).get("replays_whole") or []
    changed = False
    for i in whole:
        if not (0 <= i < len(doc["layers"])):
            continue
        tensors, planned = doc["layers"][i]["tensors"], plan["layers"][i]
        if not any(p["action"] == "recompute" for p in planned["tensors"]):
            continue
        moved = False
        for t, p in zip(tensors, planned["tensors"]):
            if t.get("recomputable") and not t.get("must_keep") and p["action"] != "recompute":
                p["action"] = "recompute"
                moved = True
        total = sum(int(t["bytes"]) for t in tensors)
        if moved and total:  # the layer's byte fractions, as the planner writes them
            planned["fractions"] = {a: sum(int(t["bytes"]) for t, p in
                                           zip(tensors, planned["tensors"])
                                           if p["action"] == a) / total
                                    for a in ("keep", "recompute", "offload")}
        changed = changed or moved
    if not changed:
        return plan, figures
    priced = evaluate(doc, plan, int(figures["budget_bytes"]), strict=False)
    predicted = dict(plan.get("predicted") or {})
    predicted.update(peak_bytes=int(priced["predicted_peak_bytes"]),
                     step_ms=float(priced["predicted_step_ms"]),
                     offloaded_bytes=sum(int(t["bytes"]) for layer, planned in
                                         zip(doc["layers"], plan["layers"])
                                         for t, p in zip(layer["tensors"], planned["tensors"])
                                         if p["action"] == "offload"))
    predicted.pop("peak_at", None)
    plan["predicted"] = predicted
    return plan, dict(figures, predicted_peak_bytes=int(priced["predicted_peak_bytes"]),
                      predicted_step_ms=float(priced["predicted_step_ms"]))


def _make_plan(doc: Doc, budget: Union[int, str], solver: str
               ) -> Tuple[Doc, Dict[str, Any]]:
    """make_plan, with the other micro-batches in flight counted (Note [Micro-batches in
    flight]) and blocks that replay whole recomputed whole (Note [A compiled block
    replays whole]). A refusal's smallest feasible budget is then one this search
    accepts."""
    plan, figures = _make_plan_in_flight(doc, budget, solver)
    return _replay_whole(doc, plan, figures)


def _make_plan_in_flight(doc: Doc, budget: Union[int, str], solver: str
                         ) -> Tuple[Doc, Dict[str, Any]]:
    measurement = doc.get("measurement") or {}
    others = int(measurement.get("in_flight", 1)) - 1
    if others <= 0:
        return make_plan(doc, budget, solver=solver)
    held = int(measurement.get("in_flight_held_bytes", 0))
    try:
        return _in_flight(doc, budget, solver, others, held)
    except InfeasibleBudget as e:
        # The budget a refusal names is _smallest_accepted's (1% above the planner's):
        # that one must have a plan here.
        smallest = e.min_feasible_bytes
        for _ in range(64):
            try:
                _in_flight(doc, _smallest_accepted(smallest, None), solver, others, held)
                break
            except InfeasibleBudget as again:
                smallest = max(smallest + max(1, smallest // 200), again.min_feasible_bytes)
        raise InfeasibleBudget(
            f"{e}; with {others + 1} micro-batches in flight the smallest budget found to "
            f"have a plan is {_smallest_accepted(smallest, None)} bytes", e.status,
            {"budget_bytes": e.budget_bytes, "min_feasible_bytes": smallest,
             "min_feasible_proved": False, "keep_all_peak_bytes": e.keep_all_peak_bytes}
        ) from None


def _in_flight(doc: Doc, budget: Union[int, str], solver: str, others: int, held: int
               ) -> Tuple[Doc, Dict[str, Any]]:
    plan, figures = make_plan(doc, budget, solver=solver)

    def need(p: Doc) -> int:
        return others * kept_bytes(doc, [[t["action"] for t in layer["tensors"]]
                                         for layer in p["layers"]]) - held

    if need(plan) <= 0:
        return plan, figures
    nbytes = int(figures["budget_bytes"])

    def with_extra(extra: int) -> Tuple[Doc, Dict[str, Any]]:
        return make_plan(dict(doc, fixed_bytes=int(doc["fixed_bytes"]) + extra), nbytes,
                         solver=solver)

    # The least extra whose plan needs no more than it, by bisection (need mostly falls
    # as the extra grows).
    lo, hi = 0, need(plan)
    best: Optional[Tuple[Doc, Dict[str, Any]]] = None
    while hi - lo > max(1, hi // 1024):
        mid = (lo + hi) // 2
        try:
            made = with_extra(mid)
        except InfeasibleBudget:
            hi = mid
            continue
        if need(made[0]) <= mid:
            hi, best = mid, made
        else:
            lo = mid
    extra = hi
    for _ in range(8):
        if best is not None:
            return best
        made = with_extra(extra)  # InfeasibleBudget when this extra has no plan
        if need(made[0]) <= extra:
            best = made
        extra = max(extra + 1, need(made[0]))
    raise InfeasibleBudget(
        f"stash_plan_make: no plan at {nbytes} bytes covers the kept activations of "
        f"{others} more micro-batches in flight", STASH_ERROR_INFEASIBLE_BUDGET,
        {"budget_bytes": nbytes, "min_feasible_bytes": nbytes + 1,
         "min_feasible_proved": False, "keep_all_peak_bytes": figures["keep_all_peak_bytes"]})
