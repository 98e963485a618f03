"""What fit(buckets=) changes on a loop of ever new lengths (Note [Lengths rounded up to a
bucket] in _fit_shapes.py): measuring steps, plans made, derived plans checked, the
planning time, steps over the budget, the loop's wall time and how much of its budget a
planned step used (median), per bucket setting, one run each, in one process.

Method. The peers' tiny Llama (stash.bench._llama, seed 0, AdamW), 40 steps of batch 4 at
random lengths 64-512 (seed 11), "80%", the given solver; every setting trains the same
batches from the same initial model.

Run with stash's libraries on the CPU test double (tests/python's environment):
  STASH_CUDART=build/cudart_double/libcudart.so.13 STASHDBL_FOREIGN_IS_DEVICE=1 \\
  STASH_LIB_DIR=build/bindings:build/bindings/torch_alloc PYTHONPATH=bindings/python \\
  python tests/benchmarks/buckets_cost.py [--solver greedy] [--buckets none,64,128]
"""

import argparse
import random
import statistics
import time

import torch

import stash.torch
from stash.bench import _llama
from stash.bench._peer_systems import decoder_layers

LINK = {"h2d_gbps": 20.0, "d2h_gbps": 20.0, "bidir_gbps": 32.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--solver", default="greedy")
    ap.add_argument("--buckets", default="none,64,128")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    size = _llama.SIZES["tiny"]
    rng, g = random.Random(11), torch.Generator().manual_seed(11)
    data = [torch.randint(0, 128, (4, rng.randrange(64, 513)), generator=g)
            for _ in range(40)]
    print(f"buckets_cost: tiny Llama, {len(data)} steps, lengths 64-512, '80%', solver "
          f"{a.solver}, torch {torch.__version__}")
    for text in a.buckets.split(","):
        buckets = None if text == "none" else int(text)
        model = _llama.model(size, 0, torch.device("cpu"))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        h = stash.torch.fit(decoder_layers(model), "80%", optimizer=opt, link=LINK,
                            buckets=buckets, solver=a.solver)
        t0 = time.perf_counter()
        for ids in data:
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        wall = time.perf_counter() - t0
        steps = h.report()["steps"]
        h.close()
        planned = [s for s in steps if s["mode"] == "plan"]
        used = statistics.median(s["measured_peak_bytes"] / s["budget_bytes"] for s in planned)
        print(f"  buckets={buckets}: {len(steps) - len(planned)} measuring, "
              f"{len({s['shape'] for s in planned})} plans, "
              f"{sum(s['check'] == 'passed' for s in steps)} checks passed, planning "
              f"{sum(s['planning_ms'] or 0 for s in steps):.0f} ms, "
              f"{sum(s['over_budget'] for s in steps)} over the budget, wall {wall:.1f} s, "
              f"{used:.3f} of the budget used (median planned step)")


if __name__ == "__main__":
    main()
