"""`python -m stash.bench.fit`: stash.torch.fit on a Hugging Face Llama, against keep-all.

One process, one model config, the same data and seed for every run: keep-all (plain
training) first, then stash.torch.fit at shares of the keep-all peak (default 85%, 70%
and 55%) and at byte budgets (--gib). For each run it records every step's measured peak
(the measuring step included) against the budget, tokens/s (the median step after the
warm-up, on the steps fit planned), and the prediction error of step time and peak; it
prints a Markdown table and writes JSON.

  python -m stash.bench.fit --size h200 --out out/fit      # bf16, SDPA, on a GPU
  python -m stash.bench.fit --size tiny --out out/fit      # CPU (the test double) or GPU

On a GPU the peak is torch.cuda.max_memory_allocated() per step; on the CPU test double
it is fit's own measurement (Note [What the budget counts] in stash/torch/_fit.py).
Needs transformers (LlamaForCausalLM from a config: no download).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

from ._llama import SIZES, data as _data, model as _model


def _run(size, data, device, budget=None, warmup=1, link=None) -> Dict[str, Any]:
    """Trains len(data) steps; the per-step figures (and fit's report when budget is set)."""
    import torch
    import stash.torch

    cuda = device == "cuda"
    model = _model(size, 0, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    handle = (stash.torch.fit(model.model.layers, budget, optimizer=opt, link=link)
              if budget is not None else None)
    steps, losses = [], []
    try:
        for ids in data:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            peak = int(torch.cuda.max_memory_allocated()) if cuda else None
            steps.append({"wall_ms": ms, "peak_bytes": peak})
            losses.append(loss.item())
        report = handle.report() if handle is not None else None
    finally:
        if handle is not None:
            handle.close()
    tokens = size["batch"] * size["seq"]
    if report is not None:
        for s, r in zip(steps, report["steps"]):
            s.update(mode=r["mode"], fit_peak_bytes=r["measured_peak_bytes"],
                     predicted_peak_bytes=r["predicted_peak_bytes"], step_ms=r["step_ms"],
                     predicted_step_ms=r["predicted_step_ms"], exposed_copy_ms=r["exposed_copy_ms"])
            if s["peak_bytes"] is None:
                s["peak_bytes"] = r["measured_peak_bytes"]
    timed = [s for s in steps[warmup:] if s.get("mode", "plan") == "plan"] or steps[-1:]
    median_ms = statistics.median(s["wall_ms"] for s in timed)
    out = {"budget": budget, "steps": steps, "losses": losses, "median_step_ms": median_ms,
           "tokens_per_s": tokens / (median_ms / 1e3),
           "peak_bytes": max(s["peak_bytes"] or 0 for s in steps)}
    if report is not None:
        out["budget_bytes"] = report["budget_bytes"]
        out["plan"] = report["plan"]
        out["timing"] = report["timing"]
        out["cupti"] = report["cupti"]
        planned = [s for s in steps if s.get("mode") == "plan"]
        if planned:
            out["step_error"] = statistics.median(
                abs(s["step_ms"] / s["predicted_step_ms"] - 1) for s in planned
                if s["predicted_step_ms"])
            out["peak_error"] = max(abs(s["peak_bytes"] / s["predicted_peak_bytes"] - 1)
                                    for s in planned if s["predicted_peak_bytes"])
        out["within_budget"] = all(s["peak_bytes"] <= report["budget_bytes"] for s in steps)
    return out


def _table(keep: Dict[str, Any], runs: List[Dict[str, Any]]) -> str:
    gib = float(1 << 30)
    rows = ["| budget | peak GiB (every step, max) | within budget | tokens/s | vs keep-all "
            "| step error | peak error | plan (keep/recompute/offload) |",
            "|---|---|---|---|---|---|---|---|",
            f"| keep-all | {keep['peak_bytes'] / gib:.2f} | - | {keep['tokens_per_s']:.0f} "
            "| 100.0% | - | - | - |" if keep["peak_bytes"] else
            f"| keep-all | n/a (no device allocator) | - | {keep['tokens_per_s']:.0f} "
            "| 100.0% | - | - | - |"]
    for r in runs:
        if "error" in r:
            rows.append(f"| {r['budget']} | - | - | - | - | - | - | {r['error']} |")
            continue
        a = r["plan"]["actions"] if r.get("plan") else {}
        rows.append(
            f"| {r['budget']} ({r['budget_bytes'] / gib:.2f} GiB) | {r['peak_bytes'] / gib:.2f} "
            f"| {'yes' if r['within_budget'] else 'NO'} | {r['tokens_per_s']:.0f} "
            f"| {100 * r['tokens_per_s'] / keep['tokens_per_s']:.1f}% "
            f"| {100 * r.get('step_error', float('nan')):.2f}% "
            f"| {100 * r.get('peak_error', float('nan')):.2f}% "
            f"| {a.get('keep', 0)}/{a.get('recompute', 0)}/{a.get('offload', 0)} |")
    return "\n".join(rows)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stash.bench.fit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--shares", default="85,70,55", help="budgets as %% of keep-all")
    ap.add_argument("--gib", default="", help="byte budgets in GiB, comma-separated")
    ap.add_argument("--steps", type=int, default=5, help="training steps per run")
    ap.add_argument("--out", default="out/fit", help="folder for fit.json and fit.md")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    a = ap.parse_args(argv)

    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    size = SIZES[a.size]
    os.makedirs(a.out, exist_ok=True)
    data = _data(size, a.steps, device)
    link = None if device == "cuda" else {"h2d_gbps": 20.0, "d2h_gbps": 20.0, "bidir_gbps": 32.0}
    print(f"stash.bench.fit: {a.size} Llama ({size}), {a.steps} steps per run, {device}",
          flush=True)
    keep = _run(size, data, device)
    print(f"keep-all: peak {keep['peak_bytes'] / 2**30:.2f} GiB, {keep['tokens_per_s']:.0f} "
          "tokens/s", flush=True)
    budgets = [f"{s.strip()}%" for s in a.shares.split(",") if s.strip()]
    budgets += [f"{g.strip()}GiB" for g in a.gib.split(",") if g.strip()]
    runs = []
    from stash import StashError

    for b in budgets:
        try:
            r = _run(size, data, device, budget=b, link=link)
        except StashError as e:  # an infeasible budget: its row says so, the others run
            runs.append({"budget": b, "error": str(e)})
            print(f"{b}: {e}", flush=True)
            continue
        runs.append(r)
        print(f"{b}: peak {r['peak_bytes'] / 2**30:.2f} GiB of {r['budget_bytes'] / 2**30:.2f}, "
              f"{r['tokens_per_s']:.0f} tokens/s", flush=True)
    table = _table(keep, runs)
    print(table)
    doc = {"size": a.size, "config": size, "device": device, "steps": a.steps,
           "torch": torch.__version__, "keep_all": keep, "runs": runs}
    with open(os.path.join(a.out, "fit.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(a.out, "fit.md"), "w") as f:
        f.write(table + "\n")
    bad = [r["budget"] for r in runs if "error" not in r and not r["within_budget"]]
    if bad:
        print(f"stash.bench.fit: over budget: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
