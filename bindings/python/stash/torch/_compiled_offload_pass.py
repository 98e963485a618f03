"""The graph pass of offload under whole-model torch.compile: it rewrites a partitioned
forward and backward so that each value a plan offloads leaves the forward through
stash::offload and comes back through stash::fetch (Note [Offload in the compiled graph]
in _compiled_offload.py, whose ops and engine calls these are). Functions of fx graphs;
no handle state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

import torch
import torch.fx as fx

from ._compile_plan import _is_tick

__all__ = ["Offload", "insert_offloads"]


@dataclass
class Offload:
    """One saved value a plan offloads: its node's name in the joint graph, its block and
    its index among the block's saved values."""

    name: str
    block: int
    index: int


def _tick_nodes(graph: fx.Graph, tick: Any, handle_id: int) -> Dict[int, fx.Node]:
    return {int(n.args[2]): n for n in graph.nodes
            if _is_tick(n, tick) and n.args[1] == handle_id}


def insert_offloads(fw: fx.GraphModule, bw: fx.GraphModule, offloads: Sequence[Offload],
                    handle_id: int, n_blocks: int, ops: Any) -> List[Offload]:
    """Note [Offload in the compiled graph] in _compiled_offload.py: rewrites a partitioned pair so
    that each offloaded value leaves the forward as a token and comes back in backward
    through stash::fetch. ops: the namespace of stash's ops (torch.ops.stash). Returns the
    offloads done (a value the forward does not return, or returns as a model output, is
    kept)."""
    out_node = fw.graph.find_nodes(op="output")[0]
    outputs = list(out_node.args[0])
    by_name = {n.name: n for n in outputs if isinstance(n, fx.Node)}
    first_saved = len(outputs) - sum(1 for n in bw.graph.nodes if n.op == "placeholder"
                                     and not n.name.startswith("tangents"))
    ticks = _tick_nodes(fw.graph, ops.tick.default, handle_id)
    placeholders = {n.name: n for n in bw.graph.nodes if n.op == "placeholder"}
    bw_order = {n: i for i, n in enumerate(bw.graph.nodes)}
    order = {n: i for i, n in enumerate(fw.graph.nodes)}
    done: List[Offload] = []
    for o in offloads:
        node = by_name.get(o.name)
        if (node is None or o.name not in placeholders
                or any(outputs[i] is node for i in range(first_saved))):
            continue
        after = ticks.get(o.block + 2, ticks.get(n_blocks))
        if after is None:
            continue
        val = node.meta["val"]
        # The copy starts right after the value is made; the settle waits for block
        # b+2's tick, where the engine has made the compute stream wait for block b's
        # copies, and holds the value in the graph until then.
        with fw.graph.inserting_after(node):
            token = fw.graph.call_function(
                ops.offload.default, (node, handle_id, o.block, o.index))
        token.meta["val"] = torch.empty((), dtype=torch.uint8, device=val.device)
        # A tick before the value (not seen): settled at once, which the run-time guard
        # makes safe (CompiledMoves.settle).
        anchor = after if order[after] > order[node] else token
        with fw.graph.inserting_after(anchor):
            settled = fw.graph.call_function(
                ops.offloaded.default, (token, node, after, handle_id, o.block, o.index),
                name=f"stash_offloaded_{o.name}")
        settled.meta["val"] = token.meta["val"]
        outputs = [settled if x is node else x for x in outputs]
        old = placeholders[o.name]
        with bw.graph.inserting_after(old):
            new = bw.graph.placeholder(settled.name)
        new.meta["val"] = settled.meta["val"]
        users = list(old.users)
        first = min(users, key=lambda u: bw_order[u]) if users else None
        with bw.graph.inserting_before(first) if first is not None else \
                bw.graph.inserting_after(new):
            fetched = bw.graph.call_function(
                ops.fetch.default, (new, handle_id, o.block, o.index, list(val.shape),
                                    list(val.stride()), val.dtype))
        fetched.meta["val"] = val
        old.replace_all_uses_with(fetched)
        bw.graph.erase_node(old)
        done.append(o)
    out_node.update_arg(0, tuple(outputs))
    fw.graph.lint()
    bw.graph.lint()
    fw.recompile()
    bw.recompile()
    return done
