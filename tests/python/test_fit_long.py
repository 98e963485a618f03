"""A long run under stash.torch.fit (issue 20 item 7): a tiny Hugging Face decoder for
STASH_LONG_STEPS steps (default 1000) with a new sequence length on most steps, an eval
every 50 steps and an exception injected every 100, on the CPU test double. Every step
within its budget on the CPU allocator's meter, bitwise equal to plain training that loses
the same steps, no pinned block held between steps, RSS flat after the first 100 steps.
It prints the figures BENCHMARKS.md records (pytest -s)."""

import os
import random
import time

import pytest
import torch

import stash
import stash.torch

transformers = pytest.importorskip("transformers")
from models import decoder  # noqa: E402

LINK = {"h2d_gbps": 20.0, "d2h_gbps": 20.0, "bidir_gbps": 32.0}
VOCAB = 64
STEPS = int(os.environ.get("STASH_LONG_STEPS", "1000"))


def qwen():
    m = decoder("qwen2", 0, layers=3, vocab=VOCAB, positions=128)
    return m, m.model.layers


class Injected(Exception):
    pass


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run(budget):
    rng = random.Random(7)
    g = torch.Generator().manual_seed(7)
    model, blocks = qwen()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    h = stash.torch.fit(blocks, budget, optimizer=opt, link=LINK) if budget else None
    armed = [False]
    blocks[1].mlp.register_forward_hook(
        lambda *a: (_ for _ in ()).throw(Injected()) if armed[0] else None)
    probe = torch.randint(0, VOCAB, (2, 32), generator=g)
    losses, evals, rss, held = [], [], {}, 0
    t0 = time.perf_counter()
    for step in range(STEPS):
        ids = torch.randint(0, VOCAB, (2, rng.randrange(16, 97)), generator=g)
        armed[0] = step % 100 == 99
        try:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
        except Injected:
            losses.append(None)
        armed[0] = False
        opt.zero_grad()
        if step % 50 == 49:
            model.eval()
            with torch.no_grad():
                evals.append(model(input_ids=probe, labels=probe).loss)
            model.train()
        if h is not None:
            s = h.stats()
            held = max(held, s["pinned"]["current_count"], s["in_flight_count"])
        if step in (99, STEPS - 1):
            rss[step] = rss_bytes()
    seconds = time.perf_counter() - t0
    params = [p.detach().clone() for p in model.parameters()]
    return losses, evals, params, h, rss, held, seconds


@pytest.mark.skipif(STEPS < 200, reason="STASH_LONG_STEPS < 200")
def test_a_long_run_keeps_the_budget():
    expected = run(None)
    got = run("95%")
    losses, evals, params, h, rss, held, seconds = got
    for a, b in zip(expected[0], losses):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
    assert all(torch.equal(a, b) for a, b in zip(expected[1], evals))
    assert all(torch.equal(a, b) for a, b in zip(expected[2], params))
    steps = h.report()["steps"]
    ran = [s for s in steps if not s["aborted"]]
    lost = [s for s in steps if s["aborted"]]
    over = [s for s in ran if s["over_budget"]]
    measuring = sum(s["mode"] == "measure" for s in ran)
    growth = rss[STEPS - 1] / rss[99] - 1
    print(f"\nlong run: {STEPS} steps in {seconds:.1f} s (plain {expected[6]:.1f} s); "
          f"{len(lost)} lost, {measuring} measuring, {len(over)} over budget; "
          f"derived plans {sum(s['plan_source'] == 'derived' for s in ran)}; "
          f"RSS {rss[99] / 2**20:.1f} -> {rss[STEPS - 1] / 2**20:.1f} MiB "
          f"({growth * 100:+.2f}%); most pinned blocks or copies held after a step: {held}")
    assert len(lost) == STEPS // 100
    assert not over, over[:3]
    assert measuring <= 3, measuring
    assert held == 0
    assert growth < 0.05, rss
    h.close()
