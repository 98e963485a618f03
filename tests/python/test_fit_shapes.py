"""stash.torch.fit across the shapes a training loop feeds it (Notes [What a share budget
means] in _fit_options.py and [A derived plan's first run] in _fit.py): a share budget
judged per shape, a new length on every step planned from the measured ones, and a
derived plan that fails its check measured next time. The models and batches are
test_fit_loops.py's (Hugging Face Mistral from a small config, on the CPU test double)."""

import pytest
import torch
import torch.nn as nn

import stash
import stash.torch

pytest.importorskip("transformers")

from test_fit_loops import (LINK, VOCAB, batches, mistral, same, stack_steps,  # noqa: E402
                            trained)


def test_a_share_budget_is_judged_per_shape():
    """Note [What a share budget means]: each step against its own shape's bytes."""
    model, blocks = mistral()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = batches(2, seq=32) + batches(2, seq=128) + batches(1, seq=32)
    with stash.torch.fit(blocks, "90%", optimizer=opt, link=LINK) as h:
        for ids in data:
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        steps = h.report()["steps"]
    short = {s["budget_bytes"] for s in steps if s["step"] in (0, 1, 4)}
    long = {s["budget_bytes"] for s in steps if s["step"] in (2, 3)}
    assert len(short) == 1 and len(long) == 1 and None not in short | long, steps
    assert long.pop() > short.pop()
    assert steps[0]["shape"] == steps[4]["shape"] != steps[2]["shape"]


LENGTHS = [32, 128, 48, 96, 40, 112, 56, 80, 64, 120, 36, 100, 72, 88, 44, 104, 60, 124]


def test_a_new_length_every_step_is_planned_from_the_measured_ones():
    """Note [A profile derived from the measured shapes]: 18 lengths from 32 to 128 (4x),
    every one new: two measuring steps, every other step planned from a derived profile
    whose first run passes its check, every step within its shape's budget, bitwise."""
    g = torch.Generator().manual_seed(3)
    data = [torch.randint(0, VOCAB, (2, s), generator=g) for s in LENGTHS]

    def go(budget):
        model, blocks, opt, h = trained(budget)
        losses = []
        for ids in data:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach().clone())
        return losses, [p.detach().clone() for p in model.parameters()], h

    expected = go(None)
    got = go("90%")
    same(got, expected)
    steps = got[2].report()["steps"]
    assert [s["mode"] for s in steps].count("measure") == 2, steps
    derived = [s for s in steps if s["plan_source"] == "derived"]
    assert len(derived) == len(LENGTHS) - 2, steps
    assert all(s["check"] == "passed" for s in derived), [s["check"] for s in derived]
    assert all(s["budget_bytes"] and not s["over_budget"] for s in steps), steps
    # On the allocator's meter, at most the derived plan's prediction (which is
    # conservative: the untracked bytes at worst, scaled with the tokens).
    assert all(s["measured_peak_bytes"] <= s["predicted_peak_bytes"] for s in derived), derived
    got[2].close()


class _Lengthy(nn.Module):
    """A block that saves one more tensor for sequences longer than 100."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x):
        y = torch.tanh(self.fc(x))
        if x.shape[1] > 100:
            y = torch.sigmoid(y) * y
        return x + y


def test_a_derived_plan_that_fails_its_check_is_measured_next_time():
    """Note [A derived plan's first run]: a shape whose blocks save what the skeleton of
    the measured shapes does not list is measured the next time it comes."""
    torch.manual_seed(0)
    blocks = nn.ModuleList([_Lengthy() for _ in range(4)])
    opt = torch.optim.SGD(blocks.parameters(), lr=0.1)
    with stash.torch.fit(blocks, "95%", optimizer=opt, link=LINK) as h:
        stack_steps(blocks, opt, [(8, s, 32) for s in (32, 64, 128, 128, 128)])
        steps = h.report()["steps"]
    assert [s["mode"] for s in steps] == ["measure", "measure", "plan", "measure", "plan"], steps
    assert steps[2]["plan_source"] == "derived" and "saved" in steps[2]["check"], steps[2]
    assert steps[4]["plan_source"] == "measured" and steps[4]["check"] is None
