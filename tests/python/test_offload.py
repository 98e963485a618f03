"""stash.torch.offload on torch's CPU build and the test double (Note [Offload hooks]).

The double runs with STASHDBL_FOREIGN_IS_DEVICE=1 (set by ctest): torch's CPU tensors are
the "device" memory the engine copies to pinned memory and back."""

import ctypes
import json
import os
import subprocess
import warnings

import pytest
import torch
import torch.nn as nn

import stash
import stash.torch
from stash import _engine
from models import Block, Gated, Scale

B, T, D, FF = 2, 8, 16, 32
N_SAVED = 15  # what a Block saves (test_record.py derives the list by hand)


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
    assert s["hooks"]["recomputed_blocks"] == 0


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


def test_whole_block_recompute():
    # A plan that recomputes all of a block's recomputable tensors (everything but its
    # input, index 0) recomputes it whole under the reentrant checkpoint.
    batches = _batches(3, requires_grad=True)
    expected = _train(_model(), batches)
    blocks = _model()
    rest = ["recompute"] * (N_SAVED - 1)
    plan = [["offload"] + rest, ["keep"] + rest, ["offload"] * N_SAVED]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a qualifying plan warns about nothing
        with stash.torch.offload(blocks, plan) as h:
            got = _train(blocks, batches)
            s = h.stats()
    _assert_bitwise(expected, got)
    assert s["hooks"]["recomputed_blocks"] == 2 * len(batches)
    assert s["hooks"]["recompute_kept_count"] == 0
    # Only the recomputed blocks' inputs reach the engine from them.
    assert s["offloaded_count"] == (1 + N_SAVED) * len(batches)
    assert s["keep_count"] == 1 * len(batches)
    assert s["recompute_count"] == 0


def _ours(caught):
    return [str(w.message) for w in caught if "stash.torch.offload" in str(w.message)]


def test_partial_recompute_is_kept_and_counted_with_one_warning():
    batches = _batches(3, requires_grad=True)
    expected = _train(_model(2), batches)
    blocks = _model(2)
    # Block 0 keeps a recomputable tensor (index 5) and recomputes the others: more kept
    # tensors than inputs, seen before the first forward.
    partial = ["keep"] + ["recompute"] * 4 + ["keep"] + ["recompute"] * (N_SAVED - 6)
    plan = [partial, ["offload"] * N_SAVED]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with stash.torch.offload(blocks, plan) as h:
            got = _train(blocks, batches)
            s = h.stats()
    _assert_bitwise(expected, got)
    ours = _ours(caught)
    assert len(ours) == 1 and "block 0 is not recomputed" in ours[0], ours
    assert s["hooks"]["recomputed_blocks"] == 0
    assert s["hooks"]["recompute_kept_count"] == 13 * 3
    assert s["recompute_count"] == 13 * 3 and s["keep_count"] == 2 * 3


def test_plan_that_recomputes_the_input_is_found_at_the_first_recompute():
    # As many non-recompute tensors as inputs, but the wrong one: the plan recomputes the
    # input (index 0, not recomputable) and keeps index 1. Only backward's recompute can
    # tell: step 1 runs under checkpoint (exact anyway), later steps keep and count.
    batches = _batches(3, requires_grad=True)
    expected = _train(_model(1), batches)
    blocks = _model(1)
    plan = [["recompute", "keep"] + ["recompute"] * (N_SAVED - 2)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with stash.torch.offload(blocks, plan) as h:
            got = _train(blocks, batches)
            s = h.stats()
    _assert_bitwise(expected, got)
    ours = _ours(caught)
    assert len(ours) == 1 and "recomputable tensors of block 0 (indices [1])" in ours[0], ours
    assert s["hooks"]["recomputed_blocks"] == 1
    assert s["hooks"]["recompute_kept_count"] == (N_SAVED - 1) * 2


def test_block_whose_input_needs_no_grad_is_not_recomputed():
    batches = _batches(2)  # inputs without requires_grad: a checkpoint would cut gradients
    expected = _train(_model(1), batches)
    blocks = _model(1)
    with pytest.warns(UserWarning, match="block 0 is not recomputed.*no input requires grad"):
        with stash.torch.offload(blocks, [["keep"] + ["recompute"] * (N_SAVED - 1)]) as h:
            got = _train(blocks, batches)
            s = h.stats()
    _assert_bitwise(expected, got)
    assert s["hooks"]["recomputed_blocks"] == 0
    assert s["hooks"]["recompute_kept_count"] == (N_SAVED - 1) * 2


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
