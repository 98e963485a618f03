"""Which tensors a block saves for backward, and their index: shared by the record pass
and the offload hooks, so that a plan made from a recorded profile names the same tensors
the hooks see (Note [What the record pass counts] in _record.py)."""

from __future__ import annotations

from typing import AbstractSet, Any, Dict, Iterable, Iterator, List, Optional, Set, Tuple

import torch
from torch.nn import Parameter


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


def call_block(block: Any, x: Any) -> Any:
    """Block i's output is block i+1's input: a tuple is positional arguments."""
    return block(*x) if isinstance(x, tuple) else block(x)


def is_fsdp(block: Any) -> bool:
    """Whether FSDP2's fully_shard manages block's parameters."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(block, FSDPModule)


def resident_storages(blocks: Iterable[torch.nn.Module]) -> Set[int]:
    """Storage keys of every parameter and buffer of the blocks: never listed (they stay
    resident anyway and belong to fixed_bytes). Taken once per step: one walk over the
    modules' own tables (what parameters() and buffers() walk, twice and deduplicated)."""
    keys: Set[int] = set()
    for block in blocks:
        for m in block.modules():
            for table in (m._parameters, m._buffers):
                for t in table.values():
                    if t is not None:
                        keys.add(storage_of(t)[0])
    return keys


class SaveOrder:
    """Numbers the tensors one block's forward saves, in the order they are saved.

    see(t) returns None for a tensor that is not listed (a parameter, a buffer, an empty
    storage), else (index, first): the index of its storage within the block, and whether
    this call listed it (a later view of a listed storage gets the same index, first=False).
    `inputs` are the storage keys of the block's input tensors; `earlier` those of storages
    that existed before the block ran (not recomputable: recompute starts from them).

    The first tensor of each listed storage is held until release(): keys are addresses,
    and a storage freed while the forward runs could hand its address to a later tensor,
    which would then look like a view of the first. keys[j] is storage j's key, size(j) its
    bytes (read from the held tensor on first ask), entries the same as dicts. see() runs
    once per saved tensor in the offload hooks (Note [The keep path] in _offload_hooks.py):
    a plain tensor costs its storage's address, from the tensor's own pointer and offset
    (no storage object), and one dict lookup."""

    __slots__ = ("resident", "inputs", "earlier", "index", "keys", "_firsts", "_sizes",
                 "_entries")

    def __init__(self, resident: AbstractSet[int], inputs: Iterable[int] = (),
                 earlier: Iterable[int] = ()) -> None:
        self.resident = resident
        self.inputs = set(inputs)
        self.earlier = self.inputs if earlier is inputs else set(earlier)
        self.index: Dict[int, int] = {}  # storage key -> index
        self.keys: List[int] = []        # per index: the storage's key
        self._firsts: List[torch.Tensor] = []  # per index: its first tensor, until release()
        self._sizes: List[Optional[int]] = []  # per index: its bytes, once asked
        self._entries: List[Dict[str, Any]] = []

    def see(self, t: torch.Tensor) -> Optional[Tuple[int, bool]]:
        if type(t) is torch.Tensor and t.numel():
            # Never a Parameter (Parameter's isinstance reads _is_param only on tensor
            # subclasses), and a storage with elements is not empty. A strided tensor's
            # pointer is its storage's plus its offset.
            try:
                # (The stubs type storage_offset() as int or SymInt; a real tensor's is an int.)
                key: int = t.data_ptr() - t.storage_offset() * t.element_size()  # type: ignore[assignment]
            except RuntimeError:  # no storage (sparse): as storage_of raises
                key = t.untyped_storage().data_ptr()
            empty = False
        elif isinstance(t, Parameter):
            # A parameter is never listed, whatever storage holds it: FSDP2 gathers a
            # block's parameters into storage of its own for each forward and each
            # backward, which no set of storages taken beforehand can name.
            return None
        else:
            key, nbytes = storage_of(t)
            empty = nbytes == 0
        i = self.index.get(key)
        if i is not None:
            return i, False
        if empty or key in self.resident:
            return None
        i = self.index[key] = len(self.keys)
        self.keys.append(key)
        self._firsts.append(t)
        self._sizes.append(None)
        return i, True

    def size(self, i: int) -> int:
        """The bytes of storage i (its first tensor must still be held)."""
        n = self._sizes[i]
        if n is None:
            n = self._sizes[i] = int(storage_of(self._firsts[i])[1])
        return n

    def release(self) -> None:
        """Drops the first tensors (the block's forward ended); sizes read so far stay."""
        self._firsts = []

    def recomputable(self, i: int) -> bool:
        """Whether storage i did not exist before the block ran."""
        return self.keys[i] not in self.earlier

    @property
    def entries(self) -> List[Dict[str, Any]]:
        """Per index: {"key", "bytes", "is_input", "recomputable"}."""
        for i in range(len(self._entries), len(self.keys)):
            key = self.keys[i]
            self._entries.append({"key": key, "bytes": self.size(i),
                                  "is_input": key in self.inputs,
                                  "recomputable": key not in self.earlier})
        return self._entries

    def __len__(self) -> int:
        return len(self.keys)
