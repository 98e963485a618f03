"""stash.torch.fit with the gradients counted where they are made (Note [Gradients by
position] in stash/torch/_fit_gradients.py) and the loss's own position (Note [The loss's
position] in planner/model/plan.h): a byte budget at full activation checkpointing's peak on the
c10 allocator's meter is planned and kept, where a profile that holds every gradient from
the start, with the loss's bytes beside the last layer's replay, was refused. CPU test
double; a Hugging Face Mistral from a small config, bitwise against plain training."""

import pytest
import torch
import torch.utils.checkpoint

import stash
import stash.torch
from stash.torch._meter import meter_for

from test_fit_loops import LINK, batches, mistral, same

transformers = pytest.importorskip("transformers")


def _run(budget=None, checkpoint=False, set_to_none=True, steps=5):
    """Trains a fresh Mistral; (losses, parameters), the meter's peak of each step, and
    fit's handle (None without a budget)."""
    model, blocks = mistral()
    if checkpoint:
        for b in blocks:
            forward = b.forward
            b.forward = (lambda *a, forward=forward, **k: torch.utils.checkpoint.checkpoint(
                forward, *a, use_reentrant=False, **k))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    h = stash.torch.fit(blocks, budget, optimizer=opt, link=LINK) if budget else None
    meter = meter_for("cpu")
    meter.begin_run()
    losses, peaks = [], []
    for i, ids in enumerate(batches(steps)):
        with meter.step(i, steps, model, opt, ids):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=set_to_none)
        losses.append(loss.detach().clone())
        peaks.append(meter.last["allocated"])
    return (losses, [p.detach().clone() for p in model.parameters()]), peaks, h


def test_a_budget_at_full_checkpointings_peak_is_planned_and_kept():
    _, ac_peaks, _ = _run(checkpoint=True)
    budget = max(ac_peaks[1:])  # from step 1 on AdamW's state exists
    expected, _, _ = _run()
    got, peaks, h = _run(budget)
    same(got, expected)
    steps = h.report()["steps"]
    assert [s["mode"] for s in steps] == ["measure"] + ["plan"] * 4, steps
    # Every step within the budget on the meter users read, and on fit's own reading.
    assert all(p <= budget for p in peaks), (peaks, budget)
    assert all(not s["over_budget"] for s in steps), steps
    entry = h._plans.cache[h._plans.key]
    assert entry["without_gradients"] is True
    h.close()


def test_a_loop_that_keeps_its_gradients_is_planned_with_all_of_them():
    """zero_grad(set_to_none=False): the gradients are alive from block 0 on, so the plan is
    made on the profile as stored, and the meter still agrees with the budget."""
    _, ac_peaks, _ = _run(checkpoint=True, set_to_none=False)
    _, keep_peaks, _ = _run(set_to_none=False)
    budget = (max(ac_peaks[1:]) + max(keep_peaks[1:])) // 2
    got, peaks, h = _run(budget, set_to_none=False)
    expected, _, _ = _run(set_to_none=False)
    same(got, expected)
    assert all(p <= budget for p in peaks[1:]), (peaks, budget)
    assert h._plans.cache[h._plans.key]["without_gradients"] is False
    h.close()


def test_the_profile_places_the_loss_and_the_gradients():
    """The measured profile's loss position and its view without gradients: the loss's
    bytes leave the last layer's temporaries, and the view's fixed bytes are the stored
    ones less every gradient, which reappear in the backward temporaries as they are made
    (layer 0's backward, the last, sees the most)."""
    _, _, h = _run("90%", steps=2)
    doc = h.profile
    g = doc["measurement"]["gradients"]
    assert doc["loss_bytes"] > 0
    assert g["fixed_bytes"] <= doc["fixed_bytes"] - g["bytes"] + 1
    temps = g["bwd_temp_bytes"]
    assert temps[0] > temps[-1]
    assert temps[0] - doc["layers"][0]["bwd_temp_bytes"] > g["bytes"] // 2
    h.close()
