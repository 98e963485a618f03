"""stash.torch.fit's report: what each step measured beside what the plan predicted, as
a dict (fit_report) and as the table the README shows (format_report). Functions of typed
step records and of what the handle hands them; they read no handle."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, Optional, Sequence

from ._fit_options import Budget
from ._fit_ranks import Ranks
from ._fit_support import GiB, StepRecord, _gib


def fit_report(records: Sequence[StepRecord], entry: Optional[Dict[str, Any]],
               budget: Budget, budget_bytes: Optional[int], *, timing: str, meter: str,
               ranks: Optional[Ranks]) -> Dict[str, Any]:
    """The budget, one entry per finished step (measured and predicted peak and step
    time, exposed copy time, mode, its shape's budget in bytes; an aborted step says
    why), the current shape's plan summary (entry: its cache entry) and how it was
    measured (timing: the clock; meter: what the peak is read from)."""
    prof = entry.get("profile") if entry else None
    plan = entry.get("plan") if entry else None
    return {"budget": str(budget), "budget_bytes": budget_bytes,
            "timing": timing,
            "cupti": prof.get("measurement", {}).get("cupti") if prof else None,
            "memory": meter,
            "link": prof["link"] if prof else None,
            "fixed_bytes": prof["fixed_bytes"] if prof else None,
            "ranks": ({"rank": ranks.rank, "world": ranks.world,
                       "local_world": ranks.local_world,
                       "plan_sha256": (hashlib.sha256(json.dumps(
                           plan, sort_keys=True).encode()).hexdigest() if plan else None)}
                      if ranks is not None else None),
            "steps": [step_entry(s) for s in records if s.finished],
            "plan": plan_summary(plan)}


def format_report(r: Dict[str, Any]) -> str:
    """fit_report()'s dict as the table the README shows."""
    lines = [f"stash.torch.fit: budget {r['budget']} = "
             f"{_gib(r['budget_bytes']) if r['budget_bytes'] else '(not yet known)'}; "
             f"timing {r['timing']}; memory {r['memory']}",
             "step  mode     peak GiB (pred)     step ms (pred)   exposed ms"]
    for s in r["steps"]:
        pp = f"{s['predicted_peak_bytes'] / GiB:.3f}" if s["predicted_peak_bytes"] else "-"
        ps = f"{s['predicted_step_ms']:.2f}" if s["predicted_step_ms"] else "-"
        flag = "  OVER BUDGET" if s["over_budget"] else ""
        if s["aborted"]:
            flag = f"  aborted: {s['aborted']}"
        elif s["check"] is not None:
            flag += f"  derived plan, first run: {s['check']}"
        lines.append(f"{s['step']:>4}  {s['mode']:<7}  {s['measured_peak_bytes'] / GiB:8.3f}"
                     f" ({pp:>7})  {s['step_ms']:9.2f} ({ps:>8})  {s['exposed_copy_ms']:8.3f}"
                     f"{flag}")
    if r["plan"]:
        p = r["plan"]
        lines.append(f"plan: {p['solver']}, {p['actions']['keep']} keep / "
                     f"{p['actions']['recompute']} recompute / {p['actions']['offload']} "
                     f"offload; predicted peak {_gib(p['predicted_peak_bytes'])} of keep-all "
                     f"{_gib(p['keep_all_peak_bytes'])}")
    return "\n".join(lines)


def step_entry(s: StepRecord) -> Dict[str, Any]:
    """One step of report()."""
    return {"step": s.index, "mode": s.mode, "shape": s.key,
            # Note [Micro-batches of other shapes] in _fit_passes.py: each pass's shape
            "pass_shapes": list(s.pass_keys),
            "measured_peak_bytes": s.peak_bytes, "measured_peak_at": s.peak_at,
            "predicted_peak_bytes": s.predicted_peak, "budget_bytes": s.budget_bytes,
            "step_ms": s.step_ms, "predicted_step_ms": s.predicted_step,
            "exposed_copy_ms": s.exposed_ms, "micro_batches": s.passes,
            "planning_ms": s.planning_ms, "aborted": s.aborted,
            "plan_source": s.plan_source, "check": s.check,
            "over_budget": s.over_budget}


def plan_summary(plan: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """What report() says of a stash.plan/1 document."""
    if plan is None:
        return None
    counts = {"keep": 0, "recompute": 0, "offload": 0}
    for layer in plan["layers"]:
        for t in layer["tensors"]:
            counts[t["action"]] += 1
    return {"solver": plan["solver"], "actions": counts,
            "predicted_peak_bytes": plan["predicted"]["peak_bytes"],
            "predicted_step_ms": plan["predicted"]["step_ms"],
            "keep_all_peak_bytes": plan["baselines"]["keep_all"]["peak_bytes"],
            "offloaded_bytes": plan["predicted"]["offloaded_bytes"],
            "binding_constraints": plan["binding_constraints"][:8]}
