"""stash.torch.fit's measuring step turned into a stash.profile/1: per-layer times and
tensors from the step's records (Notes [The measuring step] and [Recompute cost as the
replay pays it] in _fit.py), the fixed bytes (Note [What the budget counts]) and CUPTI's
figures beside the events. Mixed into _fit.BudgetHandle, whose state it reads."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict

from .. import profile as _profile
from .._engine import KEEP, OFFLOAD, RECOMPUTE
from .._planner import evaluate
from ._fit_support import (StepRecord, _cupti_fwd, _min_feasible, _optimizer_state_estimate,
                           _plan_doc)
from ._record import _device_info, _pinnable_bytes


class FitProfile:
    """BudgetHandle's profile building. Uses its _clock, _layers, blocks, device, _cuda,
    _link_section, _cache, _entry, _cupti_used, _cupti, optimizer and _store."""

    def _record_profile(self, rec: StepRecord):
        """Turns a finished measuring step into a stash.profile/1 (kept in the cache)."""
        clock = self._clock
        layers = []
        cupti_fwd = []
        total_fwd = total_bwd = 0.0
        # The first holder of a storage later blocks share is must_keep too: offloading it
        # would free nothing while they hold it.
        first_holders = {e["holder"] for layer in self._layers for e in layer.entries
                         if e["holder"] is not None}
        for i, layer in enumerate(self._layers):
            fwd = [clock.ms(v.begin, v.end) for (_, l), v in rec.fwd.items()
                   if l == i and v.begin is not None]
            bwd = [clock.ms(v.begin, v.end) for (_, l), v in rec.bwd.items()
                   if l == i and v.end is not None]
            reps = [v for (_, l), v in rec.replay.items() if l == i and v.end is not None]
            rep_ms = [clock.ms(v.begin, v.end) for v in reps]
            total_fwd += sum(fwd)
            total_bwd += sum(bwd)
            n = max(1, len(fwd))
            fwd_ms = sum(fwd) / n
            kernel = _cupti_fwd(rec.cupti, i)
            if kernel is not None:
                cupti_fwd.append({"layer": i, "kernel_ms": kernel, "span_ms": fwd_ms})
            bwd_ms = max(0.0, (sum(bwd) - sum(rep_ms)) / max(1, len(bwd)))
            # Note [Recompute cost as the replay pays it]
            # A segment that ends at an input's save (restored, not recomputed) belongs to the
            # next recomputable tensor, so the costs still add up to the replay's prefix.
            cost = {}
            if reps:
                prev = reps[0].begin
                for j, m in reps[0].marks:
                    e = layer.entries[j] if j < len(layer.entries) else None
                    if e is not None and e["recomputable"] and j not in cost:
                        cost[j] = clock.ms(prev, m)
                        prev = m
            tensors = []
            seen_names = set()
            for j, e in enumerate(layer.entries):
                again = e["holder"] is not None        # listed by an earlier block
                keep = again or (i, j) in first_holders or e.get("held_outside", False)
                name = "input" if e.get("is_input") and "input" not in seen_names else f"saved.{j}"
                seen_names.add(name)
                tensors.append({
                    "name": name,
                    "bytes": 0 if again else int(e["bytes"]),
                    "recompute_ms": float(cost.get(j, 0.0)) if e["recomputable"] else 0.0,
                    "offloadable": not keep,
                    "recomputable": bool(e["recomputable"]) and not keep,
                    "must_keep": keep,
                })
            digest = hashlib.sha256(json.dumps(
                [(t["bytes"], t["recomputable"], t["must_keep"]) for t in tensors]).encode()
            ).hexdigest()[:16]
            layers.append({"name": f"{type(self.blocks[i]).__name__}.{i}",
                           "signature": f"{type(self.blocks[i]).__name__}:{digest}",
                           "fwd_ms": fwd_ms, "bwd_ms": bwd_ms, "bwd_temp_bytes": 0,
                           "tensors": tensors})
        end = rec.end if rec.end is not None else rec.bwd_end
        step_ms = clock.ms(rec.start, end)
        # Once per step (the loss, the optimizer, the uploads), whatever the micro-batches.
        overhead = max(0.0, step_ms - total_fwd - total_bwd)
        doc = {
            "schema": _profile.SCHEMA,
            "source": "measured",
            "device": _device_info(self.device),
            "link": dict(self._link_section),
            "host": {"pinnable_bytes": _pinnable_bytes()},
            "fixed_bytes": 0,
            "step_overhead_ms": overhead,
            "layers": layers,
            "measurement": {"timing": self._timing_kind(), "passes": rec.passes,
                            "cupti": self._cupti_summary(cupti_fwd),
                            "notes": ["fit: least-memory measuring step"]},
        }
        doc["fixed_bytes"] = self._fixed_from(doc, rec)
        entry = {"profile": doc, "measured_peak_bytes": rec.peak_bytes}
        self._cache[rec.key] = entry
        self._entry = entry
        self._cache.store_profile(rec.key, doc)

    def _measure_actions_seen(self):
        """What the measuring step did with each tensor, by name."""
        names = {KEEP: "keep", RECOMPUTE: "recompute", OFFLOAD: "offload"}
        return [[names[e["action"]] for e in layer.entries] for layer in self._layers]

    def _fixed_from(self, doc, rec) -> int:
        """Note [What the budget counts]."""
        counted = self._fixed_counted()
        self._opt_state_counted = _optimizer_state_estimate(self.optimizer)
        if not self._cuda:
            return self._fixed_by_position(doc, rec, counted)
        probe = dict(doc, fixed_bytes=0)
        measure_plan = _plan_doc(probe, self._measure_actions_seen())
        act = evaluate(probe, measure_plan, 1 << 62, strict=False)["predicted_peak_bytes"]
        calibrated = rec.peak_bytes - act
        missing = self._opt_state_counted if (
            self.optimizer is not None and not len(self.optimizer.state)) else 0
        return int(max(calibrated + missing, counted))

    def _fixed_by_position(self, doc, rec, counted: int) -> int:
        """Note [What the budget counts], on the CPU: what the allocator held above fit's
        count, by position (none without the counting allocator). The most of it in any
        forward joins the fixed bytes; the rest of a layer's backward, and of the loss for
        the last layer, become the layer's backward temporaries; the optimizer step's own,
        with no activation alive, join the fixed bytes only as far as they would not fit
        under the least a plan holds."""
        u = rec.untracked
        forward = max([0] + [v for k, v in u.items() if k[0] == "fwd"])
        fixed = counted + forward
        last = len(doc["layers"]) - 1
        for i, layer in enumerate(doc["layers"]):
            temp = u.get(("bwd", i), 0)
            if i == last:
                temp = max(temp, u.get(("loss",), 0))
            layer["bwd_temp_bytes"] = int(max(0, temp - forward))
        optimizer = u.get(("opt",), 0)
        if optimizer > forward:
            least = _min_feasible(dict(doc, fixed_bytes=fixed)) - fixed
            fixed = max(fixed, counted + optimizer - max(0, least))
        return fixed

    def _cupti_summary(self, fwd) -> Dict[str, Any]:
        """Note [The measuring step]: CUPTI's forward kernel time beside the events' span,
        or why CUPTI did not run."""
        if self._cupti_used is None:
            return {"used": False, "reason": "no CUDA device (the host clock times the step)"}
        used, reason = self._cupti_used
        if used and fwd:
            return {"used": True, "forward": fwd,
                    "kernel_share": sum(f["kernel_ms"] for f in fwd)
                    / max(1e-9, sum(f["span_ms"] for f in fwd))}
        return {"used": False, "reason": reason or self._cupti.reason or "no records"}
