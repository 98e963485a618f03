"""stash.torch.fit under torch.distributed on the CPU: gloo, 2 and 4 processes (spawned,
each with its own test double), Hugging Face Llama. Note [Agreeing on a plan across
ranks] in stash/torch/_fit_ranks.py."""

import json
import multiprocessing
import os
import time

import pytest

pytest.importorskip("transformers")

import torch.distributed as dist  # noqa: E402

if not dist.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

from stash.torch._fit_ranks import combine_profiles, skeleton_digest  # noqa: E402

import ranks_worker  # noqa: E402


def launch(tmp_path, scenario, world, limit_s=240, env=None):
    """Runs scenario on world ranks; every rank's outcome (None for a rank that wrote
    none). Bounded in time: a rank still running after limit_s fails the test."""
    ctx = multiprocessing.get_context("spawn")
    init = tmp_path / "pg"
    out = tmp_path / "out"
    out.mkdir()
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        procs = [ctx.Process(target=ranks_worker.main,
                             args=(r, world, str(init), scenario, str(out)))
                 for r in range(world)]
        for p in procs:
            p.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    deadline = time.monotonic() + limit_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert not hung, f"rank(s) {hung} still running after {limit_s} s"
    results = []
    for r in range(world):
        f = out / f"rank{r}.json"
        results.append(json.loads(f.read_text()) if f.exists() else None)
    return results, [p.exitcode for p in procs]


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_under_fit_is_bitwise_ddp_and_every_rank_runs_one_plan(tmp_path, world):
    results, _ = launch(tmp_path, "ddp", world)
    for r in results:
        assert r["ok"], r.get("traceback")
        assert r["losses"] == r["ref_losses"] and r["params_equal"], r
        assert r["modes"] == ["measure", "plan", "plan", "plan"], r["modes"]
        assert r["ranks"]["world"] == world and r["link"]["local_ranks"] == world
        assert r["actions"]["recompute"] + r["actions"]["offload"] > 0, r["actions"]
    digests = {r["ranks"]["plan_sha256"] for r in results}
    assert len(digests) == 1 and None not in digests, digests
    # Ranks saw different data, hence different losses: the agreement is not trivial.
    assert results[0]["losses"] != results[1]["losses"]


def test_fsdp2_under_fit_is_bitwise_fsdp2_and_every_rank_runs_one_plan(tmp_path):
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        pytest.skip("this torch has no FSDP2 (fully_shard)")
    results, _ = launch(tmp_path, "fsdp", 2)
    for r in results:
        assert r["ok"], r.get("traceback")
        assert r["losses"] == r["ref_losses"] and r["params_equal"], r
        assert r["modes"] == ["measure", "plan", "plan", "plan"], r["modes"]
        assert r["actions"]["recompute"] + r["actions"]["offload"] > 0, r["actions"]
    assert len({r["ranks"]["plan_sha256"] for r in results}) == 1


def test_a_rank_with_another_model_is_refused_on_every_rank(tmp_path):
    t0 = time.monotonic()
    results, _ = launch(tmp_path, "shape", 2, limit_s=120)
    for r in results:
        assert not r["ok"]
        assert "the ranks measured different blocks" in r["error"], r["error"]
        assert "on rank(s) 0" in r["error"] and "on rank(s) 1" in r["error"]
    assert time.monotonic() - t0 < 120


def test_rank_0s_refusal_to_plan_is_every_ranks_error(tmp_path):
    results, _ = launch(tmp_path, "infeasible", 2, limit_s=120)
    assert not results[0]["ok"] and "no plan fits the budget" in results[0]["error"]
    assert not results[1]["ok"]
    assert results[1]["error"].startswith("StashError: stash.torch.fit: rank 0 failed: "
                                          "stash.torch.fit: no plan fits the budget"), \
        results[1]["error"]


def test_a_rank_killed_while_measuring_fails_the_others_by_name(tmp_path):
    results, codes = launch(tmp_path, "kill", 3, limit_s=120, env={"RANKS_TIMEOUT": "5"})
    assert results[1] is None and codes[1] == 7  # died without a word
    for r in (results[0], results[2]):
        assert not r["ok"]
        assert "rank(s) 1 did not post profile within 5 s" in r["error"], r["error"]
        assert r["waited_s"] < 60


def test_the_ranks_measure_the_link_at_once_and_plan_with_the_least(tmp_path):
    env = {"RANKS_CACHE": str(tmp_path / "cache")}
    results, _ = launch(tmp_path, "link", 3, env=env)
    for r in results:
        assert r["ok"], r.get("traceback")
        # Each direction's least over the ranks (rank 0 20/18/38, 1 10/24/34, 2 15/12/27),
        # as each rank's double measured it (the virtual clock: to 1e-6). Both directions
        # at once move equal bytes, so a rank measures 2 x the slower direction there:
        # 36, 20 and 24 GB/s.
        got = r["link"]
        assert got["local_ranks"] == 3
        assert [got["h2d_gbps"], got["d2h_gbps"], got["bidir_gbps"]] == \
            pytest.approx([10.0, 12.0, 20.0], rel=1e-6), got
        assert r["cached"] is False
    # Every rank started after every rank was ready, so the measuring windows overlap.
    windows = results[0]["windows"]
    assert max(w[0] for w in windows) < min(w[1] for w in windows), windows
    # A second run reads the agreed link back, on every rank, without measuring.
    (tmp_path / "again").mkdir()
    results, _ = launch(tmp_path / "again", "link", 3, env=env)
    assert all(r["ok"] and r["cached"] for r in results), results
    assert all(r["link"]["h2d_gbps"] == pytest.approx(10.0, rel=1e-6) for r in results)


def _profile(fwd, bwd, rec, link, pinnable, fixed, nbytes=100):
    return {"layers": [{"name": "L.0", "fwd_ms": fwd, "bwd_ms": bwd, "tensors": [
                {"name": "input", "bytes": nbytes, "recompute_ms": 0.0, "offloadable": True,
                 "recomputable": False, "must_keep": False},
                {"name": "saved.1", "bytes": 2 * nbytes, "recompute_ms": rec,
                 "offloadable": True, "recomputable": True, "must_keep": False}]}],
            "link": {"h2d_gbps": link[0], "d2h_gbps": link[1], "bidir_gbps": link[2],
                     "local_ranks": 2},
            "host": {"pinnable_bytes": pinnable}, "fixed_bytes": fixed,
            "step_overhead_ms": fwd / 10, "measurement": {"notes": []}}


def test_profiles_combine_to_the_slowest_compute_and_the_least_link():
    a = _profile(1.0, 3.0, 0.5, (20, 18, 30), 1000, 50)
    b = _profile(2.0, 2.5, 0.7, (10, 24, 40), 800, 70)
    c = combine_profiles([a, b])
    layer = c["layers"][0]
    assert (layer["fwd_ms"], layer["bwd_ms"], layer["tensors"][1]["recompute_ms"]) == \
        (2.0, 3.0, 0.7)
    assert c["link"] == {"h2d_gbps": 10, "d2h_gbps": 18, "bidir_gbps": 30, "local_ranks": 2}
    assert (c["host"]["pinnable_bytes"], c["fixed_bytes"], c["step_overhead_ms"]) == \
        (800, 70, 0.2)
    assert c["measurement"]["ranks"] == 2 and a["layers"][0]["fwd_ms"] == 1.0  # a copy
    # Times and memory do not change the skeleton; a tensor's size does.
    assert skeleton_digest(a) == skeleton_digest(b)
    assert skeleton_digest(a) != skeleton_digest(_profile(1.0, 3.0, 0.5, (20, 18, 30), 1000,
                                                          50, nbytes=101))
