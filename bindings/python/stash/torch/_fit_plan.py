"""stash.torch.fit's planning from the measuring step: the link, the budget in bytes, a
plan from the measured profile (on one rank; _fit_ranks.py agrees one across ranks) and
its failures, and the prefix closure of recompute (Note [Recompute cost as the replay
pays it] in _fit.py). Mixed into _fit.BudgetHandle, whose _ranks, device,
_cuda, options, budget, _entry, _cache, _store, _plan_name,
_plan_across_ranks, _link_across_ranks and _fail it uses."""

from __future__ import annotations

from typing import Any, Dict, Optional

from .._lib import StashError
from .._link import cached_link
from .._planner import InfeasibleBudget, evaluate, make_plan
from ._fit_shapes import derive_profile
from ._fit_support import _actions_of, _DerivedLayer, _gib, _min_feasible, _plan_doc
from ._record import _device_info


def _smallest_accepted(min_feasible: int, measured: Optional[int]) -> int:
    """The smallest budget a refusal names: one the same run accepts, so at least what the
    measuring step itself used (it must fit, Note [The measuring step]) as well as the
    planner's smallest feasible one."""
    return max(int(min_feasible), int(measured or 0))


class FitPlanning:
    """BudgetHandle's plan from its measurement."""

    def _link(self) -> Dict[str, Any]:
        if isinstance(self.options.link, dict):
            try:
                link = {k: float(self.options.link[k]) for k in ("h2d_gbps", "d2h_gbps",
                                                               "bidir_gbps")}
            except (KeyError, TypeError, ValueError) as e:
                raise StashError(f"stash.torch.fit: link needs h2d_gbps, d2h_gbps and "
                                 f"bidir_gbps as numbers; got {self.options.link!r}") from e
            if not all(v > 0 for v in link.values()):
                raise StashError(f"stash.torch.fit: link bandwidths must be positive, got {link}")
            ranks = self._ranks.local_world if self._ranks is not None else 1
            link["local_ranks"] = int(self.options.link.get("local_ranks", ranks))
            return link
        if self.options.link is not None and self.options.link != "measure":
            raise StashError(f"stash.torch.fit: link must be None, 'measure' or a dict with "
                             f"h2d_gbps, d2h_gbps, bidir_gbps; got {self.options.link!r}")
        dev = self.device.index if self._cuda else 0
        name = _device_info(self.device)["name"]
        nbytes = 0 if self._cuda else 64 << 20
        try:
            if self._ranks is not None:
                link = self._link_across_ranks(f"{name}-{dev}", dev, nbytes)
            else:
                link = cached_link(f"{name}-{dev}", dev, nbytes, 0, self.options.cache_dir)
        except StashError as e:
            raise StashError(f"stash.torch.fit: measuring the host-device link failed ({e}); "
                             "pass link={'h2d_gbps': ..., 'd2h_gbps': ..., 'bidir_gbps': ...} "
                             "(`stash bench link` measures them)", e.status) from e
        self.link_cached = link.get("cached", False)
        return {"h2d_gbps": link["h2d_gbps"], "d2h_gbps": link["d2h_gbps"],
                "bidir_gbps": link["bidir_gbps"], "local_ranks": int(link["local_ranks"])}

    @property
    def budget_bytes(self) -> Optional[int]:
        """The budget in bytes of the current shape: as given, or a share resolved once the
        shape has a plan (Note [What a share budget means])."""
        if not self.budget.is_share:
            return self.budget.nbytes
        entry = self._entry
        if entry is not None and "figures" in entry:
            return int(entry["figures"]["budget_bytes"])
        return None

    def _budget_for(self, key: str) -> Optional[int]:
        """The budget in bytes of the shape `key` (None: a share not resolved yet)."""
        if not self.budget.is_share:
            return self.budget.nbytes
        entry = self._cache.get(key)
        if entry is None:
            return None
        if "figures" in entry:
            return int(entry["figures"]["budget_bytes"])
        if "profile" in entry and "share_budget_bytes" not in entry:
            # A shape measured and never planned yet: its keep-all peak, from the profile.
            doc = entry["profile"]
            keep = _plan_doc(doc, [["keep"] * len(layer["tensors"]) for layer in doc["layers"]])
            peak = evaluate(doc, keep, 1 << 62, strict=False)["predicted_peak_bytes"]
            entry["share_budget_bytes"] = int(self.budget.share / 100 * peak)
        return entry.get("share_budget_bytes")

    def _plan_from_measurement(self, key: str) -> Dict[str, Any]:
        if self._ranks is not None:
            return self._plan_across_ranks(key)
        return self._plan_locally(key)

    def _plan_locally(self, key: str) -> Dict[str, Any]:
        entry = self._cache[key]
        doc = entry["profile"]
        measured = entry.get("measured_peak_bytes")
        # Note [The measuring step]: least-memory mode must fit before anything is planned.
        # A byte budget is checked against it first; a share is a budget only once the
        # planner has the keep-all peak, so it is checked right after.
        budget = self.budget.nbytes
        if budget is not None and measured is not None and measured > budget:
            self._fail_least_memory(doc, measured, budget)
        try:
            plan, figures = make_plan(doc, self.budget.planner_text, solver=self.options.solver)
        except InfeasibleBudget as e:
            seen = (f"; the measuring step (least memory) peaked at {_gib(measured)}"
                    if measured is not None else "")
            smallest = _smallest_accepted(e.min_feasible_bytes, measured)
            self._fail(StashError(
                f"stash.torch.fit: no plan fits the budget of {_gib(e.budget_bytes)} "
                f"(requested {self.budget}): the smallest feasible budget for this model "
                f"and shape is {_gib(smallest)} ({smallest} bytes); "
                f"keep-all would peak at {_gib(e.keep_all_peak_bytes)}{seen}. The blocks are "
                "restored; nothing was changed.", e.status))
        if measured is not None and measured > figures["budget_bytes"]:
            self._fail_least_memory(doc, measured, figures["budget_bytes"])
        plan, figures = self._prefix_closed(doc, plan, figures)
        entry.update(plan=plan, figures=figures, actions=_actions_of(plan))
        self._store(key, self._plan_name(), plan)
        return entry

    def _plan_derived(self, key: str) -> Optional[Dict[str, Any]]:
        """A plan for a shape never measured, from a profile derived from the measured
        shapes of its family (Note [A profile derived from the measured shapes]); None when
        there is nothing to derive from or the derived profile has no plan (the shape is
        then measured: the measurement, not a derivation, refuses a budget)."""
        if self._ranks is not None or key in self._underivable:
            return None
        family, tokens = self._shapes.get(key, (None, None))
        if tokens is None:
            return None
        counted = self._fixed_counted()
        bases = [(self._shapes[k][1], e["profile"], counted) for k, e in self._cache.items()
                 if k != key and self._shapes.get(k, (None,))[0] == family
                 and not e.get("derived") and "profile" in e and self._shapes[k][1]]
        measured = {b[0] for b in bases}
        if len(measured) == 1 and max(tokens / min(measured), min(measured) / tokens) >= 1.5:
            # One measured shape gives no exponents: a second, far enough from it to fit
            # them, is measured (Note [A profile derived from the measured shapes]).
            return None
        doc = derive_profile(bases, tokens)
        if doc is None:
            return None
        try:
            plan, figures = make_plan(doc, self.budget.planner_text, solver=self.options.solver)
        except InfeasibleBudget:
            self._underivable.add(key)
            return None
        plan, figures = self._prefix_closed(doc, plan, figures)
        entry = {"profile": doc, "derived": True, "measured_peak_bytes": None, "plan": plan,
                 "figures": figures,
                 "actions": [_DerivedLayer(a) for a in _actions_of(plan)]}
        self._cache[key] = entry
        return entry

    def _fail_least_memory(self, doc, measured, budget):
        smallest = _smallest_accepted(_min_feasible(doc), measured)
        self._fail(StashError(
            f"stash.torch.fit: the measuring step (least memory: every block recomputed from "
            f"its input, inputs offloaded) peaked at {_gib(measured)} ({measured} bytes), over "
            f"the budget of {_gib(budget)} ({budget} bytes); the smallest feasible budget "
            f"for this model and shape is {_gib(smallest)} ({smallest} bytes). The blocks are "
            "restored; nothing was planned."))

    def _prefix_closed(self, doc, plan, figures):
        """Note [Recompute cost as the replay pays it]."""
        changed = False
        for li, layer in enumerate(plan["layers"]):
            ts = layer["tensors"]
            prof = doc["layers"][li]["tensors"]
            rec = [j for j, t in enumerate(ts) if t["action"] == "recompute"]
            if not rec:
                continue
            last = max(rec)
            for j in range(last):
                if prof[j]["recomputable"] and ts[j]["action"] != "recompute":
                    ts[j]["action"] = "recompute"
                    changed = True
        if changed:
            priced = evaluate(doc, plan, figures["budget_bytes"])
            figures = dict(figures, predicted_peak_bytes=priced["predicted_peak_bytes"],
                           predicted_step_ms=priced["predicted_step_ms"])
            plan["predicted"]["peak_bytes"] = priced["predicted_peak_bytes"]
            plan["predicted"]["step_ms"] = priced["predicted_step_ms"]
            plan["prefix_closed"] = True
        return plan, figures
