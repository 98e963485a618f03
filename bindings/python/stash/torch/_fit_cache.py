"""stash.torch.fit's cache on disk (cache_dir): profiles and plans by the blocks' digest,
the shape key and (plans) the budget and solver (Note [Re-planning and the cache] in
_fit.py). Mixed into _fit.BudgetHandle, whose options, _digest, budget,
_cache, _entry, _measured_for, measure_steps, _ranks and _plan_from_measurement it uses."""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from typing import Any, Dict, Optional

from .. import profile as _profile
from .._lib import StashError
from .._planner import evaluate
from ._fit_support import _actions_of


class FitCache:
    """BudgetHandle's profiles and plans in cache_dir."""

    def _plan_name(self) -> str:
        b = hashlib.sha1(self.budget.planner_text.encode()).hexdigest()[:8]
        return f"plan-{b}-{self.options.solver}"

    def _path(self, key: str, what: str) -> Optional[str]:
        if self.options.cache_dir is None:
            return None
        return os.path.join(self.options.cache_dir, f"fit-{self._digest}-{key}.{what}.json")

    def _store(self, key: str, what: str, doc):
        path = self._path(key, what)
        if path is None:
            return
        _profile.write_json(path, doc)

    def _load_cached(self, key: str) -> Optional[Dict[str, Any]]:
        ppath = self._path(key, "profile")
        if ppath is None or not os.path.exists(ppath):
            return None
        try:
            with open(ppath) as f:
                doc = json.load(f)
            _profile.validate(doc)
        except (OSError, ValueError, StashError) as e:
            warnings.warn(f"stash.torch.fit: ignoring the cached profile {ppath}: {e}")
            return None
        entry = {"profile": doc, "from_disk": True}
        qpath = self._path(key, self._plan_name())
        if self._ranks is not None and not os.path.exists(qpath):
            return None  # ranks agree on cached plans, not profiles: measure (_agree_cached)
        self._cache[key] = entry
        plan = None
        if os.path.exists(qpath):
            try:
                with open(qpath) as f:
                    plan = json.load(f)
                figures = evaluate(doc, plan)
                figures["keep_all_peak_bytes"] = plan["baselines"]["keep_all"]["peak_bytes"]
            except (OSError, ValueError, KeyError, StashError):
                plan = None
        if plan is None:
            if self._ranks is not None:  # as without a plan on disk: measure
                self._cache.pop(key, None)
                return None
            entry["measured_peak_bytes"] = None
            self._measured_for[key] = self.options.measure_steps
            self._entry = entry
            return self._plan_from_measurement(key)
        entry.update(plan=plan, figures=figures, actions=_actions_of(plan))
        return entry
