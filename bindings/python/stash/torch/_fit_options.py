"""stash.torch.fit's inputs as values: the budget, parsed once, and the frozen options.

Note [What a share budget means]
A budget is bytes ("40GiB", 42949672960) or a share of the keep-all peak ("70%"). Bytes
mean the same on every step. A share is resolved per shape: for each shape key (Note
[Re-planning and the cache] in _fit_shape_plans.py) it is that share of the keep-all peak
the canonical model gives for that shape's profile (measured, or derived from the measured
shapes), so a longer sequence gets a larger budget in bytes, as its keep-all peak is
larger. report() therefore gives every step the budget in bytes of its own shape, and
judges it against that. The profile's keep-all peak includes its fixed bytes, so when a
plan's first run corrects them (Note [What the budget counts] in _fit_steps.py) or the
optimizer's real state replaces its estimate, the shape's share in bytes moves with them:
the share is of the keep-all peak as fit knows it then, and each step is judged against
the bytes its shape had when the step ran. The keep-all peak is that of the profile as
stored, which counts every gradient as allocated, and a share is planned on it: in a loop
that sets its gradients to None keep-all's own peak on the meter is lower, so "70%" is a
share of fit's count, not of that reading. A budget in bytes means those bytes, and is
planned with the gradients where they are made (Note [Gradients by position] in
_fit_gradients.py). A unitless number that could be a share (at most 100, or a
fraction such as 0.7) is refused, naming both spellings: "50" is 50 bytes to the planner's
syntax, and no model trains in 50 bytes.
A short shape can have no plan at the share of its own keep-all peak: the bytes that are
not activations (parameters, gradients, optimizer state) weigh more against its few
activations, and least memory is above the share. Such a shape is planned at the largest
budget in bytes the share gave a shape of this run (ShapePlans.roomier_budget): the run
already holds that much for a longer shape, so the short one fits inside the run's peak
instead of stopping stash (seen on an H200: a 6-layer Llama at "70%" through lengths 512
to 2048 was refused at 512). Only with no such shape, or one that does not hold it either,
is it refused.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple, Union, cast

from .._lib import StashError, parse_bytes

SOLVERS = ("greedy", "ilp", "exact")
_UNITLESS_SHARE_MAX = 100


def _where(what: str) -> str:
    return f"stash.torch.fit: {what}"


@dataclass(frozen=True)
class Budget:
    """A device-memory budget: ``nbytes`` (bytes) or ``share`` (0 < share <= 100, percent
    of the keep-all peak of each shape; Note [What a share budget means])."""

    nbytes: Optional[int] = None
    share: Optional[float] = None
    text: str = ""  # as given, for messages and report()

    @classmethod
    def parse(cls, value: Union[int, str, "Budget"]) -> "Budget":
        if isinstance(value, Budget):
            return value
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            hint = ""
            if isinstance(value, float) and 0 < value <= 1:
                hint = f"; for a share of the keep-all peak write '{value * 100:g}%'"
            raise StashError(_where(
                f"budget must be bytes (an int), a size such as '40GiB', or a share such as "
                f"'70%'; got {value!r}{hint}"))
        text = value.strip() if isinstance(value, str) else str(value)
        if text.endswith("%"):
            number = text[:-1].strip()
            try:
                share = float(number)
            except ValueError:
                share = float("nan")
            if not (0 < share <= 100) or not math.isfinite(share):
                raise StashError(_where(f"budget {value!r} is not a share between 0% and "
                                        "100% of the keep-all peak"))
            return cls(share=share, text=f"{number}%")
        try:
            unitless = float(text)
        except ValueError:
            unitless = None
        if unitless is not None and 0 < unitless <= _UNITLESS_SHARE_MAX:
            percent = unitless * 100 if unitless <= 1 else unitless
            raise StashError(_where(
                f"budget {value!r} has no unit: write '{percent:g}%' for a share of the "
                f"keep-all peak, or a size such as '{text}GiB'"))
        try:
            nbytes = parse_bytes(value)
        except ValueError as e:
            raise StashError(_where(f"budget {value!r} does not parse: {e}")) from None
        if nbytes == 0:
            raise StashError(_where("budget 0 bytes: no plan can meet it"))
        return cls(nbytes=nbytes, text=text)

    @property
    def is_share(self) -> bool:
        return self.share is not None

    @property
    def planner_text(self) -> str:
        """The budget in the planner's syntax (stash_plan_make): "123" or "70%"."""
        return self.text if self.is_share else str(self.nbytes)

    def __str__(self) -> str:
        return self.text


def _positive_int(x: Any) -> bool:
    """An int of at least 1 (a bool is not one)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def _checked_buckets(buckets: Any) -> Optional[Union[int, Tuple[int, ...]]]:
    """fit(buckets=): None, a length every sequence length is rounded up to a multiple of,
    or the lengths themselves (any order; sorted)."""
    if buckets is None or _positive_int(buckets):
        return cast(Optional[int], buckets)
    if (isinstance(buckets, (list, tuple)) and buckets
            and all(_positive_int(b) for b in buckets)):
        return tuple(sorted(set(buckets)))
    raise StashError(_where(
        f"buckets must be a positive int (lengths rounded up to a multiple of it) or a "
        f"non-empty list of positive int lengths, got {buckets!r}"))


@dataclass(frozen=True)
class FitOptions:
    """fit()'s keyword options, checked once (fit's docstring says what each means)."""

    solver: str = "greedy"
    cache_dir: Optional[str] = None
    measure_steps: int = 1
    lookahead: int = 1
    max_in_flight_bytes: Optional[Union[int, str]] = None
    pinned_cap: Optional[Union[int, str]] = None
    max_micro_batches: int = 8
    device: Optional[Any] = None
    link: Optional[Union[str, Dict[str, Any]]] = None
    timing: bool = True
    dist_timeout_s: float = 300.0
    # Note [Lengths rounded up to a bucket] in _fit_shapes.py: a multiple, or the lengths
    # (a sorted tuple once checked)
    buckets: Optional[Union[int, Sequence[int]]] = None

    def __post_init__(self) -> None:
        if self.solver not in SOLVERS:
            raise StashError(_where(f"unknown solver {self.solver!r} (greedy, ilp or exact)"))
        if not _positive_int(self.measure_steps):
            raise StashError(_where(f"measure_steps must be an int >= 1, got "
                                    f"{self.measure_steps!r}"))
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
        if not (isinstance(self.dist_timeout_s, (int, float)) and self.dist_timeout_s > 0):
            raise StashError(_where(f"dist_timeout_s must be a positive number of seconds, "
                                    f"got {self.dist_timeout_s!r}"))
        object.__setattr__(self, "buckets", _checked_buckets(self.buckets))

    def engine_kwargs(self) -> Dict[str, Any]:
        """The options OffloadHandle takes."""
        return {"device": self.device, "lookahead": self.lookahead,
                "pinned_cap": self.pinned_cap, "max_in_flight_bytes": self.max_in_flight_bytes,
                "timing": self.timing, "max_micro_batches": self.max_micro_batches}
