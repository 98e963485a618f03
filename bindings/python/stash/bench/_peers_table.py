"""stash.bench.peers' rows judged and written: each row's losses against keep-all's, the
stash rows' budgets and their peers, and the table peers.md shows.

Note [Which losses must match]
Every run starts from the same weights and sees the same batches, so a system that only
changes what is saved for backward (checkpointing recomputes the same ops; the offloaders
copy bytes out and back) trains bit for bit like keep-all: its losses must be equal.
torch.compile fuses and reorders floating-point work, so its losses are held to a relative
tolerance: 1e-4 in float32, 1e-2 in bfloat16. A GPU kernel that is not deterministic
(some attention backward kernels accumulate with atomics) can break the bitwise rule on a
GPU; the table then shows the largest relative difference rather than hiding it.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

__all__ = ["GIB", "finish_stash_rows", "gib", "loss_check", "stash_summary", "table"]

GIB = float(1 << 30)
TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-2, "float16": 1e-2}


def loss_check(losses: List[float], reference: List[float], compiled: bool,
               dtype: str) -> Dict[str, Any]:
    """Note [Which losses must match]."""
    if not reference or len(losses) != len(reference):
        return {"rule": "n/a", "ok": None, "max_rel_diff": None}
    # A step both lost (an injected fault: run_system's fault_at) is no comparison.
    pairs = [(a, b) for a, b in zip(losses, reference) if a is not None or b is not None]
    if any(a is None or b is None for a, b in pairs):
        return {"rule": "n/a", "ok": False, "max_rel_diff": None}
    rel = max([abs(a - b) / max(abs(b), 1e-30) for a, b in pairs] or [0.0])
    if compiled:
        tol = TOLERANCE.get(dtype, 1e-2)
        return {"rule": f"rel <= {tol:g}", "tolerance": tol, "max_rel_diff": rel,
                "ok": rel <= tol}
    return {"rule": "bitwise", "max_rel_diff": rel, "ok": losses == reference}


def stash_summary(report: Dict[str, Any], steps: List[Dict[str, Any]]) -> Dict[str, Any]:
    planned = [s for s in steps if s.get("mode") == "plan"]
    out: Dict[str, Any] = {"budget_bytes": report["budget_bytes"],
                           "plan": report.get("plan"),
                           "timing": report.get("timing"), "cupti": report.get("cupti"),
                           "fit_peak_bytes": max((s["fit_peak_bytes"] or 0) for s in steps),
                           "within_budget_fit": all((s["fit_peak_bytes"] or 0)
                                                    <= report["budget_bytes"] for s in steps)}
    if planned:
        pred_ms = [s["predicted_step_ms"] for s in planned if s["predicted_step_ms"]]
        pred_peak = [s["predicted_peak_bytes"] for s in planned if s["predicted_peak_bytes"]]
        out["predicted_step_ms"] = statistics.median(pred_ms) if pred_ms else None
        # A planned step that compiled a graph (a whole-model row's plan takes effect by
        # recompiling) times the compiler: 2249.8 ms against 46.5 predicted was read so.
        timed = [s for s in planned if not s.get("compiles")] or planned
        out["measured_step_ms"] = statistics.median(s["step_ms"] for s in timed)
        out["predicted_peak_bytes"] = max(pred_peak) if pred_peak else None
    return out


def finish_stash_rows(rows: List[Dict[str, Any]], cuda: bool) -> None:
    """Budget checks on the run's meter, and each stash row against the peer whose peak
    it ran at."""
    by_name = {r["name"]: r for r in rows}
    for r in rows:
        if r["kind"] != "stash" or r["status"] != "ok":
            continue
        budget = r["stash"]["budget_bytes"]
        r["within_budget"] = (r["peak_bytes"] is not None and r["peak_bytes"] <= budget) \
            if cuda else r["stash"]["within_budget_fit"]
        r["budget_meter"] = "cuda allocator" if cuda else "fit's own count (CPU)"
        peer = by_name.get(r["reference"])
        if peer is not None and peer["status"] == "ok" and peer["tokens_per_s"]:
            r["vs_reference"] = r["tokens_per_s"] / peer["tokens_per_s"]


def gib(v: Optional[float]) -> str:
    """Bytes as the table's GiB, '-' for none."""
    return "-" if v is None else f"{v / GIB:.3f}"


def table(rows: List[Dict[str, Any]]) -> str:
    keep = next((r for r in rows if r["kind"] == "keep-all" and r["status"] == "ok"), None)
    out = ["| system | peak allocated (GiB) | peak reserved (GiB) | tokens/s | vs keep-all "
           "| losses vs keep-all | budget (GiB) | within budget | predicted peak (GiB) "
           "| predicted / measured step (ms) | vs the peer at this budget | notes |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "ok":
            out.append(f"| {r['label']} | - | - | - | - | - | - | - | - | - | - "
                       f"| {r['status']}: {str(r['reason']).replace('|', '/')[:300]} |")
            continue
        vs_keep = (f"{100 * r['tokens_per_s'] / keep['tokens_per_s']:.1f}%"
                   if keep and keep["tokens_per_s"] else "-")
        lc = r.get("loss_check", {})
        if r["kind"] == "keep-all":
            losses = "reference"
        elif lc.get("ok") is None:
            losses = "-"
        elif lc["rule"] == "bitwise":
            losses = "bitwise" if lc["ok"] else f"DIFFER (max rel {lc['max_rel_diff']:.2e})"
        else:
            losses = (f"{'ok' if lc['ok'] else 'OUT'} (max rel {lc['max_rel_diff']:.1e}, "
                      f"{lc['rule']})")
        s = r.get("stash")
        if s:
            budget = gib(s["budget_bytes"])
            within = "yes" if r.get("within_budget") else "NO"
            pred_peak = gib(s.get("predicted_peak_bytes"))
            step = (f"{s['predicted_step_ms']:.1f} / {s['measured_step_ms']:.1f}"
                    if s.get("predicted_step_ms") else "-")
            vs_ref = (f"{100 * r['vs_reference']:.1f}% of {r['reference']}"
                      if r.get("vs_reference") else "-")
            a = (s.get("plan") or {}).get("actions", {})
            notes = (f"plan keep/recompute/offload {a.get('keep', 0)}/{a.get('recompute', 0)}"
                     f"/{a.get('offload', 0)}")
        else:
            budget = within = pred_peak = step = vs_ref = "-"
            notes = ""
        if r.get("timing_note"):
            notes = (notes + "; " if notes else "") + r["timing_note"]
        out.append(f"| {r['label']} | {gib(r['peak_bytes'])} | {gib(r['reserved_bytes'])} "
                   f"| {r['tokens_per_s']:.0f} | {vs_keep} | {losses} | {budget} | {within} "
                   f"| {pred_peak} | {step} | {vs_ref} | {notes} |")
    return "\n".join(out)
