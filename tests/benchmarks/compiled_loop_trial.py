"""A training loop under whole-model compile, read on the meter users read: per optimizer
step its length, the peak on c10's CPU allocator over the whole step (what was alive at
its start plus the most allocated above it: the tests' and the peers' meter), the peak
fit read for it, its plan's prediction, its first-run check and whether the loss is
bitwise that of the same loop compiled without stash.

Method. A Hugging Face decoder of tests/python/models.py (random init, hidden 64, vocab
256, seed 0), compiled whole after fit(layers, budget, optimizer=AdamW), batch 4 split
into --micro micro-batches whose gradients add up by hand, a graph break before block
--split (a forward pre-hook calling torch._dynamo.graph_break(); 0: none), the lengths of
--lengths in turn. The budget is --fraction of the loop's peak at its first length
without stash (a run of its own first, which also gives the reference losses).

Run with stash's libraries on the CPU test double (tests/python's environment):
  STASH_CUDART=build/cudart_double/libcudart.so.13 STASHDBL_FOREIGN_IS_DEVICE=1 \\
  STASH_LIB_DIR=build/bindings:build/bindings/torch_alloc PYTHONPATH=bindings/python \\
  python tests/benchmarks/compiled_loop_trial.py --family qwen2 --layers 4 --split 2 \\
      --micro 2 --fraction 0.8 --lengths 128,128,128,128,96,160,128,160,96,128
"""

import argparse
import os
import sys
from typing import Any, Dict, List, Optional

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import stash.torch  # noqa: E402
from stash.torch._cpu_meter import window  # noqa: E402
from stash.torch._meter import live_training_bytes  # noqa: E402
from models import decoder  # noqa: E402

VOCAB = 256
LINK = {"h2d_gbps": 20.0, "d2h_gbps": 20.0, "bidir_gbps": 32.0}


def run(args: argparse.Namespace, lengths: List[int], budget: Optional[int]
        ) -> List[Dict[str, Any]]:
    torch._dynamo.reset()
    m = decoder(args.family, 0, layers=args.layers, vocab=VOCAB)
    if args.split:
        m.model.layers[args.split].register_forward_pre_hook(
            lambda mod, a: torch._dynamo.graph_break())
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    h = (stash.torch.fit(m.model.layers, budget, optimizer=opt, link=LINK)
         if budget is not None else None)
    cm = torch.compile(m)
    g = torch.Generator().manual_seed(1)
    meter = window()
    assert meter is not None, "the counting allocator could not be built"
    out = []
    for n in lengths:
        ids = torch.randint(0, VOCAB, (4, n), generator=g)
        base = live_training_bytes(m, opt, ids)
        meter.reopen()
        try:
            for part in ids.chunk(args.micro):
                loss = cm(input_ids=part, labels=part).loss
                (loss / args.micro).backward()
        except stash.StashError as e:  # a refusal (BudgetRefused) ends the loop
            print(f"step {len(out)} (length {n}): {type(e).__name__}: {e}")
            break
        opt.step()
        opt.zero_grad()
        out.append({"length": n, "users": base + meter.peak(), "loss": loss.detach().clone()})
    meter.close()
    if h is not None:
        for row, entry in zip(out, h.report()["steps"]):
            row.update(fit=entry["measured_peak_bytes"], mode=entry["mode"],
                       predicted=entry["predicted_peak_bytes"], check=entry["check"])
        h.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="qwen2")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--split", type=int, default=2)
    p.add_argument("--micro", type=int, default=2)
    p.add_argument("--fraction", type=float, default=0.8)
    p.add_argument("--lengths", default="128,128,128,128,96,160,128,160,96,128")
    args = p.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    ref = run(args, lengths, None)
    budget = int(args.fraction * max(r["users"] for r in ref if r["length"] == lengths[0]))
    got = run(args, lengths, budget)
    print(f"budget {budget} bytes ({args.fraction:.0%} of the first length's peak without "
          "stash)")
    print("step  len  mode     users'      fit    predicted  check   over by  loss bitwise")
    for i, (r, g) in enumerate(zip(ref, got)):  # the steps that ran under fit
        over = g["users"] - budget
        print(f"{i:4d} {g['length']:4d}  {g['mode']:7s} {g['users']:9d} {g['fit']:9d} "
              f"{g['predicted'] or 0:10d}  {str(g['check']):7s} {max(0, over):8d}  "
              f"{bool(torch.equal(r['loss'], g['loss']))}")


if __name__ == "__main__":
    main()
