"""Block boundaries in backward: an identity autograd.Function at a block's output.

Note [Backward boundaries by an identity Function]
Module backward hooks differ between torch 1.13 and 2.x (and full backward hooks refuse
some inputs), but a custom autograd.Function exists in both and runs its backward exactly
when the gradient reaches that point of the graph. An identity placed on a block's output
tensors therefore marks "backward of this block begins"; the next boundary upstream (the
previous block's output, which is this block's input) marks its end. The identity returns
``x.view_as(x)``, which shares x's storage: no copy, no extra memory.

Note [Backward boundaries by a tensor hook]
A Python autograd.Function costs a node in the graph, a view, and a Python call in each
direction (about 7 us a block in tests/benchmarks/hook_cost.py). A hook on the output
tensor (Tensor.register_hook) runs at the same point, once the output's gradient is
complete, with no node, no view and no call in forward (about 4 us there; inside a
Hugging Face forward both cost more, BENCHMARKS.md says how much). So a tensor that requires
grad is marked with a hook, and the Function stays for a tensor some block has already
marked (a block that returns its input unchanged): two hooks on one tensor would run in
the order they were registered, the upstream block's first, where the Function's views
keep the downstream block's boundary first. The hook's closure holds the callback, so the
graph holds it as long as the output's node lives, as the Function's context did.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import torch


class _Boundary(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, callback: Callable[[], None], x: torch.Tensor) -> torch.Tensor:
        ctx.callback = callback
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[None, torch.Tensor]:
        ctx.callback()
        return None, grad


class _Once:
    """The callback of one block's boundaries: runs at the first gradient that arrives."""

    __slots__ = ("callback", "fired")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback, self.fired = callback, False

    def __call__(self) -> None:
        if not self.fired:
            self.fired = True
            self.callback()


class _Hook:
    """A tensor hook that runs a block's boundary callback and passes the gradient on."""

    __slots__ = ("once",)

    def __init__(self, once: _Once) -> None:
        self.once = once

    def __call__(self, grad: torch.Tensor) -> None:
        self.once()
        return None  # the gradient unchanged


def _mark(t: torch.Tensor, once: _Once) -> Any:
    """t marked (Note [Backward boundaries by a tensor hook]): t itself with a hook, or a
    view through _Boundary where a block has marked t already."""
    if t.grad_fn is not None and not getattr(t, "_stash_marked", False):
        t.register_hook(_Hook(once))  # type: ignore[no-untyped-call]
        t._stash_marked = True  # type: ignore[attr-defined]
        return t
    return _Boundary.apply(once, t)


def mark_backward(output: Any, callback: Callable[[], None],
                  on_marked: Optional[Callable[[], None]] = None) -> Any:
    """Returns `output` with `callback()` attached to run when backward first reaches it.
    Tensors, and tuples/lists of tensors (the callback fires once, at the first gradient
    that arrives), are handled; tensors that do not require grad pass unchanged.
    on_marked() runs once when at least one tensor was marked."""
    once = _Once(callback)
    if type(output) is torch.Tensor:  # one tensor, the usual case
        if not (output.requires_grad and torch.is_grad_enabled()):
            return output
        out = _mark(output, once)
        if on_marked is not None:
            on_marked()
        return out
    marked = False

    def wrap(t: Any) -> Any:
        nonlocal marked
        if isinstance(t, torch.Tensor) and t.requires_grad and torch.is_grad_enabled():
            marked = True
            return _mark(t, once)
        return t

    if isinstance(output, (tuple, list)):
        out = type(output)(wrap(t) for t in output)
    else:
        out = wrap(output)
    if marked and on_marked is not None:
        on_marked()
    return out


def at_backward_end(callback: Callable[[], None]) -> None:
    """Queues `callback` to run when the current backward pass finishes. Only valid while
    the autograd engine is executing a backward."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)
