"""stash.torch.fit under whole-model torch.compile: what a joint graph saves per block, as
a stash.profile/1, and a plan as the partitioner's tags (Note [Planning the compiled
graph] in _compiled.py). Functions of fx graphs and documents; no handle state."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import torch
import torch.fx as fx

Doc = Dict[str, Any]
Partition = Callable[..., Tuple[fx.GraphModule, fx.GraphModule]]

# The matmul-like ops whose cost is their FLOPs; any other op costs its output's bytes
# (Note [Recompute cost in a compiled block] in _compiled_steps.py).
_MATMULS = {"mm", "addmm", "bmm", "baddbmm"}
_ATTENTION = ("_scaled_dot_product", "scaled_dot_product")


@dataclass
class SavedValue:
    """One value the partitioner saves for backward at keep-all, in block `block`."""

    name: str
    nbytes: int
    recomputable: bool  # False: the block's input (recompute starts from it)
    cost: float         # relative cost of recomputing it (its chain), within its block
    offloadable: bool = False  # a dense tensor (_dense), used by no later block
    shared: bool = False  # used by a later block's forward too: kept (saved_by_block)


@dataclass
class GraphBlocks:
    """A joint graph's forward, cut into fit's blocks by the tick nodes."""

    ticks: Dict[int, fx.Node] = field(default_factory=dict)        # block (n: the end) -> tick
    region: Dict[fx.Node, int] = field(default_factory=dict)       # forward node -> block
    boundary: Set[fx.Node] = field(default_factory=set)            # the ticks and their add
    weight: Dict[int, float] = field(default_factory=dict)         # block -> total cost
    # Note [A graph break among the blocks]: why this graph cannot be planned (None: it can)
    broken: Optional[str] = None
    # Note [A graph break among the blocks]: the forward nodes before the first tick of a
    # graph that begins after block 0 (the block before it, if it was split there)
    before: Set[fx.Node] = field(default_factory=set)

    @property
    def blocks(self) -> Tuple[int, ...]:
        """The ticks this graph holds (n: the end tick), the key of its part of a shape's
        record (ShapeGraphs.record)."""
        return tuple(sorted(self.ticks))


def _is_tick(node: fx.Node, tick: Any) -> bool:
    return node.op == "call_function" and node.target is tick


def _val_bytes(node: fx.Node) -> int:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return int(val.numel()) * int(val.element_size())
    return 0


def _dense(node: fx.Node) -> bool:
    """Whether a value is a contiguous tensor with elements: what stash::fetch rebuilds
    from a flat buffer (Note [Offload in the compiled graph] in _compiled_offload.py)."""
    val = node.meta.get("val")
    return (isinstance(val, torch.Tensor) and val.layout == torch.strided
            and int(val.numel()) > 0 and bool(val.is_contiguous()))


def _cost(node: fx.Node) -> float:
    """Note [Recompute cost in a compiled block]: FLOPs of a matmul or attention, bytes of
    anything else."""
    name = getattr(node.target, "__name__", str(node.target))
    base = name.split(".")[0]
    val = node.meta.get("val")
    out = val[0] if isinstance(val, (tuple, list)) and val else val
    if not isinstance(out, torch.Tensor):
        return 0.0
    if base in _MATMULS and node.args:
        a = node.args[1] if base in ("addmm", "baddbmm") else node.args[0]
        av = a.meta.get("val") if isinstance(a, fx.Node) else None
        k = int(av.shape[-1]) if isinstance(av, torch.Tensor) and av.dim() else 1
        return 2.0 * float(out.numel()) * k
    if base.startswith(_ATTENTION) and node.args:
        q = node.args[0]
        qv = q.meta.get("val") if isinstance(q, fx.Node) else None
        if isinstance(qv, torch.Tensor) and qv.dim() >= 2:
            return 4.0 * float(qv.numel()) * int(qv.shape[-2])
    return float(out.numel() * out.element_size())


def _backward_nodes(graph: fx.Graph) -> Set[fx.Node]:
    """The nodes that depend on a tangent: the joint graph's backward."""
    bwd: Set[fx.Node] = set()
    for node in graph.nodes:
        if node.op == "placeholder" and node.name.startswith("tangents"):
            bwd.add(node)
        elif any(a in bwd for a in node.all_input_nodes):
            bwd.add(node)
    return bwd


def cut_blocks(graph: fx.Graph, tick: Any, handle_id: int, n_blocks: int
               ) -> Optional[GraphBlocks]:
    """The blocks of handle `handle_id` in a joint graph, by its ticks (None: none here).
    A forward node belongs to the block whose tick precedes it in graph order (the trace's
    order); nodes before the first tick (the embedding) or after the end tick (block
    n_blocks: the head and the loss) belong to none.

    Note [A graph break among the blocks]
    A graph break inside a block or between two (a print, a data-dependent branch, a hook
    Dynamo cannot trace) makes Dynamo compile the blocks as two graphs or more, each
    partitioned on its own. stash once read such graphs as if each were the whole model: a
    tiny Llama with a break in block 1 measured, then failed inside Inductor with "int()
    argument must be ... not 'Node'" (BackendCompilerFailed).
    A break between two blocks (in the model's loop, before a block's call) leaves each
    block whole in one graph: the graph before it holds ticks 0..k, the one after it
    ticks k+1..n. Those are planned per graph: each graph's saved values are recorded
    under its ticks (ShapeGraphs.record), the shape's record is their union, the plan is
    made from it as from one graph, and each graph is tagged with its own blocks' part of
    the plan. A value is offloadable only where the tick it is settled at (block b+2's,
    or the end) is in its own graph (Note [Offload in the compiled graph] in
    _compiled_offload.py). A graph for another shape is partitioned before the shape's
    later graphs exist, so such a shape is planned graph by graph, the blocks of the
    graphs partitioned first fixed (Note [A new shape across graphs] in
    _compiled_shapes.py).
    A break inside a block (at its start, or in its MLP) splits its values between
    graphs. Dynamo compiles the frames on the stack at the break apart, so the graph of
    the block's wrapper ends at the block's call and holds its tick alone (none of the
    block: refused). Should a later torch resume the frames inside one graph instead
    (nested graph breaks), the rest of the block lies before the next graph's first tick
    (`before`: refused if anything there is saved). Ticks that are not a contiguous run
    are refused too. A refused graph goes to min-cut untagged and the next tick raises
    StashError naming the block and what works (per-block compile, eager). Planning a
    block's values across two graphs is not built.
    After a break in the model's loop Dynamo compiles each later block's wrapper as a
    frame of its own (a graph per block, serial and shape). Dynamo's cache and its
    recompile limit (8) are per code object, and every block's wrapper shared one: a
    12-layer Llama with a break before block 1 stopped at its first step with fit's
    recompile-limit error, a 4-layer one at its second length. Each block's wrapper now
    has a code object of its own (compiled_wrapper in _compiled_graph.py), so each block
    has its own limit, and fit's error names the graphs of the block that fell back.
    The block's index and the plan's serial reach the ticks as strings (trace_block in
    _compiled.py): Dynamo guards a string by value, while an int that differs between two
    frames it compiles of the same code (the wrapper of every block, after a break)
    becomes an input of the graph, and the tick's block with it (this once failed inside
    Inductor: "int() argument must be ... not 'Node'"). A break before block 0 or after
    the end tick leaves every tick in one graph, planned as before."""
    bwd = _backward_nodes(graph)
    cut = GraphBlocks()
    current: Optional[int] = None
    seen_tick = False
    for node in graph.nodes:
        if node.op != "call_function" or node in bwd:
            continue
        if not seen_tick and not _is_tick(node, tick):
            cut.before.add(node)
        if _is_tick(node, tick) and node.args[1] == handle_id:
            if isinstance(node.args[2], fx.Node) or isinstance(node.args[3], fx.Node):
                # Note [A graph break among the blocks]: Dynamo made the block's index an
                # input of a graph resumed after a break.
                cut.broken = "a graph resumed after a graph break takes a block's index as input"
                return cut
            block = int(node.args[2])
            seen_tick = True
            cut.ticks[block] = node
            cut.boundary.add(node)
            for mul in node.users:  # x + 0 * tick: the block's input as it runs
                cut.boundary.add(mul)
                cut.boundary.update(mul.users)
            current = block if block < n_blocks else None
            continue
        if current is not None:
            cut.region[node] = current
            cut.weight[current] = cut.weight.get(current, 0.0) + _cost(node)
    ticks = cut.blocks
    if ticks and ticks != tuple(range(ticks[0], ticks[-1] + 1)):
        # Note [A graph break among the blocks]
        cut.broken = (f"this graph holds the ticks of blocks {list(ticks)} of 0..{n_blocks} "
                      "(the last: the blocks' end), not a run of them")
    if not ticks or ticks[0] == 0:
        cut.before.clear()
    last = ticks[-1] if ticks else n_blocks
    if cut.broken is None and last < n_blocks and not any(
            b == last and node not in cut.boundary for node, b in cut.region.items()):
        # Note [A graph break among the blocks]: the graph ends at block `last`'s tick.
        cut.broken = (f"a graph break inside block {last} splits it from its tick (this "
                      "graph holds none of its nodes)")
    return cut if cut.ticks else None


def split_block(cut: GraphBlocks, saved: Sequence[str]) -> Optional[str]:
    """Note [A graph break among the blocks]: why a graph that begins after block 0 holds
    part of the block before it (a saved value before its first tick), or None."""
    names = set(saved)
    if any(n.name in names and _val_bytes(n) > 0 for n in cut.before):
        k = cut.blocks[0] - 1
        return (f"a graph break inside block {k} splits its saved values between two "
                "graphs")
    return None


def saved_at_keep_all(gm: fx.GraphModule, joint_inputs: Sequence[Any], partition: Partition,
                      kwargs: Dict[str, Any]) -> List[str]:
    """The names of the values the partitioner saves when nothing is tagged (what the
    compiled model without stash saves), from a partition of a copy of the graph."""
    graph = copy.deepcopy(gm.graph)
    for node in graph.nodes:
        node.meta.pop("recompute", None)
        node.meta.pop("ac_graph_id", None)
    probe = fx.GraphModule(gm, graph)
    _, bw = partition(probe, joint_inputs, **dict(kwargs))
    return [n.name for n in bw.graph.nodes
            if n.op == "placeholder" and not n.name.startswith("tangents")]


def saved_by_block(gm: fx.GraphModule, cut: GraphBlocks, saved: Sequence[str],
                   n_blocks: int) -> Dict[int, List[SavedValue]]:
    """Per block, the saved values produced in it, in graph order, with their bytes and
    recompute cost (their chain back to other saved values and the block's input).

    A value a later block's forward uses too (a mask made once, in block 0's stretch of
    the graph, and passed to every block) is used by those blocks' backward as well: its
    first use in backward is the last block's. Fetched there, or recomputed there, it
    would live from that block's backward on, which the planner, pricing it as block b's,
    does not see (on the CPU, a 4-layer Llama's plan offloaded block 0's causal mask,
    which the backward fetched at block 3's). It is kept."""
    by_name = {n.name: n for n in gm.graph.nodes}
    saved_nodes = {by_name[s] for s in saved if s in by_name}
    # The partitioner merges common subexpressions first: block 1's copy of block 0's
    # mask becomes block 0's, whose users then span the blocks. Its users by name, so.
    try:
        from torch._functorch.compile_utils import fx_graph_cse
        merged = fx_graph_cse(gm.graph)
        users = {n.name: [by_name[u.name] for u in n.users if u.name in by_name]
                 for n in merged.nodes}
    except (ImportError, RuntimeError):
        users = {}
    out: Dict[int, List[SavedValue]] = {}
    for node in gm.graph.nodes:
        if node not in saved_nodes or node not in cut.region:
            continue
        if not isinstance(node.meta.get("val"), torch.Tensor):
            # A SymInt (a graph Dynamo made dynamic in a dimension saves sizes): no
            # bytes, nothing to plan, and left out so that a block's values are the
            # same list in every trace of its shape (Note [Saved values by position]).
            continue
        block = cut.region[node]
        boundary = node in cut.boundary
        chain: Set[fx.Node] = set()
        stack = [node]
        while stack:
            n = stack.pop()
            if n in chain:
                continue
            chain.add(n)
            for a in n.all_input_nodes:
                if (cut.region.get(a) == block and a not in saved_nodes
                        and a not in cut.boundary):
                    stack.append(a)
        cost = 0.0 if boundary else sum(_cost(n) for n in chain)
        shared = any(cut.region.get(u, block) > block
                     for u in list(node.users) + users.get(node.name, []))
        # Settled at block b+2's tick or the end tick, which must be in this graph (Note
        # [A graph break among the blocks]).
        settles = min(block + 2, n_blocks) in cut.ticks
        out.setdefault(block, []).append(SavedValue(
            node.name, _val_bytes(node), not boundary and not shared, cost,
            _dense(node) and not shared and settles, shared))
    return out


def stale_blocks(saved: Dict[int, List[SavedValue]],
                 planned: Dict[int, List[Tuple[int, bool]]]) -> List[int]:
    """The blocks whose saved values are not the ones their plan was made for (planned:
    per block, each value's bytes and whether it may be recomputed, as planned).

    Note [Saved values by position]
    A plan's actions are per block, per saved value, by position in the block's list, and
    each graph is tagged with them when it is partitioned: a graph of the plan's shape
    traced again (the plan's correction makes a new serial; Dynamo recompiles) must save
    the same values in the same order. After other lengths have run, Dynamo's automatic
    dynamic shapes traces the measured length again with the sequence symbolic, and the
    partition then saves a SymInt too (a size product, 0 bytes) among a block's values:
    a 4-layer Qwen2 with a graph break, corrected after a length of 160 ran, had its
    128 graphs tagged with the plan shifted by one value per block and ran 11% over its
    prediction (7.18 MB against 6.40). SymInts are no values of the plan's
    (saved_by_block leaves them out). Should a trace still save other values than its
    plan was made for, those blocks run least memory (each recomputed from its input),
    below the plan's prediction, and fit says so once; a tag by position onto other
    values is never made."""
    now = value_signature(saved)
    return sorted(b for b in saved if now[b] != planned.get(b))


def value_signature(saved: Dict[int, List[SavedValue]]) -> Dict[int, List[Tuple[int, bool]]]:
    """Per block, its values' bytes and recomputability: what stale_blocks compares."""
    return {b: [(int(v.nbytes), bool(v.recomputable)) for v in values]
            for b, values in saved.items()}


def outside_bytes(gm: fx.GraphModule, cut: GraphBlocks, saved: Sequence[str]) -> int:
    """The bytes of the saved values produced outside fit's blocks (the embedding, the
    head, the loss), which a profile holds in its fixed bytes."""
    names = set(saved)
    return sum(_val_bytes(n) for n in gm.graph.nodes
               if n.name in names and n not in cut.region and n.op != "placeholder")


def layer_doc(name: str, kind: str, values: Sequence[SavedValue], fwd_ms: float,
              bwd_ms: float, weight: float, bwd_temp_bytes: int = 0) -> Doc:
    """A profile layer: the block's saved values as tensors, each recomputable one priced
    at its share of the block's measured forward (Note [Recompute cost in a compiled
    block] in _compiled_steps.py). A dense value may be offloaded (Note [Offload in the
    compiled graph] in _compiled_offload.py); the block's input may not be recomputed."""
    tensors = []
    seen_input = False
    for j, v in enumerate(values):
        is_input = not v.recomputable and not v.shared
        tname = "input" if is_input and not seen_input else f"saved.{j}"
        seen_input = seen_input or is_input
        tensors.append({
            "name": tname, "bytes": int(v.nbytes),
            "recompute_ms": float(fwd_ms * v.cost / weight) if weight > 0 and v.recomputable
            else 0.0,
            "offloadable": v.offloadable, "recomputable": v.recomputable,
            "must_keep": not (v.recomputable or v.offloadable)})
    digest = hashlib.sha256(json.dumps(
        [(t["bytes"], t["recomputable"], t["offloadable"]) for t in tensors]
    ).encode()).hexdigest()[:16]
    return {"name": name, "signature": f"{kind}:compiled:{digest}", "fwd_ms": float(fwd_ms),
            "bwd_ms": float(bwd_ms), "bwd_temp_bytes": int(bwd_temp_bytes),
            "tensors": tensors}


@functools.lru_cache(maxsize=1)
def _view_ops() -> Optional[Any]:
    """The partitioner's own op lists (torch._functorch.partitioners), whose is_view
    decides which nodes min-cut will not keep from recomputing; None where this torch
    has none."""
    try:
        from torch._functorch.partitioners import get_default_op_list
    except ImportError:
        return None
    return get_default_op_list()


def _is_getitem(node: fx.Node) -> bool:
    return (node.op == "call_function" and node.target is operator.getitem
            and bool(node.args) and isinstance(node.args[0], fx.Node))


def _storage_owner(node: fx.Node) -> fx.Node:
    """The node that makes `node`'s storage: `node` itself, or for a view (as min-cut
    classifies views), the first of its bases that is not one."""
    ops = _view_ops()
    while (ops is not None and ops.is_view(node) and node.args
           and isinstance(node.args[0], fx.Node)):
        node = node.args[0]
    return node


def tag(gm: fx.GraphModule, cut: GraphBlocks, saved: Dict[int, List[SavedValue]],
        actions: Optional[Sequence[Sequence[str]]], owners: bool = True) -> None:
    """Tags the joint graph's forward nodes in fit's blocks for the min-cut partitioner
    (Note [Planning the compiled graph] in _compiled.py): the ticks MUST_SAVE (never run
    again); with `actions` (per block, per saved value: "keep", "offload" or "recompute")
    the kept and offloaded values MUST_SAVE (insert_offloads moves the offloaded ones
    after partitioning) and every other node of the block MUST_RECOMPUTE; without, every
    node of the blocks MUST_RECOMPUTE (least memory: each block recomputed from its
    input). Each block is an AC region of its own (ac_graph_id), so the partitioner saves
    the boundary between two blocks, as it does for checkpointed blocks.

    Note [What min-cut keeps]
    min-cut honours MUST_SAVE only on a node it may ban from recomputing, and it never
    bans a view (a reshape, permute, slice, ...) or a getitem of a multi-output op: such
    a node tagged MUST_SAVE with its producer MUST_RECOMPUTE is recomputed all the same,
    its producer with it. At keep-all min-cut saves exactly such nodes (the q and k
    views an attention takes, the attention's output and logsumexp), so a plan that kept
    them kept nothing there: on the peers' tiny Llama at 85% of compiled keep-all, 21 of
    the 45 values the plan kept (10 MB) were recomputed, the attention with them, and
    the step peaked 9.8 MB under its prediction and ran 40% over its predicted time. So
    the tag of a view the plan keeps or offloads goes to the node that makes its storage
    (when that node is of the block and of the view's bytes: min-cut then saves it and
    rebuilds the view), and a getitem's to its multi-output producer, which min-cut then
    may not recompute, when the plan keeps or offloads all of that producer's saved
    outputs (one it recomputed would be saved too, unpriced: then all stay recomputed,
    as before, within the prediction); its other getitems are kept with it (min-cut
    can neither recompute them nor save the tuple: a graph of GPT-2's block 1 alone,
    after a graph break, saved a layer norm's rstd but not its mean, and failed to
    partition). insert_offloads then finds the offloaded ones
    among the saved values and offloads them. Offloaded views and getitems kept their
    own tags at first, and were recomputed instead of offloaded (priced as offloaded:
    slower than planned): moving their tags had made the first run of
    test_fit_compiled's wide Llama at 70% run 7% over its prediction (46.65 MB against
    43.49), the offloading plans' overshoot of Note [A compiled plan's first run] in
    _compiled_check.py, which was the blocks' temporaries priced 0 (Note [Backward temporaries of a compiled
    block] in _compiled_fit.py). With those read against the model, the same Llama at "70%"
    makes all four offloads its plan lists (three before) and peaks at 42.06 MB against
    46.13 predicted (41.99 with three).
    owners False: the tags stay where they were (for a CompiledState whose measuring step
    reads no segments, and so not the loss's bytes, Note [The loss under whole-model
    compile] in _compiled_fit.py, a plan that keeps what it says would be priced below its
    loss)."""
    from torch.utils.checkpoint import CheckpointPolicy

    keep: Set[str] = set()
    if actions is not None:
        by_name = {n.name: n for n in gm.graph.nodes}
        parents: Dict[fx.Node, bool] = {}  # multi-output producer -> all its outputs saved
        for b, values in saved.items():
            acts = actions[b] if b < len(actions) else []
            for j, v in enumerate(values):
                act = acts[j] if j < len(acts) else "keep"
                saves = act != "recompute"  # kept or offloaded: the partition saves it
                node = by_name.get(v.name)
                owner = _storage_owner(node) if owners and node is not None else None
                if (owner is not None and owner is not node
                        and cut.region.get(owner) == b
                        and owner not in cut.boundary and _val_bytes(owner) == v.nbytes):
                    if saves:
                        keep.add(owner.name)
                    node = owner
                if node is not None and _is_getitem(node):
                    parent = node.args[0]
                    assert isinstance(parent, fx.Node)  # _is_getitem
                    parents[parent] = parents.get(parent, True) and saves
                if saves:
                    keep.add(v.name)
        if owners:
            for p, all_kept in parents.items():
                if all_kept and cut.region.get(p) is not None:
                    # Its other outputs too: min-cut cannot recompute a getitem of a
                    # producer it may not recompute, nor save the producer's tuple.
                    keep.add(p.name)
                    keep.update(u.name for u in p.users if _is_getitem(u))
    for node, b in cut.region.items():
        node.meta["ac_graph_id"] = b + 1
        if node.name in keep:
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
        else:
            node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
    for node in cut.ticks.values():
        node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
        node.meta.pop("ac_graph_id", None)


def compiled_profile(layers: Sequence[Doc], *, device: Doc, link: Doc, host: Doc,
                     timing: str = "host-clock") -> Doc:
    """The stash.profile/1 of a compiled measuring step, fixed_bytes 0; timing: the
    clock's kind ("cuda-events" or "host-clock")."""
    from .. import profile as _profile
    return {"schema": _profile.SCHEMA, "source": "measured", "device": device,
            "link": dict(link), "host": host, "fixed_bytes": 0, "step_overhead_ms": 0.0,
            "layers": list(layers),
            "measurement": {"timing": timing, "passes": 1,
                            "cupti": {"used": False, "reason": "compiled step: the ticks "
                                      "time each block"},
                            "notes": ["fit: compiled measuring step (every block "
                                      "recomputed from its input)"]}}


def without_offload(layers: Iterable[Doc]) -> None:
    """Profile layers that may offload nothing: a value that may not be recomputed either
    is kept (Note [A compiled plan's first run] in _compiled_check.py, Note [A new shape
    across graphs] in _compiled_shapes.py)."""
    for layer in layers:
        for t in layer["tensors"]:
            t["offloadable"] = False
            t["must_keep"] = not t["recomputable"]


def least_memory(recomputable: Iterable[Iterable[bool]]) -> List[List[str]]:
    """Every recomputable value recomputed, the rest kept: the measuring step's partition
    (per block, each value's `recomputable`)."""
    return [["recompute" if r else "keep" for r in layer] for layer in recomputable]


def least_memory_actions(doc: Doc) -> List[List[str]]:
    """least_memory of a profile's layers."""
    return least_memory([t["recomputable"] for t in layer["tensors"]]
                        for layer in doc["layers"])


def calibrated_fixed_bytes(doc: Doc, measured_peak: int, counted: int, missing: int) -> int:
    """Note [Planning the compiled graph]: the measured peak less the canonical model's
    activation peak for least memory, plus the optimizer state that did not exist yet;
    at least what fit counts (parameters, gradients, buffers, optimizer state)."""
    from .._planner import evaluate
    from ._fit_support import _plan_doc
    probe = dict(doc, fixed_bytes=0)
    act = evaluate(probe, _plan_doc(probe, least_memory_actions(probe)), 1 << 62,
                   strict=False)["predicted_peak_bytes"]
    return int(max(measured_peak - int(act) + missing, counted))


def calibrated_loss_bytes(doc: Doc, head_peak: int) -> int:
    """Note [The loss under whole-model compile] in _compiled_fit.py: what the measuring step
    held from its start to the end tick's backward (absolute, the optimizer state missing
    then included) above the fixed bytes and the least-memory plan's kept activations."""
    kept = sum(int(t["bytes"]) for layer in doc["layers"] for t in layer["tensors"]
               if not t["recomputable"])
    return int(max(0, head_peak - int(doc["fixed_bytes"]) - kept))


def calibrated_temporaries(doc: Doc, segment_peaks: Sequence[Optional[int]]) -> List[int]:
    """Note [Backward temporaries of a compiled block] in _compiled_fit.py: each block's
    backward temporaries as the measured peak of its backward segment (absolute, the
    optimizer state missing then included) above what the model holds there for the
    least-memory plan (the fixed bytes, the kept activations of the blocks before it and
    its own recomputed ones); None (no reading) keeps the layer's own figure."""
    out, kept = [], 0
    for layer, peak in zip(doc["layers"], segment_peaks):
        saved = sum(int(t["bytes"]) for t in layer["tensors"])
        if peak is None:
            out.append(int(layer["bwd_temp_bytes"]))
        else:
            out.append(int(max(0, peak - int(doc["fixed_bytes"]) - kept - saved)))
        kept += sum(int(t["bytes"]) for t in layer["tensors"] if not t["recomputable"])
    return out


def plan_actions_of(plan: Doc) -> List[List[str]]:
    return [[str(t["action"]) for t in layer["tensors"]] for layer in plan["layers"]]
