"""stash.torch.fit and offload under whole-model torch.compile: a handle's
CompiledState. The blocks' wrapper is in _compiled_graph.py, the per-shape plans in
_compiled_shapes.py, the steps' records and report in _compiled_steps.py.

Note [Planning the compiled graph]
When the model around fit's blocks is compiled whole (torch.compile(model), before or
after fit), Dynamo traces the blocks' wrappers: stash's saved-tensor hooks cannot run
inside the graph, and the saved values are the partitioner's, not the eager ops'. The
wrapper then traces no hook; it marks the block (a tick, below) and calls the block's
forward, and stash plans what the joint graph saves, through the min-cut partitioner:
- The tick: stash::tick(x, handle, block, serial) is an opaque custom op on the block's
  first input x, returning a 0-d zero that the block's input becomes x + 0 * tick (exact:
  x + 0.0 is x), so everything the block computes depends on it. The backward tick
  (stash::tick_back, side-effectful) takes the block input's whole gradient (_Tick's
  backward, in _compiled_graph.py), so it runs once that gradient is complete, where
  the graph's order puts it: before the previous block's backward. (It took the tick's
  own gradient once: torch 2.11's Inductor folds that to a constant zero, and on an
  H200 block 0's backward tick then ran before block 0's backward had fetched its
  offloaded values. Adding its zero to the gradient, to order the previous block after
  it, costs a gradient buffer more per block: 0.7 MB more at a small Llama's measuring
  peak on the CPU meter.) A tick after the last block's output marks their end. At
  run time, the ticks are fit's clock (block i's forward from tick i to tick i+1, its
  backward between the backward ticks) and its step boundaries (tick 0 starts a step;
  the backward tick of block 0 ends its blocks' backward, where the step's peak on the
  meter is read). In the joint graph, they cut the forward into blocks (graph order is
  the trace's order) and are tagged MUST_SAVE, so that they never run again in backward.
- stash's partitioner (torch._inductor.config.custom_partitioner_fn while a fit handle
  that saw a trace is open; graphs without its ticks go to min-cut as they are) first
  partitions a copy of the joint graph untagged: the values it saves are what compile
  saves at keep-all. Each saved value produced in a block is a tensor of that layer
  (bytes from its node's meta "val"; recomputable unless it is the block's input);
  values outside the blocks (the embedding, the head, the loss) are fixed bytes.
- The first step of a shape is the measuring step: every block recomputed from its input
  (all its nodes MUST_RECOMPUTE, each block an AC region of its own, as full activation
  checkpointing tags them), its times taken from the ticks and its peak from the meter.
  At the next step's tick 0 the profile (Note [Recompute cost in a compiled block] in
  _compiled_steps.py) is planned by the same planner (stash_plan_make), under the same
  budget, with the same refusal (BudgetRefused, raised from that forward); the measured
  peak less the canonical model's activation peak for least memory is the profile's
  fixed bytes, as on CUDA in eager mode (Note [What the budget counts] in
  _fit_steps.py), the optimizer's state added when it did not exist yet. The plan takes
  effect at the next compile: the wrapper's trace reads the plan's serial, so Dynamo's
  guard on it recompiles the graph, and the partitioner tags the kept values MUST_SAVE
  and every other node of the blocks MUST_RECOMPUTE, so that a recomputed value is
  rebuilt from kept values and the block's input, as the planner priced it. The step
  that planned still runs the measuring graph; the plan runs from the step after it.
- Identical blocks have one signature and are solved once, as in eager mode.
- Where fit cannot plan (a torch without custom_partitioner_fn, another partitioner
  installed, a backend other than inductor, whose partition stash never sees), or for
  an offload() handle (an explicit eager plan cannot name a graph's values), the tick
  raises StashError at run time naming why and what works: per-block compile (Note
  [Compiled blocks] in _offload.py) or eager. The tick's fake kernel marks the handle as
  traced, so that where Dynamo gives up on the trace and runs the blocks eagerly inside
  a compiled model (whose inner frames it compiles, inside the hooks), the eager
  wrapper raises the same error instead of training on a half-compiled replay.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import torch
import torch.fx as fx

from .._lib import StashError
from .._warn import warn
from ._clock import _Clock
from ._compile_plan import (GraphBlocks, SavedValue, least_memory, outside_bytes,
                            saved_at_keep_all, saved_by_block, split_block, stale_blocks,
                            tag, value_signature)
from ._compiled_graph import (_WHAT_WORKS, Shape, _install, _new_id, _states, _ticked,
                              _uninstall, input_shape)
from ._compiled_offload import CompiledMoves
from ._compiled_offload_pass import Offload
from ._compiled_shapes import ShapeGraphs, ShapePlan, ShapePlanner
from ._compiled_check import check_first_run
from ._compiled_steps import StepLog, StepTimes, measured_layers

__all__ = ["CompiledState"]


# --- a handle's compiled state -----------------------------------------------------------

class CompiledState:
    """What a handle knows of the compiled graphs of its blocks (Note [Planning the
    compiled graph]). planner: the handle's planning step, handed the measured layers
    and peak, returning the plan's actions per layer (or raising BudgetRefused); meter:
    (open the window at a step's start and return the bytes alive then, read the peak
    since); refusal: why this handle cannot plan a compiled graph (None: it can)."""

    def __init__(self, n: int, names: Sequence[str], kinds: Sequence[str],
                 planner: Optional[Callable[["CompiledState"], List[List[str]]]],
                 meter: Tuple[Callable[[torch.Tensor], Tuple[int, Optional[int]]],
                              Callable[[], int], Callable[[], None]],
                 refusal: Optional[str], missing: Callable[[], int] = lambda: 0,
                 gradients: Callable[[], int] = lambda: 0, grouped: bool = False,
                 shape_planner: Optional[ShapePlanner] = None,
                 refuse: Callable[[StashError], None] = lambda e: None,
                 segment: Optional[Callable[[], int]] = None,
                 clock: Optional[_Clock] = None) -> None:
        self.id = _new_id()
        # Note [Recompute cost in a compiled block] in _compiled_steps.py: the ticks' marks
        self.clock = clock if clock is not None else _Clock(False)
        self.n = n
        self.names, self.kinds = list(names), list(kinds)
        self._planner = planner
        self._meter_open, self._meter_peak = meter[0], meter[1]
        # Note [What a compiled step holds at tick 0] in _compiled_fit.py
        self._meter_mark = meter[2]
        self._missing = missing
        self._gradients = gradients
        self._refuse = refuse
        # Note [Backward temporaries of a compiled block] in _compiled_fit.py
        self._segment = segment
        # Note [Every shape under whole-model compile] in _compiled_shapes.py
        self.shapes = ShapeGraphs(names, kinds, shape_planner)
        # Note [Micro-batches under whole-model compile] in _compiled_steps.py
        self.log = StepLog(n, grouped)
        self.planned_grads: Optional[int] = None  # the gradients the plan holds for
        self.more_grads_warned = False
        self.profile: Optional[Dict[str, Any]] = None
        self.plan: Optional[Dict[str, Any]] = None
        self.figures: Optional[Dict[str, Any]] = None
        self.refusal = refusal
        self.traced = False
        self._serial = 0
        self.serial_text = "0"   # what the wrapper's trace reads (trace_block)
        self.saved: Dict[int, List[SavedValue]] = {}
        self.first_shape: Optional[Shape] = None  # the first shape a graph was measured at
        self.least_memory_warned = False  # Note [A graph break among the blocks]
        self.weights: Dict[int, float] = {}
        self.partitioned: Dict[int, int] = {}   # serial -> graphs partitioned with it
        self.graphs_with: Dict[int, int] = {}   # block -> graphs partitioned with its tick
        self.actions: Optional[List[List[str]]] = None
        # Note [Saved values by position] in _compile_plan.py: what the actions are for
        self.planned_values: Dict[int, List[Tuple[int, bool]]] = {}
        self.stale_warned = False
        self.installed = False
        self.error: Optional[StashError] = None
        # Note [A compiled plan's first run] in _compiled_check.py
        self.check_warned = False
        self.checked: Set[Tuple[int, Shape, int]] = set()
        # Note [What a compiled step holds at tick 0] in _compiled_fit.py: per shape of
        # block 0's input, what a step held there above fit's count, as last read
        self.held_at: Dict[Shape, int] = {}
        self.correction = 0  # bytes added to the calibrated fixed bytes
        self.offload = True  # plans may offload
        self.replans = 0
        self._serial_next: Optional[int] = None  # Note [A step of two serials]
        # Note [Offload in the compiled graph] in _compiled_offload.py: the engine's side,
        # and per plan serial the (block, index) of the values its graphs offload.
        self.moves: Optional[CompiledMoves] = None
        self.offloaded: Dict[int, List[Tuple[int, int]]] = {}
        _states[self.id] = self

    @property
    def serial(self) -> int:
        """0: measuring; k > 0: the k-th plan."""
        return self._serial

    @serial.setter
    def serial(self, value: int) -> None:
        self._serial = value
        self.serial_text = str(value)

    @property
    def steps(self) -> List[StepTimes]:
        """The compiled forwards so far, in the order they began."""
        return self.log.steps

    @property
    def shape_plans(self) -> Dict[Shape, ShapePlan]:
        """The plans of the shapes other than the measured one."""
        return self.shapes.plans

    # --- trace time ----------------------------------------------------------------------

    def trace_block(self, block: str, forward: Callable[..., Any], args: Tuple[Any, ...],
                    kwargs: Dict[str, Any]) -> Any:
        """The wrapper of block `block` (its index, as a string) while Dynamo traces it
        (the only code of stash it traces): the tick on the block's first input, the
        block, and the end tick."""
        # Strings: Dynamo guards on them by value (Note [Planning the compiled graph]). An
        # int read here (the serial, the block's index) that differs between two frames
        # Dynamo compiles of this code, as a graph break makes it do, becomes a graph
        # input (Note [A graph break among the blocks] in _compile_plan.py).
        i = int(block)
        serial = "-1" if self.refusal is not None else self.serial_text
        if not args or not isinstance(args[0], torch.Tensor):
            self.refusal = self.refusal or (
                f"block {i}'s first positional argument is not a tensor (the hidden "
                "state stash marks each block by)")
            return forward(*args, **kwargs)
        x = _ticked(args[0], self.id, i, serial)
        out = forward(x, *args[1:], **kwargs)
        if i == self.n - 1:
            if isinstance(out, torch.Tensor):
                out = _ticked(out, self.id, self.n, serial)
            elif isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
                out = (_ticked(out[0], self.id, self.n, serial),) + out[1:]
        return out

    def was_traced(self) -> None:
        """A tick of this handle is being traced: stash's partitioner must see its graph."""
        self.traced = True
        if self.refusal is None and not self.installed and self._planner is not None:
            why = _install()
            if why is None:
                self.installed = True
            else:
                self.refusal = why

    def partitioning(self, gm: fx.GraphModule, cut: GraphBlocks, joint_inputs: Sequence[Any],
                     partition: Callable[..., Tuple[fx.GraphModule, fx.GraphModule]],
                     kwargs: Dict[str, Any]) -> Tuple[int, List[Offload]]:
        """The partitioner met a joint graph with this handle's ticks: record what it
        saves at keep-all and tag it for the measuring step or the plan; the graph's plan
        serial and the values to offload once it is partitioned."""
        serials = {int(t.args[3]) for t in cut.ticks.values()}  # type: ignore[arg-type]
        serial = max(serials)
        if serial < 0:
            return serial, []
        names = saved_at_keep_all(gm, joint_inputs, partition, kwargs)
        split = split_block(cut, names)
        if split is not None:  # Note [A graph break among the blocks] in _compile_plan.py
            self.graph_broken(split)
            return -1, []
        saved = saved_by_block(gm, cut, names, self.n)
        shape = input_shape(cut)
        self.shapes.record(shape, cut.blocks, saved,
                           {b: cut.weight.get(b, 0.0) for b in saved},
                           outside_bytes(gm, cut, names))
        actions = self.actions if serial > 0 else None
        if actions is not None and shape == self.shapes.plan_shape:
            actions = self._as_planned(saved, actions)
        if serial == 0:
            if self.first_shape in (None, shape):
                self.first_shape = shape
                self.saved = self.shapes.saved_at[shape]
                self.weights = self.shapes.weights_at[shape]
        elif actions is not None and shape != self.shapes.plan_shape:
            if self.shapes.split:
                # Note [A new shape across graphs] in _compiled_shapes.py
                sp = self.shapes.plan_part(shape, cut.blocks, self.profile, self.refused)
                if sp.unplanned:
                    self._warn_least_memory(shape)
                actions = sp.actions
            else:
                # Note [Every shape under whole-model compile] in _compiled_shapes.py: None
                # (refused): least memory; its step raises.
                actions = self.shapes.plan_for(shape, self.profile, self.refused).actions
        # Note [What min-cut keeps] in _compile_plan.py; Note [The loss under whole-model
        # compile] in _compiled_fit.py: only where the loss's bytes are measured.
        tag(gm, cut, saved, actions, owners=self._segment is not None)
        self.partitioned[serial] = self.partitioned.get(serial, 0) + 1
        for b in cut.blocks:
            self.graphs_with[b] = self.graphs_with.get(b, 0) + 1
        if actions is None or self.moves is None:
            return serial, []
        return serial, [Offload(v.name, b, j) for b, values in saved.items()
                        for j, v in enumerate(values)
                        if b < len(actions) and j < len(actions[b])
                        and actions[b][j] == "offload"]

    def _as_planned(self, saved: Dict[int, List[SavedValue]],
                    actions: List[List[str]]) -> List[List[str]]:
        """Note [Saved values by position] in _compile_plan.py: the plan's actions, least
        memory for a block whose values are not those it was planned for."""
        stale = stale_blocks(saved, self.planned_values)
        if not stale:
            return actions
        if not self.stale_warned:
            self.stale_warned = True
            warn(f"stash.torch.fit: torch.compile traced blocks {stale} again and their "
                 "graph saves other values than the plan was made for; those blocks run "
                 "at least memory (every value recomputed) in that graph.")
        out = [list(a) for a in actions]
        for b in stale:
            if b < len(out):
                out[b] = least_memory([[v.recomputable for v in saved[b]]])[0]
        return out

    def _warn_least_memory(self, shape: Shape) -> None:
        if not self.least_memory_warned:
            self.least_memory_warned = True
            warn(f"stash.torch.fit: a graph break splits the compiled blocks into several "
                 f"graphs, and shape {list(shape)} is not the measured one: no plan of its "
                 "graphs, the blocks of those compiled first fixed, was found within the "
                 "budget, so its graphs run at least memory (every block recomputed), "
                 "unplanned; one that peaks over the budget is refused at its next step. "
                 "Remove the break (TORCH_LOGS=graph_breaks names it), train one shape "
                 "(fit(buckets=...)), or compile each block instead.")

    def offloads_done(self, serial: int, shape: Shape, done: List[Tuple[int, int]]) -> None:
        sp = self.shapes.plans.get(shape)
        if sp is not None and serial > 0:
            sp.offloaded = done
        else:
            self.offloaded[serial] = done

    # --- run time --------------------------------------------------------------------------

    def forward_tick(self, block: int, serial: int, x: torch.Tensor) -> None:
        if serial < 0 or self.error is not None or self.refusal is not None:
            raise self.refused()
        if block == 0:
            self._step_begins(serial, x)
        if self.steps:
            if block > 0 and serial != self.steps[-1].serial:
                # Note [A step of two serials] in _compiled_steps.py
                self.steps[-1].mixed = True
            self.steps[-1].fwd[block] = self.clock.mark()
        if self.moves is not None and serial > 0:
            self.moves.forward_tick(block)

    def backward_tick(self, block: int) -> None:
        if not self.steps:
            return
        step = self.steps[-1]
        if self.moves is not None and step.serial > 0:
            self.moves.backward_tick(block)
        step.bwd[block] = self.clock.mark()
        if self._segment is not None and step.serial == 0:
            # Note [Backward temporaries of a compiled block] in _compiled_fit.py
            peak = self._segment()  # the peak since the last tick
            step.seg_max = max(step.seg_max, peak)
            if block < self.n:
                step.bwd_peak[block] = peak
            else:
                step.head_peak = peak
        if block == 0:
            step.peak = step.base + max(step.seg_max, self._meter_peak())

    def _step_ends(self) -> None:
        """The last step's end (the optimizer stepped, or the next forward begins): its
        tail read (Note [The step's tail under whole-model compile] in _compiled_fit.py)
        and, for a plan's first run, its check on the whole step's peak; a plan made at
        its start under graph breaks takes effect (Note [A step of two serials] in
        _compiled_steps.py)."""
        self._read_step_end()
        if self._serial_next is not None:
            self.serial, self._serial_next = self._serial_next, None

    def _read_step_end(self) -> None:
        step = self.steps[-1] if self.steps else None
        if step is None or step.ended or step.peak is None:
            return
        step.ended = True
        if step.serial == 0 and self._segment is not None:
            step.tail_peak = self._segment()  # since block 0's backward tick
        else:
            step.peak = max(step.peak, step.base + self._meter_peak())
            if step.serial > 0 and step.serial == self.serial and not step.mixed:
                check_first_run(self, step, step.peak)
        self._meter_mark()

    def graph_broken(self, why: str) -> None:
        """Note [A graph break among the blocks] in _compile_plan.py: the graph goes to
        min-cut untagged and its first tick raises, naming the break."""
        self.refusal = self.refusal or (
            f"{why}; stash plans compiled graphs that hold whole blocks, a break between "
            "two blocks included, not a block split across graphs (TORCH_LOGS=graph_breaks "
            "names the break, torch._dynamo.explain(model) too)")

    def refused(self) -> StashError:
        if self.error is None:
            why = self.refusal or "the compiled graph was not partitioned by stash"
            self.error = StashError(
                "stash.torch: the blocks are traced by torch.compile as part of a larger "
                f"compiled model, and stash cannot plan that graph: {why}; "
                f"{_WHAT_WORKS}")
        return self.error

    def _step_begins(self, serial: int, x: torch.Tensor) -> None:
        self._step_ends()
        if serial not in self.partitioned:
            self.refusal = self.refusal or (
                "its graph was compiled by a backend other than inductor (stash plans "
                "through inductor's partitioner)")
            raise self.refused()
        last = self.log.forward_begins()
        grads = self._gradients()
        # Read before a plan is made at this tick, which may take its held bytes.
        base, held = self._meter_open(x)
        shape = tuple(x.shape)
        if held is not None:
            self.held_at[shape] = held
        elif shape in self.held_at:
            # Note [What a compiled step holds at tick 0] in _compiled_fit.py: unread
            # (a micro-batch's step ends at the next one's tick 0): the last reading.
            held = self.held_at[shape]
            base += held
        # Note [Micro-batches under whole-model compile] in _compiled_steps.py; the
        # measuring forwards are looked at only while the plan is still to come.
        pending = last is not None and self.serial == 0 and self.actions is None
        measured = self.log.measuring_forwards() if pending else []
        most = max((s.grads for s in measured), default=0)
        if pending and measured and grads <= most:
            self.actions = self.plan_actions()
            if self.shapes.split:
                # Note [A step of two serials] in _compiled_steps.py: from the step's end.
                self._serial_next = 1
            else:
                self.serial = 1
            self.planned_grads = most
            m = self.log.measured()
            planned = self.shapes.plan_shape = m.shape if m is not None else None
            if planned is not None and planned in self.shapes.saved_at:
                self.saved = self.shapes.saved_at[planned]
                self.weights = self.shapes.weights_at[planned]
            if self.moves is not None:
                self.moves.switch(self.actions)
        elif (self.planned_grads is not None and grads > self.planned_grads
              and not self.more_grads_warned):
            self.more_grads_warned = True
            warn(
                f"stash.torch.fit: a compiled step began with {grads} bytes of gradients "
                f"alive, more than the {self.planned_grads} its plan was measured with (a "
                "loop that began accumulating gradients after the plan); under whole-model "
                "compile this graph may run over the budget by up to the difference. "
                "Accumulate from the first step, or use per-block compile or eager mode.")
        step = StepTimes(serial, self.n, self.clock)
        step.missing = self._missing() if serial == 0 else 0
        step.grads = grads
        step.group = self.log.group
        step.shape = shape
        if serial > 0:
            # Note [Every shape under whole-model compile] in _compiled_shapes.py
            sp = (self.shapes.plans.get(step.shape) if step.shape != self.shapes.plan_shape
                  else None)
            if sp is not None and sp.refusal is not None:
                self._refuse(sp.refusal)
                raise sp.refusal
            step.shape_plan = sp
            step.figures = sp.figures if sp is not None else self.figures
            actions = sp.actions if sp is not None else self.actions
            if self.moves is not None and actions is not None:
                self.moves.switch(actions)
        step.base, step.held = base, held
        self.log.steps.append(step)

    def optimizer_stepped(self) -> None:
        """The optimizer stepped: the forwards since its last step were one step's."""
        self._step_ends()
        self.log.optimizer_stepped()

    def plan_actions(self) -> List[List[str]]:
        """The plan's actions from the measured profile (the planner fit gave)."""
        if self._planner is None:
            raise self.refused()
        actions = self._planner(self)
        m = self.log.measured()
        if m is not None:  # Note [Saved values by position] in _compile_plan.py
            self.planned_values = value_signature(
                self.shapes.saved_at.get(m.shape, self.saved))
        return actions

    def layers(self) -> List[Dict[str, Any]]:
        """The measured profile's layers (Note [Recompute cost in a compiled block] in
        _compiled_steps.py)."""
        m = self.log.measured()
        if m is None:
            raise StashError("stash.torch.fit: the compiled measuring step did not finish "
                             "(no backward through the blocks?)")
        return measured_layers(m, self.names, self.kinds,
                               self.shapes.saved_at.get(m.shape, self.saved),
                               self.shapes.weights_at.get(m.shape, self.weights))

    def report(self) -> Dict[str, Any]:
        """The compiled steps: per step its plan serial, peak on the meter and block
        times."""
        return {"steps": self.log.times(),
                "actions": self.actions,
                "saved_bytes": {b: sum(v.nbytes for v in vs) for b, vs in self.saved.items()},
                "offloaded": {k: list(v) for k, v in self.offloaded.items()},
                "offload_calls": self.moves.offloads if self.moves is not None else 0,
                "guarded": self.moves.guarded if self.moves is not None else 0}

    def step_entries(self, budget_bytes: Optional[int]) -> List[Dict[str, Any]]:
        """The compiled steps as fit's report() lists steps (StepLog.step_entries)."""
        return self.log.step_entries(budget_bytes)

    def close(self) -> None:
        if self.moves is not None:
            self.moves.close()
        _states.pop(self.id, None)
        if self.installed:
            self.installed = False
            _uninstall()
