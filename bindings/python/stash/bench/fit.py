"""`python -m stash.bench.fit`: stash.torch.fit on a Hugging Face Llama, against keep-all.

One process, one model config, the same data and seed for every run: keep-all (plain
training) first, then stash.torch.fit at shares of the keep-all peak (default 85%, 70%
and 55%) and at byte budgets (--gib). For each run it records every step's measured peak
(the measuring step included) against the budget, tokens/s (the median step after the
warm-up, on the steps fit planned), and the prediction error of step time and peak; it
prints a Markdown table and writes JSON.

  python -m stash.bench.fit --size h200 --out out/fit      # bf16, SDPA, on a GPU
  python -m stash.bench.fit --size tiny --out out/fit      # CPU (the test double) or GPU
  python -m stash.bench.fit --size h200 --lengths 1024-4096 --fault-at 3 --steps 12

With --lengths LO-HI every step's batch has a length drawn from [LO, HI] (a new length
on most steps; fit plans them from the measured ones, Note [A profile derived from the
measured shapes] in stash/torch/_fit_shapes.py), and the command fails when a run
measured more than twice. With --fault-at K, step K raises in the second decoder layer's
forward and the loop skips it, in every run alike (keep-all included), so the losses
still compare bit for bit.

Each run is a row of the peers harness (stash.bench.peers' run_system: the same model,
data, optimizer, loop and timing). On a GPU a step's peak is torch.cuda's
max_memory_allocated(); on the CPU test double it is fit's own count (Note [What the
budget counts] in stash/torch/_fit_steps.py; keep-all has none there). Needs transformers
(LlamaForCausalLM from a config: no download).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any, Dict, List, Optional

from . import _llama
from ..torch._meter import meter_for
from ._peer_systems import KeepAll, StashFit, System
from .peers import run_system

GIB = float(1 << 30)


def fit_figures(row: Dict[str, Any], cuda: bool) -> Dict[str, Any]:
    """The fit bench's figures of one row of the peers harness (run_system): every step's
    peak (on CUDA the allocator's; on the CPU fit's own count, Note [One meter for every
    row] in _meter.py), whether each is within the budget, and the prediction errors: the
    median over planned steps of |step / predicted - 1| and the largest |peak / predicted
    - 1|."""
    out: Dict[str, Any] = {}
    steps = [s for s in row["steps"] if not s.get("lost")]  # a lost step has no reading
    out["lost_steps"] = len(row["steps"]) - len(steps)
    out["measuring_steps"] = sum(s.get("mode") == "measure" for s in steps)
    key = "allocated_bytes" if cuda else "fit_peak_bytes"
    peaks = [s.get(key) for s in steps]
    out["step_peaks"] = peaks
    known = [p for p in peaks if p is not None]
    out["peak_bytes"] = max(known) if known else None
    st = row.get("stash")
    if st is None:
        return out
    budget = st["budget_bytes"]
    out["budget_bytes"] = budget
    # Each step against its own shape's budget in bytes (a share is resolved per shape:
    # Note [What a share budget means] in stash/torch/_fit_options.py).
    out["within_budget"] = bool(known) and len(known) == len(peaks) and all(
        p <= (s.get("step_budget_bytes") or budget) for p, s in zip(peaks, steps))
    planned = [s for s in steps if s.get("mode") == "plan"]
    errs = [abs(s["step_ms"] / s["predicted_step_ms"] - 1) for s in planned
            if s.get("predicted_step_ms")]
    out["step_error"] = statistics.median(errs) if errs else None
    pk = [abs(s[key] / s["predicted_peak_bytes"] - 1) for s in planned
          if s.get("predicted_peak_bytes") and s.get(key) is not None]
    out["peak_error"] = max(pk) if pk else None
    return out


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def table(keep: Dict[str, Any], runs: List[Dict[str, Any]]) -> str:
    rows = ["| budget | peak GiB (every step, max) | within budget | tokens/s | vs keep-all "
            "| step error | peak error | measuring / lost steps "
            "| plan (keep/recompute/offload) |",
            "|---|---|---|---|---|---|---|---|---|"]
    kp = keep["fit"]["peak_bytes"]
    lost = keep["fit"]["lost_steps"]
    rows.append(f"| keep-all | {kp / GIB:.2f} | - | {keep['tokens_per_s']:.0f} | 100.0% "
                f"| - | - | - / {lost} | - |" if kp is not None else
                f"| keep-all | n/a (no device allocator) | - | {keep['tokens_per_s']:.0f} "
                f"| 100.0% | - | - | - / {lost} | - |")
    for r in runs:
        if r["status"] != "ok":
            rows.append(f"| {r['budget']} | - | - | - | - | - | - | - | {r['reason']} |")
            continue
        f = r["fit"]
        a = (r["stash"].get("plan") or {}).get("actions", {})
        rows.append(
            f"| {r['budget']} ({f['budget_bytes'] / GIB:.2f} GiB) | {f['peak_bytes'] / GIB:.2f} "
            f"| {'yes' if f['within_budget'] else 'NO'} | {r['tokens_per_s']:.0f} "
            f"| {100 * r['tokens_per_s'] / keep['tokens_per_s']:.1f}% "
            f"| {_pct(f['step_error'])} | {_pct(f['peak_error'])} "
            f"| {f['measuring_steps']} / {f['lost_steps']} "
            f"| {a.get('keep', 0)}/{a.get('recompute', 0)}/{a.get('offload', 0)} |")
    return "\n".join(rows)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stash.bench.fit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(_llama.SIZES), default="tiny")
    ap.add_argument("--shares", default="85,70,55", help="budgets as %% of keep-all")
    ap.add_argument("--gib", default="", help="byte budgets in GiB, comma-separated")
    ap.add_argument("--steps", type=int, default=5, help="training steps per run")
    ap.add_argument("--out", default="out/fit", help="folder for fit.json and fit.md")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps at the start")
    ap.add_argument("--lengths", default="", metavar="LO-HI",
                    help="a length from LO to HI tokens for every step's batch")
    ap.add_argument("--fault-at", type=int, default=None, metavar="K",
                    help="step K raises in a block's forward; the loop skips it")
    a = ap.parse_args(argv)
    if a.steps < 2 or a.warmup < 0 or a.warmup >= a.steps:
        ap.error("--steps must be at least 2 and --warmup smaller than --steps")
    if a.fault_at is not None and not 0 <= a.fault_at < a.steps:
        ap.error("--fault-at must be a step: from 0 to --steps - 1")
    lengths = None
    if a.lengths:
        try:
            lo, hi = (int(x) for x in a.lengths.split("-"))
        except ValueError:
            ap.error(f"--lengths {a.lengths!r}: give LO-HI in tokens, e.g. 1024-4096")
        if not 8 <= lo <= hi:
            ap.error(f"--lengths {a.lengths!r}: need 8 <= LO <= HI")
        lengths = (lo, hi)

    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    cuda = device == "cuda"
    size = _llama.SIZES[a.size]
    if lengths is not None and lengths[1] > size["seq"]:
        ap.error(f"--lengths {a.lengths!r}: the {a.size} Llama takes at most {size['seq']} "
                 "tokens")
    os.makedirs(a.out, exist_ok=True)
    batches = _llama.data(size, a.steps, device, lengths)
    meter = meter_for(device)
    link = None if cuda else {"h2d_gbps": 20.0, "d2h_gbps": 20.0, "bidir_gbps": 32.0}
    print(f"stash.bench.fit: {a.size} Llama ({size}), {a.steps} steps per run, {device}",
          flush=True)

    def run(system: System) -> Dict[str, Any]:
        r = run_system(system, size, batches, device, meter, a.warmup, a.fault_at)
        if r["status"] == "ok":
            r["fit"] = fit_figures(r, cuda)
        return r

    keep = run(KeepAll())
    if keep["status"] != "ok":
        print(f"stash.bench.fit: keep-all {keep['status']}: {keep['reason']}", file=sys.stderr)
        return 1
    kp = keep["fit"]["peak_bytes"]
    print(f"keep-all: peak {'n/a' if kp is None else f'{kp / GIB:.2f} GiB'}, "
          f"{keep['tokens_per_s']:.0f} tokens/s", flush=True)
    # Budgets as fit's own text: a share of keep-all is fit's keep-all estimate, so the
    # same on the CPU, where there is no allocator peak to take a share of.
    budgets = [f"{s.strip()}%" for s in a.shares.split(",") if s.strip()]
    budgets += [f"{g.strip()}GiB" for g in a.gib.split(",") if g.strip()]
    runs = []
    for b in budgets:
        r = run(StashFit(b, f"stash at {b}", link=link))
        r["budget"] = b
        runs.append(r)
        if r["status"] == "ok":
            f = r["fit"]
            print(f"{b}: peak {f['peak_bytes'] / GIB:.2f} GiB of {f['budget_bytes'] / GIB:.2f}, "
                  f"{r['tokens_per_s']:.0f} tokens/s", flush=True)
        else:
            print(f"{b}: {r['status']}: {r['reason']}", flush=True)
    md = table(keep, runs)
    print(md)
    doc = {"size": a.size, "config": size, "device": device, "steps": a.steps,
           "warmup": a.warmup, "lengths": [int(b.shape[1]) for b in batches],
           "fault_at": a.fault_at, "torch": torch.__version__, "keep_all": keep,
           "runs": runs}
    with open(os.path.join(a.out, "fit.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(a.out, "fit.md"), "w") as f:
        f.write(md + "\n")
    # A budget fit refuses (a StashError naming why, when it starts or when it plans) is a
    # result; any other failure, a step over its budget, a run whose losses differ from
    # keep-all's, or more than two measuring steps over varied lengths, fails the command.
    bad = [r["budget"] for r in runs
           if (r["status"] != "ok" and not r["reason"].startswith("StashError"))
           or (r["status"] == "ok" and (
               not r["fit"]["within_budget"] or r["losses"] != keep["losses"]
               or (lengths is not None and r["fit"]["measuring_steps"] > 2)))]
    if bad:
        print(f"stash.bench.fit: failed or over budget: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
