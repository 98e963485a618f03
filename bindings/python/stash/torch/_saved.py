"""Which tensors a block saves for backward, and their index: shared by the record pass
and the offload hooks, so that a plan made from a recorded profile names the same tensors
the hooks see (Note [What the record pass counts] in _record.py)."""

from typing import Any, Iterator, Tuple

import torch


def storage_of(t: torch.Tensor) -> Tuple[int, int]:
    """(key, nbytes) of a tensor's storage. The key is the storage's data pointer: views of
    one storage share it. A DTensor (FSDP2's sharded parameters) counts the shard this
    rank holds."""
    if type(t) is not torch.Tensor and hasattr(t, "to_local"):
        t = t.to_local()
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def tensors_in(x: Any) -> Iterator[torch.Tensor]:
    """The tensors in x: a tensor, or tuples, lists and dict values of them, in order."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (tuple, list)):
        for y in x:
            yield from tensors_in(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from tensors_in(y)


def call_block(block, x):
    """Block i's output is block i+1's input: a tuple is positional arguments."""
    return block(*x) if isinstance(x, tuple) else block(x)


def is_fsdp(block) -> bool:
    """Whether FSDP2's fully_shard manages block's parameters."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(block, FSDPModule)


def resident_storages(blocks):
    """Storage keys of every parameter and buffer of the blocks: never listed (they stay
    resident anyway and belong to fixed_bytes)."""
    keys = set()
    for block in blocks:
        for t in list(block.parameters()) + list(block.buffers()):
            keys.add(storage_of(t)[0])
    return keys


class SaveOrder:
    """Numbers the tensors one block's forward saves, in the order they are saved.

    see(t) returns None for a tensor that is not listed (a parameter, a buffer, an empty
    storage), else (index, first): the index of its storage within the block, and whether
    this call listed it (a later view of a listed storage gets the same index, first=False).
    `inputs` are the storage keys of the block's input tensors; `earlier` those of storages
    that existed before the block ran (not recomputable: recompute starts from them)."""

    def __init__(self, resident, inputs=(), earlier=()):
        self.resident = resident
        self.inputs = set(inputs)
        self.earlier = set(earlier)
        self.index = {}     # storage key -> index
        self.entries = []   # per index: {"key", "bytes", "is_input", "recomputable"}

    def see(self, t):
        # A parameter is never listed, whatever storage holds it: FSDP2 gathers a block's
        # parameters into storage of its own for each forward and each backward, which no
        # set of storages taken beforehand can name.
        if isinstance(t, torch.nn.Parameter):
            return None
        key, nbytes = storage_of(t)
        if key in self.resident or nbytes == 0:
            return None
        i = self.index.get(key)
        if i is not None:
            return i, False
        i = self.index[key] = len(self.entries)
        self.entries.append({"key": key, "bytes": int(nbytes), "is_input": key in self.inputs,
                             "recomputable": key not in self.earlier})
        return i, True

    def __len__(self):
        return len(self.entries)
