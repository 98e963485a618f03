"""stash.profile/1 documents in Python: the fields, and a structural check.

The planner (planner/profile.cpp) is the authority on the schema; :func:`validate` checks
the same required fields, types and ranges so that a profile written from Python is known
to load in ``stash plan`` / ``stash profile --skeleton`` before it gets there.
"""

import json
import math
import os
from typing import Any, Dict, Union

SCHEMA = "stash.profile/1"

__all__ = ["SCHEMA", "validate", "write_json", "ProfileError"]


def write_json(path: Union[str, "os.PathLike[str]"], doc: Any) -> None:
    """Writes `doc` as JSON to `path` whole or not at all (a temporary file, then a rename;
    the folder is made if missing), as planner::write_json_file does for the CLI."""
    path = os.fspath(path)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


class ProfileError(ValueError):
    """A profile that is not valid stash.profile/1; the message names the field."""


def _require(cond, path, message):
    if not cond:
        raise ProfileError(f"{path}: {message}")


def _size(obj, path, key):
    _require(key in obj, f"{path}.{key}" if path else key, "is missing")
    v = obj[key]
    p = f"{path}.{key}" if path else key
    _require(isinstance(v, int) and not isinstance(v, bool) and v >= 0, p,
             f"must be a non-negative integer, got {v!r}")
    return v


def _number(obj, path, key, positive=False):
    p = f"{path}.{key}" if path else key
    _require(key in obj, p, "is missing")
    v = obj[key]
    _require(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v), p,
             f"must be a finite number, got {v!r}")
    _require(v > 0 if positive else v >= 0, p,
             f"must be {'positive' if positive else 'non-negative'}, got {v!r}")
    return v


def _string(obj, path, key):
    p = f"{path}.{key}" if path else key
    _require(key in obj and isinstance(obj[key], str), p, "must be a string")
    return obj[key]


def _bool(obj, path, key):
    p = f"{path}.{key}" if path else key
    _require(key in obj and isinstance(obj[key], bool), p, "must be true or false")
    return obj[key]


def validate(doc: Dict[str, Any]) -> Dict[str, Any]:
    """Raises ProfileError unless ``doc`` (a dict) is structurally valid stash.profile/1:
    every field the planner requires, of the right type and range, at least one layer,
    unique tensor names per layer. Returns ``doc``."""
    _require(isinstance(doc, dict), "", "a profile is a JSON object")
    _require(doc.get("schema") == SCHEMA, "schema", f"must be {SCHEMA!r}")
    _require(doc.get("source") in ("analytic", "measured"), "source",
             "must be \"analytic\" or \"measured\"")
    dev = doc.get("device")
    _require(isinstance(dev, dict), "device", "must be an object")
    _string(dev, "device", "name")
    _size(dev, "device", "memory_bytes")
    link = doc.get("link")
    _require(isinstance(link, dict), "link", "must be an object")
    for k in ("h2d_gbps", "d2h_gbps", "bidir_gbps"):
        _number(link, "link", k, positive=True)
    ranks = _size(link, "link", "local_ranks")
    _require(1 <= ranks <= 1024, "link.local_ranks", "must be between 1 and 1024")
    host = doc.get("host")
    _require(isinstance(host, dict), "host", "must be an object")
    _size(host, "host", "pinnable_bytes")
    _size(doc, "", "fixed_bytes")
    if "optimizer_bytes" in doc:  # optional (Note [The optimizer's position], plan.h)
        _size(doc, "", "optimizer_bytes")
    layers = doc.get("layers")
    _require(isinstance(layers, list) and layers, "layers", "must list at least one layer")
    for i, layer in enumerate(layers or []):
        lp = f"layers[{i}]"
        _require(isinstance(layer, dict), lp, "must be an object")
        _string(layer, lp, "name")
        _string(layer, lp, "signature")
        _number(layer, lp, "fwd_ms")
        _number(layer, lp, "bwd_ms")
        _size(layer, lp, "bwd_temp_bytes")
        tensors = layer.get("tensors")
        _require(isinstance(tensors, list), f"{lp}.tensors", "must be an array")
        names = set()
        for j, t in enumerate(tensors):
            tp = f"{lp}.tensors[{j}]"
            _require(isinstance(t, dict), tp, "must be an object")
            name = _string(t, tp, "name")
            _require(name, f"{tp}.name", "must not be empty")
            _require(name not in names, f"{tp}.name", f"duplicate tensor name {name!r} in layer")
            names.add(name)
            _size(t, tp, "bytes")
            _number(t, tp, "recompute_ms")
            for k in ("offloadable", "recomputable", "must_keep"):
                _bool(t, tp, k)
    return doc
