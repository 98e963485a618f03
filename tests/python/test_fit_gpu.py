"""GPU: stash.torch.fit on a Hugging Face Llama in bf16 with SDPA, on the real runtime.

ctest `python.fit_gpu` (label gpu) runs this file in a process of its own, with torch's
own CUDA allocator (test_offload_gpu.py installs stash's); without a
device, or without transformers, it skips with the marker ctest's SKIP_REGULAR_EXPRESSION
looks for. Every step's torch.cuda.max_memory_allocated(), the measuring step's
included, must be within the budget, the planned steps must offload, and the losses must
follow keep-all's (bf16: to a tolerance; the math SDPA kernel keeps both runs
deterministic).
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("[ STASH NO DEVICE ] torch sees no CUDA device", allow_module_level=True)
try:
    import transformers
except ImportError:
    pytest.skip("[ STASH NO DEVICE ] transformers is not installed (tools/gpu-carry.sh carries "
                "it)", allow_module_level=True)

import stash.torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

STEPS = 4


def _model(layers=6):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=8192, hidden_size=1024, intermediate_size=4096, num_hidden_layers=layers,
        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048,
        use_cache=False, attn_implementation="sdpa")
    with torch.device("cuda"):
        m = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    m.train()
    return m


def _train(budget=None):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    h = stash.torch.fit(model.model.layers, budget, optimizer=opt) if budget else None
    g = torch.Generator().manual_seed(1)
    losses, peaks = [], []
    with sdpa_kernel(SDPBackend.MATH):
        for _ in range(STEPS):
            ids = torch.randint(0, 8192, (4, 2048), generator=g).cuda()
            torch.cuda.reset_peak_memory_stats()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated())
            losses.append(loss.item())
    report = h.report() if h else None
    if h:
        h.close()
    return losses, peaks, report


def test_fit_meets_the_budget_on_a_llama_in_bf16():
    keep_losses, keep_peaks, _ = _train()
    losses, peaks, report = _train("70%")
    budget = report["budget_bytes"]
    assert budget < max(keep_peaks)
    assert [s["mode"] for s in report["steps"]] == ["measure"] + ["plan"] * (STEPS - 1)
    for p, s in zip(peaks, report["steps"]):
        assert p <= budget, (p, budget, s)
        assert s["measured_peak_bytes"] <= budget
    # On an H200 this model's layers are cheap to recompute against their bytes over the
    # link (55 GB/s), so the plan may recompute only; it must change something.
    actions = report["plan"]["actions"]
    print(f"\nfit at 70% on a 6-layer Llama: {actions}, peaks {peaks}, budget {budget}")
    assert actions["offload"] + actions["recompute"] > 0, report["plan"]
    assert report["timing"] == "cuda-events"
    for a, b in zip(keep_losses, losses):
        assert abs(a - b) <= 2e-2 * abs(a), (keep_losses, losses)


LENGTHS = [1024, 2048, 768, 1536, 1280, 512, 1792, 896, 1152, 640, 1920, 1408]
LOST = 5  # the step that raises inside block 1


class _Injected(Exception):
    pass


def _train_lengths(budget=None):
    """A new length on most steps and one step lost to an exception (issue 20's GPU part):
    the losses, every step's max_memory_allocated, the tokens/s after two steps, and fit's
    report."""
    import time

    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    h = stash.torch.fit(model.model.layers, budget, optimizer=opt) if budget else None
    armed = [False]

    def fail(*_):
        if armed[0]:
            raise _Injected()

    model.model.layers[1].mlp.register_forward_hook(fail)
    g = torch.Generator().manual_seed(2)
    losses, peaks, tokens, seconds = [], [], 0, 0.0
    with sdpa_kernel(SDPBackend.MATH):
        for step, seq in enumerate(LENGTHS):
            ids = torch.randint(0, 8192, (2, seq), generator=g).cuda()
            armed[0] = step == LOST
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            try:
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                losses.append(loss.item())
            except _Injected:
                losses.append(None)
            armed[0] = False
            opt.zero_grad()
            torch.cuda.synchronize()
            if step >= 2 and step != LOST:
                seconds += time.perf_counter() - t0
                tokens += ids.numel()
            peaks.append(torch.cuda.max_memory_allocated())
    report = h.report() if h else None
    if h:
        # What the next reader of a failure needs: each measured shape's fixed bytes and
        # what was measured beside the blocks (the derived plans scale from these).
        for key, entry in h._plans.cache.items():
            doc = entry.get("profile")
            if doc is not None and not entry.get("derived"):
                print(f"\nmeasured shape {key}: fixed_bytes {doc['fixed_bytes']}, loss_bytes "
                      f"{doc.get('loss_bytes')}, measurement {doc.get('measurement')}, "
                      f"layer 0 bwd_temp_bytes {doc['layers'][0]['bwd_temp_bytes']}, saved "
                      f"{sum(t['bytes'] for t in doc['layers'][0]['tensors'])}")
        h.close()
    return losses, peaks, tokens / seconds, report


def test_fit_keeps_the_budget_through_lengths_and_a_lost_step():
    keep_losses, _, keep_tps, _ = _train_lengths()
    losses, peaks, tps, report = _train_lengths("70%")
    steps = report["steps"]
    assert len(steps) == len(LENGTHS)
    assert [s["step"] for s in steps if s["aborted"]] == [LOST], steps
    measuring = sum(s["mode"] == "measure" for s in steps if not s["aborted"])
    over = [(i, p, s["budget_bytes"]) for i, (p, s) in enumerate(zip(peaks, steps))
            if not s["aborted"] and p > s["budget_bytes"]]
    print(f"\nfit at 70% through {len(LENGTHS)} lengths and a lost step: {measuring} measuring "
          f"steps, {len(over)} over budget, {tps:.0f} tokens/s against keep-all's "
          f"{keep_tps:.0f} ({tps / keep_tps:.1%})")
    for s, p in zip(steps, peaks):
        print(f"  step {s['step']}: {s['mode']} {s.get('plan_source')} peak {p} "
              f"(fit {s['measured_peak_bytes']}, predicted {s['predicted_peak_bytes']}) "
              f"budget {s['budget_bytes']} check {s.get('check')}")
    assert measuring <= 2, steps
    assert not over, over
    for a, b in zip(keep_losses, losses):
        assert (a is None) == (b is None)
        if a is not None:
            assert abs(a - b) <= 2e-2 * abs(a), (keep_losses, losses)


def test_whole_model_compile_offloads_within_the_budget():
    """Issue 21 (Note [Offload in the compiled graph] in stash/torch/_compiled_offload.py):
    fit under torch.compile(model) at 70% of compiled keep-all's peak. The plan offloads
    some of the graph's saved values, every planned step's max_memory_allocated is within
    the budget and below keep-all's, and the losses follow compiled keep-all's (bf16)."""
    def go(budget):
        torch._dynamo.reset()
        model = _model(layers=3)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        h = stash.torch.fit(model.model.layers, budget, optimizer=opt) if budget else None
        cm = torch.compile(model)
        g = torch.Generator().manual_seed(1)
        losses, peaks = [], []
        for _ in range(5):
            ids = torch.randint(0, 8192, (4, 1024), generator=g).cuda()
            torch.cuda.reset_peak_memory_stats()
            loss = cm(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated())
            losses.append(loss.item())
        report = h.report() if h else None
        compiled = h._compiled_st.report() if h else None
        if h:
            h.close()
        return losses, peaks, report, compiled

    ref_losses, ref_peaks, _, _ = go(None)
    keep = max(ref_peaks[1:])
    budget = int(0.7 * keep)
    losses, peaks, report, compiled = go(budget)
    print(f"\nwhole-model compile at {budget} bytes: steps {report['steps']}, compiled "
          f"{compiled}, peaks {peaks}, torch {torch.__version__}")
    assert [s["mode"] for s in report["steps"]] == ["measure", "measure", "plan", "plan",
                                                    "plan"], report["steps"]
    assert compiled["offloaded"].get(1), compiled  # the plan's graph offloads
    assert compiled["guarded"] == 0, compiled
    for p in peaks[2:]:
        assert p <= budget, (peaks, budget)
        assert p < keep, (peaks, keep)
    for a, b in zip(ref_losses, losses):
        assert abs(a - b) <= 2e-2 * abs(a), (ref_losses, losses)


# --- issue 23 §3: fit under CUDA graphs (Note [Steps under CUDA graphs] in
# stash/torch/_offload_hooks.py). Prepared without a GPU; the CPU tests in
# test_fit_graphs.py cover the capture-safety of the hooks through the double.

GRAPH_STEPS = 4


def _graph_run(budget, capture):
    """fit at `budget` on a Llama with SGD: two eager steps (measure, plan), then
    GRAPH_STEPS steps either eager or as replays of one torch.cuda.graph capture of the
    whole step. The losses, the parameters, the peak over the last steps, the report."""
    model = _model(layers=4)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    h = stash.torch.fit(model.model.layers, budget, optimizer=opt)
    g = torch.Generator().manual_seed(3)
    data = [torch.randint(0, 8192, (4, 1024), generator=g).cuda()
            for _ in range(2 + GRAPH_STEPS)]
    static_ids = data[0].clone()
    losses = []

    def step():
        loss = model(input_ids=static_ids, labels=static_ids).loss
        loss.backward()
        opt.step()
        return loss

    with sdpa_kernel(SDPBackend.MATH):
        for ids in data[:2]:
            static_ids.copy_(ids)
            losses.append(step().item())
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        if capture:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_loss = step()
            for ids in data[2:]:
                static_ids.copy_(ids)
                graph.replay()
                losses.append(static_loss.item())
        else:
            for ids in data[2:]:
                static_ids.copy_(ids)
                losses.append(step().item())
                opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    params = [p.detach().clone() for p in model.parameters()]
    report, plan = h.report(), h.plan
    if capture:
        held = h.release_graphs()
        assert held > 0, "a captured offloading step holds pinned slots until released"
        del graph
    h.close()
    return losses, params, peak, report, plan


def _recomputes(plan):
    return any(t["action"] == "recompute" for layer in plan["layers"] for t in layer["tensors"])


def test_fit_under_a_captured_training_step_replays_the_eager_plan():
    # 70% first; a plan that recomputes is refused under capture (torch cannot read the
    # CUDA RNG state then), so a higher share is tried for a plan that only offloads. A
    # share below the least-memory step's peak is refused (the logits of a 4-layer model
    # weigh much against its layers): the next one is tried.
    for budget in ("70%", "80%", "85%", "95%"):
        try:
            eager = _graph_run(budget, capture=False)
        except stash.StashError as e:
            if "no plan fits the budget" not in str(e):
                raise
            print(f"\n{budget}: {e}")
            torch.cuda.empty_cache()
            continue
        plan = eager[4]
        if not _recomputes(plan):
            break
        with pytest.raises(stash.StashError, match="recomputes"):
            _graph_run(budget, capture=True)
        torch.cuda.empty_cache()
    else:
        pytest.fail("no budget gave a plan without recompute: nothing capturable was tried")
    assert sum(t["action"] == "offload" for layer in plan["layers"]
               for t in layer["tensors"]) > 0, plan
    graphed = _graph_run(budget, capture=True)
    losses, params, peak, report, _ = graphed
    budget_bytes = report["budget_bytes"]
    print(f"\nfit at {budget} under torch.cuda.graph: peak {peak} bytes against the eager "
          f"plan's {eager[2]} and the budget {budget_bytes}")
    # Not bitwise: on an H200 two replays differed from the eager steps in the 5th digit
    # (9.216169 against 9.216017 at the fourth step), as eager runs of the embedding's
    # atomic backward differ from each other.
    for a, b in zip(losses, eager[0]):
        assert abs(a - b) <= 1e-4 * abs(b), (losses, eager[0])
    assert all(torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-3)
               for a, b in zip(params, eager[1]))
    assert peak <= budget_bytes, (peak, budget_bytes)
    # Only the eager steps are fit's steps; the captured one and its replays are not.
    assert [s["mode"] for s in report["steps"]] == ["measure", "plan"]


def test_make_graphed_callables_on_the_blocks_is_refused_by_name():
    from models import Block

    torch.manual_seed(0)
    blocks = torch.nn.ModuleList([Block(1024, 8, 4096) for _ in range(4)]).cuda()
    h = stash.torch.fit(blocks, "85%")  # any plan with copies; 85% stays above least memory
    x = torch.randn(8, 1024, 1024, device="cuda", requires_grad=True)

    def loss():
        y = x
        for b in blocks:
            y = b(y)
        return y.square().mean()

    for _ in range(4):  # the measuring step, then planned ones
        loss().backward()
        if h.plan is not None:
            break
    assert h.plan is not None, h.report()["steps"]
    copies = any(t["action"] != "keep" for layer in h.plan["layers"] for t in layer["tensors"])
    assert copies, h.plan
    with pytest.raises(stash.StashError, match="make_graphed_callables"):
        torch.cuda.make_graphed_callables(tuple(blocks), tuple((x,) for _ in blocks))
    h.close()
