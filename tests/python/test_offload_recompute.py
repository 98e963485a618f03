"""stash.torch.offload's selective recompute (Note [Selective recompute] in
stash/torch/_offload_replay.py) on torch's CPU build and the test double, as
test_offload.py."""

import ctypes
import threading
import warnings
import weakref

import pytest
import torch
import torch.nn as nn

import stash
import stash.torch
from stash.torch._recompute import Placeholder
from models import DropoutMLP, Gated, Masked, Unsteady
from offload_helpers import (B, D, FF, N_SAVED, T, _assert_bitwise, _batches, _loss, _model,
                             _two_micro_batches,
                             _plan, _train, _violations)


def _count(plan, action):
    return sum(a == action for layer in plan for a in layer)


def _assert_recompute_stats(s, plan, steps):
    """The engine saw the offload tensors and nothing else (Note [Offload hooks]); the
    hooks kept and recomputed the rest; each block with recompute tensors ran one
    recompute forward per step and captured at least one save per recompute tensor."""
    assert s["offloaded_count"] == _count(plan, "offload") * steps
    assert s["keep_count"] == 0 and s["recompute_count"] == 0
    assert s["released_count"] == _count(plan, "offload") * steps
    assert s["failed_count"] == 0 and s["pinned"]["current_count"] == 0
    h = s["hooks"]
    assert h["keep_count"] == _count(plan, "keep") * steps
    assert h["recompute_count"] == _count(plan, "recompute") * steps
    assert h["recompute_bytes"] > 0
    recomputing = sum("recompute" in layer for layer in plan)
    assert h["recompute_forwards"] == recomputing * steps
    assert h["recompute_captured"] >= h["recompute_count"]
    assert h["recompute_kept_count"] == 0


# Index legend at N_SAVED in offload_helpers.py. Each plan has all three actions; block
# by block:
PARTIAL = {
    # keep, offload and recompute interleaved inside each block
    "mixed_in_block": _plan("krrokrrokorrkr", "orkrokkorkokrk", "kkkkkkkkkkkkkk"),
    # q, k and the probabilities recomputed from ln1's output, which is offloaded (the
    # recompute starts from the offloaded input, fetched back first)
    "depends_on_offloaded": _plan("oooorrrokkkkkk", "okkorrrkkkkkko", "kkkkkkkkkkkkkk"),
    # a whole block (every tensor but its input), a partial one, one without recompute
    "across_blocks": _plan("orrrrrrrrrrrrr", "krokrorokrokro", "okokokkokokokk"),
}


@pytest.mark.parametrize("name", sorted(PARTIAL))
def test_partial_recompute_is_bitwise_identical(name):
    plan = PARTIAL[name]
    batches = _batches(3, requires_grad=True)
    expected = _train(_model(), batches)
    blocks = _model()
    _violations()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a plan the blocks can carry out warns about nothing
        with stash.torch.offload(blocks, plan) as h:
            got = _train(blocks, batches)
            s = h.stats()
    assert _violations() == []
    _assert_bitwise(expected, got)
    _assert_recompute_stats(s, plan, len(batches))


def test_whole_block_recompute():
    # Every tensor but the input (index 0, not recomputable) recomputed: the same path as
    # a partial plan; the input stays with the engine (offloaded or kept).
    batches = _batches(3, requires_grad=True)
    expected = _train(_model(), batches)
    blocks = _model()
    rest = "r" * (N_SAVED - 1)
    plan = _plan("o" + rest, "k" + rest, "o" * N_SAVED)
    with stash.torch.offload(blocks, plan) as h:
        got = _train(blocks, batches)
        s = h.stats()
    _assert_bitwise(expected, got)
    _assert_recompute_stats(s, plan, len(batches))
    # Every save but the parameters' is captured: 15 saves of 13 storages (6 and 13 twice).
    assert s["hooks"]["recompute_captured"] == 2 * 15 * len(batches)


def _call_counts(block):
    """Counts the calls of each submodule of a Block (forward pre-hooks)."""
    calls = {}
    for name, m in block.named_children():
        calls[name] = 0
        m.register_forward_pre_hook(lambda _m, _in, name=name: calls.__setitem__(
            name, calls[name] + 1))
    return calls


def test_recompute_stops_after_the_last_recompute_tensor():
    # Recomputing up to the attention probabilities (index 6, last saved by att@v) and
    # keeping the rest, the recompute runs ln1 and qkv only: it stops inside att@v,
    # before proj, ln2, fc1 and fc2. Recomputing up to relu's output runs all six.
    batches = _batches(2, requires_grad=True)
    expected = _train(_model(1), batches)
    steps = len(batches)
    replayed = {}
    for last, plan in (("att", _plan("krrrrrrkkkkkkk")), ("relu", _plan("k" + "r" * 13))):
        blocks = _model(1)
        calls = _call_counts(blocks[0])
        with stash.torch.offload(blocks, plan) as h:
            got = _train(blocks, batches)
            s = h.stats()
        _assert_bitwise(expected, got)
        assert s["hooks"]["recompute_forwards"] == steps
        # Both stop before the forward's last save: on torch 2.x fc2 saves its weight
        # (unnumbered) after relu's output.
        assert s["hooks"]["recompute_stopped_early"] == steps
        replayed[last] = s["hooks"]["recompute_replayed_saves"]
        if last == "att":
            assert calls == {"ln1": 2 * steps, "qkv": 2 * steps, "proj": steps,
                             "ln2": steps, "fc1": steps, "fc2": steps}
        else:
            assert calls == {name: 2 * steps for name in calls}
    # Saves replayed per recompute: through att@v's save of the probabilities (12 of the
    # forward's 24), through fc2's save of relu's output (23: fc2's weight, its product
    # and the residual sum are skipped).
    assert replayed == {"att": 12 * steps, "relu": 23 * steps}


def test_recompute_restores_the_rng_state_of_the_forward():
    # DropoutMLP saves 0 input, 1-2 ln stats, 3 ln output, 4 relu output, 5 the dropout
    # mask, 6 the dropped activations. A recompute that drew a new mask would change the
    # gradients; one that left the RNG where it restored it would change later steps'.
    def model():
        torch.manual_seed(0)
        return nn.ModuleList([DropoutMLP(D, FF) for _ in range(3)])

    probe = model()[0]
    x = torch.randn(B, T, D)
    assert not torch.equal(probe(x), probe(x))  # dropout is live: each call draws a mask
    batches = _batches(3, requires_grad=True)
    reference = model()
    torch.manual_seed(5)
    expected = _train(reference, batches)
    rng_after = torch.get_rng_state()
    plan = _plan("krrrrrr", "okrorrk", "kkkkkor")
    blocks = model()
    torch.manual_seed(5)
    with stash.torch.offload(blocks, plan) as h:
        got = _train(blocks, batches)
        s = h.stats()
    _assert_bitwise(expected, got)
    assert torch.equal(torch.get_rng_state(), rng_after)
    assert s["hooks"]["recompute_forwards"] == 3 * len(batches)


def test_recompute_under_cpu_autocast():
    # The forward runs under autocast (bfloat16 matmuls), the backward outside it: the
    # recompute must cast as the forward did, or it saves float32 tensors (and fails the
    # check against the forward's saves) and computes other values. Under autocast a
    # Block saves 18 tensors on torch 2.x: the bfloat16 copies of its weights too
    # (recomputable).
    def train(blocks, h):
        opt = torch.optim.SGD(blocks.parameters(), lr=0.05)
        out = []
        for x in _batches(2, requires_grad=True):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = x
                for b in blocks:
                    y = b(y)
            loss = y.float().square().mean()
            loss.backward()
            out.append((loss.detach(), [p.grad.clone() for p in blocks.parameters()]))
            opt.step()
        return [o[0] for o in out], [o[1] for o in out]

    expected = train(_model(2), None)
    blocks = _model(2)
    plan = _plan("o" + "r" * 17, "kro" * 6)
    with stash.torch.offload(blocks, plan) as h:
        got = train(blocks, h)
        s = h.stats()
    _assert_bitwise(expected, got)
    assert s["hooks"]["recompute_forwards"] == 2 * 2


class _QKV(torch.nn.Module):
    """Three projections of the raw input, as OLMo2's attention makes them (no norm
    first): under autocast each casts the input again."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(D, D) for _ in range(3))

    def forward(self, x):  # float32 in and out (the sum promotes)
        return x + torch.relu(self.q(x)) * self.k(x) + self.v(x)


def test_a_replay_casts_a_non_leaf_input_as_the_forward_did():
    """Note [A replay's inputs under autocast] in _offload_replay.py: a block's input made
    by the block before is no leaf, so autocast casts it anew at each projection; its
    replay gets it back as no leaf too. fit's measuring step recomputes every block; with
    the input restored as a leaf it saved one cached copy three times and refused the
    block ("now tensor 1 again (a view of it)")."""
    def train(budget):
        torch.manual_seed(0)
        stem = torch.nn.Linear(D, D)
        blocks = torch.nn.ModuleList([_QKV() for _ in range(3)])
        params = list(stem.parameters()) + list(blocks.parameters())
        opt = torch.optim.SGD(params, lr=0.05)
        h = stash.torch.fit(blocks, budget, optimizer=opt) if budget else None
        losses = []
        for x in _batches(3):
            y = stem(x)  # float32, as a decoder's residual stream
            with torch.autocast("cpu", dtype=torch.bfloat16):
                for b in blocks:
                    y = b(y)
            loss = y.float().square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        modes = [s["mode"] for s in h.report()["steps"]] if h else None
        if h:
            h.close()
        return losses, [p.detach().clone() for p in params], modes

    expected = train(None)
    got = train("100%")  # (the measuring step recomputes every block at any budget)
    assert got[2] == ["measure", "plan", "plan"], got[2]
    assert all(torch.equal(a, b) for a, b in zip(expected[0], got[0]))
    assert all(torch.equal(a, b) for a, b in zip(expected[1], got[1]))


def test_gradient_accumulation_with_partial_recompute():
    x0, x1 = _batches(2, requires_grad=True)
    plan = PARTIAL["across_blocks"]

    def step(blocks, h):
        return _two_micro_batches(blocks, h, x0, x1)

    expected = step(_model(), None)
    blocks = _model()
    with stash.torch.offload(blocks, plan) as h:
        got = step(blocks, h)
        s = h.stats()
    assert all(torch.equal(a, b) for a, b in zip(expected[0], got[0]))
    assert all(torch.equal(a, b) for a, b in zip(expected[1], got[1]))
    _assert_recompute_stats(s, plan, 2)
    assert s["hooks"]["abandoned_micro_batches"] == 0


def test_retain_graph_recomputes_once_per_backward():
    x = torch.randn(B, T, D, requires_grad=True)
    reference = _model(2)
    loss = _loss(reference, x)
    loss.backward(retain_graph=True)
    loss.backward()
    expected = [x.grad.clone()] + [p.grad for p in reference.parameters()]
    x.grad = None
    blocks = _model(2)
    plan = _plan("orrorrrokorrkr", "okrrrrrrrrrrrr")
    with stash.torch.offload(blocks, plan) as h:
        loss = _loss(blocks, x)
        loss.backward(retain_graph=True)
        assert h.stats()["hooks"]["recompute_forwards"] == 2
        loss.backward()
        s = h.stats()
    assert s["hooks"]["recompute_forwards"] == 4
    assert s["prefetched_count"] == _count(plan, "offload")  # the inputs fetched once
    got = [x.grad] + [p.grad for p in blocks.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


def test_no_grad_forward_with_a_recompute_plan_saves_nothing():
    blocks = _model(2)
    x = torch.randn(B, T, D)
    with torch.no_grad():
        expected = _loss(blocks, x)
    with stash.torch.offload(blocks, _plan("k" + "r" * 13, "orrorrrokorrkr")) as h:
        with torch.no_grad():
            assert torch.equal(_loss(blocks, x), expected)
        with torch.inference_mode():
            assert torch.equal(_loss(blocks, x), expected)
        s = h.stats()
    assert s["recompute_count"] == 0 and s["hooks"]["recompute_count"] == 0


def test_recompute_with_keyword_and_view_inputs():
    # Masked takes its mask as a keyword (saved by the block: an input, kept) and a float;
    # it saves 0 x, 1 mask, 2 tanh's output (torch 1.13 also saved the scale, as a wrapped
    # scalar). The first
    # input is a view with an offset into a larger storage, offloaded: the recompute
    # rebuilds it over the fetched buffer. Gated saves two views of one recomputed
    # storage: both are captured.
    def run(offload):
        torch.manual_seed(0)
        blocks = nn.ModuleList([Masked(8), Masked(8), Gated(8)])
        base = torch.randn(4, 9, requires_grad=True)
        mask = (torch.rand(4, 8) > 0.3).float()
        plan = _plan("okr", "oor", "orr")
        h = stash.torch.offload(blocks, plan) if offload else None
        y = base[:, 1:]
        for b in blocks[:2]:
            y = b(y, mask=mask, scale=0.5)
        loss = blocks[2](y).square().mean()
        loss.backward()
        s = h.stats() if h is not None else None
        if h is not None:
            h.close()
        return [loss.detach(), base.grad] + [p.grad for p in blocks.parameters()], s

    expected, _ = run(False)
    got, s = run(True)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert s["hooks"]["recompute_forwards"] == 3 and s["hooks"]["recompute_count"] == 4
    assert s["recompute_count"] == 0  # the engine sees offloads only
    assert s["hooks"]["recompute_captured"] == 5  # Gated's two views of one storage: 2
    # The mask is offloaded by block 1 (and fetched back for its recompute).
    assert s["offloaded_count"] == s["prefetched_count"] == 4


def test_recompute_that_saves_differently_raises():
    torch.manual_seed(0)
    blocks = nn.ModuleList([Unsteady(8)])
    with stash.torch.offload(blocks, _plan("krr")) as h:
        loss = _loss(blocks, torch.randn(4, 8, requires_grad=True))
        with pytest.raises(RuntimeError, match=r"stash.torch.offload: block 0 \(micro-batch 0\) "
                                               r"saved a different sequence of tensors when "
                                               r"recomputed .*save 2 was tensor 1, "
                                               r"torch.float32 \[4, 8\].*now tensor 1, "
                                               r"torch.float32 \[4, 4\]"):
            loss.backward()
        assert h.stats()["hooks"]["recompute_forwards"] == 1


def test_replay_is_not_connected_to_the_outer_graph():
    # The replay starts from detached inputs (block 1's input comes from block 0's graph
    # in forward) and hands autograd detached tensors: recomputed values are only saved
    # values, the replay's graph is never part of the backward. (The input comes back as
    # a view of its detached self, no leaf, as in the forward: Note [A replay's inputs
    # under autocast] in _offload_replay.py.)
    blocks = _model(2)
    x = torch.randn(B, T, D, requires_grad=True)

    def origin(t):
        if t.grad_fn is None:
            return "leaf"
        base = t._base
        if base is not None and base.is_leaf and type(t.grad_fn).__name__ == "ViewBackward0":
            return "view of a leaf"
        return "graph"
    seen = []  # per ln1 call of block 1: where does its input's graph begin?
    blocks[1].ln1.register_forward_pre_hook(
        lambda _m, inp: seen.append((origin(inp[0]), inp[0].requires_grad)))
    unpacked = []
    with stash.torch.offload(blocks, _plan("o" + "r" * 13, "k" + "r" * 13)) as h:
        unpack = h.hooks.unpack

        def spy(packed):
            t = unpack(packed)
            if isinstance(packed, Placeholder):
                unpacked.append(t)
            return t

        h.hooks.unpack = spy  # looked up at each forward
        _loss(blocks, x).backward()
    assert seen == [("graph", True), ("view of a leaf", True)]  # forward, replay
    assert len(unpacked) == 2 * 15
    assert all(t.grad_fn is None and not t.requires_grad for t in unpacked)


def test_input_modified_in_place_after_the_forward_is_refused():
    # A kept input is held by reference; a replay over values changed since the forward
    # would recompute other tensors than the forward saved, silently.
    blocks = _model(1)
    with stash.torch.offload(blocks, _plan("k" + "r" * (N_SAVED - 1))):
        x = torch.randn(B, T, D)
        loss = _loss(blocks, x)
        x.mul_(2)
        with pytest.raises(RuntimeError, match="an input of block 0 \\(micro-batch 0\\) was "
                                               "modified in place after the block's forward"):
            loss.backward()


def test_backward_that_fails_in_a_replay_gives_back_finished_prefetches():
    # Block 1's replay fails (Unsteady saves differently the second time) after backward
    # of block 1 began, which prefetched block 0's offloaded tensors. The backward never
    # acquires them; closing releases them. On the CPU path torch frees such a buffer at
    # once, so its copy must be complete when the hooks drop it, or it writes freed
    # memory. The double's host-to-device worker is held until shortly after close()
    # starts, so that without the wait the copies are deterministically still pending.
    torch.manual_seed(0)
    blocks = nn.ModuleList([Unsteady(8), Unsteady(8), Unsteady(8)])
    h = stash.torch.offload(blocks, _plan("ooo", "krr", "kkk"))
    lib = stash._lib.cudart()
    for f in (lib.stashdbl_stream_pause, lib.stashdbl_stream_resume):
        f.argtypes = [ctypes.c_void_p]
    _, h2d = h.engine.streams()
    loss = _loss(blocks, torch.randn(4, 8, requires_grad=True))
    assert lib.stashdbl_stream_pause(h2d) == 0
    with pytest.raises(RuntimeError, match="block 1 .* saved a different sequence"):
        loss.backward()
    # The buffers are marked while the copies wait; a buffer dropped with its mark intact
    # was dropped before its copy landed. Uint8 views over the same storages keep the
    # memory itself alive, so that a regression fails here cleanly instead of writing
    # freed memory.
    dropped = []
    buffers = h._streams.buffers
    assert len(buffers) == 3  # block 0's three tensors, prefetched
    keep = [torch.empty(0, dtype=torch.uint8).set_(buf.storage()) for buf in buffers]
    for mark, buf in zip(keep, buffers):
        mark.fill_(0xAB)
        weakref.finalize(buf, lambda mark=mark: dropped.append(bool((mark == 0xAB).all())))
    del buf
    buffers.clear()
    resume = threading.Timer(0.2, lib.stashdbl_stream_resume, [h2d])
    resume.start()
    try:
        h.close()
    finally:
        resume.join()
    assert dropped == [False, False, False]


def _ours(caught):
    return [str(w.message) for w in caught if "stash.torch.offload" in str(w.message)]


def test_plan_that_recomputes_the_input_keeps_it_with_one_warning():
    # The input (index 0) existed before the block ran: nothing can produce it again. The
    # forward sees that at once: it keeps it (counted, one warning) and recomputes the
    # rest.
    batches = _batches(3, requires_grad=True)
    expected = _train(_model(1), batches)
    blocks = _model(1)
    plan = _plan("rk" + "r" * (N_SAVED - 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with stash.torch.offload(blocks, plan) as h:
            got = _train(blocks, batches)
            s = h.stats()
    _assert_bitwise(expected, got)
    ours = _ours(caught)
    assert len(ours) == 1 and "recomputes tensor 0 of block 0" in ours[0], ours
    assert s["hooks"]["recompute_kept_count"] == len(batches)
    assert s["hooks"]["recompute_count"] == (N_SAVED - 2) * len(batches)
    assert s["hooks"]["recompute_forwards"] == len(batches)


def test_block_whose_input_needs_no_grad_is_recomputed():
    # Unlike a reentrant checkpoint, the recompute does not need an input that requires
    # grad: the parameters' gradients come from the outer graph.
    batches = _batches(2)
    expected = _train(_model(1), batches)
    blocks = _model(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with stash.torch.offload(blocks, _plan("k" + "r" * (N_SAVED - 1))) as h:
            got = _train(blocks, batches)
            s = h.stats()
    _assert_bitwise(expected, got)
    assert s["hooks"]["recompute_forwards"] == 2
    assert s["hooks"]["recompute_count"] == (N_SAVED - 1) * 2
