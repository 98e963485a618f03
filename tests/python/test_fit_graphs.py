"""stash.torch.fit under a CUDA graph capture, on the CPU test double (Note [Steps under CUDA
graphs] in stash/torch/_offload_hooks.py).

None of torch's CUDA-graph API runs on the CPU, so the test plays torch.cuda.graph's part
through the double: it begins a capture of the stream the engine uses as compute (the
hooks' own on the CPU), runs a planned fit step, ends the capture and replays the graph.
torch's CPU ops run for real during the capture and are not in the graph; the engine's
copies are the graph's nodes. torch's graph pool keeps a captured step's memory for the
graph's life; here the test keeps the storages the engine copied from and into alive
instead (a CPU allocator would reuse them at once)."""

import ctypes

import pytest
import torch
import torch.nn as nn

import stash
import stash.torch
from models import Block, decoder
from offload_helpers import B, D, FF, T, _violations

transformers = pytest.importorskip("transformers")

LINK = {"h2d_gbps": 20.0, "d2h_gbps": 20.0, "bidir_gbps": 32.0}
VOCAB = 256
MEMCPY_NODE = 1  # cudaGraphNodeTypeMemcpy


def llama(seed=0, layers=3, hidden=256):
    m = decoder("llama", seed, layers=layers, hidden=hidden, vocab=VOCAB, positions=512)
    return m, m.model.layers


class Runtime:
    """The double's capture and graph calls, from the libcudart libstash runs on."""

    def __init__(self):
        lib = stash._lib.cudart()
        P, I = ctypes.c_void_p, ctypes.c_int
        for name, args in {
                "cudaStreamBeginCapture": [P, I],
                "cudaStreamEndCapture": [P, ctypes.POINTER(P)],
                "cudaStreamIsCapturing": [P, ctypes.POINTER(I)],
                "cudaGraphInstantiate": [ctypes.POINTER(P), P, ctypes.c_ulonglong],
                "cudaGraphLaunch": [P, P],
                "cudaGraphGetNodes": [P, ctypes.POINTER(P), ctypes.POINTER(ctypes.c_size_t)],
                "cudaGraphNodeGetType": [P, ctypes.POINTER(I)],
                "cudaGraphExecDestroy": [P],
                "cudaGraphDestroy": [P],
                "cudaStreamSynchronize": [P]}.items():
            getattr(lib, name).argtypes = args
            getattr(lib, name).restype = I
        self.lib = lib

    def begin(self, s):
        assert self.lib.cudaStreamBeginCapture(s, 0) == 0  # cudaStreamCaptureModeGlobal

    def status(self, s):
        st = ctypes.c_int()
        assert self.lib.cudaStreamIsCapturing(s, ctypes.byref(st)) == 0
        return {0: "none", 1: "active", 2: "invalidated"}[st.value]

    def end(self, s):
        """(cudaError of the end, the graph or None)."""
        g = ctypes.c_void_p()
        err = self.lib.cudaStreamEndCapture(s, ctypes.byref(g))
        return err, g if err == 0 else None

    def node_types(self, g):
        n = ctypes.c_size_t()
        assert self.lib.cudaGraphGetNodes(g, None, ctypes.byref(n)) == 0
        nodes = (ctypes.c_void_p * max(1, n.value))()
        assert self.lib.cudaGraphGetNodes(g, nodes, ctypes.byref(n)) == 0
        types = []
        for i in range(n.value):
            t = ctypes.c_int()
            assert self.lib.cudaGraphNodeGetType(nodes[i], ctypes.byref(t)) == 0
            types.append(t.value)
        return types

    def instantiate(self, g):
        e = ctypes.c_void_p()
        assert self.lib.cudaGraphInstantiate(ctypes.byref(e), g, 0) == 0
        return e

    def launch(self, e, s):
        assert self.lib.cudaGraphLaunch(e, s) == 0
        assert self.lib.cudaStreamSynchronize(s) == 0


class Copies:
    """What the engine copies in a step, by key: the source storage it was handed (a uint8
    view that keeps it alive, as the graph's pool would), and the prefetch buffer it
    filled. Recorded through the handle's seams, without changing what they do."""

    def __init__(self, h):
        self.sources, self.buffers = {}, {}
        self._allocated = {}
        streams = h._streams
        hand_over, acquire = streams.hand_over, h.engine.acquire
        allocated = self._allocated

        class Buffers(dict):
            def __setitem__(self, ptr, buf):
                allocated[ptr] = buf
                super().__setitem__(ptr, buf)

        def recording_hand_over(step, key, ptr, nbytes, source):
            if source is not None:
                flat = torch.empty(0, dtype=torch.uint8).set_(source.untyped_storage())
                self.sources[key] = flat[:nbytes]
            return hand_over(step, key, ptr, nbytes, source)

        def recording_acquire(key, consumer):
            ptr = acquire(key, consumer)
            self.buffers[tuple(key)] = ptr
            return ptr

        streams._buffers = Buffers(streams._buffers)
        streams.hand_over = recording_hand_over
        h.engine.acquire = recording_acquire

    def clear(self):
        self.sources.clear()
        self.buffers.clear()
        self._allocated.clear()

    def buffer(self, key):
        return self._allocated[self.buffers[key]][:self.sources[key].numel()]


def step(model, ids):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return loss.detach()


@pytest.fixture
def planned():
    """A Llama under fit, its measuring step and one planned step run eagerly (no
    optimizer: the parameters stay as they are, so every step saves the same bytes)."""
    model, blocks = llama()
    ids = torch.randint(0, VOCAB, (4, 256), generator=torch.Generator().manual_seed(1))
    h = stash.torch.fit(blocks, "70%", link=LINK)
    copies = Copies(h._offload)  # the handle's hooks and streams
    step(model, ids)
    # One planned step, eager. On a loaded machine the double's copies finish late, the
    # planned step can peak over its prediction and fit measures again (its first-run
    # check): step until a plan stands (the copies recorded are the last step's).
    for _ in range(6):
        copies.clear()
        step(model, ids)
        if h.plan is not None:
            break
    assert h.plan is not None, h.report()["steps"]
    offloads = sum(t["action"] == "offload" for layer in h.plan["layers"]
                   for t in layer["tensors"])
    assert offloads > 0, "the plan must offload for this test to mean anything"
    yield model, ids, h, copies
    h.close()


def test_a_captured_planned_step_replays_the_eager_steps_copies_bitwise(planned):
    model, ids, h, copies = planned
    ran = [r["mode"] for r in h.report()["steps"]]  # the fixture's eager steps
    assert ran[0] == "measure" and ran[-1] == "plan", ran
    rt = Runtime()
    eager = {k: v.clone() for k, v in copies.sources.items()}
    eager_fetched = {k: copies.buffer(k).clone() for k in copies.buffers}
    assert eager and all(torch.equal(eager[k], eager_fetched[k]) for k in eager)
    copies.clear()
    before = h.stats()
    _violations()

    s = h._offload._streams.stream
    rt.begin(s)
    step(model, ids)
    assert rt.status(s) == "active", "no stash call may invalidate the capture"
    during = h.stats()
    err, g = rt.end(s)
    assert err == 0, f"cudaStreamEndCapture: {err} (an unjoined fork or an invalidation)"
    graph = rt.instantiate(g)
    try:
        n = during["offloaded_count"] - before["offloaded_count"]
        assert n == len(eager) and during["prefetched_count"] - before["prefetched_count"] == n
        # The graph is the engine's copies, one D2H and one H2D per offloaded tensor (torch's
        # CPU ops are not captured).
        assert rt.node_types(g) == [MEMCPY_NODE] * (2 * n)
        # Nothing of the capture ran: the buffers hold no copy yet.
        assert set(copies.sources) == set(eager)
        for k in eager:
            assert torch.equal(copies.sources[k], eager[k]), k  # the same forward
            copies.buffer(k).zero_()
        rt.launch(graph, s)
        for k in eager:
            assert torch.equal(copies.buffer(k), eager[k]), f"replay moved other bytes: {k}"
        # A second replay copies what the sources hold then, as a replayed forward wrote it.
        fresh = {}
        for k, src in copies.sources.items():
            src.copy_(torch.randint(0, 256, src.shape, dtype=torch.uint8))
            fresh[k] = src.clone()
            copies.buffer(k).zero_()
        rt.launch(graph, s)
        for k in fresh:
            assert torch.equal(copies.buffer(k), fresh[k]), k
        assert _violations() == []

        # The graph's pinned slots stay held until released; then everything is back.
        nbytes = sum(v.numel() for v in eager.values())
        assert h.stats()["pinned"]["current_bytes"] >= nbytes
        assert h.release_graphs() == nbytes
        assert h.stats()["pinned"]["current_bytes"] == 0
        assert h.stats()["failed_count"] == 0
    finally:
        rt.lib.cudaGraphExecDestroy(graph)
        rt.lib.cudaGraphDestroy(g)
    # Eager again: the captured step is no step of the report; the eager ones are.
    copies.clear()
    step(model, ids)
    assert {k: v for k, v in copies.sources.items()}.keys() == eager.keys()
    assert all(torch.equal(copies.sources[k], eager[k]) for k in eager)
    assert [r["mode"] for r in h.report()["steps"]] == ran + ["plan"]


def test_a_measuring_step_under_capture_is_refused_and_the_capture_stays_valid():
    model, blocks = llama(layers=2)
    ids = torch.randint(0, VOCAB, (4, 256), generator=torch.Generator().manual_seed(1))
    rt = Runtime()
    with stash.torch.fit(blocks, "70%", link=LINK) as h:
        for eager_steps in (0, 1):  # the first step, then the one after the measuring step
            for _ in range(eager_steps):
                step(model, ids)
            s = h._offload._streams.stream
            rt.begin(s)
            with pytest.raises(stash.StashError, match="eagerly") as e:
                step(model, ids)
            assert "CUDA graph" in str(e.value) and "measur" in str(e.value)
            assert rt.status(s) == "active"
            err, g = rt.end(s)
            assert err == 0
            assert rt.node_types(g) == []
            rt.lib.cudaGraphDestroy(g)
        step(model, ids)  # eager again: the planned step runs
        assert [r["mode"] for r in h.report()["steps"]] == ["measure", "plan"]


def test_a_block_run_on_its_own_names_make_graphed_callables():
    # torch.cuda.make_graphed_callables warms up and captures each block alone.
    torch.manual_seed(0)
    blocks = nn.ModuleList([Block(D, 2, FF) for _ in range(3)])
    x = torch.randn(B, T, D)
    with stash.torch.offload(blocks, [["offload"] * 14] * 3):
        with pytest.raises(stash.StashError, match="make_graphed_callables"):
            blocks[1](x)
