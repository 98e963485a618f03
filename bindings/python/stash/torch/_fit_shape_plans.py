"""stash.torch.fit's plans by shape: the part of the handle that keeps, for every shape
of block 0's inputs it has seen, its profile and plan (ShapeCache), and decides a step's
plan: a cached one, one made from the shape's measurement (on this rank, or agreed
across ranks), one derived from the measured shapes of its family, or none (the step
measures). It corrects a plan from its first run and checks a derived plan's (Notes
[Re-planning and the cache] and [A derived plan's first run]; Note [What the budget counts]
in _fit_steps.py). Handed the budget, the options, the ranks, fail (restores the blocks and
raises) and fixed_counted (fit's count of the bytes that are not activations).

Note [Re-planning and the cache]
A step's shape key is what block 0 is called with: each tensor argument's shape, dtype
and device, autocast state and training mode. At the start of a step with a new key the
in-memory cache is asked first, then cache_dir (profiles keyed by a digest of the blocks'
classes and parameter shapes and of the shape key; plans also by budget and solver), and
only a shape seen nowhere is measured again. With cache_dir a second run of the same
script starts planned: no measuring step. The plan switches between steps (the engine
takes a new plan only while no micro-batch holds tensors).

Note [What a derived plan leaves free]
A derived profile is a model of a shape, and its plans can peak a little above their
prediction: under bf16 autocast a Llama in a Trainer (two micro-batches of random padded
lengths a step) ran derived plans up to 0.2% above it, one step 28 KB over its budget. A
step whose passes ran derived plans of several shapes checks none of them (Note
[Micro-batches of other shapes] in _fit_passes.py), and a shape seldom comes twice in
such a loop, so neither its check nor a correction of its own would help. The family
learns instead: a planned step whose plans were all derived and that peaked above its
prediction sets the family's margin to that excess (the most seen) and marks the
family's derived plans stale (each is derived again when its shape next comes; until
then it keeps the budget the steps that ran it are judged against), and every plan
derived from then on leaves that share of the budget free (a plan made at the budget
less the margin; the budget the step is judged against stays the budget). Where no plan
fits the smaller figure, the plan at the budget stands. A new measured shape marks them
stale too (Note [A profile derived from the measured shapes] in _fit_shapes.py).

Note [A derived plan's first run]
A plan made from a derived profile (Note [A profile derived from the measured shapes] in
_fit_shapes.py) rests on a model of the shape, not on a measurement of it, so its first
run is a check. Its layers are not exact (_DerivedLayer): the hooks refuse no tensor count,
a tensor past the derived skeleton is kept, and a tensor the plan recomputes that cannot
be recomputed in this shape is kept, silently; the step trains as always. When it ends,
the check asks two things: did every block save the tensors the skeleton lists, and did
the step peak within its budget (on the meter: max_memory_allocated on CUDA, c10's CPU
allocator on the CPU, Note [What the budget counts] in _fit_steps.py)? If both hold the plan
stands for the shape; otherwise the record says why, the shape's derivation is dropped, and
the next step of that shape is measured. Derived plans are not written to cache_dir; the
measured profiles they come from are.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, NoReturn, Optional, Set, Tuple

import torch

from .._lib import StashError
from .._planner import InfeasibleBudget
from ._fit_cache import Entry, ShapeCache
from ._fit_gradients import planned_without, shift_fixed, view
from ._fit_options import Budget, FitOptions
from ._fit_plan import (BudgetRefused, budget_of, derived_refusal, plan_derived,
                        plan_measured)
from ._fit_ranks import (Ranks, cached_plan_agreed, combine_measured, optimizer_state_delta,
                         publish_plan, published_plan)
from ._fit_support import (StepRecord, _actions_of, _DerivedLayer, _gib,
                           _optimizer_state_bytes)


# Note [What the budget counts] in _fit_steps.py: the plan made with a correction peaks
# where other temporaries live, so a shape's run is checked until one peaks within.
MAX_CORRECTIONS = 3


class _PassRefused(Exception):
    """A later pass's shape refused (ShapePlans.choose_for_pass)."""

    def __init__(self, error: StashError) -> None:
        super().__init__(str(error))
        self.error = error


class ShapePlans:
    """Every shape's entry (cache), the current shape's (key, entry), and the planning
    decisions between steps."""

    def __init__(self, cache: ShapeCache, budget: Budget, options: FitOptions,
                 ranks: Optional[Ranks], fail: Callable[[StashError], NoReturn],
                 fixed_counted: Callable[[], int]):
        self.cache = cache
        self.budget = budget
        self.options = options
        self.ranks = ranks
        self._fail = fail
        self._fixed_counted = fixed_counted
        self.key: Optional[str] = None
        self.entry: Optional[Entry] = None   # the current shape's (planned steps)
        self.measured_for: Dict[str, int] = {}  # key -> steps measured so far
        self.shapes: Dict[str, Tuple[str, Optional[int]]] = {}  # key -> (family, tokens)
        # Note [Lengths rounded up to a bucket] in _fit_shapes.py: the keys that are buckets
        self.buckets: Set[str] = set()
        self.underivable: Set[str] = set()  # keys whose derived plan failed its check
        # keys measured again because their first measuring step compiled graphs
        self.timed_again: Set[str] = set()
        # family -> the share of the budget its derived plans leave free (Note [What a
        # derived plan leaves free])
        self.derived_margin: Dict[Optional[str], float] = {}
        # Whether the step being chosen began without gradients (Note [Gradients by
        # position] in _fit_gradients.py).
        self.without_gradients = False

    def choose(self, key: str, without_gradients: bool = False) -> Optional[Entry]:
        """The entry whose plan a step of shape `key` runs (Note [Re-planning and the
        cache]); None: the step measures. without_gradients: the step begins with no
        gradient alive (Note [Gradients by position] in _fit_gradients.py)."""
        # A share is of the stored profile's keep-all peak and planned on it; across ranks
        # every rank must plan on the same profile: the stored one.
        self.without_gradients = (without_gradients and self.ranks is None
                                  and not self.budget.is_share)
        if key != self.key:
            self.key = key
            self.entry = self.cache.get(key) or self._load_cached(key)
            if self.ranks is not None:
                self.entry = self._agree_cached(key, self.entry)
        entry = self.entry
        if entry is not None and entry.get("stale"):
            # Note [What a derived plan leaves free]: derived again (the entry stays, for
            # the budgets of the steps that ran it, until the new one replaces it).
            entry = self.entry = None
            return self._choose_new(key)
        if entry is not None and "plan" in entry and "profile" in entry and bool(
                entry.get("without_gradients")) != self._wants_view(entry):
            # Planned for the other kind of step: planned again (a derived one derived
            # again) for this one.
            for k in ("plan", "figures", "actions", "without_gradients"):
                entry.pop(k, None)
            if entry.get("derived"):
                self.cache.pop(key, None)
                entry = self.entry = None
        if entry is not None and "plan" in entry:
            return entry
        return self._choose_new(key)

    def _choose_new(self, key: str) -> Optional[Entry]:
        """choose() for a shape with no plan: from its measurement, derived, or None."""
        if self.measured_for.get(key, 0) >= self.options.measure_steps:
            return self.plan_from_measurement(key)
        entry = self._plan_derived(key)
        if entry is not None:
            self.entry = entry
        return entry

    def choose_for_pass(self, key: str) -> Tuple[Optional[Entry], Optional[str]]:
        """choose() for a later pass of a running step (Note [Micro-batches of other shapes]
        in _fit_passes.py), with the gradients alive: (its entry, None), or (None, why) where its
        shape has no plan: to be measured (why None) or refused at its budget (why: the
        refusal), which mid-step closes nothing and raises nothing."""
        fail = self._fail

        def refuse(e: StashError) -> NoReturn:
            raise _PassRefused(e)
        self._fail = refuse
        try:
            return self.choose(key), None
        except _PassRefused as r:
            return None, str(r.error)
        finally:
            self._fail = fail

    def _wants_view(self, entry: Entry) -> bool:
        """Whether the current step plans this entry on its view without gradients."""
        return planned_without(entry["profile"], self.without_gradients)

    def measured(self, key: str, entry: Entry, compiled: bool = False) -> None:
        """A measuring step of shape `key` ended with this entry (its profile). compiled:
        graphs were compiled during it, so its times are not the steady state's: the
        shape is measured once more (Note [A measuring step that compiled] in
        _fit_measure.py), its entry kept meanwhile for the step's budget but neither
        stored nor a base of other shapes' plans."""
        if (compiled and key not in self.timed_again and self.ranks is None
                and self._plannable(key, entry)):
            self.timed_again.add(key)
            entry["compiled"] = True
            self.cache[key] = entry
            self.entry = entry
            return
        if key in self.timed_again:
            entry["profile"]["measurement"]["notes"].append(
                "fit: measured again: graphs were compiled during the first measuring step")
        self.measured_for[key] = self.measured_for.get(key, 0) + 1
        # Note [A profile derived from the measured shapes] in _fit_shapes.py: a new base
        # makes the family's derived plans stale.
        self._stale_derived(self.shapes.get(key, (None,))[0])
        self.cache[key] = entry
        self.entry = entry
        self.cache.store_profile(key, entry["profile"])

    def _plannable(self, key: str, entry: Entry) -> bool:
        """Whether the shape's measurement can be planned at the budget (as _plan_locally
        plans it, a roomier budget of a share included): a shape that cannot is refused
        at its next step, not measured again first (Note [A measuring step that compiled]
        in _fit_measure.py)."""
        doc = view(entry["profile"], self._wants_view(entry))
        measured = entry.get("measured_peak_bytes")
        for budget in (self.budget, self.roomier_budget(key, measured or 0)):
            if budget is None:
                return False
            try:
                plan_measured(doc, measured, budget, self.options.solver)
                return True
            except BudgetRefused:
                continue
        return False

    def optimizer_stepped(self, opt: torch.optim.Optimizer, counted: int) -> Optional[int]:
        """The optimizer stepped, with `counted` bytes of its state in the current shape's
        fixed bytes (Note [What the budget counts] in _fit_steps.py): where its real state
        differs, the next step plans again with it (across ranks, once, with the largest
        difference any rank saw). Returns the bytes counted from now, or None where the
        current shape has no measured profile (or its ranks checked already)."""
        entry = self.entry
        if entry is None or "profile" not in entry:
            return None
        if self.ranks is not None:
            if entry.get("opt_checked"):
                return None
            entry["opt_checked"] = True
            real = _optimizer_state_bytes(opt)
            delta = optimizer_state_delta(self.ranks, real - counted)
        else:
            real = _optimizer_state_bytes(opt)
            delta = real - counted
        if delta:
            shift_fixed(entry["profile"], delta)
            entry.pop("plan", None)
        return real

    @property
    def budget_bytes(self) -> Optional[int]:
        """The budget in bytes of the current shape: as given, or a share resolved once the
        shape has a plan (Note [What a share budget means])."""
        if not self.budget.is_share:
            return self.budget.nbytes
        entry = self.entry
        return int(entry["figures"]["budget_bytes"]) if entry and "figures" in entry else None

    def budget_for(self, key: str) -> Optional[int]:
        """The budget in bytes of the shape `key` (None: a share not resolved yet): for a
        measured shape whose least-memory step peaked over its share, the longer shape's
        bytes it is planned at (Note [What a share budget means])."""
        entry = self.cache.get(key)
        own = budget_of(self.budget, entry)
        if entry is None or own is None or "figures" in entry:
            return own
        measured = entry.get("measured_peak_bytes")
        if measured is not None and measured > own:
            roomier = self.roomier_budget(key, measured)
            if roomier is not None:
                return roomier.nbytes
        return own

    def plan_from_measurement(self, key: str) -> Entry:
        if self.ranks is not None:
            return self._plan_across_ranks(key)
        return self._plan_locally(key)

    def _plan_across_ranks(self, key: str) -> Entry:
        """Note [Agreeing on a plan across ranks]: the ranks' profiles combined, rank 0's
        plan of them run everywhere."""
        ranks, entry = self.ranks, self.cache[key]
        assert ranks is not None
        try:
            own = combine_measured(ranks, entry)
        except StashError as e:
            self._fail(e)
        self.cache.store_profile(key, entry["profile"])
        if ranks.rank == 0:
            entry = self._plan_locally(key)  # a refusal fails every rank from there
            publish_plan(ranks, own, entry["plan"], entry["figures"])
            return entry
        try:
            plan, figures = published_plan(ranks, own)
        except StashError as e:
            self._fail(e)
        entry.update(plan=plan, figures=figures, actions=_actions_of(plan))
        self.cache.store_plan(key, plan)
        return entry

    def _agree_cached(self, key: str, entry: Optional[Entry]) -> Optional[Entry]:
        """A new input shape under torch.distributed: the cached plan only if every rank
        has the same one; where another rank lacks it, every rank measures again."""
        assert self.ranks is not None
        if cached_plan_agreed(self.ranks, entry):
            return entry
        if entry is not None and "plan" in entry:
            self.cache.pop(key, None)
            self.measured_for[key] = 0
            return None
        return entry

    def roomier_budget(self, key: str, needed: int) -> Optional[Budget]:
        """Note [What a share budget means]: for a share that shape `key` cannot be planned
        at (it needs `needed` bytes), the largest budget in bytes the share gave another
        shape of this run, when that holds it; else None."""
        if not self.budget.is_share:
            return None
        given = [b for k, e in self.cache.items() if k != key
                 for b in [budget_of(self.budget, e)] if b is not None]
        if not given or max(given) < needed:
            return None
        return Budget(nbytes=max(given), text=f"{self.budget} of a longer shape")

    def _plan_locally(self, key: str) -> Entry:
        entry = self.cache[key]
        without = self._wants_view(entry)
        measured = entry.get("measured_peak_bytes")
        try:
            plan, figures = plan_measured(view(entry["profile"], without), measured,
                                          self.budget, self.options.solver)
        except BudgetRefused as e:
            roomier = self.roomier_budget(key, measured or 0)  # least memory must fit
            if roomier is None:
                self._fail(e)
            try:
                plan, figures = plan_measured(view(entry["profile"], without), measured,
                                              roomier, self.options.solver)
            except BudgetRefused:
                self._fail(e)
        entry.update(plan=plan, figures=figures, actions=_actions_of(plan),
                     without_gradients=without)
        self.cache.store_plan(key, plan, without)
        return entry

    def _plan_derived(self, key: str) -> Optional[Entry]:
        """A plan for a shape never measured (_fit_plan.plan_derived), from the measured
        shapes of its family; None: the shape is measured."""
        if self.ranks is not None or key in self.underivable:
            return None
        family, tokens = self.shapes.get(key, (None, None))
        if tokens is None:
            return None
        counted = self._fixed_counted()
        # Note [What stays the same across shapes] in _fit_shapes.py
        bases = [(int(self.shapes[k][1] or 0), e["profile"],
                  max(counted, int(e["profile"].get("measurement", {}).get("constant_bytes", 0))))
                 for k, e in self.cache.items()
                 if k != key and self.shapes.get(k, (None,))[0] == family
                 and not e.get("derived") and not e.get("compiled") and "profile" in e
                 and self.shapes[k][1]]
        without = self.without_gradients
        margin = self.derived_margin.get(family, 0.0)
        refusal: Optional[BudgetRefused] = None
        try:
            made = plan_derived(bases, tokens, self.budget, self.options.solver, without,
                                margin)
        except InfeasibleBudget as e:  # Note [A shape that cannot fit] in _fit_plan.py
            refusal = derived_refusal(e, self.budget, tokens, [b[0] for b in bases],
                                      bucket=key in self.buckets)
            roomier = self.roomier_budget(key, e.min_feasible_bytes)
            if roomier is not None:  # Note [What a share budget means]
                try:
                    made = plan_derived(bases, tokens, roomier, self.options.solver, without,
                                        margin)
                    refusal = None
                except InfeasibleBudget:
                    pass
        if refusal is not None:
            self._fail(refusal)
        if made is None:
            return None
        doc, plan, figures = made
        entry: Entry = {"profile": doc, "derived": True, "measured_peak_bytes": None,
                        "plan": plan, "figures": figures,
                        "without_gradients": planned_without(doc, without),
                        "actions": [_DerivedLayer(a) for a in _actions_of(plan)]}
        self.cache[key] = entry
        return entry

    def _load_cached(self, key: str) -> Optional[Entry]:
        """The entry of a shape cache_dir holds (Note [Re-planning and the cache]): planned
        from its cached plan, or from its cached profile where no plan for this budget and
        solver is there. Under torch.distributed ranks agree on cached plans, not profiles
        (_agree_cached): a profile alone is measured again."""
        found = self.cache.read(key, self.without_gradients)
        if found is None:
            return None
        doc, plan, figures, without = found
        if plan is None and self.ranks is not None:
            return None
        entry: Entry = {"profile": doc, "from_disk": True}
        self.cache[key] = entry
        if plan is None:
            entry["measured_peak_bytes"] = None
            self.measured_for[key] = self.options.measure_steps
            self.entry = entry
            return self.plan_from_measurement(key)
        entry.update(plan=plan, figures=figures, actions=_actions_of(plan),
                     without_gradients=without)
        return entry

    def correct_fixed(self, rec: StepRecord, entry: Dict[str, Any]) -> None:
        """Note [What the budget counts] in _fit_steps.py: a measured plan's run peaking
        above its prediction on the meter puts the difference into the shape's fixed bytes;
        the next step plans again with them. Checked until a run peaks within its
        prediction, at most MAX_CORRECTIONS times."""
        over = rec.peak_bytes - int(entry["figures"]["predicted_peak_bytes"])
        done = len(entry.get("corrections", []))
        if over <= 0 or "profile" not in entry or done + 1 >= MAX_CORRECTIONS:
            entry["corrected"] = True
        # Any number of passes: the fixed bytes hold every gradient already, so a step of
        # several micro-batches peaks as one does, plus what the plan leaves alive.
        if over > 0 and "profile" in entry and done < MAX_CORRECTIONS:
            shift_fixed(entry["profile"], over)
            entry.setdefault("corrections", []).append(over)
            self.cache.store_profile(rec.key, entry["profile"])
            entry.pop("plan", None)

    def learn_derived(self, rec: StepRecord) -> None:
        """Note [What a derived plan leaves free]: a planned step whose plans were all
        derived, read against its prediction."""
        if rec.mode != "plan" or rec.predicted_peak is None or rec.predicted_peak <= 0:
            return
        entries = [self.cache.get(k) for k in rec.shapes]
        if not entries or not all(e is not None and e.get("derived") for e in entries):
            return
        excess = rec.peak_bytes / rec.predicted_peak - 1.0
        family = self.shapes.get(rec.key, (None,))[0]
        if excess <= self.derived_margin.get(family, 0.0):
            return
        self.derived_margin[family] = excess
        self._stale_derived(family)

    def _stale_derived(self, family: Optional[str]) -> None:
        """The family's derived plans are derived again when their shape next comes (a new
        base, a margin); until then their entries keep the budgets past steps are judged
        against."""
        for k, e in self.cache.items():
            if e.get("derived") and self.shapes.get(k, (None,))[0] == family:
                e["stale"] = True

    def check_derived(self, rec: StepRecord, entry: Dict[str, Any]) -> None:
        """Note [A derived plan's first run]."""
        layers = entry["profile"]["layers"]
        if rec.check is None:
            for i, layer in enumerate(layers):
                if rec.saved_counts.get(i, 0) != len(layer["tensors"]):
                    rec.check = (f"block {i} saved {rec.saved_counts.get(i, 0)} tensors, the "
                                 f"derived skeleton lists {len(layer['tensors'])}")
                    break
        if rec.check is None and rec.budget_bytes is not None and rec.over_budget:
            rec.check = (f"peaked at {_gib(rec.peak_bytes)}, over the budget of "
                         f"{_gib(rec.budget_bytes)}")
        if rec.check is None:
            rec.check = "passed"
            entry["checked"] = True
            return
        # Measured the next time this shape comes.
        self.underivable.add(rec.key)
        self.cache.pop(rec.key, None)
        if self.key == rec.key:
            self.key, self.entry = None, None
