"""What a CUDA measuring step's meter readings become in the profile, checked on a profile
the CPU test double measured (the CUDA path itself needs a GPU: test_fit_gpu.py).

Note [The measuring step's windows on CUDA] in stash/torch/_fit_cuda_meter.py: the blocks'
window gives the fixed bytes and the loss's window the loss_bytes, so that the canonical
model prices the measured actions at the windows' peaks. Note [What stays the same across
shapes] in stash/torch/_fit_shapes.py: a derived shape scales only what lies above the
bytes no shape changes."""

import json

import pytest
import torch

import stash
import stash.torch
from stash._planner import evaluate
from stash.torch._fit_measure import fixed_bytes_cuda, made_from_parameters
from stash.torch._fit_options import Budget
from stash.torch._fit_plan import plan_derived
from stash.torch._fit_shapes import derive_profile
from stash.torch._fit_support import _plan_doc

pytest.importorskip("transformers")

from test_fit_loops import batches, trained  # noqa: E402


@pytest.fixture(scope="module")
def measured():
    """A Mistral's profile from fit's measuring step, and the actions that step ran."""
    model, _, opt, h = trained("90%")
    ids = batches(1)[0]
    model(input_ids=ids, labels=ids).loss.backward()
    seen = h._recorder.actions_seen()
    opt.step()
    opt.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()  # block 0 records the measured step
    key = next(iter(h._plans.cache))
    doc = json.loads(json.dumps(h._plans.cache[key]["profile"]))
    h.close()
    for k in ("loss_bytes", "optimizer_bytes"):
        doc.pop(k, None)
    return doc, seen


def _peak(doc, seen):
    return evaluate(doc, _plan_doc(doc, seen), 1 << 62, strict=False)["predicted_peak_bytes"]


@pytest.mark.parametrize("loss_above", [0, 3 << 20, 40 << 20])
def test_the_windows_give_a_profile_that_prices_the_measured_step_at_its_peak(measured,
                                                                             loss_above):
    doc, seen = measured
    act = _peak(dict(doc, fixed_bytes=0), seen)
    blocks = 50 << 20
    loss = blocks - act + loss_above  # what the loss's window read
    fixed, loss_bytes = fixed_bytes_cuda(doc, blocks, loss, seen, counted=0,
                                         missing_optimizer_state=0)
    assert fixed == blocks - act
    out = dict(doc, fixed_bytes=fixed, loss_bytes=loss_bytes)
    # The model prices the measured actions at the larger window, the loss's when it
    # held more than any block position.
    assert _peak(out, seen) == max(blocks, loss), (loss_bytes, loss_above)
    # Without the loss's window its bytes are the fixed bytes' (everywhere), as before.
    assert fixed_bytes_cuda(doc, max(blocks, loss), None, seen, 0, 0)[1] == 0


def test_a_derived_shape_scales_only_what_lies_above_the_constant_bytes(measured):
    doc, _ = measured
    constant, per_token = 30 << 20, 200_000

    def at(tokens):
        return dict(json.loads(json.dumps(doc)),
                    fixed_bytes=constant + per_token * tokens)

    bases = [(128, at(128), constant), (256, at(256), constant)]
    assert derive_profile(bases, 96)["fixed_bytes"] == pytest.approx(
        constant + per_token * 96, abs=2)
    # Scaled from fit's smaller count instead, the constant shrinks with the tokens: the
    # under-prediction an H200 showed before constant_bytes (Note [What stays the same
    # across shapes]).
    counted = 10 << 20
    low = derive_profile([(t, p, counted) for t, p, _ in bases], 96)["fixed_bytes"]
    assert low < constant + per_token * 96 - (1 << 20)


def test_a_parameters_copy_is_told_from_what_grows_with_the_tokens():
    """Note [Saved tensors someone else holds] in _fit_measure.py: a weight's bf16 copy and
    its transpose are copies of a parameter; an embedding's output (whose backward lists
    only its weight), a product with an input, a leaf input's copy are not."""
    lin = torch.nn.Linear(8, 8)
    emb = torch.nn.Embedding(16, 8)
    x = torch.randn(4, 8, requires_grad=True)
    assert made_from_parameters(lin.weight.to(torch.bfloat16))
    assert made_from_parameters(lin.weight.t().to(torch.bfloat16).contiguous().view(-1))
    assert not made_from_parameters(emb(torch.tensor([1, 2, 3])))
    assert not made_from_parameters(lin(x))
    assert not made_from_parameters(x.to(torch.bfloat16))
    assert not made_from_parameters(lin.weight * 2)


def test_a_derived_shape_keeps_the_bytes_of_a_parameters_copy(measured):
    """A tensor the measurement lists as constant keeps its bytes in every derived
    shape, from one base as from two; the rest scale with the tokens."""
    doc, _ = measured
    base = json.loads(json.dumps(doc))
    base["measurement"]["constant_tensors"] = [[0, 1]]
    one = derive_profile([(128, base, 0)], 64)
    assert one["layers"][0]["tensors"][1]["bytes"] == base["layers"][0]["tensors"][1]["bytes"]
    other = base["layers"][0]["tensors"][2]["bytes"]
    assert one["layers"][0]["tensors"][2]["bytes"] == pytest.approx(other / 2, abs=1)
    base["measurement"]["constant_tensors"] = []
    assert derive_profile([(128, base, 0)], 64)["layers"][0]["tensors"][1]["bytes"] == (
        pytest.approx(doc["layers"][0]["tensors"][1]["bytes"] / 2, abs=1))


def test_a_derived_plan_leaves_its_margin_free(measured):
    """Note [What a derived plan leaves free] in _fit_shape_plans.py: planned at the
    budget less the margin, judged against the budget."""
    doc, _ = measured
    bases = [(128, json.loads(json.dumps(doc)), 0)]
    _, _, at = plan_derived(bases, 128, Budget.parse("95%"), "greedy")
    _, _, free = plan_derived(bases, 128, Budget.parse("95%"), "greedy", margin=0.1)
    assert free["budget_bytes"] == at["budget_bytes"]
    assert free["predicted_peak_bytes"] <= 0.9 * at["budget_bytes"] < at["predicted_peak_bytes"]
    # Where no plan fits the budget less the margin, the plan at the budget stands.
    _, _, none = plan_derived(bases, 128, Budget.parse("95%"), "greedy", margin=0.9)
    assert none["predicted_peak_bytes"] == at["predicted_peak_bytes"]


def test_the_cuda_meter_reads_a_measuring_step_in_windows(monkeypatch):
    """_fit_cuda_meter.CudaMeter against a scripted max_memory_allocated: the windows a
    measuring step closes (blocks, loss, optimizer.step()) and the step's peak."""
    from stash.torch._fit_cuda_meter import CudaMeter
    from stash.torch._fit_support import StepRecord

    meter = {"peak": 0}
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: meter["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda device=None: meter.update(peak=0))
    m = CudaMeter(torch.device("cuda", 0), pool=False)

    rec = StepRecord(0, "measure", "k", None)
    rec.windows = {}
    meter["peak"] = 100
    m.blocks_ended(rec)   # the forwards
    meter["peak"] = 150
    m.loss_ended(rec)     # the head and the loss, until the last block's backward
    meter["peak"] = 90
    m.optimizer_begins(rec)  # the backwards
    meter["peak"] = 120   # optimizer.step()
    assert m.step_peak(rec) == 150
    assert rec.windows == {"blocks": 100, "loss": 150}
    assert rec.before_optimizer_peak == 150 and rec.optimizer_peak == 120

    # Without the optimizer known: the step ends at its backward, in the blocks' window.
    rec = StepRecord(1, "measure", "k", None)
    rec.windows = {}
    meter["peak"] = 70
    m.blocks_ended(rec)
    meter["peak"] = 80
    m.loss_ended(rec)
    meter["peak"] = 60
    assert m.step_peak(rec) == 80 and rec.optimizer_peak is None
    assert rec.windows == {"blocks": 70, "loss": 80}

    # A planned step has no windows: the one peak, and nothing else is touched.
    rec = StepRecord(2, "plan", "k", None)
    meter["peak"] = 55
    m.blocks_ended(rec)
    m.loss_ended(rec)
    m.optimizer_begins(rec)
    assert m.step_peak(rec) == 55 and rec.windows is None and meter["peak"] == 55
