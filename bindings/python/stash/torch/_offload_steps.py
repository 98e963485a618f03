"""The steps of stash.torch.offload in flight, by micro-batch, and how each begins and
ends: begun at block 0's forward, ended after its backward, given back early when the
loop loses it (StepTable, a part _offload_hooks.BlockHooks owns).

Note [A step that ends early]
A training loop may lose a step anywhere: a block's forward raises (an error, an
out-of-memory error, KeyboardInterrupt), the loss raises after the blocks ran, backward
raises halfway, or a forward is simply never backwarded (an eval forward with grad on).
The loop catches it and goes on; the handle must be ready for the next step with nothing
of the lost one held: no engine key, no pinned block, no prefetch buffer. Three signals,
each certain, and none of them a guess about the loop:
- a block's forward raised: the wrapper sees it, and gives the step back at once;
- a backward through the micro-batch began and did not end (torch runs the callback queued
  at its end only when it succeeds) when block 0 of the same micro-batch runs again: that
  backward raised, and the step is given back then (not sooner: while a backward runs,
  nothing tells a backward that raised from one still running on autograd's threads);
- the forward's autograd graph died without a backward. The step's token is referenced
  only by the graph's backward boundaries once the first of them exists (before that, by
  the step: a forward whose blocks' outputs need no grad has no graph to watch); a weak
  reference's callback gives the step back when the token dies (at the end of the loop's except
  clause, typically), or, when it fires inside stash's own forward code or on another
  thread, queues it for the next block 0 (or close()). A graph still alive when the next
  forward of its micro-batch begins is the case that keeps its warning (use
  handle.micro_batch), since its backward may still come. A forward that stopped between
  two blocks while its caller still holds the graph is given back when block 0 runs
  again on other input; block 0 run again on the last block's own output is a block
  called twice in one forward, refused as before.
Giving a step back releases its keys in the engine (copies in flight finish first, as at
any release) and marks it abandoned, so a late backward through it raises a StashError
rather than reading freed memory. stash.torch.fit hears of it (its policy's
on_step_aborted): the step's record says why it ended, a measuring step leaves no profile
and is measured again.

Note [Steps under CUDA graphs]
A planned step is static, so it can run under a CUDA graph capture: torch.cuda.graph
around a whole training step (forward, loss, backward, optimizer step), captured on
torch's side stream and replayed by the caller. Block 0 asks whether its work is being
captured (torch.cuda.is_current_stream_capturing; on the CPU test double, whether the
hooks' stream captures). If so, the step runs in capture mode:
- the engine joins the caller's capture on that stream (stash_engine_capture_join: its
  copies fork from it and join back by event record and wait, its pools are frozen, it
  waits for nothing on the host; Note [Capture begun by the caller] in
  runtime/engine/prefetch_engine.h); the prefetch buffers are allocated with that stream
  current, in torch's graph pool, where the blocks' activations are too: an offloaded
  storage is handed back (freed into that pool) once its copy is ordered before the
  capture's later work, so the graph holds no second copy of it;
- the hooks make no host wait and no event query (the CPU path's host syncs are skipped:
  nothing of the copies runs during a capture); the policy's step seams
  (on_step_starting, on_step_aborted, on_backward_finished) are not called: stash.torch.fit's
  record of a step times it with events and reads them after a device sync, which no
  captured step can do, so a captured step is no step of fit's report (the eager steps
  around it are);
- the plan is the one the last eager step ran: a capture does not switch plans. A plan
  that is not final (fit's measuring step, with its marks and samples, or a derived
  plan's first run, which fit checks) is refused at block 0 with a StashError, before
  anything is captured, saying to run the step eagerly first; so is a recompute that
  would save the CUDA RNG state (torch cannot read it during capture), and a capture that
  begins anywhere but at block 0 (stash's schedule spans the blocks: a graph of one block,
  as torch.cuda.make_graphed_callables makes, cannot hold its copies' waits and
  prefetches).
- the engine settles at the next block 0 after the capture ended (or release_graphs()).
  The pinned blocks the captured step copied through stay held for the graph's life (its
  replays copy into them; stash never sees a replay); release_graphs() gives them back
  once the graphs are gone. A re-plan (a new shape, a corrected plan) needs a new capture:
  the graph replays the plan it was captured with.
The eager path pays one capture query per step, at block 0.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .._lib import StashError
from ._offload_policy import StepPolicy
from ._offload_streams import EngineStreams
from ._saved import resident_storages, storage_of, tensors_in
from ._step import _Step


class StepTable:
    """The steps in flight by micro-batch (forward run, backward not ended) and their
    lifecycle: begin() at each block's forward, end or finish_backward() when a backward
    ends, abort() and abandon() when the loop loses one (Note [A step that ends early]).
    Handed the blocks, the engine's side (EngineStreams), the policy (who hears a step
    start and end: Note [The step policy] in _offload_policy.py), the hooks' counts and
    warn_once, and capture_starting (BlockHooks': block 0 of a step under a CUDA graph
    capture, Note [Steps under CUDA graphs]). engine_active: whether
    the plan copies anything (BlockHooks.set_engine_plan sets it); while it does not, a
    step makes no engine call."""

    def __init__(self, blocks: Sequence[torch.nn.Module], streams: EngineStreams,
                 policy: StepPolicy, counts: Dict[str, int],
                 warn_once: Callable[[Tuple[object, ...], str], None],
                 capture_starting: Callable[[int], None]) -> None:
        self._blocks = blocks
        self._streams = streams
        self._policy = policy
        self._counts = counts
        self._warn_once = warn_once
        self._capture_starting = capture_starting
        self.steps: Dict[int, _Step] = {}  # micro-batch -> its step
        # Steps whose graph died, and stash's forward code on the stack (while it is,
        # graph_dropped only queues).
        self._dropped: List[_Step] = []
        self.busy = 0
        self.engine_active = True

    def begin(self, i: int, mb: int, args: Tuple[Any, ...] = (),
              kwargs: Optional[Dict[str, Any]] = None) -> _Step:
        """Block i's forward in micro-batch mb: the step it runs in (block 0 begins one,
        giving back the micro-batch's last one where the loop lost it)."""
        capture: Optional[int] = None
        if i == 0:
            self.reap()
            # Note [Steps under CUDA graphs]
            self._streams.settle_capture()
            capture = self._streams.capturing_stream()
        step = self.steps.get(mb)
        if i == 0 and step is not None:
            # Note [A step that ends early]
            if step.backward_started:  # it began and never ended: it raised
                self.abort(step, "its backward raised before it ended")
            elif 0 < step.next_block < len(self._blocks):
                first = next(iter(tensors_in(args)), None)
                if first is not None and storage_of(first)[0] in step.last_output:
                    raise StashError(
                        f"stash.torch: block 0 ran again in micro-batch {mb} on the output "
                        f"of block {step.next_block - 1}, before block {step.next_block} ran: "
                        "a block called twice in one forward (shared weights) is not "
                        "supported; each block must run once per forward, in order")
                # A new forward: the last one stopped between two blocks and its caller
                # still holds its graph (the exception it raised, say).
                self.abort(step, f"its forward stopped after block {step.next_block - 1}")
            else:
                self._warn_once(("abandon", mb), (
                    f"micro-batch {mb} ran forward again before the backward of its last "
                    "forward, whose graph is still alive (the loss raised and its output is "
                    "still held, a forward in training mode with no backward, or two "
                    "forwards before their backwards): the earlier forward's tensors are "
                    "given back and its backward, should it come, raises. Use "
                    "handle.micro_batch(i) to run several forwards before their backwards."))
                self.abandon(step)
                self._policy.on_step_aborted(step, (
                    "a later forward replaced it before its backward (the loop dropped it: "
                    "an exception between its forward and backward, or a forward in "
                    "training mode with no backward)"))
        if i == 0:
            if capture is not None:
                self._capture_starting(capture)
            else:
                self._policy.on_step_starting(mb, args, kwargs or {})
            blocks = self._blocks
            step = self.steps[mb] = _Step(mb, lambda: resident_storages(blocks))
            step.captured = capture is not None
            # Note [Lean blocks] in _offload_hooks.py
            if capture is None and not self.engine_active:
                step.lean = self._policy.lean_blocks()
        elif step is None or step.next_block != i:
            expected = "block 0" if step is None else f"block {step.next_block}"
            alone = ""
            if self._streams.capturing_stream() is not None:
                alone = (" (here under a CUDA graph capture that began at this block: a graph "
                         "of single blocks, as torch.cuda.make_graphed_callables makes, cannot "
                         "hold stash's schedule, which spans the blocks; capture the whole "
                         "training step with torch.cuda.graph instead)")
            elif step is None and i > 0:
                alone = (" (torch.cuda.make_graphed_callables runs and captures each block on "
                         "its own: stash's schedule spans the blocks, so capture the whole "
                         "training step with torch.cuda.graph instead)")
            raise StashError(f"stash.torch.offload: block {i} ran in micro-batch {mb} where "
                             f"{expected} was expected; the blocks must run in order, once "
                             f"each per micro-batch{alone}")
        return step

    def end_all(self) -> None:
        """The handle closes: every step in flight is given back, abandoned (a backward
        through it raises)."""
        for step in list(self.steps.values()):
            step.abandoned = True
            self.end(step)

    def forget(self) -> None:
        """After the engine closed (which gave every block back)."""
        self.steps.clear()

    def graph_holds_token(self, step: _Step) -> None:
        """A backward boundary holds the step's token now: from here only the graph does
        (Note [A step that ends early])."""
        token = step.token
        if token is not None:
            def dropped(_: object, step: _Step = step) -> None:
                self.graph_dropped(step)
            step.token_ref = weakref.ref(token, dropped)
            step.token = None

    def graph_dropped(self, step: _Step) -> None:
        """The weak reference's callback. It runs where the graph's last reference went:
        in the loop (the end of an except clause, a rebound variable), or inside whatever
        the garbage collector interrupted. It gives the step back at once only outside
        stash's own forward code and on the step's own thread; otherwise it queues it for
        the next block 0 or close()."""
        self._dropped.append(step)
        if self.busy == 0 and threading.get_ident() == step.thread:
            self.reap()

    def reap(self) -> None:
        """Gives back the steps whose graph died without a backward."""
        self.busy += 1
        try:
            while self._dropped:
                step = self._dropped.pop()
                if self.steps.get(step.mb) is step and not step.backward_started:
                    self.abort(step, "its forward's graph was freed without a backward (an "
                                     "exception after or between the blocks, or a forward "
                                     "never backwarded)")
        finally:
            self.busy -= 1

    def abort(self, step: _Step, reason: str) -> None:
        """Gives back what a step holds without running its backward: the engine releases
        its keys (copies in flight complete first), the hooks drop their references."""
        step.abandoned = True
        self._counts["aborted_micro_batches"] += 1
        try:
            if self._streams.engine is not None:
                self.end(step)
        finally:
            if self.steps.get(step.mb) is step:
                del self.steps[step.mb]
            if not step.captured:  # Note [Steps under CUDA graphs]
                self._policy.on_step_aborted(step, reason)

    def finish_backward(self, step: _Step) -> None:
        """The step's backward ended (the callback queued at its first boundary)."""
        engine = self._streams.engine
        if step.abandoned or engine is None:
            return
        if step.backward_open is not None and step.backward_open != 0 and self.engine_active:
            engine.backward_end(step.mb, step.backward_open)
        self.end(step)
        if not step.captured:  # Note [Steps under CUDA graphs]
            self._policy.on_backward_finished(step)

    def end(self, step: _Step) -> None:
        """Gives back what the engine still holds for the step and ends it."""
        engine = self._streams.engine
        assert engine is not None  # its callers check
        for key in sorted(step.live):
            engine.release(key)
        step.live.clear()
        if self.engine_active:
            engine.backward_end(step.mb, 0)
        if self.steps.get(step.mb) is step:
            del self.steps[step.mb]

    def abandon(self, step: _Step) -> None:
        step.abandoned = True
        self._counts["abandoned_micro_batches"] += 1
        self.end(step)

