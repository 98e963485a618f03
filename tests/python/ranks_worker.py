"""One rank of test_fit_ranks.py: started with multiprocessing's spawn, it joins a gloo
process group through a file, runs a scenario and writes its outcome as JSON (a rank that
is killed writes nothing). Not a test module itself."""

import json
import os
import time
import traceback
from datetime import timedelta

LINK = {"h2d_gbps": 20.0, "d2h_gbps": 20.0, "bidir_gbps": 32.0}


def _llama(seed=0, ffn=256, layers=3):
    from models import decoder

    return decoder("llama", seed, layers=layers, hidden=128, ffn=ffn, positions=512)


def _batches(rank, n, seq=128, batch=2):
    import torch

    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data, as under DDP
    return [torch.randint(0, 256, (batch, seq), generator=g) for _ in range(n)]


def _train(model, data, opt=None):
    """AdamW training over data (its own optimizer unless given one): losses, optimizer."""
    import torch

    opt = opt or torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for ids in data:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, opt


def _train_under_fit(model, blocks, data, budget="80%"):
    """_train with stash.torch.fit over blocks: the losses and fit's report."""
    import torch

    import stash.torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    handle = stash.torch.fit(blocks, budget, optimizer=opt, link=LINK, dist_timeout_s=60)
    losses, _ = _train(model, data, opt)
    rep = handle.report()
    handle.close()
    return losses, rep


def scenario_ddp(rank, world, out, steps=4):
    """DDP training under fit at 80% is bitwise the same DDP training without stash, and
    every rank runs one plan."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    data = _batches(rank, steps)
    ref = DDP(_llama())
    ref_losses, _ = _train(ref, data)
    ref_params = [p.detach().clone() for p in ref.parameters()]

    model = DDP(_llama())
    losses, rep = _train_under_fit(model, model.module.model.layers, data)
    out.update(losses=losses, ref_losses=ref_losses,
               params_equal=all(torch.equal(a, b) for a, b in
                                zip(ref_params, model.parameters())),
               modes=[s["mode"] for s in rep["steps"]], ranks=rep["ranks"],
               actions=rep["plan"]["actions"] if rep["plan"] else None,
               link=rep["link"])


def scenario_fsdp(rank, world, out, steps=4):
    """FSDP2 (fully_shard per decoder layer and at the root, a CPU mesh) under fit at 80%:
    bitwise the same training as FSDP2 alone, and one plan."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))

    def build():
        m = _llama()
        for layer in m.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
        return m

    data = _batches(rank, steps)
    ref = build()
    ref_losses, _ = _train(ref, data)
    model = build()
    losses, rep = _train_under_fit(model, model.model.layers, data)
    out.update(losses=losses, ref_losses=ref_losses,
               params_equal=all(torch.equal(a.to_local(), b.to_local()) for a, b in
                                zip(ref.parameters(), model.parameters())),
               modes=[s["mode"] for s in rep["steps"]], ranks=rep["ranks"],
               actions=rep["plan"]["actions"] if rep["plan"] else None)


def scenario_shape(rank, world, out):
    """Rank 1 has another model (a wider MLP): every rank must refuse to plan."""
    import stash.torch

    model = _llama(ffn=384 if rank == 1 else 256)
    data = _batches(rank, 3)
    handle = stash.torch.fit(model.model.layers, "70%", link=LINK, dist_timeout_s=30)
    try:
        _train(model, data)
    finally:
        handle.close()


def scenario_infeasible(rank, world, out):
    """A budget no plan meets: rank 0's planner refuses, and every other rank hears why."""
    import stash.torch

    model = _llama()
    handle = stash.torch.fit(model.model.layers, "40%", link=LINK, dist_timeout_s=30)
    try:
        _train(model, _batches(rank, 3))
    finally:
        handle.close()


def scenario_kill(rank, world, out):
    """Rank 1 dies in the middle of its measuring step; the others must raise, naming it."""
    import stash.torch

    model = _llama()
    data = _batches(rank, 3)
    if rank == 1:
        def die(*_):
            os._exit(7)
        model.model.layers[1].register_forward_hook(die)
    handle = stash.torch.fit(model.model.layers, "70%", link=LINK,
                             dist_timeout_s=float(os.environ.get("RANKS_TIMEOUT", "5")))
    t0 = time.monotonic()
    try:
        _train(model, data)
    finally:
        out["waited_s"] = time.monotonic() - t0
        handle.close()


def scenario_link(rank, world, out):
    """Every rank measures the link at once; the plan takes the least any rank measured."""
    import torch  # noqa: F401  (before stash, as a user's program does)

    import stash.torch
    from stash import _lib

    # bidir = h2d + d2h: both directions at once run each at its own bandwidth.
    bw = [(20.0, 18.0, 38.0), (10.0, 24.0, 34.0), (15.0, 12.0, 27.0)][rank % 3]
    _lib.cudart().stashdbl_set_bandwidth.argtypes = [__import__("ctypes").c_double] * 3
    _lib.cudart().stashdbl_set_bandwidth(*bw)
    model = _llama(layers=2)
    handle = stash.torch.fit(model.model.layers, "70%", cache_dir=os.environ["RANKS_CACHE"],
                             dist_timeout_s=60)
    out.update(link=handle._link_section, windows=handle._link_windows,
               cached=handle.link_cached)
    handle.close()


def main(rank, world, init_file, scenario, out_dir):
    import torch.distributed as dist

    os.environ["LOCAL_WORLD_SIZE"] = str(world)
    os.environ["LOCAL_RANK"] = str(rank)
    out = {"rank": rank}
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=60))
        globals()[f"scenario_{scenario}"](rank, world, out)
        out["ok"] = True
    except Exception as e:
        out.update(ok=False, error=f"{type(e).__name__}: {e}",
                   traceback=traceback.format_exc())
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    # No destroy_process_group: a peer may be dead, and the file store's cleanup waits.
    os._exit(0)
