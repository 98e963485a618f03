"""GPU: stash.torch.offload on a real CUDA model, with stash's pluggable allocator.

ctest `python.offload_gpu` (label gpu) runs this file alone, in its own process (the
allocator must be chosen before the first CUDA tensor), with the real runtime. Without a
device it skips with the marker ctest's SKIP_REGULAR_EXPRESSION looks for.

Four runs of the same training steps from the same seed: without stash, with a plan that
offloads every block but the last, with one that recomputes every block but the last
whole (keeping its input), and with one that mixes keep, offload and recompute inside
each block (Note [Selective recompute]). Losses must match the run without stash, and
the peak of stash's device pool must fall by what the plan takes off the device, less
what is in flight (one block's offload, the one-block-ahead prefetch and the block in
backward).
"""

import pytest
import torch
import torch.nn as nn

if not torch.cuda.is_available():
    pytest.skip("[ STASH NO DEVICE ] torch sees no CUDA device", allow_module_level=True)

import stash.torch  # noqa: E402
from models import Block  # noqa: E402

N, B, T, D, H, FF = 8, 8, 512, 1024, 16, 4096
STEPS = 3


@pytest.fixture(scope="module")
def allocator():
    stash.torch.use_allocator()  # before any CUDA tensor of this process
    return stash.torch


def _model():
    torch.manual_seed(0)
    return nn.ModuleList([Block(D, H, FF) for _ in range(N)]).cuda()


def _batches():
    g = torch.Generator(device="cuda").manual_seed(1)
    return [torch.randn(B, T, D, device="cuda", generator=g).requires_grad_(True)
            for _ in range(STEPS)]


def _train(blocks, batches, allocator):
    opt = torch.optim.SGD(blocks.parameters(), lr=0.01)
    losses = []
    torch.cuda.synchronize()
    allocator.reset_peak(0)
    base = allocator.allocator_stats(0)["current_bytes"]
    for x in batches:
        opt.zero_grad(set_to_none=False)
        h = x
        for b in blocks:
            h = b(h)
        loss = h.float().square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    return losses, allocator.allocator_stats(0)["peak_bytes"] - base


def _tensor_bytes(blocks):
    """Bytes of each tensor a block saves, in save order, from the record pass."""
    x = torch.randn(B, T, D, device="cuda", requires_grad=True)
    doc = stash.torch.record(blocks, x)
    return [t["bytes"] for t in doc["layers"][0]["tensors"]]


def test_offload_and_recompute_lower_the_peak(allocator):
    batches = _batches()
    blocks = _model()
    sizes = _tensor_bytes(blocks)
    per_block, input_bytes, n_saved = sum(sizes), sizes[0], len(sizes)
    # Warm-up so that the optimizer state and cuBLAS workspaces exist in every run alike.
    _train(blocks, batches[:1], allocator)
    blocks = _model()
    expected, peak_plain = _train(blocks, batches, allocator)

    offload_plan = [["offload"] * n_saved] * (N - 1) + [["keep"] * n_saved]
    blocks = _model()
    # The in-flight cap keeps the host, which runs ahead of the GPU, from holding more
    # than about one block of offloaded storages (Note [Stream order with torch's
    # allocator]).
    with stash.torch.offload(blocks, offload_plan, max_in_flight_bytes=per_block) as h:
        got, peak_offload = _train(blocks, batches, allocator)
        s = h.stats()
    # Host tensors a CUDA block saves (a wrapped Python scalar) stay where they are.
    assert s["offloaded_count"] + s["hooks"]["not_on_device_count"] == (N - 1) * n_saved * STEPS
    assert s["hooks"]["not_on_device_count"] <= (N - 1) * STEPS
    assert s["prefetched_count"] == s["offloaded_count"] and s["failed_count"] == 0
    assert s["kept_on_device_count"] == 0
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=0)
    # N-1 blocks' tensors leave the device; at most three blocks' worth are on it at once
    # beyond the kept last block (in flight, prefetched, in backward).
    saved = peak_plain - peak_offload
    assert saved >= 0.5 * (N - 1 - 3) * per_block, (peak_plain, peak_offload, per_block)

    rest = ["recompute"] * (n_saved - 1)
    recompute_plan = [["keep"] + rest] * (N - 1) + [["keep"] * n_saved]
    blocks = _model()
    with stash.torch.offload(blocks, recompute_plan) as h:
        got, peak_recompute = _train(blocks, batches, allocator)
        s = h.stats()
    assert s["hooks"]["recompute_forwards"] == (N - 1) * STEPS
    assert s["hooks"]["recompute_count"] == (N - 1) * (n_saved - 1) * STEPS
    assert s["hooks"]["recompute_kept_count"] == 0
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=0)
    # Only the inputs of N-1 blocks stay; one block is rebuilt at a time in backward.
    saved = peak_plain - peak_recompute
    assert saved >= 0.5 * (N - 2) * (per_block - input_bytes), \
        (peak_plain, peak_recompute, per_block)

    # Partial: in every block but the last, the attention probabilities (the largest
    # tensor) and every third tensor recomputed, the next ones offloaded, the rest (the
    # input among them) kept.
    largest = max(range(n_saved), key=lambda j: sizes[j])
    layer = ["recompute" if j == largest or j % 3 == 1 else "offload" if j % 3 == 2
             else "keep" for j in range(n_saved)]
    layer[0] = "keep"
    partial_plan = [layer] * (N - 1) + [["keep"] * n_saved]
    off_bytes = sum(b for b, a in zip(sizes, layer) if a == "offload")
    rec_bytes = sum(b for b, a in zip(sizes, layer) if a == "recompute")
    blocks = _model()
    with stash.torch.offload(blocks, partial_plan, max_in_flight_bytes=per_block) as h:
        got, peak_partial = _train(blocks, batches, allocator)
        s = h.stats()
    n_rec = layer.count("recompute")
    assert s["hooks"]["recompute_count"] == (N - 1) * n_rec * STEPS
    assert s["recompute_count"] == 0  # the engine sees only offloads (stash.torch.offload)
    assert s["hooks"]["recompute_forwards"] == (N - 1) * STEPS
    # A Block saves nothing again after the first save of its last tensor but that tensor
    # (relu's output, for fc2): with that tensor not recomputed, every replay stops short.
    if layer[-1] != "recompute":
        assert s["hooks"]["recompute_stopped_early"] == (N - 1) * STEPS
    assert s["hooks"]["recompute_captured"] >= s["hooks"]["recompute_count"]
    assert s["hooks"]["recompute_kept_count"] == 0
    assert s["offloaded_count"] + s["hooks"]["not_on_device_count"] == \
        (N - 1) * layer.count("offload") * STEPS
    assert s["prefetched_count"] == s["offloaded_count"] and s["failed_count"] == 0
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=0)
    # What leaves the device per block, less the three blocks' worth in flight, in
    # backward or being rebuilt.
    saved = peak_plain - peak_partial
    assert saved >= 0.5 * (N - 1 - 3) * (off_bytes + rec_bytes), \
        (peak_plain, peak_partial, off_bytes, rec_bytes)
