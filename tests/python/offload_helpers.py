"""Shared by test_offload.py and test_offload_recompute.py: the model, its plans,
training and comparison helpers, and the double's violation log."""

import contextlib
import ctypes
import os
import subprocess
import sys

import torch
import torch.nn as nn

import stash

from models import Block

B, T, D, FF = 2, 8, 16, 32
# What a Block saves on torch 2.x (test_record.py derives the list by hand): 0 input, 1-2
# ln1 mean and rstd, 3 ln1's output, 4-5 copies of q and k, 6 softmax probabilities
# (saved twice: by softmax and by att@v), 7 a copy of v, 8 y, 9 the residual, 10-11 ln2
# mean and rstd, 12 ln2's output, 13 relu's output (saved twice: by relu and by fc2).
N_SAVED = 14
_ACTION = {"k": "keep", "r": "recompute", "o": "offload"}


def _plan(*layers):
    """Per-layer action lists from strings of k/r/o, one letter per saved tensor."""
    return [[_ACTION[c] for c in layer] for layer in layers]


def _model(n=3, seed=0):
    torch.manual_seed(seed)
    return nn.ModuleList([Block(D, 2, FF) for _ in range(n)])


def _loss(blocks, x):
    for b in blocks:
        x = b(x)
    return x.square().mean()


def _train(blocks, batches, handle=None, lr=0.05, *, wait=None):
    """A few SGD steps; the losses and, after each step, every gradient. With wait (a
    handle), its copies are waited for after each step (a pinned block is reusable only
    once the copies that touched it completed; on a loaded machine the double's may not
    have)."""
    opt = torch.optim.SGD(blocks.parameters(), lr=lr)
    losses, grads = [], []
    for x in batches:
        opt.zero_grad()
        loss = _loss(blocks, x)
        loss.backward()
        losses.append(loss.detach().clone())
        grads.append([p.grad.clone() for p in blocks.parameters()])
        opt.step()
        if wait is not None:
            wait.synchronize()
    return losses, grads


def _two_micro_batches(blocks, handle, x0, x1):
    """Gradient accumulation with both forwards first, then both backwards (each forward
    under handle.micro_batch(i) when a handle is given): the losses and the gradients."""
    losses = []
    for mb, x in enumerate((x0, x1)):
        with (handle.micro_batch(mb) if handle is not None else contextlib.nullcontext()):
            losses.append(_loss(blocks, x))
    losses[1].backward()
    losses[0].backward()
    return [l.detach() for l in losses], [p.grad.clone() for p in blocks.parameters()]


def _batches(n=3, requires_grad=False):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(B, T, D, generator=g).requires_grad_(requires_grad) for _ in range(n)]


def _assert_bitwise(a, b):
    la, ga = a
    lb, gb = b
    assert all(torch.equal(x, y) for x, y in zip(la, lb)), (la, lb)
    for step_a, step_b in zip(ga, gb):
        assert len(step_a) == len(step_b)
        assert all(torch.equal(x, y) for x, y in zip(step_a, step_b))



def refused_without_the_double(call):
    """Runs `call` (Python source using `blocks`, one CPU Linear block) in a process
    without STASH_CUDART, where stash's libraries share the process's runtime (torch's):
    it must raise a StashError that names the seam and leave the block unwrapped. The
    namespace is chosen once per process, hence a process of its own."""
    code = (
        "import torch, stash, stash.torch\n"
        "blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4)])\n"
        "try:\n"
        f"    {call}\n"
        "except stash.StashError as e:\n"
        "    assert 'forward' not in vars(blocks[0])\n"
        "    print('refused:', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "STASH_CUDART"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and "STASH_CUDART" in out.stdout, out.stdout


def _violations():
    """The double's happens-before violations so far (and clears them): unordered device
    accesses to the same bytes, e.g. a prefetch writing memory a copy still reads."""
    lib = stash._lib.cudart()
    lib.stashdbl_violation_count.restype = ctypes.c_size_t
    lib.stashdbl_violation_text.restype = ctypes.c_size_t
    lib.stashdbl_violation_text.argtypes = [ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    out = []
    for i in range(lib.stashdbl_violation_count()):
        buf = ctypes.create_string_buffer(512)
        lib.stashdbl_violation_text(i, buf, 512)
        out.append(buf.value.decode())
    lib.stashdbl_clear_violations()
    return out
