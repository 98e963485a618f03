"""stash.torch.fit's gradients by position: the profile a step is planned on, depending on
whether it begins with gradients alive.

Note [Gradients by position]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
fit counts every gradient as allocated (Note [What the budget counts] in _fit_steps.py), so
a profile's fixed bytes hold them at every position. That is right for a step that begins
with them (zero_grad(set_to_none=False), gradients accumulated across steps, a later
micro-batch of the same step). A loop that sets them to None (optimizer.zero_grad()'s
default, the Hugging Face Trainer's, Lightning's) has none in its forward, and in its
backward only those made so far: the head's in the loss's backward, then each layer's as
its backward runs. Full activation checkpointing's peak comes in the last layer's
backward, before most of them exist, so a profile that holds them everywhere cannot plan
at that peak.

On the CPU the measuring step also reads each window of the allocator's meter with the
gradients it held counted in, rather than out (_fit_measure.MeasuringRecorder.sample).
Where it began without gradients and ran one pass, the profile's measurement records
("gradients") the fixed bytes without them, each layer's backward temporaries and the
loss's bytes with those made by then. A step that begins without gradients is planned on
that view (view()) when its budget is in bytes; the optimizer step, which holds them all and no activation, keeps its
position (optimizer_bytes). A share of keep-all is of the stored profile's keep-all and
planned on it (Note [What a share budget means] in _fit_options.py), as is any other
step, every step across ranks (they must plan on one profile) and every step on CUDA (where the measuring
step reads one peak and no positions), is planned on the profile as stored: the
conservative one. A cached plan says which it was made on (its entry's
"without_gradients"; its file's name), so a loop that changes kind is planned again.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

Doc = Dict[str, Any]


def positions(doc: Doc) -> Optional[Dict[str, Any]]:
    """The measurement's gradients by position (Note [Gradients by position]), or None."""
    g = doc.get("measurement", {}).get("gradients")
    if not isinstance(g, dict) or len(g.get("bwd_temp_bytes", [])) != len(doc["layers"]):
        return None
    return g


def view(doc: Doc, without_gradients: bool) -> Doc:
    """The profile a step plans on: `doc` itself, or, for a step that begins without
    gradients where the measurement says where they were made, the view without them."""
    g = positions(doc) if without_gradients else None
    if g is None:
        return doc
    out = dict(doc, fixed_bytes=int(g["fixed_bytes"]), loss_bytes=int(g["loss_bytes"]))
    out["layers"] = [dict(layer, bwd_temp_bytes=int(t))
                     for layer, t in zip(doc["layers"], g["bwd_temp_bytes"])]
    return out


def planned_without(doc: Doc, without_gradients: bool) -> bool:
    """Whether a step of this kind plans on the view (view() is not doc)."""
    return without_gradients and positions(doc) is not None


def shift_fixed(doc: Doc, delta: int) -> None:
    """Adds `delta` bytes that every position holds (a first-run correction, the optimizer's
    real state) to the profile and to its view alike."""
    doc["fixed_bytes"] = max(0, int(doc["fixed_bytes"]) + delta)
    if "optimizer_bytes" in doc:
        doc["optimizer_bytes"] = max(0, int(doc["optimizer_bytes"]) + delta)
    m = doc.get("measurement", {})
    if "constant_bytes" in m:  # Note [What stays the same across shapes] in _fit_shapes.py
        m["constant_bytes"] = max(0, int(m["constant_bytes"]) + delta)
    g = positions(doc)
    if g is not None:
        g["fixed_bytes"] = max(0, int(g["fixed_bytes"]) + delta)
