"""Block boundaries in backward: an identity autograd.Function at a block's output.

Note [Backward boundaries by an identity Function]
Module backward hooks differ between torch 1.13 and 2.x (and full backward hooks refuse
some inputs), but a custom autograd.Function exists in both and runs its backward exactly
when the gradient reaches that point of the graph. An identity placed on a block's output
tensors therefore marks "backward of this block begins"; the next boundary upstream (the
previous block's output, which is this block's input) marks its end. The identity returns
``x.view_as(x)``, which shares x's storage: no copy, no extra memory.
"""

import torch


class _Boundary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, callback, x):
        ctx.callback = callback
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.callback()
        return None, grad


class _Once:
    """The callback of one block's boundaries: runs at the first gradient that arrives."""

    __slots__ = ("callback", "fired")

    def __init__(self, callback):
        self.callback, self.fired = callback, False

    def __call__(self):
        if not self.fired:
            self.fired = True
            self.callback()


def mark_backward(output, callback, on_marked=None):
    """Returns `output` with `callback()` attached to run when backward first reaches it.
    Tensors, and tuples/lists of tensors (the callback fires once, at the first gradient
    that arrives), are handled; tensors that do not require grad pass unchanged.
    on_marked() runs once when at least one tensor was marked."""
    once = _Once(callback)
    if type(output) is torch.Tensor:  # one tensor, the usual case
        if not (output.requires_grad and torch.is_grad_enabled()):
            return output
        out = _Boundary.apply(once, output)
        if on_marked is not None:
            on_marked()
        return out
    marked = False

    def wrap(t):
        nonlocal marked
        if isinstance(t, torch.Tensor) and t.requires_grad and torch.is_grad_enabled():
            marked = True
            return _Boundary.apply(once, t)
        return t

    if isinstance(output, (tuple, list)):
        out = type(output)(wrap(t) for t in output)
    else:
        out = wrap(output)
    if marked and on_marked is not None:
        on_marked()
    return out


def at_backward_end(callback):
    """Queues `callback` to run when the current backward pass finishes. Only valid while
    the autograd engine is executing a backward."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)
