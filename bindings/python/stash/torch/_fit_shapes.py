"""stash.torch.fit's shapes: a step's shape, and a profile for a shape never measured,
derived from the shapes that were.

Note [A profile derived from the measured shapes]
A new sequence length or batch size is a new shape key (Note [Re-planning and the cache]
in _fit_shape_plans.py). Measuring each one costs a step in least-memory mode, the slowest
there is, and a loop with a new length on most steps would never leave it. So a shape whose
family (the same arguments, dtypes, ranks, autocast and mode; only sizes differ) has
measured shapes is planned from a derived profile instead:
- its size is the tokens of block 0's first tensor argument (its elements over its last
  dimension: batch x sequence for a (batch, sequence, hidden) input);
- every tensor's bytes, every layer's forward and backward time, every tensor's recompute
  time, the step's time outside the blocks and the fixed bytes' part beyond what fit
  counts from the parameters (the loss's logits, workspaces) are each a power of the
  tokens: c * tokens^e. With one measured shape e is 1 (activations scale with tokens);
  with two or more e is fitted to them by least squares in log-log space, so that an
  attention score matrix (tokens^2 when only the length moves) or a table that does not
  scale (e = 0) is followed; e is held to [0, 3] for bytes and to [1, 3] for times (a
  block's compute grows at least with its tokens: a smaller exponent fitted to two steps
  is the first step's warm-up, not the model). A tensor autograd made from parameters
  alone (autocast's copy of a weight) keeps its bytes (Note [Saved tensors someone else
  holds] in _fit_measure.py). A second shape at least 1.5x the first
  one's tokens (or at most 1/1.5 of them) is therefore measured rather than derived, so
  that the times, whose fixed costs one shape cannot tell from the rest, get exponents:
  at most two measuring steps for a family;
- only measured shapes are bases, never derived ones, and only those whose skeleton (per
  layer: the tensors, their order and their flags) is the skeleton of the one nearest in
  tokens; the derived profile has that skeleton. A shape measured later makes the
  family's derived plans stale: they are derived again, from every base, when their
  shape next comes (a 312-token plan derived from one base kept it after a second one
  was measured, and ran 1.2% over its budget three steps later).
A derived plan is checked on its first run (Note [A derived plan's first run] in
_fit_shape_plans.py): the blocks must save what the skeleton lists and the step must peak
within the budget; otherwise the shape is measured the next time it comes. Under
torch.distributed nothing is derived (the ranks would have to agree on derivations too):
each shape is measured.

Note [What stays the same across shapes]
The fixed bytes' part that scales is what lies above the bytes no shape changes. fit
counts the parameters, gradients and optimizer state from their tensors; on CUDA a
measuring step also reads torch.cuda.memory_allocated() at block 0, less block 0's
inputs, plus the gradients and the optimizer state not made yet: everything the process
holds that the step does not make (a second model, an EMA copy, a data buffer, what an
earlier phase left cached in tensors). Kept in the profile's measurement as
constant_bytes, it replaces fit's count as the part that does not scale, when larger. On
an H200 a 6-layer Llama held 0.7 GB at block 0 that fit's count left out; scaled down with
the tokens as if it were the logits, it made a 768-token plan from shapes of 1024 and
2048 peak 6% above its prediction. (On the CPU the counting allocator's samples place
those bytes already: Note [The CPU allocator's meter] in _meter.py.)

Note [Lengths rounded up to a bucket]
A loop that pads each batch to its own longest sequence gives a new length on most steps,
and each new length gets a derived plan of its own: planned, then checked on its first
run. fit(buckets=) plans per bucket of lengths instead, as people who pad to a multiple
already do for their kernels: an int rounds a length up to a multiple of it, a list to
the smallest listed length at least it (a longer one is its own shape). The length is
block 0's first tensor argument's next-to-last dimension (a decoder's hidden states,
batch x sequence x hidden); a first argument of fewer than three dimensions is not
bucketed. A bucket is a shape of its own: its key is the family, the leading (batch)
sizes, the bucket's length and the last size; its tokens are the bucket's; its plan is
derived from the family's measured shapes at those tokens (Note [A profile derived from
the measured shapes]), checked on its first run as any derived plan is, and run by every
step whose length falls in the bucket. Such a step has at most the tokens its plan was
made for, so it peaks at or below the plan's prediction, and a share budget is a share of
the bucket's keep-all peak. What stays per shape: a measuring step measures the step's
own shape (a profile is of the shape it was measured at), and a shape measured in this
run runs its own plan, which is exact; a bucket the measured shapes cannot derive yet
(one measured shape, 1.5x or more away in tokens) leaves its steps to their own shapes
until a second shape is measured. Bucket plans, being derived, are not written to
cache_dir; under torch.distributed nothing is derived, and under whole-model compile each
shape is a graph of its own (Note [Every shape under whole-model compile] in
_compiled_shapes.py), so buckets change nothing there. test_fit_shapes' 18 lengths from
32 to 128 with buckets=32: 2 measuring steps and 3 bucket plans (64, 96, 128), where
each of the other 16 lengths had a plan of its own.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ._fit_support import _autocast_state
from ._saved import tensors_in

_BYTES_EXPONENTS = (0.0, 3.0)
_TIME_EXPONENTS = (1.0, 3.0)


def shape_family(args: Any, kwargs: Dict[str, Any], training: bool) -> str:
    """The shape key with sizes left out: which shapes may derive from which."""
    parts = [(t.dim(), str(t.dtype), str(t.device), bool(t.requires_grad))
             for t in tensors_in((args, kwargs))]
    text = json.dumps([parts, _autocast_state(), training, sorted(kwargs)], default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def shape_tokens(args: Any) -> Optional[int]:
    """Tokens of block 0's first tensor argument (elements over the last dimension)."""
    first = next(iter(tensors_in(args)), None)
    if first is None or first.dim() < 2 or first.shape[-1] == 0:
        return None
    return int(first.numel() // first.shape[-1])


def bucket_length(length: int, buckets: Union[int, Sequence[int]]) -> Optional[int]:
    """Note [Lengths rounded up to a bucket]: the length of the bucket a step of `length`
    runs the plan of, or None (a length past the listed ones: its own shape's)."""
    if isinstance(buckets, int):
        return -(-length // buckets) * buckets
    return next((b for b in buckets if b >= length), None)


def bucket_shape(args: Any, family: str, buckets: Union[int, Sequence[int]]
                 ) -> Optional[Tuple[str, int]]:
    """The bucket of a step whose block 0 gets `args` (its shape family `family`): its key
    and tokens, or None where the step runs its own shape's plan."""
    first = next(iter(tensors_in(args)), None)
    if first is None or first.dim() < 3 or first.shape[-1] == 0:
        return None  # no sequence dimension (Note [Lengths rounded up to a bucket])
    length = int(first.shape[-2])
    top = bucket_length(length, buckets)
    if top is None:
        return None
    lead = [int(d) for d in first.shape[:-2]]
    text = json.dumps(["bucket", family, lead, top, int(first.shape[-1])])
    return hashlib.sha1(text.encode()).hexdigest()[:16], math.prod(lead) * top


def skeleton(profile: Dict[str, Any]) -> List[List[Tuple[bool, bool, bool, bool]]]:
    """Per layer, per tensor: the flags and whether it has bytes at all (a storage shared
    with an earlier block has none)."""
    return [[(bool(t["offloadable"]), bool(t["recomputable"]), bool(t["must_keep"]),
              t["bytes"] > 0) for t in layer["tensors"]] for layer in profile["layers"]]


def _power(points: Sequence[Tuple[float, float]], tokens: float,
           exponents: Tuple[float, float] = _BYTES_EXPONENTS) -> float:
    """c * tokens^e through the (tokens, value) points (Note [A profile derived from the
    measured shapes]); values <= 0 make the derived value 0 when every point is 0."""
    positive = [(t, v) for t, v in points if v > 0 and t > 0]
    if not positive:
        return 0.0
    if len({t for t, _ in positive}) < 2:
        t0, v0 = min(positive, key=lambda p: abs(math.log(p[0] / tokens)))
        return float(v0 * (tokens / t0) ** min(max(1.0, exponents[0]), exponents[1]))
    xs = [math.log(t) for t, _ in positive]
    ys = [math.log(v) for _, v in positive]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    e = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var
    e = min(max(e, exponents[0]), exponents[1])
    # Anchored at the nearest point, so a shape measured before derives to itself.
    t0, v0 = min(positive, key=lambda p: abs(math.log(p[0] / tokens)))
    return float(v0 * (tokens / t0) ** e)


def derive_profile(bases: Sequence[Tuple[int, Dict[str, Any], int]],
                   tokens: int) -> Optional[Dict[str, Any]]:
    """A stash.profile/1 for `tokens` from measured (tokens, profile, counted fixed bytes)
    bases; None when there is none to derive from."""
    bases = [b for b in bases if b[0] and b[0] > 0]
    if not bases:
        return None
    nearest = min(bases, key=lambda b: abs(math.log(b[0] / tokens)))
    shape = skeleton(nearest[1])
    bases = [b for b in bases if skeleton(b[1]) == shape]
    doc = json.loads(json.dumps(nearest[1]))  # a deep copy of plain JSON

    def power(get: Callable[[Dict[str, Any], int], float],
              exponents: Tuple[float, float] = _BYTES_EXPONENTS) -> float:
        return _power([(float(t), float(get(p, counted))) for t, p, counted in bases], tokens,
                      exponents)

    # Note [Saved tensors someone else holds] in _fit_measure.py: made from parameters
    # alone in the nearest shape, the same bytes in every shape.
    constant = {(int(i), int(j)) for i, j in
                doc.get("measurement", {}).get("constant_tensors", [])}
    for i, layer in enumerate(doc["layers"]):
        layer["fwd_ms"] = power(lambda p, _: p["layers"][i]["fwd_ms"], _TIME_EXPONENTS)
        layer["bwd_ms"] = power(lambda p, _: p["layers"][i]["bwd_ms"], _TIME_EXPONENTS)
        layer["bwd_temp_bytes"] = int(power(lambda p, _: p["layers"][i]["bwd_temp_bytes"]))
        for j, t in enumerate(layer["tensors"]):
            if (i, j) in constant:
                continue
            t["bytes"] = int(round(power(lambda p, _: p["layers"][i]["tensors"][j]["bytes"])))
            t["recompute_ms"] = power(lambda p, _: p["layers"][i]["tensors"][j]["recompute_ms"],
                                      _TIME_EXPONENTS)
        digest = hashlib.sha256(json.dumps(
            [(t["bytes"], t["recomputable"], t["must_keep"]) for t in layer["tensors"]]).encode()
        ).hexdigest()[:16]
        layer["signature"] = layer["signature"].split(":")[0] + ":" + digest
    doc["step_overhead_ms"] = power(lambda p, _: p.get("step_overhead_ms", 0.0),
                                    _TIME_EXPONENTS)
    doc["loss_bytes"] = int(power(lambda p, _: p.get("loss_bytes", 0)))
    counted = nearest[2]
    doc["fixed_bytes"] = int(counted + power(lambda p, c: p["fixed_bytes"] - c))
    # Note [Gradients by position] in _fit_gradients.py: the temporaries scale with the
    # tokens, the gradients made by each position do not; the nearest shape's gradients
    # part (its view's figure less its own) joins the derived temporaries.
    g = nearest[1].get("measurement", {}).get("gradients")
    if isinstance(g, dict) and all(isinstance(b[1].get("measurement", {}).get("gradients"),
                                              dict) for b in bases):
        near = nearest[1]
        doc["measurement"]["gradients"] = {
            "bytes": int(g["bytes"]),
            "fixed_bytes": max(0, doc["fixed_bytes"] - int(g["bytes"])),
            "bwd_temp_bytes": [
                int(layer["bwd_temp_bytes"]) + max(0, int(v) - int(nl["bwd_temp_bytes"]))
                for layer, nl, v in zip(doc["layers"], near["layers"], g["bwd_temp_bytes"])],
            "loss_bytes": doc["loss_bytes"] + max(0, int(g["loss_bytes"])
                                                  - int(near.get("loss_bytes", 0))),
        }
    else:
        doc["measurement"].pop("gradients", None)
    doc.setdefault("measurement", {})["derived"] = {
        "tokens": tokens, "from_tokens": sorted(b[0] for b in bases)}
    return dict(doc)
