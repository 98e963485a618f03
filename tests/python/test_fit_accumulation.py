"""stash.torch.fit under gradient accumulation written by hand (several forwards and
backwards per optimizer.step(), no handle.micro_batch()): priced per forward, a
step(closure) that runs the last micro-batch, and a step given up between two
micro-batches (Note [The loops fit lives in] in stash/torch/_fit_api.py), on
test_fit_loops.py's Mistral; and micro-batches in flight (handle.micro_batch(), every
forward before the backwards; Note [Micro-batches in flight] in
stash/torch/_fit_plan.py), on test_fit.py's Llama. On the CPU test double; every
comparison bitwise against plain training."""

import contextlib
import warnings

import pytest
import torch

import stash
import stash.torch

pytest.importorskip("transformers")

from test_fit import assert_bitwise, llama  # noqa: E402
from test_fit import batches as llama_batches  # noqa: E402
from test_fit_loops import LINK, VOCAB, Injected, batches, same, trained  # noqa: E402


def accumulate(model, opt, steps):
    """One optimizer step of `opt` per list of micro-batches in `steps`, each backward of
    its loss / 2: the losses."""
    losses = []
    for step in steps:
        for ids in step:
            loss = model(input_ids=ids, labels=ids).loss / 2
            loss.backward()
            losses.append(loss.detach().clone())
        opt.step()
        opt.zero_grad()
    return losses


def accumulated(steps, budget):
    """test_fit_loops' Mistral trained with AdamW by accumulate(), under fit at `budget`
    (None: plain training): the losses, the final parameters and the handle."""
    model, blocks, opt, h = trained(budget)
    losses = accumulate(model, opt, steps)
    return losses, [p.detach().clone() for p in model.parameters()], h


def test_accumulation_by_hand_is_priced_per_forward():
    """Two forwards and backwards of micro-batch 0 per optimizer step, no micro_batch():
    bitwise, both counted in the step (micro_batches 2), and the predicted step is that of
    two passes, not three (each forward's spans are its own). The bug this guards against
    counted one pass as overhead and predicted 1.6-1.8x the measured step here."""
    data = batches(16, seq=128)
    pairs = [data[k:k + 2] for k in range(0, len(data), 2)]
    expected = accumulated(pairs, None)
    # The time outside the blocks is checked against one pass below: on a loaded VM a
    # spike in one step's loss or optimizer can pass it (seen with ctest -j2), where the
    # bug this guards against passes it every time. So up to three runs.
    for attempt in range(3):
        got = accumulated(pairs, "85%")
        profile = got[2].profile
        one_pass = sum(layer["fwd_ms"] + layer["bwd_ms"] for layer in profile["layers"])
        if profile["step_overhead_ms"] < one_pass or attempt == 2:
            break
        got[2].close()
    same(got, expected)
    steps = got[2].report()["steps"]
    assert [s["micro_batches"] for s in steps] == [2] * 8
    # A plan's first run that peaks above its prediction corrects the shape's fixed
    # bytes (Note [What the budget counts] in _fit_steps.py) for steps of two passes as for
    # one: from then on every step peaks at or under its prediction and its budget. (It was
    # not corrected for more than one pass, and stayed 160 KB over its prediction here.)
    for s in steps[2:]:
        assert s["measured_peak_bytes"] <= s["predicted_peak_bytes"], steps
        assert not s["over_budget"], steps
    # The measuring step's two passes are the profile's, not one pass and "overhead": the
    # time outside the blocks (loss, optimizer) is less than one pass through them (times
    # of one step; a run loaded unevenly is run again, above).
    assert profile["measurement"]["passes"] == 2
    assert profile["step_overhead_ms"] < one_pass, (profile["step_overhead_ms"], one_pass)
    # A planned step is priced as two passes and the overhead once: at least two passes
    # through the blocks as measured, at most two with every tensor recomputed and every
    # byte's copies exposed. (Planned steps' own times are not compared with the measuring
    # step's: on this VM, a load that comes and goes between steps moved that ratio from
    # 1.0 to 3.5.)
    tensors = [t for layer in profile["layers"] for t in layer["tensors"]]
    worst = (sum(t["recompute_ms"] for t in tensors)
             + sum(t["bytes"] for t in tensors) / (LINK["d2h_gbps"] * 1e6)
             + sum(t["bytes"] for t in tensors) / (LINK["h2d_gbps"] * 1e6))
    over = profile["step_overhead_ms"]
    for s in steps:
        if s["mode"] == "plan":
            assert 2 * one_pass + over <= s["predicted_step_ms"] * (1 + 1e-9), (s, one_pass)
            assert s["predicted_step_ms"] <= 2 * (one_pass + worst) + over, (s, one_pass, worst)
    got[2].close()


def test_a_step_with_a_closure_and_accumulation_is_one_step():
    """optimizer.step(closure) whose closure runs the last micro-batch's forward and
    backward (Lightning does this under accumulate_grad_batches): that forward belongs
    to the step, not a sign that the step raised. Each step is one step of two passes,
    planned after the first, bitwise; it was split into an aborted step and a step of one
    pass, and the shape measured again."""
    data = batches(8)

    def go(budget):
        model, blocks, opt, h = trained(budget)
        losses = []

        def pass_of(ids):
            loss = model(input_ids=ids, labels=ids).loss / 2
            loss.backward()
            losses.append(loss.detach().clone())
            return loss

        for k in range(0, len(data), 2):
            pass_of(data[k])
            opt.step(lambda ids=data[k + 1]: pass_of(ids))
            opt.zero_grad()
        return losses, [p.detach().clone() for p in model.parameters()], h

    expected = go(None)
    got = go("85%")
    same(got, expected)
    steps = got[2].report()["steps"]
    assert [s["aborted"] for s in steps] == [None] * 4, steps
    assert [s["micro_batches"] for s in steps] == [2] * 4, steps
    assert [s["mode"] for s in steps] == ["measure", "plan", "plan", "plan"], steps
    got[2].close()


@pytest.mark.parametrize("lost", [0, 2], ids=["measuring", "planned"])
def test_a_step_given_up_between_micro_batches_is_a_step_of_its_own(lost):
    """Two micro-batches per optimizer step; in step `lost` the second one's data raises
    before its forward (nothing of fit's sees it), the loop zeroes the gradients and
    goes on with the next step. That step ends after its first micro-batch, a step of
    one pass; it was taken for the next step's first micro-batch (one step of three)."""
    data = batches(12)

    def go(budget):
        model, blocks, opt, h = trained(budget)
        losses = []
        for step, k in enumerate(range(0, len(data), 2)):
            try:
                for m, ids in enumerate(data[k:k + 2]):
                    if step == lost and m == 1:
                        raise Injected("a bad batch")
                    loss = model(input_ids=ids, labels=ids).loss / 2
                    loss.backward()
                    losses.append(loss.detach().clone())
                opt.step()
            except Injected:
                losses.append(None)
            opt.zero_grad()
        return losses, [p.detach().clone() for p in model.parameters()], h

    expected = go(None)
    got = go("85%")
    same(got, expected)
    steps = got[2].report()["steps"]
    passes = [2] * 6
    passes[lost] = 1
    assert [s["micro_batches"] for s in steps] == passes, steps
    assert [s["aborted"] for s in steps] == [None] * 6, steps
    assert steps[-1]["mode"] == "plan" and not steps[-1]["over_budget"], steps
    got[2].close()


def test_gradient_accumulation_with_micro_batches():
    # Both forwards first, then both backwards (fit's micro_batch contexts), AdamW once
    # per step: bitwise equal to the same accumulation without stash.
    data = llama_batches(6, batch=2, seq=128)

    def run(with_fit):
        model, blocks = llama(layers=3, hidden=128)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        h = stash.torch.fit(blocks, "85%", optimizer=opt, link=LINK) if with_fit else None
        losses = []
        for step in range(3):
            pair = []
            for mb, ids in enumerate(data[2 * step:2 * step + 2]):
                ctx = h.micro_batch(mb) if h else contextlib.nullcontext()
                with ctx:
                    pair.append(model(input_ids=ids, labels=ids).loss)
            pair[1].backward()
            pair[0].backward()
            opt.step()
            opt.zero_grad()
            losses += [p.detach() for p in pair]
        return losses, [p.detach().clone() for p in model.parameters()], h

    expected, got = run(False), run(True)
    assert_bitwise(expected, got)
    steps = got[2].report()["steps"]
    assert [s["mode"] for s in steps] == ["measure", "plan", "plan"]
    assert all(s["micro_batches"] == 2 for s in steps)
    # Note [Micro-batches in flight] in _fit_plan.py: micro-batch 0's kept activations
    # live through micro-batch 1's pass, and the plan counts them.
    assert not any(s["over_budget"] for s in steps), steps
    assert got[2].profile["measurement"]["in_flight"] == 2
    got[2].close()


def test_a_longer_micro_batch_in_flight_recomputes_all_it_can():
    """Note [A longer micro-batch in flight] in _fit_passes.py: micro-batches of their own
    lengths, both forwards before the backwards; a second one longer than the plan's shape
    recomputes all it can (one warning): every step within its budget, bitwise. Before,
    the step [52, 119] read 19.54 MB against a 17.84 MB budget."""
    import random
    rng, g = random.Random(5), torch.Generator().manual_seed(5)
    steps = [[torch.randint(0, VOCAB, (2, rng.randrange(24, 160)), generator=g)
              for _ in range(2)] for _ in range(5)]

    def run(budget):
        model, _, opt, h = trained(budget)
        for pair in steps:
            losses = []
            for mb, ids in enumerate(pair):
                with h.micro_batch(mb) if h else contextlib.nullcontext():
                    losses.append(model(input_ids=ids, labels=ids).loss)
            for loss in losses:
                (loss / 2).backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().clone() for p in model.parameters()], h

    expected = run(None)[0]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got, h = run("80%")
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    report = h.report()["steps"]
    h.close()
    assert [[int(ids.shape[1]) for ids in pair] for pair in steps][4] == [52, 119]
    assert [s["mode"] for s in report] == ["measure", "measure", "plan", "plan", "plan"]
    assert not any(s["over_budget"] for s in report), report
    said = [w for w in seen if "began while others held tensors" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in seen]


def test_a_refusal_with_micro_batches_in_flight_names_a_budget_that_plans():
    # Note [Micro-batches in flight] in _fit_plan.py: the smallest feasible budget of a
    # refusal counts the other micro-batch's kept activations, so the same run accepts it
    # and every step stays within it.
    import re

    data = llama_batches(4, batch=2, seq=128)

    def run(budget):
        model, blocks = llama(layers=3, hidden=128)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with stash.torch.fit(blocks, budget, optimizer=opt, link=LINK) as h:
            for step in range(2):
                pair = []
                for mb, ids in enumerate(data[2 * step:2 * step + 2]):
                    with h.micro_batch(mb):
                        pair.append(model(input_ids=ids, labels=ids).loss)
                pair[1].backward()
                pair[0].backward()
                opt.step()
                opt.zero_grad()
            return h.report()["steps"]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(stash.StashError, match="micro-batches were in flight") as e:
            run("70%")
        smallest = int(re.search(r"smallest feasible budget [^(]*\((\d+) bytes\)",
                                 str(e.value)).group(1))
        steps = run(smallest)
    assert [s["mode"] for s in steps] == ["measure", "plan"]
    assert not any(s["over_budget"] for s in steps), steps


def test_micro_batches_of_other_lengths_run_their_own_plans():
    """Note [Micro-batches of other shapes] in stash/torch/_fit_passes.py: accumulation over
    micro-batches padded each to its own length (a Trainer with a padding collator) runs
    each pass under its own shape's plan, bitwise, and every step is within the budget on
    the meter. With every pass on the first pass's plan, a longer micro-batch after a
    shorter one ran its step over the budget. The step of two 192-token micro-batches
    checks the derived plan of 192 on the CPU meter (Note [A later pass on the CPU meter]
    in stash/torch/_fit_steps.py): with the first pass's inputs counted through the
    second, it read 0.6% over the budget."""
    lengths = [(64, 64), (64, 160), (160, 64), (96, 192), (192, 96), (64, 192), (128, 64),
               (192, 192)]
    g = torch.Generator().manual_seed(5)
    data = [[torch.randint(0, 128, (2, n), generator=g) for n in pair] for pair in lengths]

    expected = accumulated(data, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no OVER-the-budget warning
        got = accumulated(data, "85%")
    same(got, expected)
    h = got[2]
    steps = h.report()["steps"]
    assert [s["micro_batches"] for s in steps] == [2] * len(lengths), steps
    assert sum(s["mode"] == "measure" for s in steps) <= 2, steps
    for s in steps:
        assert not s["over_budget"] and s["measured_peak_bytes"] <= s["budget_bytes"], s
    mixed = [s for s in steps if len(set(s["pass_shapes"])) > 1]
    assert len(mixed) >= 4, steps
    # A step of one length is judged against its own budget, one of two lengths against
    # the larger of theirs.
    own = {s["shape"]: s["budget_bytes"] for s in steps if len(set(s["pass_shapes"])) == 1}
    for s in mixed:
        budgets = [own[k] for k in s["pass_shapes"] if k in own]
        assert s["budget_bytes"] >= max(budgets, default=0), (s, own)
    h.close()


def test_a_later_micro_batch_whose_length_cannot_fit_runs_at_least_memory():
    """Note [Micro-batches of other shapes] in stash/torch/_fit_passes.py: a micro-batch after the
    first whose length no plan fits at the budget (derived from the lengths measured so
    far) is not refused in the middle of its step, whose earlier micro-batch ran: it runs
    at least memory, the step's record and a warning say why, and training goes on under
    fit, bitwise. A step that begins with that length is refused, before it runs."""
    lengths = [(160, 160), (64, 64), (64, 256), (64, 64)]
    g = torch.Generator().manual_seed(5)
    data = [[torch.randint(0, 128, (2, n), generator=g) for n in pair] for pair in lengths]
    expected = accumulated(data, None)
    model, _, opt, h = trained("55%")
    with pytest.warns(UserWarning, match=r"step 2, pass 2: a new input shape \(512 tokens\) "
                      r"does not fit"):
        losses = accumulate(model, opt, data)
    same((losses, [p.detach().clone() for p in model.parameters()], h), expected)
    steps = h.report()["steps"]
    assert [s["mode"] for s in steps] == ["measure", "measure", "plan", "plan"], steps
    assert steps[2]["check"].endswith("It ran at least memory."), steps[2]
    ids = data[2][1]
    with pytest.raises(stash.StashError, match=r"\(512 tokens\) does not fit"):
        model(input_ids=ids, labels=ids)
    h.close()


def test_plans_under_autocast_peak_within_their_predictions():
    """Note [Saved tensors someone else holds] in stash/torch/_fit_measure.py: autocast's
    cache holds the bf16 copy of every weight a block casts until the autocast region
    ends, after the loss, so recomputing those copies frees nothing until then. The
    measuring step finds them alive after the last block's forward and the profile keeps
    them (must_keep); the plans count them where they live. Every planned step peaks
    within 0.5% of its prediction and within its budget (below, the one exception), at
    one length (the first plan ran 0.75 MB, 4.9%, over its prediction, and three
    corrections of the shape's fixed bytes were needed) and with
    three micro-batches of random lengths a step (plans derived from the measured shapes,
    which no step checks: 6 of 8 such steps of a Qwen2 ran 1.6-2.6% over their budgets).
    There the copies keep their bytes in a derived shape, and a plan derived before the
    second shape was measured is derived again after it (step 4 here ran such a plan 1.2%
    over its budget)."""
    g = torch.Generator().manual_seed(1)
    same_length = [batches(3, seq=192)] * 4
    lengths = [[torch.randint(0, VOCAB, (2, int(torch.randint(24, 200, (1,), generator=g))),
                              generator=g) for _ in range(3)] for _ in range(6)]
    for steps_in, budget in ((same_length, "70%"), (lengths, "85%")):
        model, _, opt, h = trained(budget)
        for data in steps_in:
            for ids in data:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model(input_ids=ids, labels=ids).loss / 3
                loss.backward()
            opt.step()
            opt.zero_grad()
        held = [t for layer in h.profile["layers"] for t in layer["tensors"]
                if t["name"].startswith("held.")]
        steps = h.report()["steps"]
        h.close()
        assert held and all(t["must_keep"] for t in held), h.profile
        planned = [s for s in steps if s["mode"] == "plan"]
        assert len(planned) >= 3, steps
        learned = 0.0
        for s in planned:
            # (A step whose passes run plans of several shapes predicts none of its own.)
            if s["predicted_peak_bytes"] is None:
                assert not s["over_budget"], steps
                continue
            # A derived profile is a model: its plans may run a little above their
            # prediction (0.25% at most in BENCHMARKS.md's runs, none in this one as
            # recorded; which plan the measured times choose moves from run to run), and
            # a step over its budget is then the first to show its family that error
            # (Note [What a derived plan leaves free] in _fit_shape_plans.py). Before the
            # fix the first plan here ran 4.9% above its prediction.
            excess = s["measured_peak_bytes"] / s["predicted_peak_bytes"] - 1
            assert excess <= 0.005, (s, steps)
            assert not s["over_budget"] or (s["plan_source"] == "derived"
                                            and excess > learned), (s, steps)
            if s["plan_source"] == "derived":
                learned = max(learned, excess)
