"""stash.torch.offload over blocks that FSDP2 shards only some of: gloo, world size 1 on
the CPU, in a spawned process as test_fit_ranks.py starts its ranks (a process group
in the test process would outlive the test). Note [Recompute under FSDP2] in
stash/torch/_offload_replay.py."""

import json
import multiprocessing
import os
import traceback
from datetime import timedelta

import pytest

import torch.distributed as dist

if not dist.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)


def _mixed_blocks(init_file, out_path):
    """Block 0 sharded by fully_shard, block 1 plain; block 1's plan recomputes what the
    record pass marks recomputable. Writes the recomputes run and whether the gradients
    are bitwise those of the same blocks without stash."""
    out = {}
    try:
        import torch
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        import stash.torch

        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=0,
                                world_size=1, timeout=timedelta(seconds=60))

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.l = torch.nn.Linear(8, 8)

            def forward(self, x):
                return torch.relu(self.l(x)) * 2

        torch.manual_seed(0)
        b0, b1 = Block(), Block()
        x = torch.randn(4, 8, requires_grad=True)
        # Recorded before sharding: stash.torch.record reads the parameters' storages
        # before the forward, so it would list the weight FSDP gathers for b0 as saved.
        prof = stash.torch.record([b0, b1], x)
        fully_shard(b0, mesh=init_device_mesh("cpu", (1,)))

        def grads():
            g = [x.grad.clone()] + [p.grad.full_tensor() if hasattr(p.grad, "full_tensor")
                                    else p.grad.clone()
                                    for b in (b0, b1) for p in b.parameters()]
            x.grad = None
            for b in (b0, b1):
                b.zero_grad(set_to_none=True)
            return g

        plan = [["keep"] * len(prof["layers"][0]["tensors"]),
                ["recompute" if t["recomputable"] else "keep"
                 for t in prof["layers"][1]["tensors"]]]
        assert "recompute" in plan[1], prof["layers"][1]
        with stash.torch.offload([b0, b1], plan) as h:
            b1(b0(x)).sum().backward()
            out["recompute_forwards"] = h.stats()["hooks"]["recompute_forwards"]
        under = grads()
        b1(b0(x)).sum().backward()  # the same blocks without stash
        out["grads_equal"] = all(torch.equal(a, b) for a, b in zip(grads(), under))
        out["ok"] = True
    except Exception as e:
        out.update(ok=False, error=f"{type(e).__name__}: {e}",
                   traceback=traceback.format_exc())
    with open(out_path, "w") as f:
        json.dump(out, f)
    os._exit(0)  # as ranks_worker.py: no waiting on the file store's cleanup


def test_a_plain_block_among_sharded_ones_recomputes_without_unshard(tmp_path):
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        pytest.skip("this torch has no FSDP2 (fully_shard)")
    out = tmp_path / "out.json"
    p = multiprocessing.get_context("spawn").Process(
        target=_mixed_blocks, args=(str(tmp_path / "pg"), str(out)))
    p.start()
    p.join(120)
    if p.is_alive():
        p.kill()
        pytest.fail("the FSDP2 process still running after 120 s")
    r = json.loads(out.read_text())
    assert r["ok"], r.get("traceback")
    assert r["recompute_forwards"] >= 1 and r["grads_equal"], r
