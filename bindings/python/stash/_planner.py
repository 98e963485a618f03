"""The planner (stash.h, "Planner") through ctypes: a profile and a budget give a plan.

:func:`make_plan` is what ``stash plan`` does, in this process: the same solvers, the same
messages. A budget that has no valid plan raises :class:`InfeasibleBudget`, which carries
the smallest budget that has one; :func:`evaluate` prices any plan with the canonical
model (``stash check``).
"""

from __future__ import annotations

import ctypes
import json
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from ._lib import StashError, load, status_string

__all__ = ["InfeasibleBudget", "PlanResult", "SOLVERS", "evaluate", "make_plan"]

SOLVERS = {"greedy": 0, "ilp": 1, "exact": 2}

STASH_ERROR_BAD_PROFILE = 105
STASH_ERROR_INFEASIBLE_BUDGET = 106

GiB = float(1 << 30)


class PlanOptions(ctypes.Structure):
    """stash_plan_options_t; filled by stash_plan_options_init."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("version", ctypes.c_uint),
                ("solver", ctypes.c_int), ("time_limit_s", ctypes.c_double),
                ("mip_gap", ctypes.c_double), ("polish", ctypes.c_int)]


class PlanResult(ctypes.Structure):
    """stash_plan_result_t; filled by stash_plan_result_init."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("budget_bytes", ctypes.c_uint64),
                ("keep_all_peak_bytes", ctypes.c_uint64),
                ("min_feasible_bytes", ctypes.c_uint64), ("min_feasible_proved", ctypes.c_int),
                ("predicted_peak_bytes", ctypes.c_uint64),
                ("predicted_step_ms", ctypes.c_double)]

    def as_dict(self) -> Dict[str, Any]:
        return {f[0]: getattr(self, f[0]) for f in self._fields_[1:]}


class InfeasibleBudget(StashError):
    """No valid plan exists at the budget; ``min_feasible_bytes`` is the smallest budget
    that has one (``min_feasible_proved`` False: a budget that works, maybe not the least)."""

    def __init__(self, message: str, status: int, result: Dict[str, Any]):
        super().__init__(message, status)
        self.budget_bytes = int(result["budget_bytes"])
        self.min_feasible_bytes = int(result["min_feasible_bytes"])
        self.min_feasible_proved = bool(result["min_feasible_proved"])
        self.keep_all_peak_bytes = int(result["keep_all_peak_bytes"])


def _lib() -> ctypes.CDLL:
    lib = load("libstash.so")
    if not getattr(lib, "_stash_planner_typed", False):
        lib.stash_plan_options_init.argtypes = [ctypes.POINTER(PlanOptions)]
        lib.stash_plan_options_init.restype = None
        lib.stash_plan_result_init.argtypes = [ctypes.POINTER(PlanResult)]
        lib.stash_plan_result_init.restype = None
        lib.stash_plan_make.argtypes = [ctypes.c_char_p, ctypes.c_char_p,
                                        ctypes.POINTER(PlanOptions),
                                        ctypes.POINTER(ctypes.c_void_p),
                                        ctypes.POINTER(PlanResult)]
        lib.stash_plan_make.restype = ctypes.c_int
        lib.stash_plan_evaluate.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint64,
                                            ctypes.POINTER(PlanResult)]
        lib.stash_plan_evaluate.restype = ctypes.c_int
        lib.stash_free.argtypes = [ctypes.c_void_p]
        lib.stash_free.restype = None
        lib.stash_last_error.argtypes = []
        lib.stash_last_error.restype = ctypes.c_char_p
        setattr(lib, "_stash_planner_typed", True)
    return lib


def _text(doc: Union[str, Mapping[str, Any]]) -> bytes:
    return (doc if isinstance(doc, str) else json.dumps(doc)).encode()


def make_plan(profile: Union[str, Mapping[str, Any]], budget: Union[int, str], *,
              solver: str = "greedy", time_limit_s: float = 60.0, mip_gap: float = 0.0,
              polish: bool = True) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Plans `profile` (a stash.profile/1 dict or JSON text) under `budget` (bytes, "40GiB"
    or "70%" of the profile's keep-all peak). Returns (plan, figures): the stash.plan/1
    document as a dict, and stash_plan_result_t as a dict (budget_bytes,
    keep_all_peak_bytes, predicted_peak_bytes, predicted_step_ms, ...).

    Raises InfeasibleBudget when no valid plan exists, StashError naming the field for a
    malformed profile or budget, ValueError for an unknown solver."""
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r} (use greedy, ilp or exact)")
    lib = _lib()
    opt = PlanOptions()
    lib.stash_plan_options_init(ctypes.byref(opt))
    opt.solver, opt.time_limit_s, opt.mip_gap = SOLVERS[solver], time_limit_s, mip_gap
    opt.polish = 1 if polish else 0
    res = PlanResult()
    lib.stash_plan_result_init(ctypes.byref(res))
    out = ctypes.c_void_p()
    status = lib.stash_plan_make(_text(profile), str(budget).encode(), ctypes.byref(opt),
                                 ctypes.byref(out), ctypes.byref(res))
    if status != 0:
        msg = lib.stash_last_error().decode(errors="replace")
        text = f"{msg} ({status_string(status)}, status {status})"
        if status == STASH_ERROR_INFEASIBLE_BUDGET:
            raise InfeasibleBudget(text, status, res.as_dict())
        raise StashError(text, status)
    try:
        plan = json.loads(ctypes.string_at(out.value or 0).decode())
    finally:
        lib.stash_free(out)
    return plan, res.as_dict()


def evaluate(profile: Union[str, Mapping[str, Any]], plan: Union[str, Mapping[str, Any]],
             budget_bytes: Optional[int] = None, *, strict: bool = True) -> Dict[str, Any]:
    """Prices `plan` on `profile` with the canonical model (what ``stash check`` does):
    predicted_peak_bytes and predicted_step_ms, and budget_bytes (the plan's own when
    None). Raises StashError naming each violated constraint when the plan is not valid
    under that budget, unless strict is False: then the figures come back all the same,
    with "violations" (the message) added."""
    lib = _lib()
    res = PlanResult()
    lib.stash_plan_result_init(ctypes.byref(res))
    status = lib.stash_plan_evaluate(_text(profile), _text(plan),
                                     0 if budget_bytes is None else int(budget_bytes),
                                     ctypes.byref(res))
    if status != 0:
        msg = lib.stash_last_error().decode(errors="replace")
        if not strict and status == STASH_ERROR_INFEASIBLE_BUDGET:
            return dict(res.as_dict(), violations=msg)
        raise StashError(f"{msg} ({status_string(status)}, status {status})", status)
    return res.as_dict()
