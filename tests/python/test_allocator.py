"""The PyTorch pluggable allocator library through ctypes, on the CPU test double."""

import ctypes

import pytest
import torch

import stash
import stash.torch
from stash import _lib
from stash.torch import _allocator

MiB = 1 << 20


def test_on_the_test_double():
    # The C side must run on the double (ctest sets STASH_CUDART), in a linker namespace
    # of its own: torch's CUDA build keeps its own libcudart.so.13 in the base namespace.
    assert hasattr(_lib.cudart(), "stashdbl_probe")
    assert not _lib.runs_on_cuda_runtime_of_torch()
    if torch.version.cuda is not None:
        torch_rt = ctypes.CDLL("libcudart.so.13")  # the one torch loaded
        assert not hasattr(torch_rt, "stashdbl_probe")


def test_libstash_version():
    assert stash.version() == "0.3.0"
    assert stash.status_string(2) == "out of memory"


def test_parse_bytes():
    assert stash.parse_bytes("8GiB") == 8 << 30
    assert stash.parse_bytes("1.5 KiB") == 1536
    assert stash.parse_bytes("85.9GB") == 85_900_000_000
    assert stash.parse_bytes(123) == 123
    for bad in ("1.5", "-1", "8G", "", "GiB", True, -3):
        with pytest.raises(ValueError):
            stash.parse_bytes(bad)


def test_budget_and_stats():
    stash.torch.set_budget("64MiB")
    assert stash.torch.allocator_stats(0)["limit_bytes"] == 64 * MiB
    lib = _allocator._lib()
    a = lib.stash_torch_malloc(40 * MiB, 0, None)
    assert a
    assert not lib.stash_torch_malloc(40 * MiB, 0, None)  # over budget
    s = stash.torch.allocator_stats(0)
    assert s["current_count"] == 1 and s["current_bytes"] == 40 * MiB
    assert s["failed_count"] == 1 and s["reserved_bytes"] <= 64 * MiB
    with pytest.raises(stash.StashError, match="live blocks"):
        stash.torch.set_budget("1GiB")  # not while a block is live
    lib.stash_torch_free(a, 40 * MiB, 0, None)
    assert stash.torch.allocator_stats(0)["current_count"] == 0
    stash.torch.set_budget(None)
    assert stash.torch.allocator_stats(0)["limit_bytes"] == 0


def test_use_allocator_needs_pluggable_allocator():
    if hasattr(torch.cuda.memory, "CUDAPluggableAllocator") and torch.cuda.is_available():
        pytest.skip("torch has the pluggable allocator and a device (covered on GPU)")
    with pytest.raises(stash.StashError, match="CUDAPluggableAllocator|no usable CUDA"):
        stash.torch.use_allocator(budget="1GiB")


def test_missing_library_names_the_search_path(monkeypatch):
    monkeypatch.setitem(_lib._loaded, "libstash_nothing.so", None)
    del _lib._loaded["libstash_nothing.so"]
    with pytest.raises(stash.StashError, match="STASH_LIB_DIR"):
        _lib.load("libstash_nothing.so")
