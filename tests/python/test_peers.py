"""python -m stash.bench.peers: the harness's logic, and a whole run at --size tiny on the
CPU (stash on its test double) in which every peer that can run on a CPU runs."""

import json
import xml.etree.ElementTree as ET

import pytest
import torch

from stash.bench import _llama, peers
from stash.torch._meter import CpuProfilerMeter, live_training_bytes, peak_delta
from stash.bench._peer_systems import (CompileBudget, Session, StashFit, System, sac_policy,
                                       sac_save_list, stash_systems, system_by_name,
                                       peer_systems)
from stash.bench._svg import knee, pareto_front, peers_svg, stash_curve

GIB = float(1 << 30)


def _result(name, kind, status="ok", peak=None, tps=None, budget=None):
    return {"name": name, "label": name, "kind": kind, "status": status, "reason": None,
            "peak_bytes": peak, "tokens_per_s": tps,
            "stash": {"budget_bytes": budget} if budget else None}


def test_a_peers_measured_peak_becomes_stashs_budget():
    results = [_result("keep-all", "keep-all", peak=1000, tps=10.0),
               _result("full-ac", "full-ac", peak=400, tps=7.0),
               _result("torchtune", "torchtune", status="unavailable"),
               _result("sac", "sac", status="failed"),
               _result("compile-0.5", "compile", peak=555, tps=9.0),
               _result("compile-whole", "compile", peak=900, tps=12.0),
               _result("compile-offload", "compile-offload", peak=800, tps=11.0)]
    rows = stash_systems(results, [85, 70])
    assert [(s.reference, s.budget) for s in rows] == [
        ("keep-all", 1000),                      # keep-all's own peak
        ("full-ac", 400), ("compile-0.5", 555),  # the peers that ran, their exact bytes
        ("compile-0.5", 555),                    # with the layers compiled
        ("compile-0.5", 555),                    # with the model compiled whole
        ("compile-whole", 900),
        ("compile-offload", 800),                # torch's offloading pass: eager stash,
        ("compile-offload", 800),                # and stash's compiled offload against it
        ("85%", 850), ("70%", 700),              # shares of keep-all's measured peak
        ("85% of compile-whole", 765), ("70% of compile-whole", 630)]
    assert all(isinstance(s, StashFit) and s.kind == "stash" for s in rows)
    assert [s.name for s in rows if s.compiled] == [
        "stash+compile@compile-0.5", "stash+whole@compile-0.5",
        "stash+whole@compile-offload", "stash+whole@85%", "stash+whole@70%"]
    # A peer that did not run gives no budget; without keep-all there are no shares.
    assert stash_systems(results[2:4], [85]) == []


def test_torchs_offloading_pass_offloads_what_the_partition_saves():
    """Note [torch's own offloading pass]: the compile-offload row's backend marks the
    joint graph so that torch's pass offloads the saved values it can move; run here in
    its synchronous form (device_put in the graph's order, CPU to CPU), the gradients are
    the eager ones."""
    import torch._functorch._activation_offloading.activation_offloading as ao
    from stash.bench._peer_systems import _backend

    chosen = []
    choose = ao.choose_offload_sets

    def spy(fwd, *args):
        out = choose(fwd, *args)
        chosen.append(sum(1 for n in fwd.graph.nodes if n.meta.get("saved_for_offloading")))
        return out

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    x = torch.randn(16, 64)
    m(x).square().sum().backward()
    eager = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    torch._dynamo.reset()
    try:
        ao.choose_offload_sets = spy
        torch.compile(m, backend=_backend(offload="sync"))(x).square().sum().backward()
    finally:
        ao.choose_offload_sets = choose
        torch._dynamo.reset()
    assert chosen and chosen[0] > 0, chosen
    for a, p in zip(eager, m.parameters()):
        torch.testing.assert_close(p.grad, a)


def test_systems_are_chosen_by_name_and_unknown_names_are_refused():
    systems = peer_systems([0.3, 0.5])
    assert [s.name for s in systems] == ["keep-all", "full-ac", "sac", "save_on_cpu",
                                         "torchtune", "compile-0.3", "compile-0.5",
                                         "compile-whole", "compile-offload"]
    assert [s.name for s in system_by_name(systems, ["keep-all", "sac"])] == ["keep-all", "sac"]
    with pytest.raises(ValueError, match="unknown system.*compile-0.9"):
        system_by_name(systems, ["compile-0.9"])


class _Refuses(System):
    def __init__(self):
        super().__init__("refuses", "refuses", "full-ac")

    def start(self, model, optimizer, device):
        raise RuntimeError("not installed here")


class _BreaksInForward(System):
    def __init__(self):
        super().__init__("breaks", "breaks", "sac")

    def start(self, model, optimizer, device):
        class S(Session):
            def forward(self):
                raise ValueError("broken hook")
        return S()


def test_a_peer_that_cannot_run_or_fails_keeps_its_row_with_the_reason():
    size = dict(_llama.SIZES["tiny"], layers=1, seq=16, batch=1)
    batches = _llama.data(size, 2, "cpu")
    r = peers.run_system(_Refuses(), size, batches, "cpu", CpuProfilerMeter(), 1)
    assert (r["status"], r["reason"]) == ("unavailable", "RuntimeError: not installed here")
    r = peers.run_system(_BreaksInForward(), size, batches, "cpu", CpuProfilerMeter(), 1)
    assert (r["status"], r["reason"]) == ("failed", "ValueError: broken hook")
    assert r["tokens_per_s"] is None and r["peak_bytes"] is None
    md = peers.table([r])
    assert "| breaks | - |" in md and "failed: ValueError: broken hook" in md


def test_size_auto_is_the_largest_llama_the_device_holds(monkeypatch):
    class Props:
        total_memory = 0

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: Props)
    for gib, size in ((141, "h200-fill"), (80, "h200"), (40, "tiny")):
        Props.total_memory = gib * 2**30
        assert _llama.size_for("cuda") == size, gib
    assert _llama.size_for("cpu") == "tiny"


def test_compiled_systems_side_by_side_run_their_own_graphs(monkeypatch):
    # Note [A compile backend per system]: two models compiled at different memory budgets
    # in one process save what their own budget partitions, not what the first compiled.
    size = dict(_llama.SIZES["tiny"], layers=1)
    ids = _llama.data(size, 1, "cpu")[0]
    models = [_llama.model(size, 0, "cpu") for _ in range(2)]
    sessions = [system.start(model, torch.optim.SGD(model.parameters()), "cpu")
                for system, model in zip((CompileBudget(0.3), CompileBudget(1.0)), models)]
    saved = []
    for model in models:  # both started first, as the interleaved rounds start them
        n = [0]

        def pack(t, n=n):
            n[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids, labels=ids).loss.backward()
        saved.append(n[0])
    for session in sessions:
        session.close()
    assert saved[0] < saved[1], saved
    # Side by side (Note [Ratios from interleaved steps]): a step that compiled a graph is
    # not timed, so the first round of each is left out.
    times = peers.time_interleaved([CompileBudget(0.3), CompileBudget(1.0)], size, "cpu",
                                   steps=3, warmup=0)
    assert {k: len(v) for k, v in times.items()} == {"compile-0.3": 2, "compile-1": 2}


def test_a_planned_step_that_compiled_is_not_the_measured_step_time():
    from stash.bench._peers_table import stash_summary

    def step(mode, ms, graphs=0):
        return {"mode": mode, "step_ms": ms, "compiles": graphs, "fit_peak_bytes": 1,
                "predicted_step_ms": 40.0, "predicted_peak_bytes": 2}

    report = {"budget_bytes": 3}
    steps = [step("measure", 900.0, 2), step("plan", 2000.0, 1), step("plan", 50.0),
             step("plan", 52.0)]
    assert stash_summary(report, steps)["measured_step_ms"] == 51.0
    # Only steps that compiled: their median still, rather than nothing.
    assert stash_summary(report, steps[:2])["measured_step_ms"] == 2000.0


def test_loss_rules():
    a = [2.0, 1.5, 1.25]
    assert peers.loss_check(list(a), a, compiled=False, dtype="float32")["ok"] is True
    off = [2.0, 1.5, 1.25 * (1 + 1e-6)]
    bit = peers.loss_check(off, a, compiled=False, dtype="float32")
    assert bit["ok"] is False and bit["max_rel_diff"] == pytest.approx(1e-6, rel=1e-3)
    assert peers.loss_check(off, a, compiled=True, dtype="float32")["ok"] is True  # <= 1e-4
    far = [2.0, 1.5, 1.25 * 1.001]
    assert peers.loss_check(far, a, compiled=True, dtype="float32")["ok"] is False
    assert peers.loss_check(far, a, compiled=True, dtype="bfloat16")["ok"] is True  # <= 1e-2


def test_knee_on_the_pareto_front():
    # (1, 1) is beaten by (1, 5) and (2, 0.5) by everything before it: off the front.
    pts = [(4, 10), (1, 1), (1, 5), (2, 0.5), (2, 9), (3, 9.5)]
    assert pareto_front(pts) == [(1, 5), (2, 9), (3, 9.5), (4, 10)]
    # Scaled to [0,1]: (0,0), (1/3,0.8), (2/3,0.9), (1,1); the chord is y = x, so the
    # distances are 0.467/sqrt2 and 0.233/sqrt2: the knee is (2, 9).
    assert knee(pts) == (2, 9)
    assert knee([(1, 1), (2, 2)]) is None
    assert knee([(1, 1), (2, 2), (3, 3)]) is None  # a straight line has none


def test_sac_policy_saves_every_other_mm_and_attention():
    from torch.utils.checkpoint import CheckpointPolicy

    mm = torch.ops.aten.mm.default
    assert mm in sac_save_list()
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in sac_save_list()

    class Ctx:
        is_recompute = False

    p, ctx = sac_policy(), Ctx()
    got = [p(ctx, mm) for _ in range(4)] + [p(ctx, torch.ops.aten.add.Tensor)]
    assert got == [CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE,
                   CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE,
                   CheckpointPolicy.PREFER_RECOMPUTE]
    ctx.is_recompute = True  # the recompute counts its own mms from one
    assert p(ctx, mm) == CheckpointPolicy.MUST_SAVE


def test_cpu_meter_sees_the_steps_allocations():
    from torch.profiler import ProfilerActivity, profile

    x = torch.ones(1 << 20)  # 4 MiB alive before: not the step's
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        a = torch.empty(1 << 20)   # +4 MiB
        b = torch.empty(1 << 21)   # +8 MiB: 12 MiB held
        del a                      # -4 MiB
        c = torch.empty(1 << 19)   # +2 MiB: 10 MiB
        del b, c
    assert peak_delta(prof) == 12 << 20
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert live_training_bytes(model, opt, x) == (16 + 4) * 4 + (4 << 20)


def test_svg_draws_what_ran():
    rows = [dict(_result("keep-all", "keep-all", peak=10 * GIB, tps=100.0), label="keep"),
            _result("s1", "stash", peak=5 * GIB, tps=80.0, budget=5 * GIB),
            _result("s2", "stash", peak=7 * GIB, tps=97.0, budget=7 * GIB),
            _result("s3", "stash", peak=9 * GIB, tps=99.0, budget=9 * GIB),
            _result("tt", "torchtune", status="unavailable")]
    assert stash_curve(rows) == [(5.0, 80.0), (7.0, 97.0), (9.0, 99.0)]
    svg = ET.fromstring(peers_svg(rows, "t", "s"))
    assert svg.tag.endswith("svg")
    text = ET.tostring(svg, encoding="unicode")
    assert "knee: 7.00 GiB, 97 tokens/s" in text
    assert "torchtune" not in text  # it did not run: the table says why, the plot omits it


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("peers")
    # Compiled rows keep their sequential figures here: interleaving them compiles every
    # compiled row's graphs again (test_compiled_systems_side_by_side_run_their_own_graphs).
    rc = peers.main(["--size", "tiny", "--steps", "4", "--warmup", "1", "--interleave", "2",
                     "--no-interleave-compiled", "--out", str(out)])
    return rc, out


def test_tiny_run_every_cpu_peer_runs_and_trains_as_keep_all(tiny_run):
    rc, out = tiny_run
    assert rc == 0
    doc = json.loads((out / "peers.json").read_text())
    rows = {r["name"]: r for r in doc["rows"]}
    assert doc["device"] == "cpu" and doc["torchtune"] == "0.6.1"
    for name in ["keep-all", "full-ac", "sac", "save_on_cpu", "compile-0.3", "compile-0.5",
                 "compile-0.7", "compile-whole"]:
        r = rows[name]
        assert r["status"] == "ok", (name, r["reason"])
        assert r["peak_bytes"] > 0 and r["tokens_per_s"] > 0 and len(r["losses"]) == 4
        if name != "keep-all":
            assert r["loss_check"]["ok"], (name, r["loss_check"])
            assert r["loss_check"]["rule"] == ("bitwise" if r["compiled"] is False
                                               else "rel <= 0.0001")
    # On a CPU torchtune's offloader cannot start (it takes CUDA streams): its row says so.
    tt = rows["torchtune"]
    assert tt["status"] == "unavailable" and "needs CUDA" in tt["reason"], tt["reason"]
    co = rows["compile-offload"]  # Note [torch's own offloading pass]
    assert co["status"] == "unavailable" and "needs CUDA" in co["reason"], co["reason"]
    keep = rows["keep-all"]["peak_bytes"]
    assert rows["full-ac"]["peak_bytes"] < rows["sac"]["peak_bytes"] < keep
    # save_on_cpu's copies are CPU tensors too: no less than keep-all's peak (Note [One
    # meter for every row]).
    assert rows["save_on_cpu"]["peak_bytes"] >= keep

    stash_rows = [r for r in doc["rows"] if r["kind"] == "stash"]
    # Each compile-B peak: eager, the layers compiled, the model compiled whole.
    peers_ran = ["full-ac", "sac", "save_on_cpu"] + [
        f"compile-{b}" for b in (0.3, 0.5, 0.7) for _ in range(3)] + ["compile-whole"]
    shares = ["85%", "70%", "55%"]
    assert [r["reference"] for r in stash_rows] == \
        ["keep-all"] + peers_ran + shares + [f"{s} of compile-whole" for s in shares]
    assert [r["compiled"] for r in stash_rows if r["reference"].startswith("compile-0")] == \
        [False, True, True] * 3
    assert [r["name"] for r in stash_rows if r["name"].startswith("stash+whole")] == \
        [f"stash+whole@compile-{b}" for b in (0.3, 0.5, 0.7)] + [
            f"stash+whole@{s}" for s in shares]
    # Note [Ratios from interleaved steps]: the eager rows' tokens/s are the interleaved
    # pass's; compiled rows keep their own.
    for r in doc["rows"]:
        if r["status"] == "ok":
            assert r.get("interleaved", False) is (not r["compiled"]), r["name"]
            assert r["timed_steps"] == (2 if not r["compiled"] else r["timed_steps"])
    for r in stash_rows:
        ref = rows.get(r["reference"])
        share = r["reference"].split("%")[0]
        of = rows["compile-whole"]["peak_bytes"] if "of compile-whole" in r["reference"] \
            else keep
        assert r["budget"] == (ref["peak_bytes"] if ref else round(of * float(share) / 100))
        if r["status"] != "ok":  # only a budget below what fit can train in
            assert r["infeasible"] and "smallest feasible budget" in r["reason"], r["reason"]
            continue
        if r["compiled"]:  # Note [Which losses must match] in _peers_table.py
            assert r["loss_check"]["ok"] is True, r["loss_check"]
        else:
            assert r["loss_check"] == {"rule": "bitwise", "max_rel_diff": 0.0, "ok": True}
        # Note [What the budget counts] in _fit_steps.py: on the CPU meter the canonical
        # model is exact or above at every position (Notes [Block 0's inputs in the CPU
        # meter's samples] in _fit_measure.py and [Fetched buffers die with their last view]
        # in _offload_hooks.py), so every planned step is within the budget, a plan's first
        # run included, and its prediction is at or above what it measured. (The first
        # run used to be allowed 5% over: 0.4% at 55% was seen.)
        budget = r["stash"]["budget_bytes"]
        planned = [s for s in r["steps"] if s["mode"] == "plan"]
        if r["name"].startswith("stash+whole") and planned[0]["check"] == "failed":
            # Note [A compiled plan's first run] in stash/torch/_compiled.py: a plan whose
            # first run failed its check is corrected; every step after it is within.
            assert planned[0]["fit_peak_bytes"] > budget, (r["label"], planned[0])
            planned = planned[1:]
        assert planned and all(s["fit_peak_bytes"] <= budget for s in planned), (
            r["label"], [s["fit_peak_bytes"] for s in planned], budget)
        # A compiled graph's positions are priced only as well as their calibration
        # (Note [A compiled plan's first run]): which plan a row makes depends on its
        # measured times, and one (stash+whole at compile-0.3's peak, 2026-12-07) ran 188
        # KB (0.74%) above its prediction, within its budget. Eager plans: exact or above.
        slack = 1.01 if r["name"].startswith("stash+whole") else 1.0
        assert planned[0]["fit_peak_bytes"] <= slack * planned[0]["predicted_peak_bytes"], (
            r["label"], planned[0])
        assert r["within_budget"] is (not r["name"].startswith("stash+whole")
                                      or all(s["fit_peak_bytes"] <= budget for s in r["steps"]))
        assert r["stash"]["predicted_peak_bytes"] > 0
        assert r["stash"]["predicted_step_ms"] > 0
    ok = {r["reference"] for r in stash_rows if r["status"] == "ok"}
    # Full checkpointing's peak is planned (Notes [Gradients by position] in
    # _fit_gradients.py and [The loss's position] in planner/model/plan.h), and so is keep-all's.
    assert {"85%", "70%", "save_on_cpu", "full-ac", "keep-all"} <= ok, ok
    # Offload and recompute move real memory on the double: below keep-all at 70%.
    assert next(r for r in stash_rows if r["reference"] == "70%")["peak_bytes"] < keep


def test_tiny_run_writes_a_table_and_a_plot(tiny_run):
    rc, out = tiny_run
    md = (out / "peers.md").read_text()
    doc = json.loads((out / "peers.json").read_text())
    for r in doc["rows"]:
        assert f"| {r['label']} |" in md
    assert "unavailable: RuntimeError: OffloadActivations needs CUDA" in md
    svg = ET.fromstring((out / "peers.svg").read_text())
    marks = [e for e in svg.iter() if e.tag.endswith(("circle", "polygon", "rect", "path"))]
    ran = [r for r in doc["rows"] if r["status"] == "ok"]
    assert len(marks) >= len(ran)


# ---- python -m stash.bench.fit: rows of the same harness ---------------------------------

def _fit_row(steps, budget=None):
    return {"status": "ok", "steps": steps,
            "stash": {"budget_bytes": budget} if budget is not None else None}


def test_fit_figures_hold_every_step_to_the_budget():
    from stash.bench.fit import fit_figures

    planned = [{"mode": "measure", "allocated_bytes": 90, "fit_peak_bytes": 80,
                "step_ms": 10.0, "predicted_step_ms": None, "predicted_peak_bytes": None},
               {"mode": "plan", "allocated_bytes": 100, "fit_peak_bytes": 95,
                "step_ms": 11.0, "predicted_step_ms": 10.0, "predicted_peak_bytes": 80},
               {"mode": "plan", "allocated_bytes": 99, "fit_peak_bytes": 95,
                "step_ms": 9.0, "predicted_step_ms": 10.0, "predicted_peak_bytes": 100}]
    # CUDA: the allocator's peak of every step, the measuring one included.
    f = fit_figures(_fit_row(planned, budget=100), cuda=True)
    assert f["step_peaks"] == [90, 100, 99] and f["peak_bytes"] == 100
    assert f["within_budget"] is True
    assert f["step_error"] == pytest.approx(0.1)   # median of |11/10 - 1|, |9/10 - 1|
    assert f["peak_error"] == pytest.approx(0.25)  # |100/80 - 1| beats |99/100 - 1|
    assert fit_figures(_fit_row(planned, budget=99), cuda=True)["within_budget"] is False
    # CPU: fit's own count.
    f = fit_figures(_fit_row(planned, budget=94), cuda=False)
    assert f["step_peaks"] == [80, 95, 95] and f["within_budget"] is False
    # A step without a reading is not within budget by default.
    missing = [dict(planned[0], allocated_bytes=None)] + planned[1:]
    assert fit_figures(_fit_row(missing, budget=1000), cuda=True)["within_budget"] is False
    # Each step against its own shape's budget where the report gives one.
    own = [dict(s, step_budget_bytes=b) for s, b in zip(planned, [90, 101, 99])]
    assert fit_figures(_fit_row(own, budget=50), cuda=True)["within_budget"] is True
    own[2]["step_budget_bytes"] = 98
    assert fit_figures(_fit_row(own, budget=1000), cuda=True)["within_budget"] is False
    # A lost step has no reading and counts as lost, not as over the budget.
    lost = planned + [{"lost": True, "wall_ms": None, "metered": False}]
    f = fit_figures(_fit_row(lost, budget=100), cuda=True)
    assert f["within_budget"] is True and f["lost_steps"] == 1 and f["measuring_steps"] == 1
    # keep-all: peaks and counts only.
    assert set(fit_figures(_fit_row(planned), cuda=True)) == {
        "step_peaks", "peak_bytes", "lost_steps", "measuring_steps"}


def test_bench_fit_tiny_run(tmp_path):
    from stash.bench import fit

    out = tmp_path / "fit"
    assert fit.main(["--size", "tiny", "--steps", "3", "--shares", "70", "--gib", "0.001",
                     "--out", str(out), "--device", "cpu"]) == 0
    doc = json.loads((out / "fit.json").read_text())
    keep, (share, refused) = doc["keep_all"], doc["runs"]
    assert keep["status"] == "ok" and keep["fit"]["peak_bytes"] is None  # no CPU allocator
    assert share["budget"] == "70%" and share["status"] == "ok"
    assert share["fit"]["within_budget"] and len(share["fit"]["step_peaks"]) == 3
    assert share["losses"] == keep["losses"]  # the same training, bit for bit
    assert share["fit"]["step_error"] is not None
    # Below the parameters and gradients: fit refuses it, and the run goes on.
    assert refused["status"] != "ok" and refused["reason"].startswith("StashError")
    md = (out / "fit.md").read_text()
    assert "| 70% (" in md and "no plan can meet it" in md


def test_bench_fit_new_lengths_and_a_fault(tmp_path):
    """Issue 20's GPU check, run here at the tiny size: a new length on most steps and one
    injected fault; every run skips the same step, plans the lengths it did not measure
    (at most two measuring steps), keeps each step within its own shape's budget, and
    trains bit for bit like keep-all."""
    from stash.bench import fit

    out = tmp_path / "fit"
    assert fit.main(["--size", "tiny", "--steps", "8", "--shares", "70", "--gib", "0.025",
                     "--lengths", "64-256", "--fault-at", "3", "--out", str(out),
                     "--device", "cpu"]) == 0
    doc = json.loads((out / "fit.json").read_text())
    assert doc["fault_at"] == 3 and len(set(doc["lengths"])) >= 5, doc["lengths"]
    keep = doc["keep_all"]
    assert keep["losses"][3] is None and keep["fit"]["lost_steps"] == 1
    for r in doc["runs"]:
        assert r["status"] == "ok", r["reason"]
        f = r["fit"]
        assert f["lost_steps"] == 1 and f["measuring_steps"] <= 2, f
        assert f["within_budget"], f
        assert r["losses"] == keep["losses"]
    assert "measuring / lost steps" in (out / "fit.md").read_text()
    # The wrong argument is named.
    with pytest.raises(SystemExit):
        fit.main(["--size", "tiny", "--lengths", "64-1024", "--device", "cpu",
                  "--out", str(out)])
