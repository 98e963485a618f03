"""stash.torch.nvtx_ranges: the stash:layer:<i>:fwd|bwd ranges, in order."""

import warnings

import pytest
import torch

import stash.torch
from models import Block


class Recorder:
    def __init__(self):
        self.events = []
        self.next = 0

    def start(self, name):
        self.next += 1
        self.events.append(("start", name, self.next))
        return self.next

    def end(self, handle):
        self.events.append(("end", handle))


def _run(n_blocks, steps=1):
    torch.manual_seed(0)
    blocks = [Block() for _ in range(n_blocks)]
    rec = Recorder()
    with stash.torch.nvtx_ranges(blocks, backend=(rec.start, rec.end)):
        for _ in range(steps):
            x = torch.randn(2, 8, 16)
            for b in blocks:
                x = b(x)
            x.sum().backward()
    return rec


def _spans(rec):
    """[(name, start position, end position)] from the recorded events."""
    names, opened, spans = {}, {}, []
    for pos, ev in enumerate(rec.events):
        if ev[0] == "start":
            names[ev[2]] = ev[1]
            opened[ev[2]] = pos
        else:
            spans.append((names[ev[1]], opened.pop(ev[1]), pos))
    assert not opened, "every range is closed"
    return sorted(spans, key=lambda s: s[1])


def test_forward_and_backward_ranges_in_order():
    spans = _spans(_run(3))
    assert [s[0] for s in spans] == [
        "stash:layer:0:fwd", "stash:layer:1:fwd", "stash:layer:2:fwd",
        "stash:layer:2:bwd", "stash:layer:1:bwd", "stash:layer:0:bwd"]
    # Backward ranges follow one another without overlap: 2 ends before 1 starts.
    bwd = spans[3:]
    assert bwd[0][2] < bwd[1][1] and bwd[1][2] < bwd[2][1]


def test_ranges_repeat_per_step_and_hooks_are_removed():
    rec = _run(2, steps=2)
    assert [s[0] for s in _spans(rec)] == [
        "stash:layer:0:fwd", "stash:layer:1:fwd", "stash:layer:1:bwd", "stash:layer:0:bwd"] * 2


def test_cpu_without_nvtx_is_a_noop_with_a_note():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: NVTX is available")
    blocks = [Block()]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ranges = stash.torch.nvtx_ranges(blocks)
    assert not ranges.active and "NVTX" in ranges.reason
    assert any("nvtx_ranges" in str(x.message) for x in w)
    blocks[0](torch.randn(2, 8, 16)).sum().backward()  # runs unchanged
    ranges.remove()
