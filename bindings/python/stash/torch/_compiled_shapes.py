"""The plans of whole-model compiled graphs for shapes other than the measured one (Note
[Every shape under whole-model compile]): per input shape, what its graphs save and cost
(ShapeGraphs), and each derived shape's plan (ShapePlan). A CompiledState (_compiled.py)
owns one.

Note [Every shape under whole-model compile]
A graph compiled for another shape than the measured one (a new sequence length or
batch size) saves the same values at other sizes, or others (one more, a size, in a
Llama's first block at length 160). Its partition knows them all: its saved values'
bytes, and its blocks' costs (matmul and attention FLOPs, other nodes' bytes: Note
[Recompute cost in a compiled block] in _compiled_steps.py). So that graph is planned
for its own shape at partition time, as eager mode plans a shape it never measured (Note
[A profile derived from the measured shapes] in _fit_shapes.py), without a measuring
step: its values as they are, each block's measured times scaled by its cost over the
measured block's, the
measured fixed bytes plus the difference in what is saved outside the blocks (the head's
logits and the loss grow with the tokens). A shape whose plan does not fit is refused
when its step begins, before it runs, naming its smallest feasible budget (Note [A shape
that cannot fit] in _fit_plan.py). Plans are keyed by block 0's input shape; the tick
that begins a step gives the engine that shape's offloads. A derived plan is checked on
its first run as a measured one is (Note [A compiled plan's first run] in
_compiled_check.py): under
whole-model compile a shape is not measured again (its measuring graph would be a
compile of its own). Before, such a graph got the measured plan by position, or kept
all: a Llama planned at 85% of its keep-all at length 128 peaked 4.9% over the budget
at 160.
Under a graph break between blocks (Note [A graph break among the blocks] in
_compile_plan.py) a shape's graphs are planned as they come (Note [A new shape across
graphs]).
The cost: the partition reads each saved value's size, which specializes the graph to
its shape, so every new shape is a compile of its own (Dynamo's automatic dynamic
shapes does not make one graph serve them all), and Dynamo's recompile limit
(torch._dynamo.config.recompile_limit, 8 by default) caps the shapes a run may train;
past it, Dynamo runs the model eagerly and fit names the limit.

Note [A new shape across graphs]
Under a graph break between blocks a shape's first graph (blocks 0..k-1) is partitioned,
and must be tagged, before its later graphs exist: Dynamo compiles the graph after the
break only when the forward reaches it. Until 2026-12-07 such a shape ran at least
memory (every block recomputed), unplanned. Now each graph is planned when it is
partitioned, from the profile of the whole shape: the blocks of its graphs partitioned
so far as they are, the others the measured shape's, their bytes and costs scaled by the
tokens (and what their graphs save outside the blocks, the head's logits), or, where a
block of this shape alike in the measured shape (the same saved values) was partitioned
already, that block's own bytes rather than scaled ones: on a 12-layer Llama split
before every block after the first, length 160 saved one value more per block than the
measured 128 did (a SymInt, left out since: Note [Saved values by position] in
_compile_plan.py), and blocks planned beside the measured ones kept one value more each
than the last graph had room for (least memory then ran 1.2% over the budget). Every block kept what fit the budget,
and the last graph, with the head and the loss, needed 367 KB (1.3%) more than the
estimate gave it: so a plan made while graphs are still to come is made within 2% less
than the budget (_PROVISIONAL_MARGIN; at the full budget where that has no plan), and
the last graph's plan at the budget. The blocks of
the graph at hand take that plan's actions and are fixed (ShapePlan.fixed). A later
graph is planned with them as they are: in the canonical model (planner/model/plan.h) a
position of block i holds only the kept bytes of the blocks before it, so block j < k's
positions do not move with a later block's decisions, and a later block's positions, the
loss's and the optimizer's see the fixed blocks only through their kept bytes. The later
blocks are therefore planned alone, as a profile of their own whose fixed bytes add the
fixed blocks' kept bytes (for each micro-batch in flight), at the budget in bytes the
whole profile resolves a share to; the whole plan is then priced by the model, and its
figures are the shape's. When the whole profile's own plan already agrees with the fixed
blocks, it is the plan. Its first run is checked as any derived shape's (Note [A
compiled plan's first run] in _compiled_check.py), on the whole step. Where no plan is
found (a shape too long for the budget), the blocks not fixed run at least memory, fit
warns once, and the first run is checked against the budget: over it, the shape's next
step is refused (_compiled_check._check_unplanned). Nothing of such a shape is
offloaded: its first step would run a later graph's offload before the engine has the
plan that names it (the engine takes a step's plan at tick 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from .._lib import StashError
from .._planner import InfeasibleBudget, evaluate
from ._compile_plan import (SavedValue, layer_doc, least_memory, plan_actions_of,
                            without_offload)
from ._compiled_graph import Shape
from ._fit_plan import BudgetRefused, kept_bytes
from ._fit_support import _plan_doc

__all__ = ["ShapeGraphs", "ShapePlan", "ShapePlanner"]

# Note [A new shape across graphs]: the share of the budget a plan made while some of the
# shape's graphs are still to come leaves free for what their blocks save beyond the
# estimate (1.3% was needed on a 12-layer Llama, below).
_PROVISIONAL_MARGIN = 0.02

# A shape's profile, its tokens, the measured shape's and a budget in bytes (None: fit's
# budget) -> its plan and figures (or raises the shape's refusal).
ShapePlanner = Callable[[Dict[str, Any], int, int, Optional[int]],
                        Tuple[Dict[str, Any], Dict[str, Any]]]


def _tokens(shape: Shape) -> int:
    n = 1
    for d in shape[:-1]:
        n *= d
    return n


@dataclass
class ShapePlan:
    """The plan of a graph compiled for a shape other than the measured one (Note [Every
    shape under whole-model compile]): its actions, profile, plan and figures, or the
    refusal its step raises; its first run's check ("passed", "failed")."""

    shape: Shape
    actions: Optional[List[List[str]]] = None
    profile: Optional[Dict[str, Any]] = None
    plan: Optional[Dict[str, Any]] = None
    figures: Optional[Dict[str, Any]] = None
    refusal: Optional[StashError] = None
    offloaded: List[Tuple[int, int]] = field(default_factory=list)
    check: Optional[str] = None
    # Run at least memory, not planned (Note [A graph break among the blocks] in
    # _compile_plan.py): its first run is checked against the budget alone.
    unplanned: bool = False
    # Note [A new shape across graphs]: the blocks whose graph was tagged with their actions
    fixed: Set[int] = field(default_factory=set)


class ShapeGraphs:
    """Per shape (block 0's input), what its compiled graphs save (by block, and outside
    the blocks) and its blocks' costs; the measured shape the plan is of, and the plans
    of the other shapes (Note [Every shape under whole-model compile]). planner: a
    derived shape's planning step (None: such a shape is refused)."""

    def __init__(self, names: Sequence[str], kinds: Sequence[str],
                 planner: Optional[ShapePlanner]) -> None:
        self.names, self.kinds = list(names), list(kinds)
        self.saved_at: Dict[Shape, Dict[int, List[SavedValue]]] = {}
        self.weights_at: Dict[Shape, Dict[int, float]] = {}
        self.outside_at: Dict[Shape, int] = {}
        self.plans: Dict[Shape, ShapePlan] = {}
        self.plan_shape: Optional[Shape] = None   # the measured shape the plan is of
        self._planner = planner
        # Note [A graph break among the blocks] in _compile_plan.py: per shape, each
        # graph's part, by the ticks it holds; the *_at figures are their union.
        self._parts: Dict[Shape, Dict[Tuple[int, ...], Tuple[
            Dict[int, List[SavedValue]], Dict[int, float], int]]] = {}

    def record(self, shape: Shape, ticks: Tuple[int, ...], saved: Dict[int, List[SavedValue]],
               weights: Dict[int, float], outside: int) -> None:
        """A graph for `shape` holding `ticks` was partitioned: what it saves, its blocks'
        costs and the bytes it saves outside the blocks (a graph recompiled for the same
        ticks replaces its part)."""
        parts = self._parts.setdefault(shape, {})
        parts[ticks] = (saved, weights, outside)
        merged: Dict[int, List[SavedValue]] = {}
        costs: Dict[int, float] = {}
        for part_saved, part_weights, _ in parts.values():
            merged.update(part_saved)
            costs.update(part_weights)
        self.saved_at[shape] = merged
        self.weights_at[shape] = costs
        self.outside_at[shape] = sum(o for _, _, o in parts.values())

    @property
    def split(self) -> bool:
        """Whether some graph held only some of the ticks (Note [A graph break among the
        blocks] in _compile_plan.py)."""
        whole = len(self.names) + 1
        return any(len(ticks) != whole for parts in self._parts.values() for ticks in parts)

    def blocks_of(self, shape: Shape) -> Set[int]:
        """The blocks of `shape` whose graphs were partitioned so far."""
        n = len(self.names)
        return {b for ticks in self._parts.get(shape, {}) for b in ticks if b < n}

    def least_memory_for(self, shape: Shape) -> "ShapePlan":
        """Note [A new shape across graphs]: a shape other than the measured one, under
        graph breaks, with no plan within the budget: every recomputable value of the
        blocks not yet fixed recomputed, the rest kept, unpriced (no figures); its first
        run is checked against the budget. Blocks whose graph was tagged already keep
        their actions (that graph runs them)."""
        sp = self.plans.get(shape) or ShapePlan(shape)
        sp.unplanned = True
        sp.figures = sp.plan = None
        self.plans[shape] = sp
        saved = self.saved_at.get(shape, {})
        actions = least_memory([v.recomputable for v in saved.get(i, [])]
                               for i in range(len(self.names)))
        for b in sp.fixed:
            if sp.actions is not None and b < len(sp.actions):
                actions[b] = sp.actions[b]
        sp.actions = actions
        return sp

    def _derived_doc(self, shape: Shape, base: Dict[str, Any], offload: bool = True
                     ) -> Dict[str, Any]:
        """The profile of `shape` from its recorded graphs' saved values and the measured
        shape's profile `base` (Note [Every shape under whole-model compile]); a block
        whose graph is not partitioned yet is the measured shape's, its bytes and costs
        scaled by the tokens (Note [A new shape across graphs]). offload False: nothing
        may be offloaded."""
        m = self.plan_shape
        assert m is not None
        seen = self.blocks_of(shape)
        saved, m_saved = self.saved_at.get(shape, {}), self.saved_at[m]
        weights, m_weights = self.weights_at.get(shape, {}), self.weights_at[m]
        ratio = _tokens(shape) / max(1, _tokens(m))
        signature = [[(v.nbytes, v.recomputable, v.offloadable, v.shared)
                      for v in m_saved.get(i, [])] for i in range(len(self.names))]
        layers = []
        for i in range(len(self.names)):
            old = base["layers"][i]
            like = [j for j in seen if signature[j] == signature[i]]
            if i in seen:
                values, weight = saved.get(i, []), weights.get(i, 0.0)
            elif like:
                # A block of this shape measured alike: its values (the graph for
                # another length may save one value more per block than the measured).
                values, weight = saved.get(max(like), []), weights.get(max(like), 0.0)
            else:
                values = [replace(v, nbytes=int(v.nbytes * ratio), offloadable=False)
                          for v in m_saved.get(i, [])]
                weight = m_weights.get(i, 0.0) * ratio
            r = weight / m_weights[i] if m_weights.get(i) else ratio
            # The temporaries scale as the block's saved bytes do.
            now = sum(v.nbytes for v in values)
            then = sum(v.nbytes for v in m_saved.get(i, []))
            temp = int(int(old.get("bwd_temp_bytes", 0)) * (now / then if then else ratio))
            layers.append(layer_doc(self.names[i], self.kinds[i], values,
                                    float(old["fwd_ms"]) * r, float(old["bwd_ms"]) * r,
                                    weight, temp))
        if not offload:
            without_offload(layers)
        doc = dict(base, layers=layers)
        # What the graphs not partitioned yet save outside the blocks (the head's logits,
        # the loss): the measured shape's graphs of the same ticks', scaled.
        outside = self.outside_at.get(shape, 0) + sum(
            int(o * ratio) for ticks, (_, _, o) in self._parts.get(m, {}).items()
            if not any(b in seen for b in ticks if b < len(self.names)))
        doc["fixed_bytes"] = max(0, int(base["fixed_bytes"]) + outside - self.outside_at[m])
        if "loss_bytes" in base:  # Note [The loss under whole-model compile] in _compiled_fit.py
            doc["loss_bytes"] = int(int(base["loss_bytes"]) * max(1.0, ratio))
        if "optimizer_bytes" in base:
            # Note [The step's tail under whole-model compile] in _compiled_fit.py
            opt, fixed = int(base["optimizer_bytes"]), int(base["fixed_bytes"])
            doc["optimizer_bytes"] = int(opt + max(0, opt - fixed) * max(0.0, ratio - 1.0))
        doc["measurement"] = dict(base.get("measurement", {}), derived_from=list(m))
        return doc

    def plan_for(self, shape: Shape, base: Optional[Dict[str, Any]],
                 refused: Callable[[], StashError]) -> ShapePlan:
        """The plan of a graph for `shape` (recorded), from its own saved values and the
        measured shape's profile `base` (times, fixed bytes); refused: the refusal where
        there is no measured profile or no planner."""
        sp = ShapePlan(shape)
        self.plans[shape] = sp
        if base is None or self.plan_shape is None or self._planner is None:
            sp.refusal = refused()
            return sp
        doc = self._derived_doc(shape, base)
        sp.profile = doc
        try:
            sp.plan, sp.figures = self._planner(doc, _tokens(shape),
                                                _tokens(self.plan_shape), None)
        except StashError as e:
            sp.refusal = e
            return sp
        sp.actions = plan_actions_of(sp.plan)
        return sp

    def plan_part(self, shape: Shape, ticks: Tuple[int, ...], base: Optional[Dict[str, Any]],
                  refused: Callable[[], StashError]) -> ShapePlan:
        """Note [A new shape across graphs]: the plan of a shape other than the measured one
        when one of its graphs (holding `ticks`) is partitioned under graph breaks, the
        blocks of its graphs partitioned before fixed."""
        n = len(self.names)
        sp = self.plans.get(shape)
        if sp is None:
            sp = self.plans[shape] = ShapePlan(shape)
        mine = {b for b in ticks if b < n}
        if sp.unplanned:
            return self.least_memory_for(shape)
        if sp.actions is not None and mine <= sp.fixed:
            return sp  # a graph of fixed blocks compiled again
        m = self.plan_shape
        if base is None or m is None or self._planner is None:
            sp.refusal = refused()
            return sp
        k = len(sp.fixed)
        if sorted(sp.fixed) != list(range(k)) or (mine and min(mine) < k):
            return self.least_memory_for(shape)  # not the blocks after a fixed prefix
        doc = self._derived_doc(shape, base, offload=False)
        tokens, m_tokens = _tokens(shape), _tokens(m)
        complete = self.blocks_of(shape) >= set(range(n))
        no_plan = (BudgetRefused, InfeasibleBudget)
        try:
            plan, figures = self._planner(doc, tokens, m_tokens, None)
            nbytes = int(figures["budget_bytes"])
            # What a plan fixed before its last graph leaves free: _PROVISIONAL_MARGIN.
            target = nbytes if complete else int(nbytes * (1.0 - _PROVISIONAL_MARGIN))
            if target < nbytes:
                try:
                    plan, within = self._planner(doc, tokens, m_tokens, target)
                    figures = dict(within, budget_bytes=nbytes)
                except no_plan:
                    target = nbytes
            actions = plan_actions_of(plan)
            if k and sp.actions is not None and actions[:k] != sp.actions[:k]:
                try:
                    actions, plan, figures = self._after_fixed(
                        doc, sp.actions[:k], figures, tokens, m_tokens, target)
                except no_plan:
                    if target == nbytes:
                        raise
                    actions, plan, figures = self._after_fixed(
                        doc, sp.actions[:k], figures, tokens, m_tokens, nbytes)
        except no_plan:
            return self.least_memory_for(shape)
        sp.fixed |= mine
        sp.actions, sp.profile = actions, doc
        if complete:
            sp.plan, sp.figures = plan, figures
        return sp

    def _after_fixed(self, doc: Dict[str, Any], fixed: List[List[str]],
                     figures: Dict[str, Any], tokens: int, m_tokens: int, target: int
                     ) -> Tuple[List[List[str]], Dict[str, Any], Dict[str, Any]]:
        """Note [A new shape across graphs]: the blocks after the `fixed` ones planned
        with those as they are, within `target` bytes; the whole plan, priced at the
        budget in bytes `figures` resolved (BudgetRefused when it has none)."""
        k = len(fixed)
        kept = kept_bytes(doc, fixed)  # of the fixed blocks: zip stops at them
        in_flight = int((doc.get("measurement") or {}).get("in_flight", 1))
        sub = dict(doc, layers=doc["layers"][k:],
                   fixed_bytes=int(doc["fixed_bytes"]) + kept * max(1, in_flight))
        nbytes = int(figures["budget_bytes"])
        assert self._planner is not None  # plan_part checked
        sub_plan, _ = self._planner(sub, tokens, m_tokens, target)
        actions = [list(a) for a in fixed] + plan_actions_of(sub_plan)
        plan = dict(_plan_doc(doc, actions), budget_bytes=nbytes, solver=sub_plan["solver"])
        priced = evaluate(doc, plan, nbytes, strict=False)
        if "violations" in priced:
            raise BudgetRefused(f"stash.torch.fit: {priced['violations']}")
        return actions, plan, dict(figures, predicted_peak_bytes=priced["predicted_peak_bytes"],
                                   predicted_step_ms=priced["predicted_step_ms"])
