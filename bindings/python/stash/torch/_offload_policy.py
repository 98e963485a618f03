"""The seam between stash.torch's offload hooks and whatever decides the blocks' actions.

Note [The step policy]
An OffloadHandle carries out the blocks' actions: its hooks pack, copy, replace and replay
saved tensors and mark the blocks' boundaries for backward (Note [Offload hooks] in
_offload_hooks.py). What the actions are, and who listens as a step runs, is a StepPolicy
the handle is given. offload() gives this base class: the plan it was given, nothing
listening. stash.torch.fit's BudgetHandle is the other: it owns an OffloadHandle made with
itself as the policy, measures, chooses each step's plan and records the step.
- The handle asks: the layers' first actions (initial_actions), how the engine lays out a
  layer's actions (engine_layer), the action of a tensor the plan recomputes that existed
  before the block (unrecomputable_action), whether a layer runs without hooks
  (keeps_everything) or needs its backward boundary (needs_boundary), which blocks of a
  step just begun may run as bare calls (lean_blocks), whether the blocks run as plain
  forwards now (passes_through), the arguments a block gets (call_arguments), and the
  compiled-graph state (compiled_state).
- The handle tells (the on_* methods): a step starts or ends early, a block's forward
  began, saved a new storage, ended and let go of its saves, a block's backward began,
  the micro-batch's backward finished, a replay began, saved, ended, and a prefetch
  buffer was allocated. on_saved on the keep path, and on_replay_saved at all, are called
  only where the policy says it listens (observes_saves; Note [The keep path]).
- The policy changes the actions only through OffloadHandle.set_actions, between steps.
Neither reads the other's private attributes: the policy uses the handle's public members
(blocks, device, engine, actions, cuda, micro_batch_index, steps_in_flight, copies,
set_actions, warn_once, compiled_state, compiled_moves) and the handle only the methods
here. Until this seam BudgetHandle subclassed OffloadHandle, overrode 17 of its methods
and read 16 of its private attributes: any change to the hooks meant reading fit, and the
reverse.
"""

from __future__ import annotations

from typing import (TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Protocol, Sequence,
                    Tuple, cast)

import torch

from .._engine import OFFLOAD

if TYPE_CHECKING:
    from ._compiled import CompiledState
    from ._offload import OffloadHandle
    from ._recompute import Frame, Replay
    from ._saved import SaveOrder
    from ._step import _Step


class LayerActions(Protocol):
    """A layer's actions by plan index: a list of KEEP/RECOMPUTE/OFFLOAD, or stash.torch.fit's
    _MeasureLayer (which has no tensor count: `exact` False)."""

    def __len__(self) -> int: ...

    def __getitem__(self, j: int) -> int: ...


EngineLayer = Tuple[List[int], Optional[List[Optional[int]]]]


def offload_slots(actions: LayerActions) -> EngineLayer:
    """A layer's actions as the engine's plan lists them (Note [Offload hooks] in
    _offload_hooks.py): its offload slots only, and the slot of each plan index (None for a
    tensor the engine never sees)."""
    slots: List[Optional[int]] = []
    n = 0
    for a in cast(Iterable[int], actions):  # a list here (not _MeasureLayer)
        if a == OFFLOAD:
            slots.append(n)
            n += 1
        else:
            slots.append(None)
    return [OFFLOAD] * n, slots


class StepPolicy:
    """Note [The step policy]. This base is offload()'s: the plan as given, nothing
    listening."""

    who = "stash.torch.offload"  # what the handle's warnings and capture refusals start with
    # Whether on_saved is called for every new storage (the keep path included) and
    # on_replay_saved at all (Note [The keep path] in _offload_hooks.py).
    observes_saves = False

    # --- asked --------------------------------------------------------------------------

    def initial_actions(self, n_blocks: int) -> Optional[List[LayerActions]]:
        """The blocks' actions before any step, or None for the plan the handle was given."""
        return None

    def engine_layer(self, actions: LayerActions) -> EngineLayer:
        """The engine's plan for a layer and each plan index's engine slot (None where slot
        j is index j)."""
        return offload_slots(actions)

    def unrecomputable_action(self, i: int, j: int, t: torch.Tensor, nbytes: int,
                              first_input: Any) -> Optional[int]:
        """The action for tensor j of block i, which the plan recomputes but which existed
        before the block ran (its input): nothing in the block can produce it again. None:
        the handle's own answer (kept, counted, with one warning). first_input: the storage
        key of the block's first positional tensor argument."""
        return None

    def keeps_everything(self, i: int, actions: LayerActions) -> bool:
        """Whether block i runs without saved-tensor hooks: its plan keeps every tensor and
        asks for no tensor count (an offload() plan is checked against the record pass's
        count, so its layers are always hooked)."""
        return False

    def needs_boundary(self, i: int, plain: bool) -> bool:
        """Whether block i's output is marked for backward (its boundary: the engine's
        backward_begin, the hooks' checks); plain: the block ran without hooks."""
        return True

    def lean_blocks(self) -> Optional[Sequence[bool]]:
        """Asked once a step has begun (block 0's forward, micro-batch by micro-batch): by
        block, whether it may run as a bare call of its forward for the rest of this step
        (Note [Lean blocks] in _offload_hooks.py). A True block must keep everything
        (keeps_everything), need no boundary (needs_boundary), and the policy must want
        none of on_forward_began/ended/released for it and pass its arguments unchanged
        (call_arguments). None: every block takes the full path."""
        return None

    def passes_through(self) -> bool:
        """Whether the blocks run as plain forwards now, with grad on (fit lets eval-mode
        forwards through)."""
        return False

    def call_arguments(self, i: int, args: Tuple[Any, ...], kwargs: Dict[str, Any]
                       ) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        """The arguments block i's forward gets (fit drops a key/value cache)."""
        return args, kwargs

    def compiled_state(self, handle: OffloadHandle) -> Optional[CompiledState]:
        """What the handle knows of its blocks' compiled graphs (Note [Planning the compiled
        graph] in _compiled.py), or None for the handle's own (which refuses to plan
        them). Asked once, while the handle is made."""
        return None

    # --- told ---------------------------------------------------------------------------

    def on_step_starting(self, mb: int, args: Tuple[Any, ...], kwargs: Dict[str, Any]
                         ) -> None:
        """Block 0 of micro-batch `mb` is about to run eagerly with these arguments (no
        micro-batch of the handle holds engine tensors unless several run at once)."""

    def on_step_aborted(self, step: _Step, reason: str) -> None:
        """The micro-batch's step ended early and was given back (Note [A step that ends
        early] in _offload_hooks.py); reason says how."""

    def on_forward_began(self, i: int, step: _Step) -> None:
        """Block i's forward begins (after its step is known, before the engine hears)."""

    def on_saved(self, i: int, j: int, t: torch.Tensor, nbytes: int, action: int) -> None:
        """Block i saved a new storage, index j, with this action."""

    def on_forward_ended(self, i: int, step: _Step, order: Optional[SaveOrder]) -> None:
        """Block i's forward returned; its saved storages are still held."""

    def on_forward_released(self, i: int, step: _Step) -> None:
        """Block i's forward returned and the hooks let go of what it saved (recompute
        storages are freed now)."""

    def on_backward_began(self, step: _Step, i: int) -> None:
        """Backward of block i began (block i+1's, if any, ended just before)."""

    def on_backward_finished(self, step: _Step) -> None:
        """The whole backward of the micro-batch ended (its step is out of the handle's
        steps in flight)."""

    def on_replay_began(self, frame: Frame) -> None:
        """A replay of `frame` is about to run (Note [Selective recompute] in
        _offload_replay.py)."""

    def on_replay_saved(self, frame: Frame, pos: int, seen: Optional[Tuple[int, bool]],
                        t: torch.Tensor) -> None:
        """The replay of `frame` made save `pos` (seen: SaveOrder.see's answer); called only
        where observes_saves."""

    def on_replay_ended(self, frame: Frame, replay: Replay) -> None:
        """The replay of `frame` ended (stopped, or raised)."""

    def on_buffer_allocated(self, buf: torch.Tensor, nbytes: int) -> None:
        """The engine allocated a prefetch buffer (inside an engine call, on the thread that
        made it)."""


# offload()'s policy: one, since it holds nothing.
FIXED_PLAN = StepPolicy()
