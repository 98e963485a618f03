"""GPU: stash.torch.fit under FSDP2 on the NCCL backend at world size 1, and the link as
several processes on one GPU share it (the GPU machine has one GPU: multi-rank on separate
GPUs cannot be measured there). In ctest python.ranks_gpu; skips without a device.

Prints the figures BENCHMARKS.md records (pytest -s shows them; -rs the skip reasons)."""

import math
import multiprocessing
import statistics
import time

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("[ STASH NO DEVICE ] torch sees no CUDA device", allow_module_level=True)
try:
    import transformers  # noqa: F401  (test_fit_gpu's model)
except ImportError:
    pytest.skip("[ STASH NO DEVICE ] transformers is not installed", allow_module_level=True)

import torch.distributed as dist  # noqa: E402

import stash.torch  # noqa: E402
from test_fit_gpu import _model  # noqa: E402  (the same bf16 Llama)

STEPS = 5


def _fsdp_train(tmp_path, budget):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method=f"file://{tmp_path}/pg", rank=0,
                                world_size=1)
    mesh = init_device_mesh("cuda", (1,))
    model = _model()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    h = stash.torch.fit(model.model.layers, budget, optimizer=opt) if budget else None
    g = torch.Generator().manual_seed(1)
    peaks, ms = [], []
    for _ in range(STEPS):
        ids = torch.randint(0, 8192, (4, 2048), generator=g).cuda()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        ms.append((time.perf_counter() - t0) * 1e3)
        peaks.append(torch.cuda.max_memory_allocated())
    report = h.report() if h else None
    if h:
        h.close()
    return peaks, ms, report


def test_fsdp2_world_1_on_nccl_meets_a_70_percent_budget(tmp_path):
    try:
        import torch.distributed.fsdp as fsdp
        fsdp.fully_shard  # noqa: B018
    except (ImportError, AttributeError):
        pytest.skip("this torch has no FSDP2 (fully_shard)")
    keep_peaks, keep_ms, _ = _fsdp_train(tmp_path, None)
    peaks, ms, report = _fsdp_train(tmp_path, "70%")
    budget = report["budget_bytes"]
    for p, s in zip(peaks, report["steps"]):
        assert p <= budget, (p, budget, s)
    keep_t, t = statistics.median(keep_ms[2:]), statistics.median(ms[2:])
    # Note [FSDP2's memory in the budget]: the measured fixed bytes beside the formula's
    # parts (world 1: the shards are whole; bf16 parameters, gradients and AdamW moments).
    model = _model()
    P = sum(q.numel() * q.element_size() for q in model.parameters())
    p = sum(q.numel() * q.element_size() for q in model.model.layers[0].parameters())
    del model
    print(f"\nFSDP2 fixed bytes (measured, calibrated) {report['fixed_bytes'] / 2**30:.3f} GiB; "
          f"formula: shards 4P = {4 * P / 2**30:.3f} GiB, gathered layers 2p-3p = "
          f"{2 * p / 2**30:.3f}-{3 * p / 2**30:.3f} GiB; the rest is the loss's logits and "
          "temporaries")
    print(f"\nFSDP2 world 1 (NCCL), Llama 6 x 1024, bf16, seq 2048 x 4: keep-all peak "
          f"{max(keep_peaks) / 2**30:.2f} GiB, {keep_t:.1f} ms/step; fit 70% budget "
          f"{budget / 2**30:.2f} GiB, peak {max(peaks) / 2**30:.2f} GiB, {t:.1f} ms/step "
          f"({100 * keep_t / t:.1f}% of keep-all's throughput); plan {report['plan']['actions']}")


def _measure(barrier, queue, nbytes):
    from stash._link import measure_link

    torch.cuda.init()
    barrier.wait()
    queue.put(measure_link(0, nbytes, 1))


def _shared(n, nbytes=256 << 20):
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_measure, args=(barrier, queue, nbytes)) for _ in range(n)]
    for p in procs:
        p.start()
    out = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    return out


def test_the_link_shared_by_2_and_4_processes_against_one_alone():
    alone = _shared(1)[0]
    lines = [f"alone: h2d {alone['h2d_gbps']:.1f}, d2h {alone['d2h_gbps']:.1f}, both "
             f"{alone['bidir_gbps']:.1f} GB/s"]
    for n in (2, 4):
        got = _shared(n)
        for k in ("h2d_gbps", "d2h_gbps"):
            # Sharing cannot make a process faster than it is alone (5% for noise).
            assert all(g[k] <= alone[k] * 1.05 for g in got), (k, got, alone)
        lines.append(f"{n} processes at once: per process h2d "
                     f"{min(g['h2d_gbps'] for g in got):.1f}-{max(g['h2d_gbps'] for g in got):.1f}, "
                     f"d2h {min(g['d2h_gbps'] for g in got):.1f}-"
                     f"{max(g['d2h_gbps'] for g in got):.1f}; the rule bandwidth / "
                     f"log2(ranks) would say {alone['h2d_gbps'] / max(1.0, math.log2(n)):.1f}")
    print("\n" + "\n".join(lines))
