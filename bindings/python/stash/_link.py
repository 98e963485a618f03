"""The link benchmark (stash.h, "Link") through ctypes, and its per-machine cache."""

from __future__ import annotations

import ctypes
import json
import os
import re
from typing import Any, Dict, Optional

from ._lib import StashError, load, status_string
from .profile import write_json

__all__ = ["LinkResult", "cached_link", "measure_link", "read_cached_link", "store_link"]


class LinkResult(ctypes.Structure):
    """stash_link_result_t; filled by stash_link_result_init."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("h2d_gbps", ctypes.c_double),
                ("d2h_gbps", ctypes.c_double), ("bidir_gbps", ctypes.c_double),
                ("local_ranks", ctypes.c_int), ("sharers", ctypes.c_int),
                ("buffer_bytes", ctypes.c_size_t), ("device_name", ctypes.c_char * 256)]


def _lib() -> ctypes.CDLL:
    lib = load("libstash.so")
    if not getattr(lib, "_stash_link_typed", False):
        lib.stash_link_result_init.argtypes = [ctypes.POINTER(LinkResult)]
        lib.stash_link_result_init.restype = None
        lib.stash_link_measure.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int,
                                           ctypes.POINTER(LinkResult)]
        lib.stash_link_measure.restype = ctypes.c_int
        lib.stash_last_error.restype = ctypes.c_char_p
        setattr(lib, "_stash_link_typed", True)
    return lib


def measure_link(device: int = 0, nbytes: int = 0, sharers: int = 0) -> Dict[str, Any]:
    """Measures the pinned host <-> device link of `device` (``stash bench link``): the
    profile's link section (per rank) plus "device_name" and "buffer_bytes"."""
    lib = _lib()
    r = LinkResult()
    lib.stash_link_result_init(ctypes.byref(r))
    status = lib.stash_link_measure(int(device), int(nbytes), int(sharers), ctypes.byref(r))
    if status != 0:
        msg = lib.stash_last_error().decode(errors="replace")
        raise StashError(f"{msg} ({status_string(status)}, status {status})", status)
    return {"h2d_gbps": r.h2d_gbps, "d2h_gbps": r.d2h_gbps, "bidir_gbps": r.bidir_gbps,
            "local_ranks": r.local_ranks, "device_name": r.device_name.decode(),
            "buffer_bytes": int(r.buffer_bytes), "sharers": r.sharers}


def cache_root(cache_dir: Optional[str] = None) -> str:
    """cache_dir, else $XDG_CACHE_HOME/stash, else ~/.cache/stash."""
    if cache_dir:
        return os.fspath(cache_dir)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "stash")


def _cache_path(key: str, cache_dir: Optional[str]) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", key)
    return os.path.join(cache_root(cache_dir), f"link-{safe}.json")


def read_cached_link(key: str, cache_dir: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """The link an earlier run measured under key ("cached": True), or None."""
    try:
        with open(_cache_path(key, cache_dir)) as f:
            link = json.load(f)
    except (OSError, ValueError):
        return None
    if isinstance(link, dict) and all(isinstance(link.get(k), (int, float)) and link[k] > 0
                                      for k in ("h2d_gbps", "d2h_gbps", "bidir_gbps")):
        link["cached"] = True
        return link
    return None


def store_link(key: str, link: Dict[str, Any], cache_dir: Optional[str] = None) -> None:
    write_json(_cache_path(key, cache_dir), {k: v for k, v in link.items() if k != "cached"})


def cached_link(key: str, device: int = 0, nbytes: int = 0, sharers: int = 0,
                cache_dir: Optional[str] = None) -> Dict[str, Any]:
    """The link of this machine: read from `<cache>/link-<key>.json` when an earlier run
    measured it, else measured now and written there (``"cached": True`` when read)."""
    link = read_cached_link(key, cache_dir)
    if link is not None:
        return link
    link = measure_link(device, nbytes, sharers)
    store_link(key, link, cache_dir)
    link["cached"] = False
    return link
