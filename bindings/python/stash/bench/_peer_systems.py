"""The memory-saving systems `python -m stash.bench.peers` compares, as PyTorch users run
them, each applied to a freshly built model.

A system is a name, a label, and start(model, optimizer, device) -> Session. A Session says
what wraps the model's forward (forward(): a context manager; the backward runs outside it,
as in torchtune's recipes), and close() undoes nothing but what it holds: every run builds
its own model, so no system has to restore one. start() raises when a system cannot run
here (not installed, a torch without the feature, needs CUDA); the harness turns that into
the row's reason (Note [Rows that say why] in peers.py).

Note [Selective checkpointing, torchtitan's op policy]
torchtitan's "selective op" activation checkpointing keeps the outputs of the compute-heavy
ops on its save list (aten.mm and the fused SDPA kernels) and recomputes everything else in
the layer, except that every second mm of a layer's forward is recomputed too (its counter
per forward and per recompute, so both count the same mms). We reproduce that policy
through torch's own create_selective_checkpoint_contexts, one checkpoint per decoder layer,
non-reentrant. On the CPU, SDPA runs as aten._scaled_dot_product_flash_attention_for_cpu,
which torchtitan's CUDA-only list does not name; it is on our list so that the CPU run keeps
attention as the GPU run does. Ops a torch does not have are left out of the list.

Note [A compile backend per system]
Dynamo keeps one cache of compiled graphs per code object, not per model: two models of
one class compiled in one process run the same graph for their layers, the one compiled
first (a tiny Llama at memory budget 0.3 and a second one meant for 1.0 both saved 16.4
MB a step, the 0.3 partition). Its guards do check the backend that compiled a graph. So
every compiled system compiles through a backend of its own, inductor under the system's
partitioner settings (the min-cut memory budget, bound to that backend instead of set in
torch's global config while the system runs): systems trained side by side (Note [Ratios
from interleaved steps] in peers.py) each run their own graphs, partitioned as their
row says (the same two models: 16.4 and 34.3 MB saved).

Note [torch's own offloading pass]
torch (2.15 here) has an activation offloading pass of its own in the partitioner
(torch._functorch._activation_offloading, behind functorch's enable_activation_offloading):
after min-cut's partition it moves every saved value whose node is marked
"should_offload" to the CPU in the forward graph and back in the backward, on a transfer
stream with the forward's waits sunk and the backward's reloads prefetched (the
activation_offload_* options), and skips what it cannot move (views, getitems,
non-contiguous values, the model's outputs). Nothing in torch marks nodes; torchtitan's
graph passes do, by policy. The compile-offload row marks every node of the joint graph
(an inductor joint_custom_post_pass), so the pass offloads all it can: torch's answer to
"offload the activations" under whole-model compile, against which stash's row at the
same peak plans what to offload, recompute or keep. On the CPU it does not run: its
"host" copy is another CPU tensor the meter counts (as save_on_cpu's is), and its
streams are CUDA's.
"""

from __future__ import annotations

import collections
import contextlib
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Dict, List, Optional, Tuple, Union

if TYPE_CHECKING:  # for the hints only: torch is imported when a system starts
    import torch
    from torch.utils.checkpoint import CheckpointPolicy
    from transformers import LlamaForCausalLM

    from ..torch._fit import BudgetHandle
    from ._llama import Device

# torch.utils.checkpoint's context_fn: the forward's and the recompute's contexts.
ContextFn = Callable[[], Tuple[ContextManager[Any], ContextManager[Any]]]


def _backend(memory_budget: Optional[float] = None, offload: Optional[str] = None
             ) -> Callable[..., Any]:
    """Note [A compile backend per system]: inductor, a function of this system's own, with
    torch.compile's activation memory budget (min-cut's knapsack) when one is given, and
    with torch's activation offloading pass when `offload` is "streams" (on CUDA) or
    "sync" (device_put in the graph's own order; Note [torch's own offloading pass])."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    patches: Dict[str, Any] = {}
    inductor: Dict[str, Any] = {}
    if memory_budget is not None:
        patches["activation_memory_budget"] = memory_budget
    if offload is not None:
        streams = offload == "streams"
        patches.update(enable_activation_offloading=True,
                       activation_offload_separate_stream=streams,
                       activation_offload_sink_wait=streams,
                       activation_reload_prefetch=streams)
        inductor["joint_custom_post_pass"] = _offload_every_saved_value

    def backend(gm: Any, example_inputs: Any) -> Any:
        with functorch_config.patch(**patches), inductor_config.patch(**inductor):
            return compile_fx(gm, example_inputs)

    return backend


def _offload_every_saved_value(graph: Any) -> None:
    """Note [torch's own offloading pass]: every node of the joint graph asked for offload;
    the pass moves those the partition saves and it can move."""
    for node in graph.nodes:
        if node.op == "call_function":
            node.meta["should_offload"] = True


class Session:
    """One system applied to one model: forward() wraps each step's forward."""

    def forward(self) -> ContextManager[Any]:
        return contextlib.nullcontext()

    def close(self) -> None:
        pass

    def stash_report(self) -> Optional[Dict[str, Any]]:
        """stash.torch.fit's report; None for the other systems."""
        return None


class System:
    """A row of the comparison. kind groups the rows into one marker style in the plot."""

    def __init__(self, name: str, label: str, kind: str, compiled: bool = False,
                 budget: Optional[Union[int, str]] = None,
                 reference: Optional[str] = None) -> None:
        self.name = name
        self.label = label
        self.kind = kind
        self.compiled = compiled
        self.budget = budget          # stash only: bytes or "70%"
        self.reference = reference    # stash only: the row whose peak is the budget

    def start(self, model: LlamaForCausalLM, optimizer: torch.optim.Optimizer,
              device: Device) -> Session:
        return Session()

    def describe(self) -> Dict[str, Any]:
        return {"name": self.name, "label": self.label, "kind": self.kind,
                "compiled": self.compiled, "budget": self.budget, "reference": self.reference}


def decoder_layers(model: LlamaForCausalLM) -> torch.nn.ModuleList:
    """A Hugging Face causal LM's repeated decoder layers (Llama: model.model.layers)."""
    layers: torch.nn.ModuleList = model.model.layers
    return layers


def _checkpoint_each_layer(model: LlamaForCausalLM, context_fn: Optional[ContextFn] = None
                           ) -> None:
    """torch.utils.checkpoint around every decoder layer, non-reentrant."""
    from torch.utils.checkpoint import checkpoint

    extra: Dict[str, Any] = {} if context_fn is None else {"context_fn": context_fn}
    for layer in decoder_layers(model):
        def forward(*args: Any, _inner: Callable[..., Any] = layer.forward,
                    **kwargs: Any) -> Any:
            return checkpoint(_inner, *args, use_reentrant=False, **extra, **kwargs)
        layer.forward = forward


class KeepAll(System):
    def __init__(self) -> None:
        super().__init__("keep-all", "keep-all", "keep-all")


class FullCheckpoint(System):
    def __init__(self) -> None:
        super().__init__("full-ac", "full activation checkpointing", "full-ac")

    def start(self, model: LlamaForCausalLM, optimizer: torch.optim.Optimizer,
              device: Device) -> Session:
        _checkpoint_each_layer(model)
        return Session()


def sac_save_list() -> List[Any]:
    """The ops whose outputs torchtitan's op policy saves, those this torch has (Note
    [Selective checkpointing, torchtitan's op policy])."""
    import torch

    names = [("aten", "mm"), ("aten", "_scaled_dot_product_efficient_attention"),
             ("aten", "_scaled_dot_product_flash_attention"),
             ("aten", "_scaled_dot_product_cudnn_attention"),
             ("aten", "_scaled_dot_product_flash_attention_for_cpu"),
             ("_c10d_functional", "reduce_scatter_tensor")]
    ops = []
    for ns, name in names:
        packet = getattr(getattr(torch.ops, ns), name, None)
        if packet is not None and hasattr(packet, "default"):
            ops.append(packet.default)
    return ops


def sac_policy() -> Callable[..., CheckpointPolicy]:
    """A fresh policy (its mm counters new) for one checkpointed call."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    save = set(sac_save_list())
    mm = torch.ops.aten.mm.default
    counts: Dict[str, int] = collections.defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == mm:
            counts[mode] += 1
        keep = func in save and not (func == mm and counts[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


class SelectiveCheckpoint(System):
    def __init__(self) -> None:
        super().__init__("sac", "selective activation checkpointing (op)", "sac")

    def start(self, model: LlamaForCausalLM, optimizer: torch.optim.Optimizer,
              device: Device) -> Session:
        try:
            from torch.utils.checkpoint import create_selective_checkpoint_contexts
        except ImportError as e:
            raise RuntimeError("this torch has no create_selective_checkpoint_contexts "
                               "(torch >= 2.4)") from e
        _checkpoint_each_layer(
            model, lambda: create_selective_checkpoint_contexts(  # type: ignore[no-untyped-call]
                sac_policy()))
        return Session()


class _ContextSession(Session):
    def __init__(self, make: Callable[[], ContextManager[Any]]) -> None:
        self._make = make

    def forward(self) -> ContextManager[Any]:
        return self._make()


class SaveOnCpu(System):
    def __init__(self) -> None:
        super().__init__("save_on_cpu", "save_on_cpu (pinned)", "save_on_cpu")

    def start(self, model: LlamaForCausalLM, optimizer: torch.optim.Optimizer,
              device: Device) -> Session:
        import torch

        # Without a CUDA device torch's save_on_cpu copies into unpinned host memory: on the
        # CPU every saved tensor is copied into another CPU tensor.
        return _ContextSession(lambda: torch.autograd.graph.save_on_cpu(pin_memory=True))


class TorchtuneOffload(System):
    def __init__(self) -> None:
        super().__init__("torchtune", "torchtune OffloadActivations (streams)", "torchtune")

    def start(self, model: LlamaForCausalLM, optimizer: torch.optim.Optimizer,
              device: Device) -> Session:
        try:
            from torchtune.training import OffloadActivations
        except Exception as e:  # not installed, or its imports fail on this torch
            raise RuntimeError(f"torchtune is not importable here: {type(e).__name__}: {e}") \
                from e
        import torch

        # One context for the run, entered around every forward, as torchtune's recipes do.
        try:
            ctx = OffloadActivations(use_streams=True)
        except RuntimeError as e:
            if torch.device(device).type == "cuda":
                raise
            raise RuntimeError("OffloadActivations needs CUDA (its constructor takes "
                               f"torch.cuda.default_stream()): {e}") from e
        return _ContextSession(lambda: ctx)


class CompileBudget(System):
    """Per-layer torch.compile with the min-cut partitioner's activation memory budget."""

    def __init__(self, budget: float) -> None:
        super().__init__(f"compile-{budget:g}", f"torch.compile, memory budget {budget:g}",
                         "compile", compiled=True)
        self.memory_budget = budget

    def start(self, model: LlamaForCausalLM, optimizer: torch.optim.Optimizer,
              device: Device) -> Session:
        import torch
        import torch._dynamo
        import torch._functorch.config as functorch_config

        if not hasattr(functorch_config, "activation_memory_budget"):
            raise RuntimeError("this torch has no activation_memory_budget (torch >= 2.4)")
        torch._dynamo.reset()
        backend = _backend(self.memory_budget)
        for layer in decoder_layers(model):
            layer.compile(backend=backend)
        return _reset_on_close(Session())


class CompileOffload(System):
    """The whole model compiled with torch's own activation offloading pass (Note [torch's
    own offloading pass]); CUDA only."""

    def __init__(self) -> None:
        super().__init__("compile-offload", "torch.compile, torch's activation offloading",
                         "compile-offload", compiled=True)

    def start(self, model: LlamaForCausalLM, optimizer: torch.optim.Optimizer,
              device: Device) -> Session:
        import torch
        import torch._dynamo
        import torch._functorch.config as functorch_config

        if not hasattr(functorch_config, "enable_activation_offloading") or not hasattr(
                functorch_config, "activation_offload_separate_stream"):
            raise RuntimeError("this torch has no activation offloading pass "
                               "(torch._functorch._activation_offloading)")
        if torch.device(device).type != "cuda":
            raise RuntimeError("torch's activation offloading pass needs CUDA: on the CPU "
                               "its copy to host memory is a second CPU tensor, its streams "
                               "CUDA streams")
        torch._dynamo.reset()
        model.compile(backend=_backend(offload="streams"))
        return _reset_on_close(Session())


class CompileWhole(System):
    """The whole model under torch.compile (model.compile()) at torch's default
    partitioner: what the compiled model saves without a memory budget, the reference of
    stash's rows under whole-model compile."""

    def __init__(self) -> None:
        super().__init__("compile-whole", "torch.compile of the whole model", "compile",
                         compiled=True)

    def start(self, model: LlamaForCausalLM, optimizer: torch.optim.Optimizer,
              device: Device) -> Session:
        return _whole(model, Session())


def _whole(model: LlamaForCausalLM, session: Session) -> Session:
    """The model compiled whole, anew, for `session`'s life."""
    import torch._dynamo

    torch._dynamo.reset()
    model.compile(backend=_backend())
    return _reset_on_close(session)


def _reset_on_close(session: Session) -> Session:
    """`session`, whose close() also drops Dynamo's compiled graphs."""
    import torch._dynamo

    close = session.close

    def closed() -> None:
        close()
        torch._dynamo.reset()

    session.close = closed  # type: ignore[method-assign]
    return session


class _FitSession(Session):
    def __init__(self, handle: BudgetHandle) -> None:
        self.handle = handle
        self._report: Optional[Dict[str, Any]] = None

    def close(self) -> None:
        if self._report is None:
            self._report = self.handle.report()
        self.handle.close()

    def stash_report(self) -> Dict[str, Any]:
        if self._report is None:
            self._report = self.handle.report()
        return self._report


class StashFit(System):
    """stash.torch.fit over the decoder layers at a budget: bytes (a peer's measured peak,
    or a share of keep-all's) or fit's own budget text."""

    budget: Union[int, str]

    def __init__(self, budget: Union[int, str], label: str, reference: Optional[str] = None,
                 link: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(f"stash@{reference or budget}", label, "stash", budget=budget,
                         reference=reference)
        self.link = link

    def start(self, model: LlamaForCausalLM, optimizer: torch.optim.Optimizer,
              device: Device) -> Session:
        import stash.torch

        handle = stash.torch.fit(decoder_layers(model), self.budget, optimizer=optimizer,
                                 link=self.link)
        return _FitSession(handle)


class StashCompiled(StashFit):
    """stash.torch.fit over decoder layers each compiled with torch.compile (the form the
    compile-B rows take, at torch's default partitioner), at a compile-B row's peak:
    stash's plan against the min-cut knapsack's at the same memory, both compiled."""

    def __init__(self, budget: Union[int, str], label: str, reference: str,
                 link: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(budget, label, reference=reference, link=link)
        self.name = f"stash+compile@{reference}"
        self.compiled = True

    def start(self, model: LlamaForCausalLM, optimizer: torch.optim.Optimizer,
              device: Device) -> Session:
        import torch._dynamo

        torch._dynamo.reset()
        backend = _backend()
        for layer in decoder_layers(model):
            layer.compile(backend=backend)
        return _reset_on_close(super().start(model, optimizer, device))


class StashWhole(StashFit):
    """stash.torch.fit over the decoder layers of a model compiled whole (fit entered,
    then model.compile()): stash plans the compiled graph's saved values (Note [Planning
    the compiled graph] in stash/torch/_compiled.py), at a compile row's peak or a share of
    compile-whole's."""

    def __init__(self, budget: Union[int, str], label: str, reference: str, name: str,
                 link: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(budget, label, reference=reference, link=link)
        self.name = name
        self.compiled = True

    def start(self, model: LlamaForCausalLM, optimizer: torch.optim.Optimizer,
              device: Device) -> Session:
        # fit first; _whole drops every compiled graph before the model's first trace.
        return _whole(model, super().start(model, optimizer, device))


def peer_systems(compile_budgets: List[float]) -> List[System]:
    """Every peer in the order the table lists them, keep-all first."""
    return ([KeepAll(), FullCheckpoint(), SelectiveCheckpoint(), SaveOnCpu(),
             TorchtuneOffload()] + [CompileBudget(b) for b in compile_budgets]
            + [CompileWhole(), CompileOffload()])


def stash_systems(results: List[Dict[str, Any]], shares: List[float],
                  link: Optional[Dict[str, Any]] = None,
                  gib: float = float(1 << 30)) -> List[System]:
    """stash's rows: one at each peer's measured peak (peers that ran; at a compile-B row's
    also one with the layers compiled, StashCompiled, and one with the model compiled
    whole, StashWhole), then at each share of keep-all's measured peak, and under
    whole-model compile at each share of compile-whole's. A peer that did not run gives no
    budget; its own row says why. Budgets are whole bytes of the same meter the peers were
    measured with."""
    keep = next((r for r in results if r["kind"] == "keep-all" and r["status"] == "ok"), None)
    out: List[System] = []
    for r in results:
        # keep-all's own peak too: what stash costs where nothing needs to move.
        if r["kind"] == "stash" or r["status"] != "ok" or not r["peak_bytes"]:
            continue
        b = int(r["peak_bytes"])
        out.append(StashFit(b, f"stash at {r['name']}'s peak ({b / gib:.2f} GiB)",
                            reference=r["name"], link=link))
        if r["kind"] == "compile-offload":  # stash's compiled offload against torch's
            out.append(StashWhole(b, f"stash, model compiled whole, at {r['name']}'s "
                                     f"peak ({b / gib:.2f} GiB)", reference=r["name"],
                                  name=f"stash+whole@{r['name']}", link=link))
        if r["kind"] == "compile" and r["name"] != "compile-whole":
            out.append(StashCompiled(b, f"stash, layers compiled, at {r['name']}'s peak "
                                        f"({b / gib:.2f} GiB)", reference=r["name"],
                                     link=link))
            out.append(StashWhole(b, f"stash, model compiled whole, at {r['name']}'s "
                                     f"peak ({b / gib:.2f} GiB)", reference=r["name"],
                                  name=f"stash+whole@{r['name']}", link=link))
    if keep is not None and keep["peak_bytes"]:
        for s in shares:
            b = int(round(keep["peak_bytes"] * s / 100.0))
            out.append(StashFit(b, f"stash at {s:g}% of keep-all ({b / gib:.2f} GiB)",
                                reference=f"{s:g}%", link=link))
    whole = next((r for r in results if r["name"] == "compile-whole" and r["status"] == "ok"
                  and r["peak_bytes"]), None)
    if whole is not None:
        for s in shares:
            b = int(round(whole["peak_bytes"] * s / 100.0))
            out.append(StashWhole(b, f"stash, model compiled whole, at {s:g}% of "
                                     f"compile-whole ({b / gib:.2f} GiB)",
                                  reference=f"{s:g}% of compile-whole",
                                  name=f"stash+whole@{s:g}%", link=link))
    return out


def system_by_name(systems: List[System], names: Optional[List[str]]) -> List[System]:
    """The systems whose name is in names (all when names is None), in their order."""
    if not names:
        return systems
    known = {s.name for s in systems}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown system(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(known))}")
    return [s for s in systems if s.name in names]

