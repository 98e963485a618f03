"""stash: a CUDA runtime memory manager with an ahead-of-time planner.

This package is a thin ctypes layer over stash's C libraries:

- ``libstash.so``, the C API (``stash.h``): :func:`version`, :func:`status_string`, and
  the prefetch engine (:mod:`stash._engine`, used by :func:`stash.torch.offload`);
- ``libstash_torch.so``, the PyTorch pluggable allocator: :mod:`stash.torch`.

The libraries are found through ``STASH_LIB_DIR`` (directories separated by ``:``),
then next to the package (``stash/lib/``), then on the loader's default path; see
:func:`stash._lib.find_library`. When PyTorch is used, ``import torch`` before ``import
stash`` so that both load the same ``libcudart.so.13``.
"""

from ._lib import StashError, find_library, parse_bytes, status_string, version
from . import profile

__all__ = ["StashError", "find_library", "parse_bytes", "profile", "status_string", "version"]
__version__ = "0.3.0"
