"""The record pass: which tensors each block saves for backward, in order, and how big.

Note [What the record pass counts]
A forward pass over the blocks runs under torch.autograd.graph.saved_tensors_hooks; the
pack hook sees every tensor autograd saves, in the order it saves them, which is the
order the offload hooks see them in too (tensors are identified by that order within a
block, matching the profile; both number them with _saved.SaveOrder). For each one:
- parameters and buffers (of any of the blocks) are skipped: they stay resident anyway
  and belong to fixed_bytes;
- tensors are keyed by their storage, so several views of one storage (a transpose, the
  q/k/v slices of one projection) are one entry, at the position of the first, with the
  storage's bytes: that is what offloading it moves and what freeing it releases;
- a storage that existed before the block ran (the block's input, the output of an
  earlier block) is marked not recomputable: recompute starts from it, it cannot be
  produced again by the block. The block's input is named "input".
Everything else is offloadable and recomputable; times are 0, to be filled by `stash
profile` (CUPTI), which also names what it could not measure.
"""

import ctypes
import hashlib
import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set

import torch

from .. import profile as _profile
from .._lib import StashError, load
from ._saved import SaveOrder, call_block, resident_storages, storage_of, tensors_in


def _pinnable_bytes() -> int:
    """The pinned pool's default cap for this rank, from the library (stash_pinned_default_cap:
    0.8 x the host memory really available, cgroup limits included, / LOCAL_WORLD_SIZE)."""
    lib = load("libstash.so")
    lib.stash_pinned_default_cap.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
    lib.stash_pinned_default_cap.restype = ctypes.c_int
    n = ctypes.c_size_t(0)
    if lib.stash_pinned_default_cap(ctypes.byref(n)) != 0:
        raise StashError("stash_pinned_default_cap failed")
    return int(n.value)


def _device_info(device: Optional[torch.device] = None) -> Dict[str, Any]:
    """A profile's device section: `device`'s, or (None) the current CUDA device's when
    there is one."""
    if device is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    if device is not None and device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"name": props.name, "memory_bytes": int(props.total_memory)}
    return {"name": "cpu", "memory_bytes": 0}


def _fixed_bytes(blocks: Sequence[torch.nn.Module]) -> int:
    seen: Set[Any] = set()
    total = 0
    for block in blocks:
        for p in block.parameters():
            key, n = storage_of(p)
            if key in seen:
                continue
            seen.add(key)
            total += n * (2 if p.requires_grad else 1)  # the parameter and its gradient
        for b in block.buffers():
            key, n = storage_of(b)
            if key not in seen:
                seen.add(key)
                total += n
    return total


def record(blocks: Sequence[torch.nn.Module], sample_inputs: Any, path: Optional[str] = None,
           *, names: Optional[Sequence[str]] = None,
           link: Optional[Mapping[str, Any]] = None,
           fixed_bytes: Optional[int] = None) -> Dict[str, Any]:
    """Runs one forward pass of `blocks` (nn.Modules applied in order: block i's output is
    block i+1's input) on `sample_inputs` (a tensor, or a tuple of positional arguments
    for the first block) and returns a stash.profile/1 skeleton as a dict; writes it as
    JSON to `path` when given. Note [What the record pass counts] says what is listed.

    names: one layer name per block (default "<ClassName>.<i>"). link: the link section
    (default: placeholder 1 GB/s, local_ranks 1, for `stash profile` or the user to
    replace). fixed_bytes: default = the blocks' parameters, their gradients and buffers.
    Each layer's signature is its class name plus a digest of its tensors' bytes and
    flags, so identical blocks share one and the planner solves them once."""
    blocks = list(blocks)
    if not blocks:
        raise ValueError("stash.torch.record: no blocks")
    if names is not None and len(names) != len(blocks):
        raise ValueError("stash.torch.record: one name per block")
    resident = resident_storages(blocks)

    layers = []
    earlier = set()  # storages that existed before the current block ran
    # Every block's output stays alive until the end, so that no storage address seen
    # is reused by a later tensor (keys are addresses).
    outputs = []
    x = sample_inputs
    with torch.enable_grad():
        for t in tensors_in(x):
            earlier.add(storage_of(t)[0])
        for i, block in enumerate(blocks):
            order = SaveOrder(resident, (storage_of(t)[0] for t in tensors_in(x)), earlier)
            tensors: List[Dict[str, Any]] = []

            def pack(t: torch.Tensor, order: SaveOrder = order,
                     tensors: List[Dict[str, Any]] = tensors) -> torch.Tensor:
                seen = order.see(t)
                if seen is not None and seen[1]:
                    e = order.entries[seen[0]]
                    tensors.append({
                        "name": "input" if e["is_input"] else f"saved.{len(tensors)}",
                        "bytes": e["bytes"],
                        "recompute_ms": 0.0,
                        "offloadable": True,
                        "recomputable": e["recomputable"],
                        "must_keep": False,
                    })
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = call_block(block, x)
            # An input that two inputs share gets "input" once; later ones are renamed.
            seen_names: Set[str] = set()
            for entry in tensors:
                if entry["name"] in seen_names:
                    entry["name"] = f"input.{len(seen_names)}"
                seen_names.add(entry["name"])
            digest = hashlib.sha256(json.dumps(
                [(t["bytes"], t["recomputable"]) for t in tensors]).encode()).hexdigest()[:16]
            layers.append({
                "name": names[i] if names else f"{type(block).__name__}.{i}",
                "signature": f"{type(block).__name__}:{digest}",
                "fwd_ms": 0.0,
                "bwd_ms": 0.0,
                "bwd_temp_bytes": 0,
                "tensors": tensors,
            })
            earlier.update(order.index)
            for t in tensors_in(out):
                earlier.add(storage_of(t)[0])
            outputs.append(out)
            x = out
        del x, outputs

    doc = {
        "schema": _profile.SCHEMA,
        "source": "measured",
        "device": _device_info(),
        "link": dict(link) if link else
                {"h2d_gbps": 1.0, "d2h_gbps": 1.0, "bidir_gbps": 1.0, "local_ranks": 1},
        "host": {"pinnable_bytes": _pinnable_bytes()},
        "fixed_bytes": int(_fixed_bytes(blocks) if fixed_bytes is None else fixed_bytes),
        "layers": layers,
    }
    _profile.validate(doc)
    if path is not None:
        _profile.write_json(path, doc)
    return doc
