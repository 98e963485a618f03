"""stash.torch.fit across the shapes a training loop feeds it (Notes [What a share budget
means] in _fit_options.py and [A derived plan's first run] in _fit_shape_plans.py): a
share budget judged per shape, a new length on every step planned from the measured ones,
and a derived plan that fails its check measured next time. The models and batches are
test_fit_loops.py's (Hugging Face Mistral from a small config, on the CPU test double)."""

import functools

import pytest
import torch
import torch.nn as nn

import stash
import stash.torch

pytest.importorskip("transformers")

from test_fit import train  # noqa: E402
from test_fit_loops import (LINK, VOCAB, batches, mistral, same, stack_steps,  # noqa: E402
                            trained)


def train_on(data, budget, **options):
    """A fresh Mistral trained on `data` (test_fit.train's AdamW steps) under fit at
    `budget` (None: plain training) with fit's other `options`: the losses, the final
    parameters and the handle."""
    model, blocks = mistral()

    def fit(opt):
        return stash.torch.fit(blocks, budget, optimizer=opt, link=LINK, **options)
    return train(model, data, fit if budget else None)


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


@functools.lru_cache(maxsize=1)
def _lengths_run():
    """The batches of LENGTHS and their plain training (shared by the tests below)."""
    g = torch.Generator().manual_seed(3)
    data = [torch.randint(0, VOCAB, (2, s), generator=g) for s in LENGTHS]
    return data, train_on(data, None)


def test_a_short_shape_a_share_cannot_hold_runs_at_a_longer_shapes_bytes():
    """Note [What a share budget means]: at a share a short sequence cannot be planned at
    (its parameters, gradients and optimizer state weigh more against its few
    activations), the short shape, measured or derived, is planned at the budget in bytes
    the share gave the longer shapes, not refused; every step within its budget and the
    losses bitwise with plain training."""
    data = (batches(1, seq=256) + batches(1, seq=192, seed=2) + batches(1, seq=16, seed=3)
            + batches(1, seq=24, seed=4) + batches(1, seq=256, seed=5))
    expected = train_on(data, None)
    got = train_on(data, "60%")
    same(got, expected)
    steps = got[2].report()["steps"]
    got[2].close()
    seq = [int(ids.shape[1]) for ids in data]
    longest = max(s["budget_bytes"] for s in steps if seq[s["step"]] >= 192)
    short = [s for s in steps if seq[s["step"]] < 64]
    assert short and all(s["budget_bytes"] == longest for s in short), steps
    assert not any(s["over_budget"] for s in steps), steps


def test_a_new_length_every_step_is_planned_from_the_measured_ones():
    """Note [A profile derived from the measured shapes]: 18 lengths from 32 to 128 (4x),
    every one new: two measuring steps, every other step planned from a derived profile
    whose first run passes its check, every step within its shape's budget, bitwise."""
    data, expected = _lengths_run()
    got = train_on(data, "90%")
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


def test_lengths_rounded_up_to_buckets_share_their_buckets_plans():
    """Note [Lengths rounded up to a bucket] in _fit_shapes.py: the same 18 lengths with
    buckets=32: the two measured shapes run their own plans, every other length its
    bucket's (64, 96 or 128), derived once each and checked on its first run; every step
    within its budget and at most its plan's prediction on the meter, bitwise."""
    data, expected = _lengths_run()
    got = train_on(data, "90%", buckets=32)
    same(got, expected)
    steps = got[2].report()["steps"]
    got[2].close()
    assert [s["mode"] for s in steps].count("measure") == 2, steps
    planned = [(s, int(ids.shape[1])) for s, ids in zip(steps, data) if s["mode"] == "plan"]
    by_bucket = {}
    for s, length in planned:
        by_bucket.setdefault(-(-length // 32) * 32, set()).add(s["shape"])
    assert sorted(by_bucket) == [64, 96, 128], by_bucket
    assert all(len(keys) == 1 for keys in by_bucket.values()), by_bucket
    assert len(set.union(*by_bucket.values())) == 3
    assert all(s["plan_source"] == "derived" for s, _ in planned), steps
    assert [s["check"] for s, _ in planned].count("passed") == 3, steps
    assert all(s["budget_bytes"] and not s["over_budget"] for s in steps), steps
    assert all(s["measured_peak_bytes"] <= s["predicted_peak_bytes"] for s, _ in planned)


def test_buckets_are_lengths():
    """fit(buckets=): a multiple or a list of lengths; anything else is named."""
    from stash.torch._fit_shapes import bucket_length
    assert [bucket_length(n, 64) for n in (1, 64, 65, 300)] == [64, 64, 128, 320]
    assert [bucket_length(n, (128, 512)) for n in (1, 128, 129, 512, 513)] == [
        128, 128, 512, 512, None]
    blocks = nn.ModuleList([nn.Linear(4, 4)])
    for bad in (0, -64, "64", [], [64, 0], 64.0, True):
        with pytest.raises(stash.StashError, match="buckets must be"):
            stash.torch.fit(blocks, "1GiB", link=LINK, buckets=bad)
    stash.torch.fit(blocks, "1GiB", link=LINK, buckets=[512, 128]).close()


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
    """Note [A derived plan's first run] in _fit_shape_plans.py: a shape whose blocks save
    what the skeleton of the measured shapes does not list is measured the next time it
    comes."""
    torch.manual_seed(0)
    blocks = nn.ModuleList([_Lengthy() for _ in range(4)])
    opt = torch.optim.SGD(blocks.parameters(), lr=0.1)
    with stash.torch.fit(blocks, "95%", optimizer=opt, link=LINK) as h:
        stack_steps(blocks, opt, [(8, s, 32) for s in (32, 64, 128, 128, 128)])
        steps = h.report()["steps"]
    assert [s["mode"] for s in steps] == ["measure", "measure", "plan", "measure", "plan"], steps
    assert steps[2]["plan_source"] == "derived" and "saved" in steps[2]["check"], steps[2]
    assert steps[4]["plan_source"] == "measured" and steps[4]["check"] is None


def _smallest_named(error):
    import re
    return int(re.search(r"smallest feasible budget .*? \((\d+) bytes\)", str(error)).group(1))


def _loop_that_skips_runtime_errors(model, opt, data):
    """A loop that skips a batch on RuntimeError, as loops that skip out-of-memory
    batches do; the steps it skipped."""
    skipped = []
    for i, ids in enumerate(data):
        try:
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
        except RuntimeError:
            skipped.append(i)
        opt.zero_grad()
    return skipped


def test_a_new_length_that_cannot_fit_is_refused_before_it_runs():
    """Note [A shape that cannot fit] in _fit_plan.py: at the smallest budget the first
    length accepts, a longer length derived from it is refused before its step runs (its
    measuring step would peak over the budget); the refusal is also a warning (Note [A
    refusal is also a warning]), so a loop that skips RuntimeErrors still hears it; and
    the budget it names is accepted by the same run."""
    data = batches(2, seq=64) + batches(1, seq=80, seed=2)
    params = sum(p.numel() * p.element_size() for p in mistral()[0].parameters())
    model, blocks, opt, h = trained(4 * params)  # below least memory: refused at step 1
    with pytest.raises(stash.StashError, match="smallest feasible budget") as e:
        for ids in data[:2]:
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    first = _smallest_named(e.value)

    model, blocks, opt, h = trained(first)
    with pytest.warns(RuntimeWarning, match="does not fit the budget") as w:
        skipped = _loop_that_skips_runtime_errors(model, opt, data)
    assert skipped == [2] and h.engine is None, skipped
    assert any("goes on without stash" in str(x.message) for x in w)
    steps = h.report()["steps"]
    assert [s["mode"] for s in steps] == ["measure", "plan"], steps
    assert not any(s["over_budget"] for s in steps), steps
    refusal = next(str(x.message) for x in w if "does not fit" in str(x.message))
    assert "(160 tokens)" in refusal, refusal  # 2 x 80

    model, blocks, opt, h = trained(_smallest_named(refusal))
    assert _loop_that_skips_runtime_errors(model, opt, data) == []
    steps = h.report()["steps"]
    assert [s["mode"] for s in steps] == ["measure", "plan", "plan"], steps
    assert steps[2]["plan_source"] == "derived" and not steps[2]["over_budget"], steps
    h.close()
