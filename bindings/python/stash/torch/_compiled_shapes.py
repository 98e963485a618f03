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
_compile_plan.py) a shape's first graph is partitioned before its later graphs exist, so
such a shape is not planned: its graphs run at least memory (ShapeGraphs.least_memory_for),
and a first step of it that peaks over the budget refuses the shape's next step, as a
measuring step over the budget refuses an eager shape.
The cost: the partition reads each saved value's size, which specializes the graph to
its shape, so every new shape is a compile of its own (Dynamo's automatic dynamic
shapes does not make one graph serve them all), and Dynamo's recompile limit
(torch._dynamo.config.recompile_limit, 8 by default) caps the shapes a run may train;
past it, Dynamo runs the model eagerly and fit names the limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .._lib import StashError
from ._compile_plan import SavedValue, layer_doc, least_memory, plan_actions_of
from ._compiled_graph import Shape

__all__ = ["ShapeGraphs", "ShapePlan", "ShapePlanner"]

# A shape's profile, its tokens and the measured shape's -> its plan and figures (or raises
# the shape's refusal).
ShapePlanner = Callable[[Dict[str, Any], int, int], Tuple[Dict[str, Any], Dict[str, Any]]]


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

    def least_memory_for(self, shape: Shape) -> "ShapePlan":
        """Note [A graph break among the blocks] in _compile_plan.py: a shape other than
        the measured one, under graph breaks: every recomputable value recomputed, the
        rest kept, unpriced (no figures); its first run is checked against the budget."""
        sp = self.plans.get(shape) or ShapePlan(shape)
        sp.unplanned = True
        self.plans[shape] = sp
        saved = self.saved_at.get(shape, {})
        sp.actions = least_memory([v.recomputable for v in saved.get(i, [])]
                                  for i in range(len(self.names)))
        return sp

    def plan_for(self, shape: Shape, base: Optional[Dict[str, Any]],
                 refused: Callable[[], StashError]) -> ShapePlan:
        """The plan of a graph for `shape` (recorded), from its own saved values and the
        measured shape's profile `base` (times, fixed bytes); refused: the refusal where
        there is no measured profile or no planner."""
        sp = ShapePlan(shape)
        self.plans[shape] = sp
        m = self.plan_shape
        if base is None or m is None or self._planner is None:
            sp.refusal = refused()
            return sp
        saved = self.saved_at[shape]
        weights, m_weights = self.weights_at[shape], self.weights_at[m]
        ratio = _tokens(shape) / max(1, _tokens(m))
        layers = []
        for i in range(len(self.names)):
            old = base["layers"][i]
            r = weights[i] / m_weights[i] if m_weights.get(i) else ratio
            # The temporaries scale as the block's saved bytes do.
            now, then = (sum(v.nbytes for v in vs.get(i, []))
                         for vs in (saved, self.saved_at[m]))
            temp = int(int(old.get("bwd_temp_bytes", 0)) * (now / then if then else ratio))
            layers.append(layer_doc(self.names[i], self.kinds[i], saved.get(i, []),
                                    float(old["fwd_ms"]) * r, float(old["bwd_ms"]) * r,
                                    weights[i], temp))
        doc = dict(base, layers=layers)
        doc["fixed_bytes"] = max(0, int(base["fixed_bytes"]) + self.outside_at[shape]
                                 - self.outside_at[m])
        if "loss_bytes" in base:  # Note [The loss under whole-model compile] in _compiled_fit.py
            doc["loss_bytes"] = int(int(base["loss_bytes"]) * max(1.0, ratio))
        doc["measurement"] = dict(base.get("measurement", {}), derived_from=list(m))
        sp.profile = doc
        try:
            sp.plan, sp.figures = self._planner(doc, _tokens(shape), _tokens(m))
        except StashError as e:
            sp.refusal = e
            return sp
        sp.actions = plan_actions_of(sp.plan)
        return sp
