"""stash.torch.fit's parts that hold no handle state: the budget's syntax, a step's shape
key, byte counts of tensors and optimizer state, the step clock and the records a step
leaves, and small conversions between plans, profiles and the planner (Notes in _fit.py,
_fit_steps.py and _fit_shape_plans.py)."""

from __future__ import annotations

import functools
import hashlib
import json
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import torch

from .. import _lib
from .._engine import KEEP, RECOMPUTE, plan_actions
from .._lib import StashError
from .._planner import InfeasibleBudget, make_plan
from ._saved import storage_of

if TYPE_CHECKING:
    from types import ModuleType

GiB = float(1 << 30)
MIN_OFFLOAD_BYTES = 1 << 20  # the planner's floor (planner/model/profile.h kMinOffloadBytes)
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


class _DerivedLayer(list[int]):
    """A layer's actions in a derived plan (Note [A derived plan's first run] in
    _fit_shape_plans.py): the plan's list, but not exact: the hooks check no tensor count, a
    tensor past the list is kept, and only offloads go to the engine, whose plan has room
    for them."""

    exact = False

    def __getitem__(self, j: int) -> int:  # type: ignore[override]
        return list.__getitem__(self, j) if j < list.__len__(self) else KEEP

    def __len__(self) -> int:
        return max(MEASURE_SLOTS, list.__len__(self))

    def engine_actions(self) -> List[int]:
        return [self[j] for j in range(len(self))]


def _is_kv_cache(value: object) -> bool:
    """A Hugging Face key/value cache (DynamicCache, StaticCache, ...), by its class name:
    fit must not import transformers."""
    return type(value).__name__.endswith("Cache") and not isinstance(value, torch.Tensor)


def _repeated_blocks_in(module: torch.nn.Module) -> Optional[str]:
    """The name of the first ModuleList or Sequential under `module` that holds two or more
    modules of one class (a decoder's layers), else None."""
    for name, child in module.named_modules():
        if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)) and len(child) > 1:
            kinds = {type(c) for c in child}
            if len(kinds) == 1:
                return name or "(the module itself)"
    return None


def _checked_blocks(blocks: Any) -> List[torch.nn.Module]:
    """Note [The loops fit lives in] in _fit_api.py: blocks as a list, or a StashError
    that names the fix."""
    what = "stash.torch.fit: blocks must be the model's repeated blocks in the order its " \
           "forward runs them (e.g. model.model.layers)"
    if isinstance(blocks, (torch.nn.ModuleDict, dict)):
        raise StashError(f"{what}; got a {type(blocks).__name__}: pass list(its values()) if "
                         "that is the order they run in")
    if isinstance(blocks, torch.nn.Module) and not isinstance(
            blocks, (torch.nn.ModuleList, torch.nn.Sequential)):
        inner = _repeated_blocks_in(blocks)
        hint = (f"; its repeated blocks are .{inner}: fit(<{type(blocks).__name__}>.{inner}, "
                "...)" if inner else "")
        raise StashError(f"{what}; got a single {type(blocks).__name__}{hint}")
    try:
        blocks = list(blocks)
    except TypeError:
        raise StashError(f"{what}; got a {type(blocks).__name__}, which is not a sequence") \
            from None
    if not blocks:
        raise StashError("stash.torch.fit: no blocks")
    for i, b in enumerate(blocks):
        if not isinstance(b, torch.nn.Module):
            raise StashError(f"{what}; block {i} is a {type(b).__name__}, not a torch.nn.Module")
    if len(blocks) == 1:
        inner = _repeated_blocks_in(blocks[0])
        if inner is not None:
            raise StashError(
                f"stash.torch.fit: the one block given ({type(blocks[0]).__name__}) holds the "
                f"model's repeated blocks (.{inner}): give those instead "
                f"(fit(<{type(blocks[0]).__name__}>.{inner}, ...)); stash plans what each "
                "block keeps, recomputes or offloads, and prefetches one block ahead, so it "
                "needs the blocks themselves")
    return blocks  # type: ignore[no-any-return]  # a list of Modules, checked above


def _autocast_state() -> List[Tuple[str, bool, str]]:
    """Autocast's state on the CPU and CUDA, as far as this torch tells it."""
    auto = []
    for dt in ("cpu", "cuda"):
        try:
            on = torch.is_autocast_enabled(dt)
            # The dtype of an autocast that is off changes nothing (and asking costs).
            auto.append((dt, on, str(torch.get_autocast_dtype(dt)) if on else ""))
        except (TypeError, AttributeError, RuntimeError):
            pass
    return auto


_SIGNATURES: Dict[Any, str] = {}  # _signature's digests by their parts


def _signature(inputs: Sequence[torch.Tensor], kwargs: Dict[str, Any], training: bool) -> str:
    """Note [Re-planning and the cache] in _fit_shape_plans.py: the shape key of a step whose
    block 0 gets the tensors `inputs` (tensors_in of its arguments) and keywords `kwargs`.
    The digest of parts seen before is looked up, not hashed again, and the parts are what
    a tensor answers without making an object (torch.Size is a tuple; the device as
    get_device() and is_cuda, not a torch.device; Note [What it costs] in _fit_passes.py)."""
    parts = tuple((t.shape, t.dtype, t.get_device(), t.is_cuda, t.requires_grad)
                  for t in inputs)
    auto = tuple(_autocast_state())
    names = tuple(sorted(kwargs))
    memo = (parts, auto, training, names)
    key = _SIGNATURES.get(memo)
    if key is None:
        text = json.dumps([[(list(p[0]), str(p[1]), str(t.device), bool(p[4]))
                            for p, t in zip(parts, inputs)],
                           [list(a) for a in auto], training, list(names)], default=str)
        key = hashlib.sha1(text.encode()).hexdigest()[:16]
        if len(_SIGNATURES) > 4096:  # a run of ever new shapes keeps no more than this
            _SIGNATURES.clear()
        _SIGNATURES[memo] = key
    return key


def _model_digest(blocks: Iterable[torch.nn.Module]) -> str:
    parts = []
    for b in blocks:
        parts.append((type(b).__name__, [(tuple(p.shape), str(p.dtype)) for p in b.parameters()]))
    text = json.dumps([parts, torch.__version__, _lib.version()])
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _tensor_bytes(ts: Iterable[object]) -> int:
    seen: Set[int]
    seen, n = set(), 0
    for t in ts:
        if isinstance(t, torch.Tensor):
            k, b = storage_of(t)
            if k not in seen:
                seen.add(k)
                n += b
    return n


def _storages(ts: Iterable[object]) -> List[Tuple[Any, int]]:
    """The tensors' storages, each once: (a weak reference, None for a storage that takes
    none, and its bytes); the bytes sum to _tensor_bytes(ts)."""
    seen: Set[int] = set()
    out: List[Tuple[Any, int]] = []
    for t in ts:
        if isinstance(t, torch.Tensor):
            k, b = storage_of(t)
            if k not in seen:
                seen.add(k)
                out.append((_weak(t), b))
    return out


# By optimizer: the shape of its state when last counted (Note [What it costs] in _fit_passes.py),
# a weak reference to its first state tensor, and the bytes.
_STATE_BYTES: "weakref.WeakKeyDictionary[Any, Tuple[Any, Any, int]]" = \
    weakref.WeakKeyDictionary()


def _first_state_tensor(opt: Any) -> Optional[torch.Tensor]:
    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                return v
    return None


def _state_shape(opt: Any) -> Tuple[int, int, int, int]:
    """What _optimizer_state_bytes compares, in a few lookups: the state dict itself, its
    number of per-parameter dicts and the entries of its first and last."""
    state = opt.state
    if not state:
        return (id(state), 0, 0, 0)
    values = state.values()
    return (id(state), len(state), len(next(iter(values))), len(next(reversed(values))))


def _optimizer_state_bytes(opt: Any) -> int:
    """The optimizer's state tensors' bytes, by storage. Counted again only when the
    state changed shape: another state dict, another number of per-parameter dicts or of
    entries in the first or last of them, or another first tensor (load_state_dict makes
    new ones). torch's optimizers make a parameter's whole state at its first step and
    update it in place, so between two such changes the bytes stay (Note [What it costs]
    in _fit_passes.py: walking every state tensor twice a step cost 50 us on a tiny Llama,
    and even the per-parameter dicts' lengths cost tens of microseconds after a step's
    compute)."""
    shape = _state_shape(opt)
    first = _first_state_tensor(opt)
    hit = _STATE_BYTES.get(opt)
    if hit is not None and hit[0] == shape and (
            hit[1]() if hit[1] is not None else None) is first:
        return hit[2]
    n = _tensor_bytes(v for st in opt.state.values() for v in st.values()
                      if isinstance(v, torch.Tensor))
    _STATE_BYTES[opt] = (shape, weakref.ref(first) if first is not None else None, n)
    return n


def _optimizer_state_estimate(opt: Any) -> int:
    """Bytes the optimizer's state will hold after its first step (Note [What the budget
    counts] in _fit_steps.py); exact once it has stepped."""
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


def _compile_events() -> int:
    """How many compile events (Dynamo traces, AOT and Inductor compiles, a lazily compiled
    backward included) this process has timed so far; 0 where Dynamo was never imported
    (Note [A measuring step that compiled] in _fit_measure.py). stash.bench.peers leaves
    a step that compiled untimed by the same count."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    metrics = getattr(utils, "compilation_time_metrics", None)
    if not isinstance(metrics, dict):
        return 0
    return sum(len(v) for v in metrics.values())


@dataclass
class Span:
    """A begin and an end mark of the step clock (None: not reached)."""

    begin: Any = None
    end: Any = None


@dataclass
class ReplaySpan(Span):
    """A replay's span and a mark at each recomputable save: (save index, mark)."""

    marks: List[Tuple[int, Any]] = field(default_factory=list)


# (the serial number of a forward, layer): every forward of a step has its own spans,
# micro-batches and accumulation by hand alike (two forwards of micro-batch 0 in one step).
SpanKey = Tuple[int, int]


@dataclass
class StepRecord:
    """One training step as fit saw it: its mode, its marks and its memory. ``aborted``
    names what ended it early (an exception, an abandoned forward); such a step leaves
    no profile and is judged against no budget."""

    index: int
    mode: str
    key: str
    start: Any
    end: Any = None
    fwd: Dict[SpanKey, Span] = field(default_factory=dict)
    bwd: Dict[SpanKey, Span] = field(default_factory=dict)
    replay: Dict[SpanKey, ReplaySpan] = field(default_factory=dict)
    passes: int = 1          # forwards of block 0 (micro-batches)
    # The shape key of each pass, the first the step's (Note [Micro-batches of other
    # shapes] in _fit_passes.py); StepBook.begin sets the first.
    pass_keys: List[str] = field(default_factory=list)
    in_flight: int = 1       # most micro-batches between forward and backward at once
    backwards: int = 0       # backward passes through the blocks that ended
    live_peak: int = 0       # CPU: most tracked activation bytes at once
    peak_at: Optional[str] = None
    peak_bytes: int = 0
    budget_bytes: Optional[int] = None  # of this step's shape (Note [What a share budget means])
    predicted_peak: Optional[int] = None
    predicted_step: Optional[float] = None
    exposed_before: float = 0.0
    exposed_ms: float = 0.0
    step_ms: float = 0.0
    backward_done: bool = False
    made_gradients: bool = False  # with the optimizer known: gradients alive after backward
    optimizer_began: bool = False
    plan_source: Optional[str] = None  # "measured", "derived" or "cache_dir"
    # a derived plan's first run (Note [A derived plan's first run] in _fit_shape_plans.py)
    checking: bool = False
    saved_counts: Dict[int, int] = field(default_factory=dict)  # checking: layer -> tensors
    check: Optional[str] = None  # checking: "passed" or why it failed
    meter_peak: Optional[int] = None   # the meter's reading at the step's end
    # CUDA, a measuring step (Note [The measuring step's windows on CUDA] in
    # _fit_cuda_meter.py): the meter's peak by window, "blocks" (their forwards and
    # backwards) and "loss" (the head, the loss and their backward); whether the loss window
    # is open; the most before optimizer.step(), and over it alone; the optimizer state's
    # bytes fit estimated at block 0 where none existed yet.
    windows: Optional[Dict[str, int]] = None
    in_loss: bool = False
    before_optimizer_peak: Optional[int] = None
    optimizer_peak: Optional[int] = None
    # A measuring step: the process's compile events at its start (Note [A measuring step
    # that compiled] in _fit_measure.py).
    compiles_before: Optional[int] = None
    optimizer_state_missing: int = 0
    # CUDA, a measuring step: what no shape changes, read at block 0 (Note [What stays
    # the same across shapes] in _fit_shapes.py).
    constant_bytes: Optional[int] = None
    # CPU: what is alive at block 0, below the counting allocator's window (Note [The CPU
    # allocator's meter] in _meter.py).
    meter_base: Optional[int] = None
    # Block 0's inputs' bytes, in meter_base (Note [Block 0's inputs in the CPU meter's
    # samples] in _fit_measure.py).
    meter_inputs: int = 0
    # Their storages by weak reference (None: one that takes none), with their bytes (Note
    # [A later pass on the CPU meter] in _fit_steps.py).
    meter_input_refs: List[Tuple[Any, int]] = field(default_factory=list)
    meter_running: int = 0   # the most it read at a sample so far
    counted: int = 0         # fit's count of what is not an activation (_fixed_counted)
    # The most the meter read above fit's count, by the position the step was in:
    # ("fwd", i), ("loss",), ("bwd", i), ("opt",) (Note [What the budget counts] in
    # _fit_steps.py).
    untracked: Dict[Tuple[Any, ...], int] = field(default_factory=dict)
    # ... with the gradients alive at each window's peak counted in (Note [Gradients by
    # position] in _fit_gradients.py); a step that began without gradients reads them.
    untracked_with_grads: Dict[Tuple[Any, ...], int] = field(default_factory=dict)
    grads_at_start: int = 0  # gradient bytes alive at block 0
    phase: Tuple[Any, ...] = ("fwd", 0)
    tracked_before: int = 0  # fit's count of activations at the last sample
    state_at_start: int = 0  # gradients and optimizer state alive at block 0
    grown: int = 0           # ... made since, as at the last backward or optimizer sample
    bwd_end: Any = None
    finished: bool = False
    aborted: Optional[str] = None
    planning_ms: float = 0.0
    cupti: Optional[Dict[str, Any]] = None

    @property
    def shapes(self) -> List[str]:
        """The shape keys its passes ran, each once, in order."""
        return list(dict.fromkeys(self.pass_keys)) or [self.key]

    @property
    def over_budget(self) -> bool:
        return (self.aborted is None and self.budget_bytes is not None
                and self.peak_bytes > self.budget_bytes)


class _LayerRecord:
    """What a measuring step learned about one block's saved tensors (per index)."""

    def __init__(self) -> None:
        self.entries: List[Dict[str, Any]] = []


def _weak(t: torch.Tensor) -> Any:
    try:
        return _storage_weak_ref()(t.untyped_storage())
    except Exception:  # noqa: BLE001 -- a tensor without a storage (e.g. a subclass)
        return None


@functools.lru_cache(maxsize=None)
def _storage_weak_ref() -> Any:
    """torch's StorageWeakRef, imported once (with the import statement in each call a weak
    reference took 2.3 us here, 1.0 us without)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    return StorageWeakRef


def _allocator_state() -> ModuleType:
    from . import _allocator
    return _allocator


def _plan_doc(profile: Dict[str, Any], actions: Sequence[Sequence[str]]) -> Dict[str, Any]:
    """A stash.plan/1 document with these per-layer actions, for evaluate()."""
    layers = []
    for i, (layer, acts) in enumerate(zip(profile["layers"], actions)):
        layers.append({"index": i, "name": layer["name"],
                       "fractions": {"keep": 0, "recompute": 0, "offload": 0},
                       "tensors": [{"name": t["name"], "action": a}
                                   for t, a in zip(layer["tensors"], acts)]})
    return {"schema": "stash.plan/1", "budget_bytes": 1 << 62, "solver": "greedy",
            "solve_ms": 0, "profile_sha256": "", "layers": layers}


def _actions_of(plan: Dict[str, Any]) -> List[List[int]]:
    return plan_actions(plan)


def _cupti_fwd(cupti: Optional[Dict[str, Any]], i: int) -> Optional[float]:
    """Layer i's forward kernel time from a CUPTI run's per-layer output, if measured."""
    if not cupti:
        return None
    for layer in cupti.get("layers", []):
        if layer.get("index") == i and layer.get("fwd_ms"):
            return float(layer["fwd_ms"])
    return None


def _min_feasible(doc: Dict[str, Any]) -> int:
    try:
        make_plan(doc, "1")
    except InfeasibleBudget as e:
        return e.min_feasible_bytes
    return 0
