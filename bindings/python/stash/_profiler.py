"""The in-process CUPTI profiler (stash.h, "Profiler") through ctypes: layer scopes and
start/stop, as stash.torch.fit's measuring step uses them."""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
from typing import Any, Dict, Optional, Tuple

from ._lib import load

__all__ = ["Profiler"]

FORWARD, BACKWARD, TENSOR = 0, 1, 2


def _lib() -> ctypes.CDLL:
    lib = load("libstash.so")
    if not getattr(lib, "_stash_profiler_typed", False):
        lib.stash_profiler_start.argtypes = []
        lib.stash_profiler_start.restype = ctypes.c_int
        lib.stash_profiler_active.argtypes = []
        lib.stash_profiler_active.restype = ctypes.c_int
        lib.stash_profiler_stop.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        lib.stash_profiler_stop.restype = ctypes.c_int
        lib.stash_profile_scope_begin.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p]
        lib.stash_profile_scope_begin.restype = ctypes.c_int
        lib.stash_profile_scope_end.argtypes = []
        lib.stash_profile_scope_end.restype = ctypes.c_int
        lib.stash_last_error.restype = ctypes.c_char_p
        setattr(lib, "_stash_profiler_typed", True)
    return lib


class Profiler:
    """One CUPTI session: start() says whether CUPTI runs (and why not), forward scopes
    name the kernels of a layer's forward, stop() returns the per-layer kernel times."""

    def __init__(self) -> None:
        self.active = False
        self.reason: Optional[str] = None

    def start(self) -> Tuple[bool, Optional[str]]:
        lib = _lib()
        if lib.stash_profiler_start() == 0:
            self.active, self.reason = True, None
        else:
            self.active = False
            self.reason = lib.stash_last_error().decode(errors="replace")
        return self.active, self.reason

    def begin(self, kind: int, layer: int) -> None:
        if self.active:
            _lib().stash_profile_scope_begin(kind, layer, None)

    def end(self) -> None:
        if self.active:
            _lib().stash_profile_scope_end()

    def stop(self) -> Optional[Dict[str, Any]]:
        """Stops and returns {"layers": [{"index", "fwd_ms", "bwd_ms"}...], ...} (kernel
        time per scope, medians), or None when the profiler did not run or failed."""
        if not self.active:
            return None
        self.active = False
        fd, path = tempfile.mkstemp(prefix="stash-cupti-", suffix=".json")
        os.close(fd)
        try:
            if _lib().stash_profiler_stop(None, os.fsencode(path)) != 0:
                self.reason = _lib().stash_last_error().decode(errors="replace")
                return None
            with open(path) as f:
                times: Dict[str, Any] = json.load(f)
            return times
        finally:
            os.unlink(path)
