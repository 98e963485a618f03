"""stash's device pool as PyTorch's CUDA allocator (libstash_torch.so, stash_torch.h)."""

import ctypes
from typing import Any, Dict, Union

from .._lib import PoolStats, StashError, find_library, load, parse_bytes

LIBRARY = "libstash_torch.so"
installed = False  # use_allocator made stash's pool torch's CUDA allocator in this process


def _lib() -> ctypes.CDLL:
    lib = load(LIBRARY)
    if not getattr(lib, "_stash_typed", False):
        lib.stash_torch_set_budget.argtypes = [ctypes.c_int, ctypes.c_size_t]
        lib.stash_torch_set_budget.restype = ctypes.c_int
        lib.stash_torch_stats.argtypes = [ctypes.c_int, ctypes.POINTER(PoolStats)]
        lib.stash_torch_stats.restype = ctypes.c_int
        lib.stash_torch_reset_peak.argtypes = [ctypes.c_int]
        lib.stash_torch_reset_peak.restype = ctypes.c_int
        lib.stash_torch_release_cached.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_size_t)]
        lib.stash_torch_release_cached.restype = ctypes.c_int
        lib.stash_torch_last_error.argtypes = []
        lib.stash_torch_last_error.restype = ctypes.c_char_p
        lib.stash_torch_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.stash_torch_malloc.restype = ctypes.c_void_p
        lib.stash_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                         ctypes.c_void_p]
        lib.stash_torch_free.restype = None
        setattr(lib, "_stash_typed", True)
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        msg = _lib().stash_torch_last_error().decode(errors="replace")
        raise StashError(f"{what}: {msg or 'status ' + str(status)}", status)


def set_budget(budget: Union[int, str, None], device: int = -1) -> None:
    """Sets the device pool's budget (bytes, or a string such as "40GiB"; 0 or None: no
    budget) for `device`, or every device (-1). Only while that pool has no live block."""
    bytes_ = 0 if budget is None else parse_bytes(budget)
    _check(_lib().stash_torch_set_budget(int(device), bytes_), "stash_torch_set_budget")


def allocator_stats(device: int = 0) -> Dict[str, Any]:
    """The pool statistics of `device` as a dict (stash_pool_stats_t fields)."""
    s = PoolStats.empty()
    _check(_lib().stash_torch_stats(int(device), ctypes.byref(s)), "stash_torch_stats")
    return s.as_dict()


def reset_peak(device: int = 0) -> None:
    _check(_lib().stash_torch_reset_peak(int(device)), "stash_torch_reset_peak")


def release_cached(device: int = 0) -> int:
    """Gives the pool's entirely free slabs back to CUDA; the bytes released."""
    n = ctypes.c_size_t(0)
    _check(_lib().stash_torch_release_cached(int(device), ctypes.byref(n)),
           "stash_torch_release_cached")
    return int(n.value)


def use_allocator(budget: Union[int, str, None] = None) -> Any:
    """Makes stash's device pool PyTorch's CUDA allocator, with an optional budget (bytes or
    "40GiB"; None: STASH_DEVICE_BUDGET from the environment, else none) for every device.

    Call before the first CUDA tensor is created: PyTorch cannot change its allocator after
    that. Needs torch >= 2.0 built with CUDA (torch.cuda.memory.CUDAPluggableAllocator);
    raises StashError otherwise. Returns the CUDAPluggableAllocator."""
    import torch

    memory = getattr(torch.cuda, "memory", None)
    pluggable = getattr(memory, "CUDAPluggableAllocator", None)
    change = getattr(memory, "change_current_allocator", None)
    if pluggable is None or change is None:
        raise StashError(
            f"stash.torch.use_allocator needs torch.cuda.memory.CUDAPluggableAllocator, which "
            f"torch {torch.__version__} does not have (it came in torch 2.0). Use "
            "LD_PRELOAD=libstash_preload.so with STASH_DEVICE_BUDGET instead, or upgrade torch.")
    if not torch.cuda.is_available():
        raise StashError("stash.torch.use_allocator: this torch has no usable CUDA device")
    if budget is not None:
        set_budget(budget, -1)
    path = find_library(LIBRARY)
    _lib()  # fails here, with the search path in the message, if the library is missing
    allocator = pluggable(path, "stash_torch_malloc", "stash_torch_free")
    change(allocator)
    global installed
    installed = True
    return allocator
