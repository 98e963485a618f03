"""What stash.torch.fit costs when its plan keeps everything (issue 20 item 6: at keep-all's
peak, at least 99% of keep-all's tokens/s), as a ratio of step times in one run.

Method. Two copies of the peers' tiny Llama (stash.bench._llama, the same seed, AdamW,
zero_grad(set_to_none=True)): one trained plainly, one under stash.torch.fit with a budget
far above keep-all's peak (every layer kept, so no hook runs: what is left is fit's own
per-step work). The two alternate step by step, the order swapped every round, on the same
batches, for --rounds rounds after 5 warm-up rounds (fit's measuring step is one of them);
each step is timed with time.perf_counter around forward, backward, optimizer step and
zero_grad. Reported: the median step of each, their ratio, the median of the per-round
ratios, and the medians of the forward, backward and optimizer phases.

Run with stash's libraries on the CPU test double (tests/python's environment):
  STASH_CUDART=build/cudart_double/libcudart.so.13 STASHDBL_FOREIGN_IS_DEVICE=1 \\
  STASH_LIB_DIR=build/bindings:build/bindings/torch_alloc PYTHONPATH=bindings/python \\
  python tests/benchmarks/keep_all_cost.py [--rounds 40] [--threads 2]
"""

import argparse
import statistics
import time

import torch

import stash.torch
from stash.bench import _llama
from stash.bench._peer_systems import decoder_layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    size = _llama.SIZES["tiny"]
    batches = _llama.data(size, 8, torch.device("cpu"))

    def make(under_fit):
        model = _llama.model(size, 0, torch.device("cpu"))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        h = stash.torch.fit(decoder_layers(model), "1GiB", optimizer=opt) if under_fit else None
        return model, opt, h

    systems = {"plain": make(False), "fit": make(True)}
    phases = {k: [] for k in systems}
    for r in range(a.rounds + 5):
        for k in (list(systems) if r % 2 == 0 else list(systems)[::-1]):
            model, opt, _ = systems[k]
            ids = batches[r % len(batches)]
            t0 = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            t3 = time.perf_counter()
            if r >= 5:
                phases[k].append((t1 - t0, t2 - t1, t3 - t2))
    h = systems["fit"][2]
    modes = [s["mode"] for s in h.report()["steps"]]
    assert modes.count("measure") == 1 and h.plan is not None
    assert all(a == "keep" for layer in h.plan["layers"] for a in
               (t["action"] for t in layer["tensors"])), "the plan must keep everything"
    h.close()
    total = {k: [sum(p) for p in v] for k, v in phases.items()}
    med = {k: statistics.median(v) * 1e3 for k, v in total.items()}
    pairs = [p / f for p, f in zip(total["plain"], total["fit"])]
    print(f"keep_all_cost: tiny Llama, {a.rounds} rounds, {a.threads} threads, torch "
          f"{torch.__version__}")
    for k in systems:
        ph = [statistics.median(p[i] for p in phases[k]) * 1e3 for i in range(3)]
        print(f"  {k:5s} median step {med[k]:.2f} ms (forward {ph[0]:.2f}, backward "
              f"{ph[1]:.2f}, optimizer {ph[2]:.2f})")
    print(f"  plain / fit: {med['plain'] / med['fit']:.4f} (medians), "
          f"{statistics.median(pairs):.4f} (median of the rounds' ratios)")


if __name__ == "__main__":
    main()
