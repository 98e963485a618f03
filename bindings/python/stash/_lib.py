"""Finding and loading stash's shared libraries, and the C types they share."""

from __future__ import annotations

import ctypes
import os
from typing import Dict, List, Optional, Tuple, Union

__all__ = ["StashError", "PoolStats", "cudart", "find_library", "load", "parse_bytes",
           "status_string", "version"]


class StashError(RuntimeError):
    """A stash call failed. ``status`` is the stash_status_t number (0 when not from C)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _search_dirs() -> List[str]:
    dirs = [d for d in os.environ.get("STASH_LIB_DIR", "").split(os.pathsep) if d]
    dirs.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
    return dirs


def find_library(filename: str) -> str:
    """The path of ``filename`` (e.g. ``"libstash_torch.so"``): the first of the
    ``STASH_LIB_DIR`` directories, then ``stash/lib/`` next to this package, that holds
    it; else ``filename`` itself, which the dynamic loader then looks up on its default
    path (``LD_LIBRARY_PATH``, ldconfig)."""
    for d in _search_dirs():
        path = os.path.join(d, filename)
        if os.path.exists(path):
            return path
    return filename


_loaded: Dict[str, ctypes.CDLL] = {}
_CUDART_ENV = "STASH_CUDART"


# Note [A linker namespace for stash's libcudart]
# stash's libraries link libcudart.so.13 by soname. In a process that has already loaded
# a libcudart.so.13 (torch's CUDA build loads the one in its nvidia-cuda-runtime wheel)
# the loader binds any later library that needs that soname to the one loaded, and
# LD_LIBRARY_PATH cannot change that without changing what torch binds to as well. So
# STASH_CUDART=/path/to/libcudart.so.13 loads that runtime, and stash's libraries after
# it, into a linker namespace of their own (glibc's dlmopen(LM_ID_NEWLM)): there the soname
# resolves to STASH_CUDART's file, while torch keeps its own runtime in the base
# namespace. The namespace has its own copies of libc, libstdc++ and the libraries stash
# links; memory is one address space, so pointers pass freely, but memory one namespace's
# malloc returned must be freed by the same namespace (hence stash_free). This is how the
# Python tests run stash on its CPU test double (tests/cudart_double) beside a CUDA build of
# torch; it is one seam, named by one variable, and works for any runtime file. The
# namespace's libc gets an environment of its own, a copy of os.environ made when the
# namespace is created and kept alive here: its `environ` would otherwise keep pointing at
# the array the base libc had then, which the base libc frees when the program sets a
# variable later. stash's libraries therefore see the environment as it was when
# stash first loaded them (they read it once, at load, in any case). Unset
# (the normal case), the libraries load into the base namespace and share torch's runtime,
# as stash.torch's allocator and offload hooks must on a GPU.
class _Namespace:
    RTLD_NOW, RTLD_DI_LMID, LM_ID_NEWLM = 2, 1, -1

    def __init__(self, cudart: str) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._dlmopen = libc.dlmopen
        self._dlmopen.restype = ctypes.c_void_p
        self._dlmopen.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_int]
        self._dlerror = libc.dlerror
        self._dlerror.restype = ctypes.c_char_p
        dlinfo = libc.dlinfo
        dlinfo.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        if not os.path.isfile(cudart):
            raise StashError(f"{_CUDART_ENV}={cudart}: no such file")
        h = self._open(self.LM_ID_NEWLM, cudart)
        lmid = ctypes.c_long()
        if dlinfo(h, self.RTLD_DI_LMID, ctypes.byref(lmid)) != 0:
            raise StashError(f"dlinfo({cudart}): {self._dlerror().decode(errors='replace')}")
        self.lmid, self.cudart_path = lmid.value, cudart
        self.cudart = ctypes.CDLL(cudart, handle=h)
        self._environ = self._own_environment()

    def _own_environment(self) -> Tuple[List[ctypes.Array[ctypes.c_char]],
                                        ctypes.Array[ctypes.c_char_p]]:
        """Points the namespace's libc at a copy of the environment that lives as long as
        this object (see the Note)."""
        entries = [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in os.environ.items()]
        strings = [ctypes.create_string_buffer(e) for e in entries]
        array = (ctypes.c_char_p * (len(strings) + 1))(
            *[ctypes.cast(b, ctypes.c_char_p) for b in strings], None)
        libc = ctypes.CDLL("libc.so.6", handle=self._open(self.lmid, "libc.so.6"))
        ctypes.c_void_p.in_dll(libc, "environ").value = ctypes.addressof(array)
        return strings, array

    def _open(self, lmid: int, path: str) -> int:
        h: Optional[int] = self._dlmopen(lmid, os.fsencode(path), self.RTLD_NOW)
        if not h:
            raise OSError(self._dlerror().decode(errors="replace"))
        return h

    def load(self, path: str) -> ctypes.CDLL:
        return ctypes.CDLL(path, handle=self._open(self.lmid, path))


_namespace: Optional[_Namespace] = None


def _ns() -> Optional[_Namespace]:
    """The namespace of STASH_CUDART (Note [A linker namespace for stash's libcudart]), or
    None when it is unset."""
    global _namespace
    cudart = os.environ.get(_CUDART_ENV)
    if not cudart:
        return None
    if _namespace is None:
        _namespace = _Namespace(os.path.abspath(cudart))
    return _namespace


def load(filename: str) -> ctypes.CDLL:
    """Loads a stash library once per process; StashError naming where it looked."""
    if filename not in _loaded:
        path = find_library(filename)
        try:
            ns = _ns()
            _loaded[filename] = ns.load(path) if ns else ctypes.CDLL(path)
        except OSError as e:
            raise StashError(
                f"cannot load {filename} ({e}); looked in STASH_LIB_DIR and "
                f"{_search_dirs()[-1]}, then on the loader's path. Set STASH_LIB_DIR to the "
                "build's library directories, or install the package (pip install "
                "bindings/python).") from e
    return _loaded[filename]


def cudart() -> ctypes.CDLL:
    """The libcudart.so.13 that libstash.so runs on: STASH_CUDART's, in stash's namespace,
    or the process's (torch's) otherwise. Loads libstash.so first."""
    load("libstash.so")
    ns = _ns()
    return ns.cudart if ns else ctypes.CDLL("libcudart.so.13")


def runs_on_cuda_runtime_of_torch() -> bool:
    """True when stash's libraries share the process's libcudart (STASH_CUDART unset)."""
    return _ns() is None


class PoolStats(ctypes.Structure):
    """stash_pool_stats_t (stash.h); every field is exact."""

    _fields_ = [("struct_size", ctypes.c_size_t)] + [
        (name, ctypes.c_uint64) for name in (
            "current_count", "peak_count", "total_count", "current_bytes", "peak_bytes",
            "total_bytes", "requested_bytes", "pending_count", "pending_bytes",
            "reserved_bytes", "peak_reserved_bytes", "slab_count", "largest_free_bytes",
            "limit_bytes", "failed_count")]

    @classmethod
    def empty(cls) -> PoolStats:
        s = cls()
        s.struct_size = ctypes.sizeof(cls)
        return s

    def as_dict(self) -> Dict[str, int]:
        return {f[0]: int(getattr(self, f[0])) for f in self._fields_[1:]}


def _libstash() -> ctypes.CDLL:
    lib = load("libstash.so")
    if not getattr(lib, "_stash_typed", False):
        lib.stash_version_string.restype = ctypes.c_char_p
        lib.stash_version_string.argtypes = []
        lib.stash_status_string.restype = ctypes.c_char_p
        lib.stash_status_string.argtypes = [ctypes.c_int]
        setattr(lib, "_stash_typed", True)
    return lib


def version() -> str:
    """The version of the loaded libstash.so, "MAJOR.MINOR.PATCH"."""
    return str(_libstash().stash_version_string().decode())


def status_string(status: int) -> str:
    """stash_status_string: the name of a stash_status_t number."""
    return str(_libstash().stash_status_string(int(status)).decode())


def _libstash_bytes() -> ctypes.CDLL:
    lib = _libstash()
    if not getattr(lib, "_stash_bytes_typed", False):
        lib.stash_parse_bytes.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)]
        lib.stash_parse_bytes.restype = ctypes.c_int
        lib.stash_last_error.argtypes = []
        lib.stash_last_error.restype = ctypes.c_char_p
        setattr(lib, "_stash_bytes_typed", True)
    return lib


def parse_bytes(value: Union[int, str]) -> int:
    """A byte count from an int, or from a string in stash's one byte-count syntax, which
    libstash's stash_parse_bytes reads (stash.h, "Byte counts"): "123456", "8GiB", "1.5 TB"
    (B KB MB GB TB KiB MiB GiB TiB, case-insensitive). An int passes through (a bool or a
    negative one is refused). ValueError otherwise, with libstash's message."""
    if isinstance(value, bool):
        raise ValueError(f"not a byte count: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a byte count cannot be negative: {value}")
        return value
    text = str(value)
    if "\0" in text:  # a C string would end there
        raise ValueError(f"not a byte count: {value!r}")
    lib = _libstash_bytes()
    out = ctypes.c_uint64()
    if lib.stash_parse_bytes(text.encode(), ctypes.byref(out)) != 0:
        raise ValueError(lib.stash_last_error().decode(errors="replace"))
    return int(out.value)
