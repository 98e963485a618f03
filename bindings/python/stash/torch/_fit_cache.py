"""stash.torch.fit's cache: every shape's profile and plan in memory, by shape key, and
in cache_dir on disk by the blocks' digest, the shape key and (plans) the budget and
solver (Note [Re-planning and the cache] in _fit_shape_plans.py). What a cached plan means
for the step (plan from it, measure, agree across ranks) is the handle's decision, not this
part's."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, Optional, Tuple

from .. import profile as _profile
from .._lib import StashError
from .._planner import evaluate
from .._warn import warn
from ._fit_gradients import planned_without, view
from ._fit_options import Budget

Entry = Dict[str, Any]  # profile, plan, figures, actions and the flags fit keeps beside them


class ShapeCache(Dict[str, Entry]):
    """The entries of the shapes seen (a dict: shape key -> entry), and their files in
    cache_dir when one is given."""

    def __init__(self, cache_dir: Optional[str], digest: str, budget: Budget, solver: str):
        super().__init__()
        self.cache_dir = cache_dir
        self.digest = digest
        budget_id = hashlib.sha1(budget.planner_text.encode()).hexdigest()[:8]
        self.plan_name = f"plan-{budget_id}-{solver}"

    def _path(self, key: str, what: str) -> Optional[str]:
        if self.cache_dir is None:
            return None
        return os.path.join(self.cache_dir, f"fit-{self.digest}-{key}.{what}.json")

    def store_profile(self, key: str, doc: Dict[str, Any]) -> None:
        self._store(key, "profile", doc)

    def _plan_file(self, without_gradients: bool) -> str:
        """A plan made on the view without gradients has a name of its own (Note
        [Gradients by position] in _fit_gradients.py)."""
        return self.plan_name + ("-nograd" if without_gradients else "")

    def store_plan(self, key: str, plan: Dict[str, Any], without_gradients: bool = False) -> None:
        self._store(key, self._plan_file(without_gradients), plan)

    def _store(self, key: str, what: str, doc: Dict[str, Any]) -> None:
        path = self._path(key, what)
        if path is not None:
            _profile.write_json(path, doc)

    def read(self, key: str, without_gradients: bool = False
             ) -> Optional[Tuple[Dict[str, Any], Optional[Dict[str, Any]],
                                 Optional[Dict[str, Any]], bool]]:
        """(profile, plan, figures, on the view) of `key` from cache_dir, for a step that
        begins without gradients or not; None without a readable profile (a file that does
        not validate is ignored, with a warning). plan and figures are None where no plan
        for this budget, solver and kind of step is there, or it does not price against
        the profile it was made on."""
        ppath = self._path(key, "profile")
        if ppath is None or not os.path.exists(ppath):
            return None
        try:
            with open(ppath) as f:
                doc = json.load(f)
            _profile.validate(doc)
        except (OSError, ValueError, StashError) as e:
            warn(f"stash.torch.fit: ignoring the cached profile {ppath}: {e}")
            return None
        without = planned_without(doc, without_gradients)
        qpath = self._path(key, self._plan_file(without))
        if qpath is None or not os.path.exists(qpath):
            return doc, None, None, without
        try:
            with open(qpath) as f:
                plan = json.load(f)
            figures = evaluate(view(doc, without), plan)
            figures["keep_all_peak_bytes"] = plan["baselines"]["keep_all"]["peak_bytes"]
        except (OSError, ValueError, KeyError, StashError):
            return doc, None, None, without
        return doc, plan, figures, without
