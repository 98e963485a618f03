"""stash.torch.fit's measuring recorder: what a step fit measures records of each block's
saved tensors, the storages it tracks for the CPU meter and the meter's samples by
position (Notes [The measuring step] below and [What the budget counts] in
_fit_steps.py), and the stash.profile/1 made from a measured step (measured_profile,
fixed_bytes). The handle owns one recorder and calls it from its hook seams; the recorder
reads no handle.

Note [The measuring step]
The first step for a shape (measure_steps of them) runs in stash's least-memory mode, so
that a model that does not fit at keep-all can still be measured: every tensor a block
saves that the block can produce again is recomputed in backward (the offload hooks'
selective recompute, Note [Selective recompute] in _offload_replay.py, with every recomputable
tensor marked), and the block's hidden-state input (its first positional tensor, when it
is on the device, at least 1 MiB and held by nothing but the block) is offloaded through
the engine. Anything else that existed before the block (masks, rotary tables shared by
every block) is kept. The engine's plan for such a step has offload slots only
(_MeasureLayer): the hooks hand it just the tensors it copies, since which index is the
input is known only when the block saves it. Meanwhile the hooks record, as the record
pass numbers them (_saved.SaveOrder), each block's saved storages: bytes, whether the
block can recompute them, and whether a storage is shared with another block (a storage
one block saves that an earlier block saved and still holds: listed once, with its
bytes, must_keep, and with 0 bytes where it appears again). Times, on the compute stream
(CUDA events; on the CPU test double, the host clock): each block's forward, each block's
backward less its replay, the replay itself with a mark at each save (Note [Recompute
cost as the replay pays it] in _fit_measure.py), and the whole step, whose remainder is the
profile's step_overhead_ms. Events, not CUPTI's kernel sums, give the plan its times: a copy
overlaps the compute stream's wall time, gaps between kernels included, which is what
events span and kernel sums leave out. Where the in-process CUPTI profiler can start (a
GPU with CUPTI and no other CUPTI client), each block's forward is a CUPTI layer scope as
well and report()["cupti"] gives its kernel time beside the events' span (the share of
the forward the GPU spent in kernels); elsewhere it gives CUPTI's reason. The step's
measured peak is the check that least-memory mode fits: if
it does not, fit raises before planning, restoring the blocks, with the measured figure
and the planner's smallest feasible budget.

Note [Block 0's inputs in the CPU meter's samples]
A step's reading on the CPU meter is its base (what was alive when block 0 began: the
parameters and buffers, the gradients and optimizer state, block 0's inputs) plus the
most the allocator held above its level then. In a sample, what fit does not track is
that reading less the non-activation bytes fit counts (the base without the inputs, and
what the step grew) and less the saved storages it tracks. Block 0's inputs are left out
of the first on purpose: the ones a block saves (its hidden states, the rotary tables a
decoder passes to every block) are tracked, and the plan's model counts them as saved
tensors; the ones none saves (position ids) are what fit does not track, and join the
fixed bytes. Subtracting them with the base as well took the saved ones off twice: on
the peers' tiny Llama every position came out 0.59 MB short (what a plan's first run
still peaked above its prediction after Note [Fetched buffers die with their last view]
in _offload_hooks.py), and the unsaved ones 2 KB.

Note [Saved tensors someone else holds]
Recomputing a saved tensor frees memory only if nothing else holds its storage. Under
autocast something does: the autocast cache keeps the bf16 copy of every weight a block
casts until the autocast region ends, after the loss. The measuring step recomputes every
recomputable tensor, so after the last block's forward (its saves let go) a dropped
storage still alive is held by someone else: the profile keeps it (must_keep, named
held.j), and every plan counts it where it lives, from its block's forward through the
loss. Recomputing it freed nothing before the loss, and the plans, which counted it freed,
ran over: a Qwen2 under bf16 autocast with three micro-batches of random lengths a step
ran 6 of 8 planned steps 1.6-2.6% over the budget at "85%", and a Mistral at one length
peaked 0.75 MB above its first plan's prediction (corrected three times before a run
peaked within). Counting such a tensor as alive at the loss whatever its action, instead,
inflated the keep-all peak the budget's shares are of by the tensors counted twice (21.90
-> 24.23 MB): kept, it is counted once. What keeping costs is its bytes between the loss
and its block's backward, where recomputing would free them; the copies are a block's
weights in bf16 (1.2 MB of the Qwen2's 21.9). A weight's copy is also the same size for
every shape: a tensor autograd made from parameters alone keeps its bytes in a derived
profile (made_from_parameters; the measurement's constant_tensors), where scaling it with
the tokens under-counted it.

Note [Recompute cost as the replay pays it]
stash recomputes a block's tensors by re-running its forward from its inputs up to the
last tensor it needs (a prefix of the forward in save order). The planner prices
recompute per tensor, additively. The measuring step's replay runs the whole prefix up to
the last recomputable save and marks the time at each save; tensor j's recompute_ms is the
time from the previous recomputable tensor's first save (or the replay's start) to j's
first save. The sum over a prefix is then exactly what a replay of that prefix costs. A
plan that recomputes a set whose members are not a prefix pays for the whole prefix up to
its last member anyway, and makes the members it keeps again. So the profile says
"recompute_cost": "prefix", and the planner prices a layer's recompute as the prefix its
replay runs and searches only plans that recompute a prefix of each layer's recomputable
tensors (Note [Recompute by prefix] in planner/model/plan.h). Until then fit solved per
tensor and closed each prefix afterwards, which priced a deep tensor that looked cheap at
its own cost and then paid the whole replay to it: on an H200 stash at selective
checkpointing's peak kept 8 of 84 tensors. A compiled block (torch.compile, per block)
saves everything at the end of its forward, so its first recomputable tensor carries the
whole forward's cost and the rest none, which the same rule prices correctly: any
recompute in a compiled block costs its whole forward.

Note [A compiled block's saved tensors in the CPU meter's window]
The CPU meter is sampled at every tensor a block saves, and a window's bytes above what
fit tracks are the position's untracked bytes (fixed, temporaries). An eager block saves
each tensor as its op runs, so the windows follow them. A block compiled per block saves
them all at the end of its forward (AOTAutograd's save_for_backward), after Inductor
made them: the window up to its first save held every one of them, tracked one, and on
the measuring step (least memory, the recomputable ones dropped at the forward's end)
the rest went into the fixed bytes, counted again at every position beside the forward's
own A_i (the canonical model in planner/model/plan.h). OLMo 2 with its three blocks
compiled (hidden 128, sequence 256) measured 16.3 MB of fixed bytes where eager measured
10.5, and 60% of keep-all was refused with a smallest feasible budget of 23.6 MB, though
least memory ran at 12.8 (16.8 with AdamW's state). So a compiled block's saves are not
samples: its forward's end is, with the bytes it saved counted as held in that window
(60% is then planned: 16.8 MB run against 18.6 predicted). Counted once, a plan that
kept part of a recomputed compiled block ran over: Note [A compiled block replays whole]
in _fit_plan.py. On CUDA the windows are the meter's own (Note [The measuring step's
windows on CUDA] in _fit_cuda_meter.py), not these samples.

Note [A measuring step that compiled]
Under per-block compile (or a compiled loss or optimizer step) the first step compiles:
Dynamo traces each block's forward inside its first call and AOTAutograd compiles the
backward at the first backward, so the measuring step's times hold the compiles. On the
peers' tiny Llama with its layers compiled, the measuring step took 3.9 s and every
planned step about 115 ms, and the plan was made for (and reported) a step of 3844 ms:
block 0's forward looked 30 times its cost, so recomputing it looked dear. So fit counts
the compile events torch times (torch._dynamo.utils.compilation_time_metrics, not read
where Dynamo was never imported) at a measuring step's start and when its profile is
made; where there were any, the shape is measured once more, its memory records kept
(as measure_steps > 1 keeps them) and its times taken from the second step; meanwhile its
entry gives the step its budget but is not stored in cache_dir nor a base of another
shape's derived plan. Once per shape, so a model that compiles at every step is measured
twice, not forever; not across ranks, whose measuring steps must agree in number; and not
where the first measurement already cannot be planned at the budget: that shape is
refused at its next step, as before, rather than measured again over its budget (a Phi-3
at "75%", whose parameters, gradients and AdamW state were 93% of keep-all's peak, ran a
second least-memory step 33% over the budget before the refusal).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .. import profile as _profile
from .._engine import KEEP, OFFLOAD, RECOMPUTE
from .._planner import evaluate
from ._clock import _Clock
from ._offload import _compiled_block
from ._fit_support import (StepRecord, _cupti_fwd, _LayerRecord,
                           _plan_doc, _weak)
from ._saved import storage_of

Doc = Dict[str, Any]
Phase = Tuple[Any, ...]


class MeasuringRecorder:
    """The measuring step's per-block records and the CPU meter's samples.

    layers: per block, the saved storages the measuring step numbered (bytes, holder,
    recomputable, what the hooks did), for the shape layers_key. tracking: whether saved
    storages are counted by weak reference this step (a measuring step on the CPU, or
    any step where the counting allocator cannot be built). counting: the CPU counting
    allocator's window (None on CUDA); state_bytes: the gradients and optimizer state
    alive now."""

    def __init__(self, n_blocks: int, counting: Any, state_bytes: Callable[[], int]):
        self.n = n_blocks
        self.layers: List[_LayerRecord] = [_LayerRecord() for _ in range(n_blocks)]
        self.layers_key: Optional[str] = None
        self.tracking = False
        self.counting = counting
        self._state_bytes = state_bytes
        self._tracked: Dict[Any, Tuple[Any, int]] = {}      # storage -> (weakref, bytes)
        self._held: Dict[Any, Tuple[Any, int, int]] = {}    # storage -> (weakref, layer, j)
        # Storages the step lets go, offloaded or recomputed: (layer, j, weakref)
        self._let_go: List[Tuple[int, int, Any]] = []

    def measure(self, key: str) -> None:
        """A measuring step of shape `key`: its layers' records start afresh unless they
        are this shape's (measure_steps > 1 adds to them)."""
        if self.layers_key != key:
            self.layers = [_LayerRecord() for _ in range(self.n)]
            self.layers_key = key

    def begin_step(self, tracking: bool) -> None:
        self.tracking = tracking
        self.forget()

    def forget(self) -> None:
        """What the last step held is given back (a new step, or a lost one)."""
        self._tracked = {}
        self._held = {}
        self._let_go = []

    def drop_layers(self) -> None:
        """A lost measuring step: the shape is measured again from scratch."""
        self.layers_key = None

    def holder(self, i: int, t: torch.Tensor) -> Optional[Tuple[int, int]]:
        """(layer, index) of an earlier block that saved this very storage and still holds
        it (Note [The measuring step]: a storage shared by blocks), else None."""
        held = self._held.get(storage_of(t)[0])
        if held is None:
            return None
        ref, layer, j = held
        if layer == i or ref is None or ref.expired():
            return None
        return (layer, j)

    def saved(self, i: int, j: int, t: torch.Tensor, nbytes: int, action: int, *,
              first_micro_batch: bool) -> None:
        """Block i saved its tensor j in a measuring step."""
        key = storage_of(t)[0]
        if first_micro_batch:
            layer = self.layers[i]
            if len(layer.entries) <= j:
                layer.entries.append({"bytes": int(nbytes), "holder": self.holder(i, t),
                                      "recomputable": action == RECOMPUTE,
                                      "action": action,
                                      "from_parameters": made_from_parameters(t)})
                if action in (OFFLOAD, RECOMPUTE):
                    self._let_go.append((i, j, _weak(t)))
        held = self._held.get(key)
        if held is None or held[0] is None or held[0].expired():
            self._held[key] = (_weak(t), i, j)

    def forward_ended(self, i: int, entries_seen: Sequence[Dict[str, Any]]) -> None:
        """Block i's forward ended in a measuring step's first micro-batch."""
        # The recomputable flag is the record pass's: an input is not, whatever the action
        # the hooks chose.
        entries = self.layers[i].entries
        for j, e in enumerate(entries_seen):
            if j < len(entries):
                entries[j]["recomputable"] = bool(e["recomputable"])
                entries[j]["is_input"] = bool(e["is_input"])

    def forward_released(self, i: int) -> None:
        """Block i's forward let go of what it saved, in a measuring step's first
        micro-batch: after the last block's, a storage the step let go that is still alive
        is held by someone else, and the profile keeps it (must_keep): a tensor dropped to
        recompute (Note [Saved tensors someone else holds]), or an input offloaded two or
        more blocks back, handed back by now (forward_begin(i+2)), which the caller holds
        (a Hugging Face model keeps inputs_embeds through its forward)."""
        if i != self.n - 1:
            return
        for li, j, ref in self._let_go:
            if ref is None or ref.expired() or j >= len(self.layers[li].entries):
                continue
            e = self.layers[li].entries[j]
            if (e["recomputable"] if e["action"] == RECOMPUTE else li <= self.n - 3):
                e["held_outside"] = True
        self._let_go = []

    def track(self, t: torch.Tensor, nbytes: int) -> None:
        """Counts a storage the step holds (while tracking), until it is freed."""
        if self.tracking:
            self._tracked[storage_of(t)[0]] = (_weak(t), int(nbytes))

    def sample(self, rec: StepRecord, where: str, after: Optional[Phase] = None,
               held: int = 0) -> None:
        """CPU: the most activation bytes held at once, and what the allocator held beyond
        fit's count since the last sample, by the position the step was in then (Note
        [What the budget counts] in _fit_steps.py); after: the position from here on (None:
        the same). held: bytes fit tracked in the window that its peak held above what
        was tracked at its start, though some are gone by its end (Note [A compiled
        block's saved tensors in the CPU meter's window])."""
        if not self.tracking:
            return
        total, dead = 0, []
        for k, (ref, n) in self._tracked.items():
            if ref is None or ref.expired():
                dead.append(k)
            else:
                total += n
        for k in dead:
            del self._tracked[k]
        if total > rec.live_peak:
            rec.live_peak = total
            rec.peak_at = where
        if self.counting is not None and rec.meter_base is not None:
            # Note [What the budget counts] in _fit_steps.py: the allocator's peak since the
            # last sample, above what fit counts now, is what it does not track there.
            window = rec.meter_base + self.counting.peak()
            self.counting.reset_peak()
            rec.meter_running = max(rec.meter_running, window)
            # What fit tracked in the window: as at its start or at its end, whichever is
            # more (a block's recompute storages go when its forward returns, between two
            # samples, and the window's peak held them).
            tracked = max(total, rec.tracked_before + held)
            rec.tracked_before = total
            # Gradients and optimizer state made in the step are fit's to count too. A
            # block's backward makes its gradients after the window's peak (the first
            # grads of its backward, right after its replay), so there they count as at
            # the window's start; the optimizer step's state, as at its end.
            grown_before = rec.grown
            if where.startswith(("backward", "optimizer")):
                rec.grown = self._state_bytes() - rec.state_at_start
            # Note [Block 0's inputs in the CPU meter's samples]
            counted = rec.meter_base - rec.meter_inputs
            alive = counted + max(0, grown_before if where.startswith("backward")
                                  else rec.grown)
            phase = rec.phase
            if where == "optimizer step":  # no activation is alive: a phase of its own
                phase, tracked = ("opt",), 0
            rec.untracked[phase] = max(rec.untracked.get(phase, 0), window - alive - tracked)
            # Note [Gradients by position] in _fit_gradients.py: the same window with the
            # gradients it held counted in, as no fixed byte holds them (the optimizer's
            # state grows only in its step, which keeps its own figure above).
            raw = window - counted - tracked
            rec.untracked_with_grads[phase] = max(rec.untracked_with_grads.get(phase, 0), raw)
        if after is not None:
            rec.phase = after

    def actions_seen(self) -> List[List[str]]:
        """What the measuring step did with each tensor, by name."""
        names = {KEEP: "keep", RECOMPUTE: "recompute", OFFLOAD: "offload"}
        return [[names[e["action"]] for e in layer.entries] for layer in self.layers]


# Autograd nodes that make a tensor of their one input's elements: a chain of them from a
# parameter is a copy of it, whatever the shape of the step.
_COPY_NODES = frozenset({"ToCopyBackward0", "TBackward0", "TransposeBackward0",
                         "PermuteBackward0", "ViewBackward0", "UnsafeViewBackward0",
                         "ReshapeAliasBackward0", "CloneBackward0", "AliasBackward0"})


def made_from_parameters(t: torch.Tensor, limit: int = 8) -> bool:
    """Whether t is a parameter's copy (autocast's bf16 copy of a weight, a transposed
    weight): autograd made it through at most `limit` nodes of _COPY_NODES, each with one
    input, from a parameter. Its bytes do not change with the shape (Note [Saved tensors
    someone else holds]). Any other node says no: an embedding's backward lists only its
    weight, and its output grows with the tokens."""
    fn = t.grad_fn
    for _ in range(limit):
        if fn is None:
            return False
        variable = getattr(fn, "variable", None)  # AccumulateGrad: a leaf
        if variable is not None:
            return isinstance(variable, torch.nn.Parameter)
        nexts = fn.next_functions
        if type(fn).__name__ not in _COPY_NODES or len(nexts) != 1:
            return False
        fn = nexts[0][0]
    return False


def measured_profile(rec: StepRecord, layers: Sequence[_LayerRecord],
                     blocks: Sequence[torch.nn.Module], clock: _Clock, *,
                     device: Dict[str, Any], link: Dict[str, Any], host: Dict[str, Any],
                     timing: str, cupti: Callable[[List[Dict[str, Any]]], Dict[str, Any]]
                     ) -> Doc:
    """A finished measuring step as a stash.profile/1, fixed_bytes 0 (fixed_bytes()
    gives them): per-layer times and tensors from the step's records (Note [The
    measuring step] in _fit.py and Note [Recompute cost as the replay pays it]). cupti:
    the CUPTI summary of the forwards' kernel times."""
    out = []
    cupti_fwd = []
    total_fwd = total_bwd = 0.0
    # The first holder of a storage later blocks share is must_keep too: offloading it
    # would free nothing while they hold it.
    first_holders = {e["holder"] for layer in layers for e in layer.entries
                     if e["holder"] is not None}
    # Note [Saved tensors someone else holds]: what a derived profile keeps at its bytes.
    constant = [[i, j] for i, layer in enumerate(layers) for j, e in enumerate(layer.entries)
                if e.get("from_parameters") and e["holder"] is None]
    for i, layer in enumerate(layers):
        fwd = [clock.ms(v.begin, v.end) for (_, l), v in rec.fwd.items()
               if l == i and v.begin is not None]
        bwd = [clock.ms(v.begin, v.end) for (_, l), v in rec.bwd.items()
               if l == i and v.end is not None]
        reps = [v for (_, l), v in rec.replay.items() if l == i and v.end is not None]
        rep_ms = [clock.ms(v.begin, v.end) for v in reps]
        total_fwd += sum(fwd)
        total_bwd += sum(bwd)
        fwd_ms = sum(fwd) / max(1, len(fwd))
        kernel = _cupti_fwd(rec.cupti, i)
        if kernel is not None:
            cupti_fwd.append({"layer": i, "kernel_ms": kernel, "span_ms": fwd_ms})
        bwd_ms = max(0.0, (sum(bwd) - sum(rep_ms)) / max(1, len(bwd)))
        # Note [Recompute cost as the replay pays it]
        # A segment that ends at an input's save (restored, not recomputed) belongs to the
        # next recomputable tensor, so the costs still add up to the replay's prefix.
        cost: Dict[int, float] = {}
        if reps:
            prev = reps[0].begin
            for j, m in reps[0].marks:
                e = layer.entries[j] if j < len(layer.entries) else None
                if e is not None and e["recomputable"] and j not in cost:
                    cost[j] = clock.ms(prev, m)
                    prev = m
        tensors = []
        seen_names = set()
        for j, e in enumerate(layer.entries):
            again = e["holder"] is not None        # listed by an earlier block
            keep = again or (i, j) in first_holders or e.get("held_outside", False)
            if e.get("is_input") and "input" not in seen_names:
                name = "input"
            elif e.get("held_outside") and e["recomputable"]:
                name = f"held.{j}"  # Note [Saved tensors someone else holds]
            else:
                name = f"saved.{j}"
            seen_names.add(name)
            tensors.append({
                "name": name,
                "bytes": 0 if again else int(e["bytes"]),
                "recompute_ms": float(cost.get(j, 0.0)) if e["recomputable"] else 0.0,
                "offloadable": not keep,
                "recomputable": bool(e["recomputable"]) and not keep,
                "must_keep": keep,
            })
        digest = hashlib.sha256(json.dumps(
            [(t["bytes"], t["recomputable"], t["must_keep"]) for t in tensors]).encode()
        ).hexdigest()[:16]
        out.append({"name": f"{type(blocks[i]).__name__}.{i}",
                    "signature": f"{type(blocks[i]).__name__}:{digest}",
                    "fwd_ms": fwd_ms, "bwd_ms": bwd_ms, "bwd_temp_bytes": 0,
                    "tensors": tensors})
    end = rec.end if rec.end is not None else rec.bwd_end
    step_ms = clock.ms(rec.start, end)
    # Once per step (the loss, the optimizer, the uploads), whatever the micro-batches.
    overhead = max(0.0, step_ms - total_fwd - total_bwd)
    return {
        "schema": _profile.SCHEMA,
        "source": "measured",
        "device": device,
        "link": dict(link),
        "host": host,
        "fixed_bytes": 0,
        "step_overhead_ms": overhead,
        "recompute_cost": "prefix",  # Note [Recompute cost as the replay pays it]
        "layers": out,
        "measurement": {"timing": timing, "passes": rec.passes, "in_flight": rec.in_flight,
                        "cupti": cupti(cupti_fwd), "constant_tensors": constant,
                        # Note [A compiled block replays whole] in _fit_plan.py
                        "replays_whole": [i for i, b in enumerate(blocks)
                                          if _compiled_block(b)],
                        "notes": ["fit: least-memory measuring step"]},
    }


def fixed_bytes_cuda(doc: Doc, peak: int, loss_peak: Optional[int],
                     actions_seen: List[List[str]], counted: int,
                     missing_optimizer_state: int) -> Tuple[int, int]:
    """Note [What the budget counts] in _fit_steps.py, on CUDA: (fixed_bytes, loss_bytes).
    The fixed bytes are the measured peak of the blocks' passes less the canonical model's
    activation peak there for what the measuring step did, plus the optimizer state that did
    not exist yet; at least what fit counts. With the loss's window read apart (Note [The
    measuring step's windows on CUDA] in _fit_cuda_meter.py), loss_bytes is what that window
    held above the fixed bytes and the activations the model puts there (Note [The loss's
    position] in planner/model/plan.h); 0 without it."""
    probe = dict(doc, fixed_bytes=0, loss_bytes=0, optimizer_bytes=0)
    seen = _plan_doc(probe, actions_seen)
    act = evaluate(probe, seen, 1 << 62, strict=False)["predicted_peak_bytes"]
    fixed = int(max(peak - act + missing_optimizer_state, counted))
    if loss_peak is None:
        return fixed, 0
    big = 1 << 50  # a loss position that binds: the peak less it is the activations there
    at_loss = evaluate(dict(probe, loss_bytes=big), seen, 1 << 62,
                       strict=False)["predicted_peak_bytes"] - big
    return fixed, int(max(0, loss_peak + missing_optimizer_state - fixed - at_loss))


def fixed_bytes_cpu(doc: Doc, rec: StepRecord, counted: int, gradient_bytes: int) -> int:
    """Note [What the budget counts] in _fit_steps.py, on the CPU: what the allocator held
    above fit's count, by position (none without the counting allocator). The most of it in
    any forward joins the fixed bytes; the rest of a layer's backward becomes the layer's
    backward temporaries, the loss's the profile's loss_bytes (Note [The loss's position]
    in planner/model/plan.h), the optimizer step's its optimizer_bytes (all set in doc).
    gradient_bytes: the gradients fit counts in `counted`; where the step began without
    any and ran one pass, doc's measurement also says where they were made (Note
    [Gradients by position] in _fit_gradients.py)."""
    u = rec.untracked
    forward = max([0] + [v for k, v in u.items() if k[0] == "fwd"])
    fixed = counted + forward
    for i, layer in enumerate(doc["layers"]):
        layer["bwd_temp_bytes"] = int(max(0, u.get(("bwd", i), 0) - forward))
    doc["loss_bytes"] = int(max(0, u.get(("loss",), 0) - forward))
    if ("opt",) in u:
        doc["optimizer_bytes"] = int(counted + max(0, u[("opt",)]))
    raw = rec.untracked_with_grads
    if rec.grads_at_start == 0 and rec.passes == 1 and gradient_bytes > 0 and raw:
        doc["measurement"]["gradients"] = {
            "bytes": int(gradient_bytes),
            "fixed_bytes": int(max(0, fixed - gradient_bytes)),
            "bwd_temp_bytes": [int(max(0, raw.get(("bwd", i), 0) - forward))
                               for i in range(len(doc["layers"]))],
            "loss_bytes": int(max(0, raw.get(("loss",), 0) - forward)),
        }
    return fixed
