"""stash.torch.fit's parts that hold no handle state: the budget's syntax, a step's shape
key, byte counts of tensors and optimizer state, the step clock and the records a step
leaves, and small conversions between plans, profiles and the planner (Notes in _fit.py)."""

from __future__ import annotations

import hashlib
import json
import math
import time
from typing import Any, Dict, List, Union

import torch

from .. import _lib
from .._engine import RECOMPUTE, plan_actions
from .._lib import StashError, parse_bytes
from .._planner import InfeasibleBudget, make_plan
from ._saved import storage_of, tensors_in

GiB = float(1 << 30)
MIN_OFFLOAD_BYTES = 1 << 20  # the planner's floor (planner/profile.h kMinOffloadBytes)
MEASURE_SLOTS = 64           # engine slots per layer in a measuring step


def _gib(n: float) -> str:
    return f"{n / GiB:.3g} GiB"


class _MeasureLayer:
    """A layer's actions in a measuring step (Note [The measuring step]): every tensor is
    recompute as far as the hooks ask (they keep or offload what cannot be recomputed);
    not an exact list, so the hooks check no tensor count."""

    exact = False

    def __len__(self) -> int:
        return MEASURE_SLOTS

    def __getitem__(self, j: int) -> int:
        return RECOMPUTE

    def __contains__(self, action: object) -> bool:
        return action == RECOMPUTE


def _parse_budget(budget: Union[int, str]) -> str:
    """The budget in the planner's syntax ("123", "40GiB", "70%"); StashError otherwise."""
    if isinstance(budget, bool) or not isinstance(budget, (int, str)):
        raise StashError(f"stash.torch.fit: budget must be bytes (an int), a size such as "
                         f"'40GiB', or a share such as '70%'; got {budget!r}")
    if isinstance(budget, str) and budget.strip().endswith("%"):
        text = budget.strip()[:-1].strip()
        try:
            share = float(text)
        except ValueError:
            share = float("nan")
        if not (0 < share <= 100) or not math.isfinite(share):
            raise StashError(f"stash.torch.fit: budget {budget!r} is not a share between 0% "
                             "and 100% of the keep-all peak")
        return f"{text}%"
    try:
        return str(parse_bytes(budget))
    except ValueError as e:
        raise StashError(f"stash.torch.fit: budget {budget!r} does not parse: {e}") from None


def _signature(args, kwargs, training: bool) -> str:
    """Note [Re-planning and the cache]: the shape key of a step."""
    parts = []
    for t in tensors_in((args, kwargs)):
        parts.append((tuple(t.shape), str(t.dtype), str(t.device), bool(t.requires_grad)))
    auto = []
    for dt in ("cpu", "cuda"):
        try:
            auto.append((dt, torch.is_autocast_enabled(dt), str(torch.get_autocast_dtype(dt))))
        except (TypeError, AttributeError, RuntimeError):
            pass
    text = json.dumps([parts, auto, training, sorted(kwargs)], default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _model_digest(blocks) -> str:
    parts = []
    for b in blocks:
        parts.append((type(b).__name__, [(tuple(p.shape), str(p.dtype)) for p in b.parameters()]))
    text = json.dumps([parts, torch.__version__, _lib.version()])
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _tensor_bytes(ts) -> int:
    seen, n = set(), 0
    for t in ts:
        if isinstance(t, torch.Tensor):
            k, b = storage_of(t)
            if k not in seen:
                seen.add(k)
                n += b
    return n


def _optimizer_state_bytes(opt) -> int:
    return _tensor_bytes(v for st in opt.state.values() for v in st.values()
                         if isinstance(v, torch.Tensor))


def _optimizer_state_estimate(opt) -> int:
    """Bytes the optimizer's state will hold after its first step (Note [What the budget
    counts]); exact once it has stepped."""
    if opt is None:
        return 0
    if len(opt.state):
        return _optimizer_state_bytes(opt)
    per = 0
    name = type(opt).__name__
    if name in ("Adam", "AdamW", "NAdam", "RAdam", "Adamax"):
        per = 2
    elif name == "SGD":
        per = 1 if any(g.get("momentum", 0) for g in opt.param_groups) else 0
    elif name in ("RMSprop", "Adagrad", "Adadelta"):
        per = 1
    params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
    return per * _tensor_bytes(params)


class _Clock:
    """Marks on the compute stream (CUDA events) or on the host clock (CPU)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.kind = "cuda-events" if cuda else "host-clock"

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a, b) -> float:
        if a is None or b is None:
            return 0.0
        if self.cuda:
            return float(a.elapsed_time(b))
        return (b - a) * 1e3

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


class _StepRecord:
    """One training step as fit saw it: its mode, its marks and its memory."""

    def __init__(self, index: int, mode: str, key: str, start):
        self.index, self.mode, self.key, self.start = index, mode, key, start
        self.end = None
        self.fwd = {}       # (mb, layer) -> [begin, end]
        self.bwd = {}       # (mb, layer) -> [begin, end]
        self.replay = {}    # (mb, layer) -> [begin, end, [(index, mark), ...]]
        self.passes = 0     # forwards of block 0 (micro-batches)
        self.live_peak = 0  # CPU: most tracked activation bytes at once
        self.peak_at = None
        self.peak_bytes = 0
        self.exposed_before = 0.0
        self.exposed_ms = 0.0
        self.backward_done = False
        self.finished = False
        self.planning_ms = 0.0


class _LayerRecord:
    """What a measuring step learned about one block's saved tensors (per index)."""

    def __init__(self):
        self.entries: List[Dict[str, Any]] = []


def _weak(t):
    try:
        from torch.multiprocessing.reductions import StorageWeakRef
        return StorageWeakRef(t.untyped_storage())
    except Exception:  # noqa: BLE001 -- a tensor without a storage (e.g. a subclass)
        return None


def _allocator_state():
    from . import _allocator
    return _allocator


def _plan_doc(profile, actions) -> Dict[str, Any]:
    """A stash.plan/1 document with these per-layer actions, for evaluate()."""
    layers = []
    for i, (layer, acts) in enumerate(zip(profile["layers"], actions)):
        layers.append({"index": i, "name": layer["name"],
                       "fractions": {"keep": 0, "recompute": 0, "offload": 0},
                       "tensors": [{"name": t["name"], "action": a}
                                   for t, a in zip(layer["tensors"], acts)]})
    return {"schema": "stash.plan/1", "budget_bytes": 1 << 62, "solver": "greedy",
            "solve_ms": 0, "profile_sha256": "", "layers": layers}


def _actions_of(plan) -> List[List[int]]:
    return plan_actions(plan)


def _cupti_fwd(cupti, i):
    """Layer i's forward kernel time from a CUPTI run's per-layer output, if measured."""
    if not cupti:
        return None
    for layer in cupti.get("layers", []):
        if layer.get("index") == i and layer.get("fwd_ms"):
            return float(layer["fwd_ms"])
    return None


def _min_feasible(doc) -> int:
    try:
        make_plan(doc, "1")
    except InfeasibleBudget as e:
        return e.min_feasible_bytes
    return 0
