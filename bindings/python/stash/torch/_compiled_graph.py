"""stash.torch's whole-model compile, the graph side: the registry of compiled states, the
tick ops that mark fit's blocks in a traced graph, the partitioner stash installs into
Inductor, and the blocks' wrapper that Dynamo traces (Note [Planning the compiled graph]
in _compiled.py, whose CompiledState these serve)."""

from __future__ import annotations

import secrets
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.fx as fx

from .._lib import StashError
from ._compile_plan import GraphBlocks, cut_blocks
from ._compiled_offload_pass import Offload, insert_offloads

if TYPE_CHECKING:
    from ._compiled import CompiledState

Shape = Tuple[int, ...]


def input_shape(cut: GraphBlocks) -> Shape:
    """The shape of block 0's input in a joint graph (its tick's input): the key of the
    graph's plan (Note [Every shape under whole-model compile] in _compiled_shapes.py).
    A graph after a break between blocks (Note [A graph break among the blocks] in
    _compile_plan.py) has no tick 0: its first block's input, which has that shape in
    the models fit plans (each block takes and returns the hidden state)."""
    tick = cut.ticks.get(0, cut.ticks[cut.blocks[0]] if cut.ticks else None)
    val = tick.args[0].meta.get("val") if tick is not None and isinstance(
        tick.args[0], fx.Node) else None
    return tuple(int(d) for d in val.shape) if isinstance(val, torch.Tensor) else ()


# A handle's id is random, not a count: it is a constant of the traced graph, and a graph
# with another process's ids must not be found in Inductor's and AOTAutograd's caches
# (which would skip stash's partitioner for it).
def _new_id() -> int:
    return secrets.randbits(52) + 1
_states: "weakref.WeakValueDictionary[int, CompiledState]" = weakref.WeakValueDictionary()
_lock = threading.Lock()


# --- the tick ops ------------------------------------------------------------------------

@torch.library.custom_op("stash::tick", mutates_args=())
def _tick(x: torch.Tensor, handle: int, block: int, serial: str) -> torch.Tensor:
    state = _states.get(handle)
    if state is not None:
        state.forward_tick(block, int(serial), x)
    return torch.zeros((), dtype=torch.float32, device=x.device)


@_tick.register_fake
def _tick_fake(x: torch.Tensor, handle: int, block: int, serial: str) -> torch.Tensor:
    # Runs as Python at trace time (Dynamo does not trace a fake kernel).
    state = _states.get(handle)
    if state is not None:
        state.was_traced()
    return torch.empty((), dtype=torch.float32, device=x.device)


@torch.library.custom_op("stash::tick_back", mutates_args=())
def _tick_back(g: torch.Tensor, handle: int, block: int) -> torch.Tensor:
    state = _states.get(handle)
    if state is not None:
        state.backward_tick(block)
    return torch.zeros((), dtype=g.dtype, device=g.device)


@_tick_back.register_fake
def _tick_back_fake(g: torch.Tensor, handle: int, block: int) -> torch.Tensor:
    return torch.empty((), dtype=g.dtype, device=g.device)


def _tick_setup(ctx: Any, inputs: Tuple[Any, ...], output: torch.Tensor) -> None:
    x, handle, block, _ = inputs
    ctx.handle, ctx.block = handle, block
    ctx.shape, ctx.dtype = x.shape, x.dtype


def _tick_backward(ctx: Any, g: torch.Tensor) -> Tuple[Any, ...]:
    # The backward tick is _Tick's (below): this gradient is a folded zero.
    return None, None, None, None


_tick.register_autograd(_tick_backward, setup_context=_tick_setup)


# The ticks are side effects, not values: torch 2.11's Inductor folded `t * 0` below to a
# constant and, the tick's output then unused, dropped the functional op as dead code, so
# on an H200 the forward ticks never ran and fit saw no step at all. Marked so, FX's and
# Inductor's dead-code elimination keep them whatever becomes of their output. (`x + t`
# kept them too, but made every block's backward reduce its whole gradient for t's.)
torch.fx.node.has_side_effect(torch.ops.stash.tick.default)
torch.fx.node.has_side_effect(torch.ops.stash.tick_back.default)


class _Tick(torch.autograd.Function):
    """x + 0 * tick(x); its backward runs stash::tick_back on the whole gradient of the
    block's input, so the backward tick runs once the block's backward has made it (Note
    [Planning the compiled graph])."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, handle: int, block: int,
                serial: str) -> torch.Tensor:
        ctx.handle, ctx.block = handle, block
        t: torch.Tensor = torch.ops.stash.tick(x, handle, block, serial)
        return x + t * 0

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Tuple[Any, ...]:
        torch.ops.stash.tick_back(g, ctx.handle, ctx.block)
        return g, None, None, None


def _ticked(x: torch.Tensor, handle: int, block: int, serial: str) -> torch.Tensor:
    return _Tick.apply(x, handle, block, serial)  # type: ignore[no-any-return]


# --- the partitioner -----------------------------------------------------------------------

def _min_cut() -> Callable[..., Tuple[fx.GraphModule, fx.GraphModule]]:
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    return min_cut_rematerialization_partition


def _partitioner_base() -> Optional[type]:
    try:
        from torch._inductor.custom_graph_pass import CustomPartitionerFn
    except ImportError:
        return None
    import torch._inductor.config as inductor_config
    if not hasattr(inductor_config, "custom_partitioner_fn"):
        return None
    return CustomPartitionerFn


class _Installed:
    """The one partitioner stash installs, shared by every open handle that saw a trace."""

    fn: Any = None
    users = 0


def _partition(gm: fx.GraphModule, joint_inputs: Sequence[Any],
               **kwargs: Any) -> Tuple[fx.GraphModule, fx.GraphModule]:
    """Note [Planning the compiled graph] in _compiled.py: graphs with a fit handle's ticks
    are tagged by its plan, then min-cut partitions them; others go to min-cut as they
    are."""
    partition = _min_cut()
    moves: List[Tuple[CompiledState, int, List[Offload], Shape]] = []
    for state in list(_states.values()):
        cut = cut_blocks(gm.graph, torch.ops.stash.tick.default, state.id, state.n)
        if cut is not None and cut.broken is not None:
            state.graph_broken(cut.broken)  # Note [A graph break among the blocks]
        elif cut is not None:
            serial, offloads = state.partitioning(gm, cut, joint_inputs, partition, kwargs)
            if offloads:
                moves.append((state, serial, offloads, input_shape(cut)))
    fw, bw = partition(gm, joint_inputs, **kwargs)
    for state, serial, offloads, shape in moves:
        # Note [Offload in the compiled graph] in _compiled_offload.py
        done = insert_offloads(fw, bw, offloads, state.id, state.n, torch.ops.stash)
        state.offloads_done(serial, shape, [(o.block, o.index) for o in done])
    return fw, bw


_BASE = _partitioner_base()
if _BASE is not None:
    class StashPartitioner(_BASE):  # type: ignore[misc, valid-type]
        """Inductor's custom partitioner: _partition. Module-level, so that Inductor can
        pickle it into its cache key (uuid None: the plan is not in that key, so Inductor
        does not cache these graphs)."""

        def __call__(self, gm: fx.GraphModule, joint_inputs: Sequence[Any],
                     **kwargs: Any) -> Tuple[fx.GraphModule, fx.GraphModule]:
            return _partition(gm, joint_inputs, **kwargs)

        def uuid(self) -> Optional[Any]:
            return None


def _make_partitioner() -> Any:
    return StashPartitioner() if _BASE is not None else None


def _install() -> Optional[str]:
    """Installs stash's partitioner; None, or why it cannot be."""
    with _lock:
        if _Installed.fn is None:
            fn = _make_partitioner()
            if fn is None:
                return (f"this torch ({torch.__version__}) has no "
                        "torch._inductor.config.custom_partitioner_fn")
            import torch._inductor.config as inductor_config
            current = inductor_config.custom_partitioner_fn
            if current is not None:
                return (f"another partitioner is installed "
                        f"(torch._inductor.config.custom_partitioner_fn = {current!r})")
            inductor_config.custom_partitioner_fn = fn
            _Installed.fn = fn
        _Installed.users += 1
        return None


def _uninstall() -> None:
    with _lock:
        if _Installed.fn is None:
            return
        _Installed.users -= 1
        if _Installed.users <= 0:
            import torch._inductor.config as inductor_config
            if inductor_config.custom_partitioner_fn is _Installed.fn:
                inductor_config.custom_partitioner_fn = None
            _Installed.fn = None
            _Installed.users = 0


# --- the blocks' wrapper ------------------------------------------------------------------

_WHAT_WORKS = ("compile each block instead (torch.compile(block) or block.compile(), "
               "Note [Compiled blocks] in stash/torch/_offload.py), or train eagerly")


def compiled_wrapper(state: Callable[[], CompiledState], i: int, forward: Callable[..., Any],
                     eager: Callable[..., Any]) -> Callable[..., Any]:
    """Block i's wrapper: `eager` (the hooks) when it runs, the compiled form (Note
    [Planning the compiled graph] in _compiled.py) when Dynamo traces it."""
    block = str(i)  # a string for Dynamo (CompiledState.trace_block)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            if not torch.is_grad_enabled():
                return forward(*args, **kwargs)
            return state().trace_block(block, forward, args, kwargs)
        s = state()
        if s.traced and torch.is_grad_enabled():
            if s.refusal is not None or s.error is not None:
                raise s.refused()
            limit = getattr(torch._dynamo.config, "recompile_limit", None)
            graphs = s.graphs_with.get(i, 0)
            if isinstance(limit, int) and graphs >= limit:
                # Note [Every shape under whole-model compile] in _compiled_shapes.py
                raise StashError(
                    f"stash.torch: torch.compile made {graphs} graphs of this model, its "
                    f"recompile limit (torch._dynamo.config.recompile_limit = {limit}), and "
                    f"now runs block {i} eagerly; under whole-model compile stash plans "
                    f"each input shape's own graph, so each new shape is a compile: raise "
                    f"the limit, pad the inputs to a few lengths, or {_WHAT_WORKS}")
            raise StashError(
                f"stash.torch: block {i} runs eagerly inside a model torch.compile traced "
                "(Dynamo fell back on part of it, so the blocks' inner frames are compiled "
                f"inside stash's hooks); stash cannot plan that; {_WHAT_WORKS}")
        return eager(*args, **kwargs)
    # Note [A graph break among the blocks] in _compile_plan.py: a code object per block,
    # so that Dynamo's cache and recompile limit, which are per code object, are per block.
    wrapped.__code__ = wrapped.__code__.replace(co_name=f"stash_block_{i}")
    setattr(wrapped, "__wrapped__", forward)
    setattr(wrapped, "_stash_wrapped", True)
    return wrapped
