"""stash.torch.offload on torch's CPU build and the test double (Note [Offload hooks]).

The double runs with STASHDBL_FOREIGN_IS_DEVICE=1 (set by ctest): torch's CPU tensors are
the "device" memory the engine copies to pinned memory and back."""

import json
import os
import subprocess

import pytest
import torch
import torch.nn as nn

import stash
import stash.torch
from stash import _engine
from models import Gated, Scale
from offload_helpers import (B, D, FF, N_SAVED, T, _assert_bitwise, _batches, _loss, _model,
                             refused_without_the_double,
                             _two_micro_batches,
                             _train, _violations)


MIXED = [["offload" if j % 2 == 0 else "keep" for j in range(N_SAVED)],
         ["keep" if j % 3 else "offload" for j in range(N_SAVED)],
         ["keep"] * N_SAVED]


def test_runs_on_the_double_with_foreign_memory_as_device():
    lib = stash._lib.cudart()
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
    # Note [Offload hooks]: the engine sees the offload tensors only; the hooks count the
    # kept ones.
    assert s["keep_count"] == 0 and s["hooks"]["keep_count"] == n_keep
    assert s["released_count"] == n_off  # every key given back
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
        return _two_micro_batches(blocks, h, x0, x1)

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


def _engine_calls(h):
    """Counts the handle's calls into its engine, by method name."""
    calls = {}
    for name in ("forward_begin", "forward_end", "backward_begin", "backward_end", "offload",
                 "acquire", "release"):
        real = getattr(h.engine, name)

        def counted(*args, _real=real, _name=name):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*args)
        setattr(h.engine, name, counted)
    return calls


def test_a_plan_that_copies_nothing_makes_no_engine_call():
    # Note [Offload hooks]: keep and recompute tensors never reach the engine, and with
    # nothing to copy neither do the blocks; one offload brings the block calls back.
    batches = _batches(2)
    expected = _train(_model(), batches)
    quiet = [["keep"] * N_SAVED, ["keep"] + ["recompute"] * (N_SAVED - 1), ["keep"] * N_SAVED]
    for plan, copies in ((quiet, False), (MIXED, True)):
        blocks = _model()
        with stash.torch.offload(blocks, plan) as h:
            calls = _engine_calls(h)
            _assert_bitwise(expected, _train(blocks, batches))
            s = h.stats()
        n_off = sum(a == "offload" for layer in plan for a in layer) * len(batches)
        n_keep = sum(a == "keep" for layer in plan for a in layer) * len(batches)
        assert s["hooks"]["keep_count"] == n_keep
        if copies:
            assert calls["offload"] == n_off and calls["forward_begin"] == 3 * len(batches)
            assert calls["backward_end"] == 3 * len(batches)
        else:
            assert calls == {} and s["offloaded_count"] == 0 and s["keep_count"] == 0


class _PassThrough(nn.Module):
    """A block that returns its input unchanged (it saves nothing)."""

    def forward(self, x):
        return x


def test_a_block_that_returns_its_input_keeps_the_backward_order():
    # Note [Backward boundaries by a tensor hook]: the pass-through block's output is the
    # tensor block 0 marked already; its boundary must still run before block 0's.
    torch.manual_seed(0)
    from models import Block
    plan = [MIXED[0], [], MIXED[0]]

    def model():
        torch.manual_seed(0)
        return nn.ModuleList([Block(D, 2, FF), _PassThrough(), Block(D, 2, FF)])

    batches = _batches(2)
    expected = _train(model(), batches)
    blocks = model()
    with stash.torch.offload(blocks, plan) as h:
        order = []
        real = h.engine.backward_begin
        h.engine.backward_begin = lambda mb, layer: (order.append(layer), real(mb, layer))
        _assert_bitwise(expected, _train(blocks, batches, wait=h))
    assert order == [2, 1, 0] * len(batches), order


def test_timing_is_off_unless_asked_for():
    # Events on every engine call cost host time; only write_trace and overlap read them.
    blocks = _model(2)
    with stash.torch.offload(blocks, [["offload"] * N_SAVED] * 2) as h:
        _train(blocks, _batches(1))
        assert h.engine.timing is False
        for read in (h.overlap, lambda: h.write_trace("unused.json")):
            with pytest.raises(stash.StashError, match="pass timing=True"):
                read()


def test_trace_and_overlap(tmp_path):
    blocks = _model(3)
    with stash.torch.offload(blocks, [["offload"] * N_SAVED] * 3, timing=True) as h:
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


def test_cpu_blocks_without_the_double_are_refused():
    # Without STASH_CUDART stash's libraries share the process's runtime (torch's), which
    # cannot take CPU tensors as device memory.
    refused_without_the_double("stash.torch.offload(blocks, [['keep']])")


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
        got = _train(blocks, batches, wait=h)
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
