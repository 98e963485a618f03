"""stash.torch.offload on torch's CPU build and the test double (Note [Offload hooks]).

The double runs with STASHDBL_FOREIGN_IS_DEVICE=1 (set by ctest): torch's CPU tensors are
the "device" memory the engine copies to pinned memory and back."""

import contextlib
import ctypes
import json
import os
import subprocess
import threading
import warnings
import weakref

import pytest
import torch
import torch.nn as nn

import stash
import stash.torch
from stash import _engine
from stash.torch._recompute import Placeholder
from models import Block, DropoutMLP, Gated, Masked, Scale, Unsteady

B, T, D, FF = 2, 8, 16, 32
# What a Block saves (test_record.py derives the list by hand): 0 input, 1-2 ln1 mean and
# rstd, 3 ln1's output, 4-5 copies of q and k, 6 the 1/sqrt(d) scalar, 7 softmax
# probabilities (saved twice: by softmax and by att@v), 8 a copy of v, 9 y, 10 the
# residual, 11-12 ln2 mean and rstd, 13 ln2's output, 14 relu's output (saved twice:
# by relu and by fc2).
N_SAVED = 15
_ACTION = {"k": "keep", "r": "recompute", "o": "offload"}


def _plan(*layers):
    """Per-layer action lists from strings of k/r/o, one letter per saved tensor."""
    return [[_ACTION[c] for c in layer] for layer in layers]


def _model(n=3, seed=0):
    torch.manual_seed(seed)
    return nn.ModuleList([Block(D, 2, FF) for _ in range(n)])


def _loss(blocks, x):
    for b in blocks:
        x = b(x)
    return x.square().mean()


def _train(blocks, batches, handle=None, lr=0.05):
    """A few SGD steps; the losses and, after each step, every gradient."""
    opt = torch.optim.SGD(blocks.parameters(), lr=lr)
    losses, grads = [], []
    for x in batches:
        opt.zero_grad()
        loss = _loss(blocks, x)
        loss.backward()
        losses.append(loss.detach().clone())
        grads.append([p.grad.clone() for p in blocks.parameters()])
        opt.step()
    return losses, grads


def _batches(n=3, requires_grad=False):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(B, T, D, generator=g).requires_grad_(requires_grad) for _ in range(n)]


def _assert_bitwise(a, b):
    la, ga = a
    lb, gb = b
    assert all(torch.equal(x, y) for x, y in zip(la, lb)), (la, lb)
    for step_a, step_b in zip(ga, gb):
        assert len(step_a) == len(step_b)
        assert all(torch.equal(x, y) for x, y in zip(step_a, step_b))


MIXED = [["offload" if j % 2 == 0 else "keep" for j in range(N_SAVED)],
         ["keep" if j % 3 else "offload" for j in range(N_SAVED)],
         ["keep"] * N_SAVED]


def _violations():
    """The double's happens-before violations so far (and clears them): unordered device
    accesses to the same bytes, e.g. a prefetch writing memory a copy still reads."""
    lib = ctypes.CDLL("libcudart.so.13")
    lib.stashdbl_violation_count.restype = ctypes.c_size_t
    lib.stashdbl_violation_text.restype = ctypes.c_size_t
    lib.stashdbl_violation_text.argtypes = [ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    out = []
    for i in range(lib.stashdbl_violation_count()):
        buf = ctypes.create_string_buffer(512)
        lib.stashdbl_violation_text(i, buf, 512)
        out.append(buf.value.decode())
    lib.stashdbl_clear_violations()
    return out


def test_runs_on_the_double_with_foreign_memory_as_device():
    lib = ctypes.CDLL("libcudart.so.13")
    assert hasattr(lib, "stashdbl_probe")
    assert os.environ.get("STASHDBL_FOREIGN_IS_DEVICE") == "1"


@pytest.mark.parametrize("plan", [MIXED, [["offload"] * N_SAVED] * 3], ids=["mixed", "all"])
def test_training_is_bitwise_identical_and_offloads_happen(plan):
    batches = _batches()
    expected = _train(_model(), batches)
    blocks = _model()
    _violations()
    with stash.torch.offload(blocks, plan) as h:
        got = _train(blocks, batches)
        s = h.stats()
    assert _violations() == []
    _assert_bitwise(expected, got)
    n_off = sum(a == "offload" for layer in plan for a in layer) * len(batches)
    n_keep = sum(a == "keep" for layer in plan for a in layer) * len(batches)
    assert s["offloaded_count"] == n_off and s["prefetched_count"] == n_off
    assert s["keep_count"] == n_keep
    assert s["released_count"] == n_off + n_keep  # every key given back
    assert s["failed_count"] == 0 and s["kept_on_device_count"] == 0
    assert s["offloaded_bytes"] == s["prefetched_bytes"] > 0
    # Each offload hands back the source storage and, after the backward, the buffer.
    assert s["release_callbacks"] == 2 * n_off
    assert s["pinned"]["current_count"] == 0 and s["in_flight_count"] == 0
    assert s["hooks"]["recompute_forwards"] == 0 and s["recompute_count"] == 0


def test_backward_reads_the_copy_not_the_original():
    # Scale saves its input and nothing else (the weight is a parameter). Once the D2H is
    # done, wiping the input's memory behind autograd's back (.data: no version bump)
    # must not change the weight's gradient: backward reads the prefetched copy.
    def grad(offload):
        torch.manual_seed(0)
        blocks = nn.ModuleList([Scale(D), Scale(D)])
        x = torch.randn(B, D)
        h = stash.torch.offload(blocks, [["offload"], ["offload"]]) if offload else None
        loss = _loss(blocks, x)
        if h is not None:
            h.synchronize()
            x.data.zero_()
        loss.backward()
        if h is not None:
            assert h.stats()["prefetched_count"] == 2
            h.close()
        return [p.grad.clone() for p in blocks.parameters()]

    expected = grad(False)
    assert expected[0].abs().sum() > 0
    got = grad(True)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


def test_gradient_accumulation_over_two_micro_batches():
    x0, x1 = _batches(2)

    def step(blocks, h):
        losses = []
        for mb, x in enumerate((x0, x1)):  # both forwards first, then both backwards
            if h is None:
                losses.append(_loss(blocks, x))
            else:
                with h.micro_batch(mb):
                    losses.append(_loss(blocks, x))
        losses[1].backward()
        losses[0].backward()
        return [l.detach() for l in losses], [p.grad.clone() for p in blocks.parameters()]

    expected = step(_model(), None)
    blocks = _model()
    plan = [["offload"] * N_SAVED] * 2 + [["keep"] * N_SAVED]
    with stash.torch.offload(blocks, plan) as h:
        got = step(blocks, h)
        s = h.stats()
    assert all(torch.equal(a, b) for a, b in zip(expected[0], got[0]))
    assert all(torch.equal(a, b) for a, b in zip(expected[1], got[1]))
    assert s["offloaded_count"] == 2 * 2 * N_SAVED
    assert s["prefetched_count"] == s["offloaded_count"]
    assert s["hooks"]["abandoned_micro_batches"] == 0


def _count(plan, action):
    return sum(a == action for layer in plan for a in layer)


def _assert_recompute_stats(s, plan, steps):
    """The engine saw every tensor with its action; each block with recompute tensors ran
    one recompute forward per step and captured at least one save per recompute
    tensor."""
    assert s["offloaded_count"] == _count(plan, "offload") * steps
    assert s["keep_count"] == _count(plan, "keep") * steps
    assert s["recompute_count"] == _count(plan, "recompute") * steps
    assert s["released_count"] == sum(map(len, plan)) * steps
    assert s["failed_count"] == 0 and s["pinned"]["current_count"] == 0
    h = s["hooks"]
    assert h["recompute_count"] == s["recompute_count"] and h["recompute_bytes"] > 0
    recomputing = sum("recompute" in layer for layer in plan)
    assert h["recompute_forwards"] == recomputing * steps
    assert h["recompute_captured"] >= h["recompute_count"]
    assert h["recompute_kept_count"] == 0


# Index legend above N_SAVED. Each plan has all three actions; block by block:
PARTIAL = {
    # keep, offload and recompute interleaved inside each block
    "mixed_in_block": _plan("krrokrkrokorrkr", "orkrokrkorkokrk", "kkkkkkkkkkkkkkk"),
    # q, k and the probabilities recomputed from ln1's output, which is offloaded (the
    # recompute starts from the offloaded input, fetched back first)
    "depends_on_offloaded": _plan("oooorrorokkkkkk", "okkorrkrkkkkkko", "kkkkkkkkkkkkkkk"),
    # a whole block (every tensor but its input), a partial one, one without recompute
    "across_blocks": _plan("orrrrrrrrrrrrrr", "krokrokrokrokro", "okokokokokokokk"),
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
    # Every save but the parameters' is captured: 16 saves of 14 storages (7 and 14 twice).
    assert s["hooks"]["recompute_captured"] == 2 * 16 * len(batches)


def _call_counts(block):
    """Counts the calls of each submodule of a Block (forward pre-hooks)."""
    calls = {}
    for name, m in block.named_children():
        calls[name] = 0
        m.register_forward_pre_hook(lambda _m, _in, name=name: calls.__setitem__(
            name, calls[name] + 1))
    return calls


def test_recompute_stops_after_the_last_recompute_tensor():
    # Recomputing up to the attention probabilities (index 7, last saved by att@v) and
    # keeping the rest, the recompute runs ln1 and qkv only: it stops inside att@v,
    # before proj, ln2, fc1 and fc2. Recomputing up to relu's output runs all six.
    batches = _batches(2, requires_grad=True)
    expected = _train(_model(1), batches)
    steps = len(batches)
    replayed = {}
    for last, plan in (("att", _plan("krrrrrrrkkkkkkk")), ("relu", _plan("k" + "r" * 14))):
        blocks = _model(1)
        calls = _call_counts(blocks[0])
        with stash.torch.offload(blocks, plan) as h:
            got = _train(blocks, batches)
            s = h.stats()
        _assert_bitwise(expected, got)
        assert s["hooks"]["recompute_forwards"] == steps
        assert s["hooks"]["recompute_stopped_early"] == (steps if last == "att" else 0)
        replayed[last] = s["hooks"]["recompute_replayed_saves"]
        if last == "att":
            assert calls == {"ln1": 2 * steps, "qkv": 2 * steps, "proj": steps,
                             "ln2": steps, "fc1": steps, "fc2": steps}
        else:
            assert calls == {name: 2 * steps for name in calls}
    # Saves replayed per recompute: through att@v's save of the probabilities (12 of the
    # forward's 25), through fc2's save of relu's output (25: its last, so not "early",
    # though fc2's product and the residual sum are still skipped).
    assert replayed == {"att": 12 * steps, "relu": 25 * steps}


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
    # Block saves 19 tensors: the bfloat16 copies of its weights too (recomputable).
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
    plan = _plan("o" + "r" * 18, "kro" * 6 + "k")
    with stash.torch.offload(blocks, plan) as h:
        got = train(blocks, h)
        s = h.stats()
    _assert_bitwise(expected, got)
    assert s["hooks"]["recompute_forwards"] == 2 * 2


def test_gradient_accumulation_with_partial_recompute():
    x0, x1 = _batches(2, requires_grad=True)
    plan = PARTIAL["across_blocks"]

    def step(blocks, h):
        losses = []
        for mb, x in enumerate((x0, x1)):  # both forwards first, then both backwards
            with (h.micro_batch(mb) if h is not None else contextlib.nullcontext()):
                losses.append(_loss(blocks, x))
        losses[1].backward()
        losses[0].backward()
        return [l.detach() for l in losses], [p.grad.clone() for p in blocks.parameters()]

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
    plan = _plan("orrorrkrokorrkr", "okrrrrrrrrrrrrr")
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
    with stash.torch.offload(blocks, _plan("k" + "r" * 14, "orrorrkrokorrkr")) as h:
        with torch.no_grad():
            assert torch.equal(_loss(blocks, x), expected)
        with torch.inference_mode():
            assert torch.equal(_loss(blocks, x), expected)
        s = h.stats()
    assert s["recompute_count"] == 0 and s["hooks"]["recompute_count"] == 0


def test_recompute_with_keyword_and_view_inputs():
    # Masked takes its mask as a keyword (saved by the block: an input, kept) and a float;
    # it saves 0 x, 1 mask, 2 tanh's output, 3 the scale (a wrapped scalar). The first
    # input is a view with an offset into a larger storage, offloaded: the recompute
    # rebuilds it over the fetched buffer. Gated saves two views of one recomputed
    # storage: both are captured.
    def run(offload):
        torch.manual_seed(0)
        blocks = nn.ModuleList([Masked(8), Masked(8), Gated(8)])
        base = torch.randn(4, 9, requires_grad=True)
        mask = (torch.rand(4, 8) > 0.3).float()
        plan = _plan("okrr", "oorr", "orr")
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
    assert s["hooks"]["recompute_forwards"] == 3 and s["recompute_count"] == 6
    assert s["hooks"]["recompute_captured"] == 7  # Gated's two views of one storage: 2
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
    # values, the replay's graph is never part of the backward.
    blocks = _model(2)
    x = torch.randn(B, T, D, requires_grad=True)
    seen = []  # per ln1 call of block 1: does its input carry a graph?
    blocks[1].ln1.register_forward_pre_hook(
        lambda _m, inp: seen.append((inp[0].grad_fn is not None, inp[0].requires_grad)))
    unpacked = []
    with stash.torch.offload(blocks, _plan("o" + "r" * 14, "k" + "r" * 14)) as h:
        unpack = h._unpack

        def spy(packed):
            t = unpack(packed)
            if isinstance(packed, Placeholder):
                unpacked.append(t)
            return t

        h._unpack = spy  # looked up at each forward
        _loss(blocks, x).backward()
    assert seen == [(True, True), (False, True)]  # forward, replay
    assert len(unpacked) == 2 * 16
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
    lib = ctypes.CDLL("libcudart.so.13")
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
    buffers = list(h._buffers.values())
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


def test_plan_from_the_record_pass_and_the_planner_json(tmp_path):
    blocks = _model(2)
    x = torch.randn(B, T, D)
    skeleton = stash.torch.record(blocks, x)
    plan = {"schema": "stash.plan/1", "layers": [
        {"index": i, "name": layer["name"],
         "tensors": [{"name": t["name"], "action": "offload" if t["bytes"] >= 1024 else "keep"}
                     for t in layer["tensors"]]}
        for i, layer in enumerate(skeleton["layers"])]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    expected = _train(_model(2), [x])
    with stash.torch.offload(blocks, str(path)) as h:
        got = _train(blocks, [x])
        s = h.stats()
    _assert_bitwise(expected, got)
    big = sum(t["bytes"] >= 1024 for layer in skeleton["layers"] for t in layer["tensors"])
    assert s["offloaded_count"] == big > 0


def test_mismatched_plan_raises_naming_block_and_counts():
    x = torch.randn(B, T, D)
    with pytest.raises(stash.StashError, match="plan has 2 layers, but 3 blocks"):
        stash.torch.offload(_model(3), [["keep"] * N_SAVED] * 2)
    blocks = _model(2)
    short = [["keep"] * N_SAVED, ["keep"] * (N_SAVED - 1)]
    with stash.torch.offload(blocks, short):
        with pytest.raises(stash.StashError,
                           match=f"block 1 saves more than the {N_SAVED - 1} tensors"):
            _loss(blocks, x)
    long = [["keep"] * (N_SAVED + 2), ["keep"] * N_SAVED]
    with stash.torch.offload(blocks, long):
        with pytest.raises(stash.StashError,
                           match=f"block 0 saved {N_SAVED} tensors, but the plan lists "
                                 f"{N_SAVED + 2} for layer 0"):
            _loss(blocks, x)
    assert "forward" not in vars(blocks[0])  # closed: the forwards are restored
    with pytest.raises(stash.StashError, match=r"layers\[0\]\.tensors\[1\]\.action"):
        stash.torch.offload(blocks, {"schema": "stash.plan/1", "layers": [
            {"tensors": [{"action": "keep"}, {"action": "drop"}]}, {"tensors": []}]})


def test_engine_errors_carry_the_last_error():
    blocks = _model(1)
    with stash.torch.offload(blocks, [["keep"] * N_SAVED]) as h:
        with pytest.raises(stash.StashError,
                           match=r"stash_engine_release\(0, 0, 99\).*index 99\) is unknown") as e:
            h.engine.release((0, 0, 99))
        assert e.value.status == _engine.STASH_ERROR_UNKNOWN_TENSOR
    with pytest.raises(stash.StashError, match="closed"):
        h.stats()


def test_no_grad_forward_and_close_restore_the_blocks():
    blocks = _model(2)
    x = torch.randn(B, T, D)
    with torch.no_grad():
        expected = _loss(blocks, x)
    with stash.torch.offload(blocks, [["offload"] * N_SAVED] * 2) as h:
        with torch.no_grad():
            assert torch.equal(_loss(blocks, x), expected)
        assert h.stats()["offloaded_count"] == 0
    assert all("forward" not in vars(b) for b in blocks)
    assert torch.equal(_loss(blocks, x).detach(), expected)


def test_forward_without_backward_is_dropped_and_its_graph_fails_clearly():
    blocks = _model(2)
    x = torch.randn(B, T, D)
    with stash.torch.offload(blocks, [["offload"] * N_SAVED] * 2) as h:
        stale = _loss(blocks, x)
        with pytest.warns(UserWarning, match="micro-batch 0 ran forward again"):
            fresh = _loss(blocks, x)
        fresh.backward()
        with pytest.raises(stash.StashError, match="replaced"):
            stale.backward()
        assert h.stats()["hooks"]["abandoned_micro_batches"] == 1


def test_blocks_out_of_order_raise():
    blocks = _model(2)
    with stash.torch.offload(blocks, [["keep"] * N_SAVED] * 2):
        with pytest.raises(stash.StashError, match="block 1 ran in micro-batch 0 where block 0"):
            blocks[1](torch.randn(B, T, D))


def test_trace_and_overlap(tmp_path):
    blocks = _model(3)
    with stash.torch.offload(blocks, [["offload"] * N_SAVED] * 3) as h:
        _train(blocks, _batches(1))
        path = tmp_path / "trace.json"
        h.write_trace(str(path))
        o = h.overlap()
    doc = json.loads(path.read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    tracks = json.dumps(events)
    assert "stash d2h" in tracks and "stash h2d" in tracks
    # The double's virtual clock times every copy: bytes / 50 GB/s.
    assert o["total"]["copy_ms"] > 0
    assert {l["layer"] for l in o["layers"]} >= {0, 1}


def test_retain_graph_reuses_the_fetched_tensors():
    x = torch.randn(B, T, D)
    expected_blocks = _model(2)
    loss = _loss(expected_blocks, x)
    loss.backward(retain_graph=True)
    loss.backward()
    blocks = _model(2)
    with stash.torch.offload(blocks, [["offload"] * N_SAVED] * 2) as h:
        loss = _loss(blocks, x)
        loss.backward(retain_graph=True)
        loss.backward()
        assert h.stats()["prefetched_count"] == 2 * N_SAVED  # fetched once
    for a, b in zip(expected_blocks.parameters(), blocks.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_cpu_blocks_need_the_double_opt_in(monkeypatch):
    monkeypatch.delenv("STASHDBL_FOREIGN_IS_DEVICE")
    with pytest.raises(stash.StashError, match="STASHDBL_FOREIGN_IS_DEVICE=1"):
        stash.torch.offload(_model(1), [["keep"] * N_SAVED])


def test_record_then_stash_plan_then_offload(tmp_path):
    # The whole path: the record pass lists what the blocks save, `stash plan` decides
    # under a budget, offload carries the plan out. A sequence of 256 makes each block's
    # attention probabilities 1 MiB, the planner's offload minimum, while the matmuls stay
    # small (torch's CPU build here is slow); times filled in as `stash profile` would.
    cli = os.environ.get("STASH_CLI")
    if not cli:
        pytest.skip("STASH_CLI (the stash binary) is not set; ctest sets it")
    blocks, reference = _model(4), _model(4)
    g = torch.Generator().manual_seed(3)
    batches = [torch.randn(2, 256, D, generator=g) for _ in range(2)]
    doc = stash.torch.record(blocks, batches[0])
    for layer in doc["layers"]:
        layer["fwd_ms"], layer["bwd_ms"] = 20.0, 40.0
        for t in layer["tensors"]:
            t["recompute_ms"] = 0.5 if t["recomputable"] else 0.0
    doc["link"] = {"h2d_gbps": 20.0, "d2h_gbps": 20.0, "bidir_gbps": 30.0, "local_ranks": 1}
    profile, plan = tmp_path / "profile.json", tmp_path / "plan.json"
    profile.write_text(json.dumps(doc))
    r = subprocess.run([cli, "plan", "--profile", str(profile), "--budget", "70%", "-o",
                        str(plan)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    actions = [[t["action"] for t in layer["tensors"]]
               for layer in json.loads(plan.read_text())["layers"]]
    n_off = sum(a == "offload" for layer in actions for a in layer)
    assert n_off > 0 and actions[-1] == ["keep"] * len(actions[-1])  # last layer never offloads

    expected = _train(reference, batches)
    with stash.torch.offload(blocks, str(plan)) as h:
        got = _train(blocks, batches)
        s = h.stats()
    _assert_bitwise(expected, got)
    assert s["offloaded_count"] == n_off * len(batches)
    assert s["offloaded_bytes"] >= n_off * len(batches) * (1 << 20)


def test_in_flight_cap_reaches_the_engine():
    # The cap bounds device-to-host bytes in transit (a single larger tensor goes alone).
    # Without it, this model has about 20 KB in flight at once on the double.
    largest = B * T * FF * 4
    blocks = _model(3)
    with stash.torch.offload(blocks, [["offload"] * N_SAVED] * 3,
                             max_in_flight_bytes=largest, pinned_cap="64MiB") as h:
        got = _train(blocks, _batches(1))
        s = h.stats()
    _assert_bitwise(_train(_model(3), _batches(1)), got)
    assert 0 < s["peak_in_flight_bytes"] <= largest
    assert s["pinned"]["limit_bytes"] == 64 << 20


def test_pinned_pool_exhausted_keeps_tensors_on_the_device():
    # A pinned cap of two 4 KiB blocks (the pinned alignment), held until backward: the
    # first two offloads of a step go to the host, the engine keeps the others where they
    # are (counted), acquire returns their original storage, and training is unchanged.
    batches = _batches(2)
    expected = _train(_model(2), batches)
    blocks = _model(2)
    with stash.torch.offload(blocks, [["offload"] * N_SAVED] * 2, pinned_cap=8192) as h:
        got = _train(blocks, batches)
        s = h.stats()
    _assert_bitwise(expected, got)
    assert s["offloaded_count"] == 2 * len(batches) and s["failed_count"] == 0
    assert s["kept_on_device_count"] == (2 * N_SAVED - 2) * len(batches)
    assert s["pinned"]["current_count"] == 0


def test_views_of_one_storage_share_one_offload():
    # Gated saves both halves of one projection (two views, one storage): one offload, one
    # prefetch, and both views rebuilt over the same buffer.
    def run(offload):
        torch.manual_seed(0)
        blocks = nn.ModuleList([Gated(8), Gated(8)])
        x = torch.randn(4, 8, requires_grad=True)
        h = stash.torch.offload(blocks, [["offload"] * 3] * 2) if offload else None
        _loss(blocks, x).backward()
        s = h.stats() if h is not None else None
        if h is not None:
            h.close()
        return [x.grad] + [p.grad for p in blocks.parameters()], s

    expected, _ = run(False)
    got, s = run(True)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert s["offloaded_count"] == s["prefetched_count"] == 6
