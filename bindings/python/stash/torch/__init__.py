"""stash for PyTorch. ``import torch`` first (both must load the same libcudart.so.13).

- :func:`use_allocator`: stash's device pool as PyTorch's CUDA allocator (torch >= 2.0).
- :func:`allocator_stats`, :func:`set_budget`: the pool behind it, through ctypes.
- :func:`record`: the record pass; writes a stash.profile/1 skeleton of a model's blocks.
- :class:`nvtx_ranges`: wraps blocks in the ``stash:layer:<i>:fwd|bwd`` NVTX ranges that
  ``stash profile`` attributes kernel times to.
- :func:`offload`: applies a plan to the blocks through the prefetch engine (saved-tensor
  hooks: offload in forward, prefetch one block ahead in backward, selective recompute).
- :func:`fit`: budget mode: measures the model in its first training step, plans in
  process and applies the plan from the next step on.
"""

from ._allocator import allocator_stats, release_cached, reset_peak, set_budget, use_allocator
from ._nvtx import nvtx_ranges
from ._fit import BudgetHandle
from ._fit_api import fit
from ._offload import OffloadHandle, offload
from ._record import record

__all__ = ["BudgetHandle", "OffloadHandle", "allocator_stats", "fit", "nvtx_ranges",
           "offload", "record", "release_cached", "reset_peak", "set_budget", "use_allocator"]
