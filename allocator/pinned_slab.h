// pinned_slab.h: obtains and returns the pinned slabs of the pinned pool, on the GPU's
// NUMA node where the machine has several.
//
// Note [NUMA placement of pinned slabs]
// A D2H/H2D copy to pinned memory on the far socket crosses the inter-socket link and
// loses a large share of PCIe bandwidth, so slabs go on the node nearest the GPU
// (cudaDevAttrHostNumaId). Of the two ways to do this we use libnuma: mmap an anonymous
// range, mbind(MPOL_BIND) it to the node before any page is touched, then
// cudaHostRegister it (which faults the pages in, on that node, and pins them). Why not a
// CUDA memory pool located on the host NUMA node (cudaMemPoolCreate with
// cudaMemLocationTypeHostNuma): (1) it needs a recent driver and a kernel with HMM/NUMA
// support, and fails on many current cluster images, while mbind works on every Linux
// with the NUMA syscalls; (2) the pool would hand out memory stream-ordered, a second
// allocator under ours, whose reservation and trimming we cannot observe or cap exactly;
// (3) cudaHostRegister'd slabs behave exactly like cudaHostAlloc'd ones for copies, so
// the pool has one code path above this file; (4) the runtime calls it needs
// (cudaHostRegister) are ones the CPU test double already implements. On a machine with a
// single node, without libnuma, or when the node is unknown, slabs come from
// cudaHostAlloc (portable) and no placement is attempted.
//
// Errors: acquire returns a status and writes the thread-local error text; release
// tolerates a runtime that is unloading. Thread-safe (no state beyond construction).
#pragma once

#include <cstddef>

#include "core/error.h"

namespace stash {

struct pinned_slab {
  void* base = nullptr;
  size_t bytes = 0;
  bool mapped = false;  // mmap + mbind + cudaHostRegister, else cudaHostAlloc
};

class pinned_slab_source {
 public:
  // device: the GPU the slabs feed; numa_placement: try to bind to its node.
  pinned_slab_source(int device, bool numa_placement) noexcept;

  status acquire(size_t bytes, pinned_slab* out) const noexcept;
  void release(const pinned_slab& slab) const noexcept;

  // The node slabs are bound to, or -1 when they are not placed.
  int numa_node() const noexcept { return node_; }

 private:
  int node_ = -1;
};

}  // namespace stash
