"""stash.torch.fit under torch.distributed: every rank measures, the profiles are combined,
rank 0 plans, every rank runs that one plan. Ranks is the store the ranks post to; the
functions below are the agreements fit makes through it, each handed what it needs.

Note [Agreeing on a plan across ranks]
A rank that offloads another layer than its peers turns the collectives of DDP and FSDP
into stalls, so under torch.distributed (initialized, world size > 1) fit runs one plan on
every rank. At each point where a plan is chosen, every rank posts what it has and waits
for every other rank's post:
  - at fit(): whether its link is cached; then, unless every rank's is, all of them
    measure at once (so that the ranks of a host share the link as they will in training,
    Note [The link the ranks share]) and post what they measured;
  - at a new input shape: whether it has a cached plan for it (cache_dir), and which; the
    cache is used only when every rank has the same one, else every rank measures;
  - after the measuring step: its profile, with a digest of its skeleton (the blocks'
    saved tensors: names, bytes, what may be offloaded or recomputed). Different
    skeletons (a rank with another model or other shapes) are an error on every rank,
    naming the ranks of each digest. Otherwise the profiles are combined: per layer the
    slowest rank's times (the plan must hide copies behind the slowest rank's compute),
    the most fixed bytes, the least link share and pinnable memory; every rank gets the
    same combined profile. Rank 0 plans it and publishes the plan; every rank checks the
    published skeleton digest against its own before it runs it;
  - after the first optimizer step that follows a plan: its optimizer's real state; if
    any rank's differs from the estimate, every rank re-plans with the largest.
The posts go through the process group's own key-value store (the TCPStore or FileStore
that init_process_group made, under a prefix of fit's own), not through collectives: a
store read cannot hang. Each wait polls for every rank's post and for every rank's failure
key, and ends at dist_timeout_s. A rank that fails inside fit (a budget its measurement
does not meet, a refusal) writes its message to its failure key before it raises, so
every other rank raises with that rank and message at its next wait; a rank that died or
hangs is named when the wait times out. Either way every rank raises StashError, and none
waits in a collective of stash's. (A collective of the training's own, such as DDP's
all-reduce, waits for a dead rank as long as the process group's timeout says.)

Note [The link the ranks share]
The ranks of one host share its PCIe/C2C link and its pinned memory. torchtitan divides
the bandwidth by log2 of the local ranks; stash measures instead: every rank starts its
link measurement at the same moment (after every rank has posted that it is ready) with
only its own copies (sharers 1), so each measures its share while the others copy too.
The plan takes the least any rank measured, per direction. The measurement is cached per
machine and number of local ranks; pinned memory is capped per rank by the pinned pool
(host memory available / LOCAL_WORLD_SIZE, stash_pinned_default_cap).

Note [FSDP2's memory in the budget]
Under fully_shard the budget (max_memory_allocated on CUDA) counts what this rank holds:
its shards of the parameters, gradients and optimizer state, the unsharded parameters of
the layers FSDP has gathered at once (the running layer and the one its prefetch gathers
next; in backward also a layer whose gradients wait to be reduce-scattered) and the
reduce-scatter's buffers. fit takes them from measurement: the measuring step's peak is
the allocator's, and fixed_bytes is calibrated from it (Note [What the budget counts] in
_fit_steps.py), so whatever FSDP held at the peak is counted. The formula, to check against:
with P the model's parameter bytes, p a layer's, W ranks and AdamW, the shards are
(P + P + 2P) / W (parameters, gradients, two moments), and FSDP adds about 2p in forward
(running + prefetched layer) and about 3p in backward (gathered parameters of two layers
and one layer's unreduced gradients). Not yet compared on a GPU. On the CPU test double
fit counts the parameters' local shards, gradients and optimizer state from their tensors
(storage_of reads a DTensor's local shard); FSDP's gathered copies and buffers are not
tensors the hooks see, so the CPU count is the shard part of the formula only. Recompute
under FSDP2: Note [Recompute under FSDP2] in _offload_replay.py.

Note [stash's copy streams beside FSDP's]
stash's engine copies on streams of its own: a D2H copy waits on an event recorded on the
compute stream after the tensor's producer, and the compute stream waits on a prefetch's
event before the tensor's consumer (Note [The step's schedule] in planner/model/schedule.h).
FSDP2 orders its all-gather and reduce-scatter streams against the compute stream with
events of its own. Neither side waits on the other's streams: each waits only on the
compute stream, and the compute stream on each, so the two are ordered through the
compute stream and otherwise run at once (stash's copies use the host link, FSDP's
collectives NVLink or the network). No stash stream is passed to, or made to wait on,
a process group. Not yet measured on a GPU.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from .._lib import StashError

__all__ = ["Ranks", "combine_profiles", "skeleton_digest"]

_handles = 0  # fit handles this process made under torch.distributed


def skeleton_digest(doc: Dict[str, Any]) -> str:
    """A profile's structure without its times: what every rank's must share."""
    skel = [(layer["name"], [(t["name"], int(t["bytes"]), bool(t["offloadable"]),
                              bool(t["recomputable"]), bool(t["must_keep"]))
                             for t in layer["tensors"]])
            for layer in doc["layers"]]
    return hashlib.sha256(json.dumps(skel).encode()).hexdigest()[:16]


def combine_profiles(docs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One profile from every rank's (same skeleton): Note [Agreeing on a plan across
    ranks]."""
    out = copy.deepcopy(docs[0])
    for li, layer in enumerate(out["layers"]):
        layer["fwd_ms"] = max(d["layers"][li]["fwd_ms"] for d in docs)
        layer["bwd_ms"] = max(d["layers"][li]["bwd_ms"] for d in docs)
        for ti, t in enumerate(layer["tensors"]):
            t["recompute_ms"] = max(d["layers"][li]["tensors"][ti]["recompute_ms"]
                                    for d in docs)
    out["step_overhead_ms"] = max(d.get("step_overhead_ms", 0.0) for d in docs)
    out["fixed_bytes"] = max(int(d["fixed_bytes"]) for d in docs)
    out["host"]["pinnable_bytes"] = min(int(d["host"]["pinnable_bytes"]) for d in docs)
    for k in ("h2d_gbps", "d2h_gbps", "bidir_gbps"):
        out["link"][k] = min(float(d["link"][k]) for d in docs)
    out["link"]["local_ranks"] = max(int(d["link"].get("local_ranks", 1)) for d in docs)
    m = out.setdefault("measurement", {})
    m["ranks"] = len(docs)
    m.setdefault("notes", []).append(
        f"fit: combined over {len(docs)} ranks: per layer the slowest rank's times, the "
        "most fixed bytes, the least link and pinnable memory")
    return out


class Ranks:
    """The ranks of the default process group, as fit's posts see them."""

    def __init__(self, store: Any, rank: int, world: int, local_world: int,
                 timeout_s: float) -> None:
        self.store = store
        self.rank = rank
        self.world = world
        self.local_world = local_world
        self.timeout_s = float(timeout_s)
        self._round = 0

    @classmethod
    def current(cls, timeout_s: float) -> Optional["Ranks"]:
        """The default group's ranks when torch.distributed runs more than one; else None.
        Every rank makes its fit handles in the same order, so the n-th handle's posts go
        under the same prefix on every rank: a count, not the blocks' digest, so that a
        rank with another model still meets the others and hears that it differs."""
        try:
            import torch.distributed as dist
        except ImportError:
            return None
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        if not timeout_s or timeout_s <= 0:
            raise StashError(f"stash.torch.fit: dist_timeout_s must be positive, got "
                             f"{timeout_s!r}")
        try:
            from torch.distributed.distributed_c10d import _get_default_store
            base = _get_default_store()
        except Exception as e:  # private in torch; named so the failure is clear
            raise StashError("stash.torch.fit: cannot reach the process group's store "
                             f"(torch.distributed.distributed_c10d._get_default_store: {e}); "
                             "multi-rank fit needs it to agree on a plan") from e
        global _handles
        _handles += 1
        store = dist.PrefixStore(f"stash.fit/{_handles}/", base)  # type: ignore[attr-defined]
        world = dist.get_world_size()
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or world
        return cls(store, dist.get_rank(), world, local, timeout_s)

    # --- posts -----------------------------------------------------------------------------

    def fail(self, message: str) -> None:
        """This rank failed inside fit: every other rank raises with it at its next wait."""
        try:
            self.store.set(f"failed/{self.rank}", message)
        except Exception:  # the store is gone too: the others time out and name this rank
            pass

    def _failed(self) -> Dict[int, str]:
        out = {}
        for r in range(self.world):
            if r != self.rank and self.store.check([f"failed/{r}"]):
                out[r] = self.store.get(f"failed/{r}").decode(errors="replace")
        return out

    def _wait(self, what: str, keys: Dict[int, str]) -> Dict[int, Any]:
        deadline = time.monotonic() + self.timeout_s
        got: Dict[int, Any] = {}
        try:
            while True:
                for r, k in keys.items():
                    if r not in got and self.store.check([k]):
                        got[r] = json.loads(self.store.get(k).decode())
                if len(got) == len(keys):
                    return got
                failed = self._failed()
                if failed:
                    raise StashError("stash.torch.fit: " + "; ".join(
                        f"rank {r} failed: {m}" for r, m in sorted(failed.items())))
                if time.monotonic() > deadline:
                    missing = sorted(set(keys) - set(got))
                    raise StashError(
                        f"stash.torch.fit: rank(s) {', '.join(map(str, missing))} did not "
                        f"post {what} within {self.timeout_s:g} s (dist_timeout_s): a rank "
                        "that died, hangs, or runs other steps than this one's "
                        f"(rank {self.rank} waited)")
                time.sleep(0.005)
        except StashError:
            raise
        except Exception as e:  # the store's own errors: its host is gone
            raise StashError(f"stash.torch.fit: the process group's store failed while "
                             f"rank {self.rank} waited for {what}: {e}") from e

    def exchange(self, what: str, payload: Any) -> List[Any]:
        """Posts payload and returns every rank's, in rank order."""
        self._round += 1
        base = f"{self._round}.{what}"
        self.store.set(f"{base}/{self.rank}", json.dumps(payload))
        got = self._wait(what, {r: f"{base}/{r}" for r in range(self.world)})
        return [got[r] for r in range(self.world)]

    def publish(self, what: str, payload: Any = None) -> Any:
        """Rank 0 posts payload; every rank returns rank 0's."""
        self._round += 1
        key = f"{self._round}.{what}/root"
        if self.rank == 0:
            self.store.set(key, json.dumps(payload))
            return payload
        return self._wait(what, {0: key})[0]


def link_across_ranks(ranks: Ranks, name: str, device: int, nbytes: int,
                      cache_dir: Optional[str]) -> Tuple[Dict[str, Any], List[Any]]:
    """Note [The link the ranks share]: (the link every rank plans with, each rank's
    measuring window; None where the link was cached)."""
    from .._link import measure_link, read_cached_link, store_link

    key = f"{name}-{device}-ranks{ranks.local_world}"
    cached = read_cached_link(key, cache_dir)
    views = ranks.exchange("link-cache", cached)
    if all(v is not None for v in views):
        links = views
    else:
        ranks.exchange("link-ready", True)  # every rank starts copying now
        t0 = time.time()
        mine = measure_link(device, nbytes, 1)
        mine["window"] = [t0, time.time()]
        links = ranks.exchange("link", mine)
    out: Dict[str, Any] = {k: min(float(v[k]) for v in links)
                           for k in ("h2d_gbps", "d2h_gbps", "bidir_gbps")}
    out["local_ranks"] = ranks.local_world
    if any(v is None for v in views):
        # What the plan uses, the same on every rank: a later run reads it back.
        store_link(key, out, cache_dir)
    out["cached"] = all(v is not None for v in views)
    return out, [v.get("window") for v in links]


def cached_plan_agreed(ranks: Ranks, entry: Optional[Dict[str, Any]]) -> bool:
    """A new input shape: whether every rank has the same cached plan as this one."""
    plan = entry.get("plan") if entry else None
    mine = plan.get("profile_sha256") if plan else None
    views = ranks.exchange("cached-plan", mine)
    return mine is not None and all(v == mine for v in views)


def combine_measured(ranks: Ranks, entry: Dict[str, Any]) -> str:
    """After the measuring step: every rank's profile into one, the same on every rank
    (entry's profile and measured peak are replaced). Returns this rank's skeleton
    digest; StashError when the ranks measured different blocks."""
    own = skeleton_digest(entry["profile"])
    views = ranks.exchange("profile", {"skeleton": own, "profile": entry["profile"],
                                       "measured": entry.get("measured_peak_bytes")})
    by: Dict[str, List[int]] = {}
    for r, v in enumerate(views):
        by.setdefault(v["skeleton"], []).append(r)
    if len(by) > 1:
        raise StashError(
            "stash.torch.fit: the ranks measured different blocks (skeleton digest "
            + "; ".join(f"{d} on rank(s) {', '.join(map(str, rs))}" for d, rs in by.items())
            + "): every rank runs one plan, so every rank's blocks must save the same "
              "tensors (the same model and the same input shapes on every rank)")
    entry["profile"] = combine_profiles([v["profile"] for v in views])
    measured = [v["measured"] for v in views if v["measured"] is not None]
    entry["measured_peak_bytes"] = max(measured) if measured else None
    return own


def publish_plan(ranks: Ranks, own: str, plan: Dict[str, Any],
                 figures: Dict[str, Any]) -> None:
    """Rank 0: the plan every rank runs."""
    ranks.publish("plan", {"skeleton": own, "plan": plan, "figures": figures})


def published_plan(ranks: Ranks, own: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Other ranks: rank 0's (plan, figures), checked against this rank's skeleton."""
    got = ranks.publish("plan")
    if got["skeleton"] != own:
        raise StashError(
            f"stash.torch.fit: rank 0's plan is for skeleton {got['skeleton']}, rank "
            f"{ranks.rank} measured {own}; not running it")
    return got["plan"], got["figures"]


def optimizer_state_delta(ranks: Ranks, delta: int) -> int:
    """The first optimizer step after a plan: the largest difference any rank saw between
    its optimizer's real state and the estimate."""
    return max(int(d) for d in ranks.exchange("optimizer-state", int(delta)))
