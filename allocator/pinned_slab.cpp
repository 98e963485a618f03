#include "pinned_slab.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "cuda_prim.h"

#if STASH_HAVE_LIBNUMA
#include <numa.h>
#include <numaif.h>
#endif

namespace stash {

pinned_slab_source::pinned_slab_source(int device, bool numa_placement) noexcept {
#if STASH_HAVE_LIBNUMA
  if (numa_placement && numa_available() >= 0 && numa_num_configured_nodes() > 1) {
    const int node = prim::host_numa_node(device);
    if (node >= 0 && node <= numa_max_node()) node_ = node;
  }
#else
  (void)device;
  (void)numa_placement;
#endif
}

status pinned_slab_source::acquire(size_t bytes, pinned_slab* out) const noexcept {
  *out = pinned_slab{};
#if STASH_HAVE_LIBNUMA
  if (node_ >= 0) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return fail(status::out_of_memory, "mmap of a %zu-byte pinned slab failed: %s", bytes,
                  std::strerror(errno));
    }
    unsigned long mask[16] = {};  // up to 1024 nodes
    const unsigned long bits = 8 * sizeof(unsigned long);
    mask[static_cast<size_t>(node_) / bits] |= 1UL << (static_cast<unsigned>(node_) % bits);
    if (::mbind(p, bytes, MPOL_BIND, mask, sizeof(mask) * 8, 0) != 0) {
      const int e = errno;
      ::munmap(p, bytes);
      return fail(status::out_of_memory, "mbind of a %zu-byte pinned slab to NUMA node %d failed: %s",
                  bytes, node_, std::strerror(e));
    }
    const cudaError_t err = prim::host_register(p, bytes);
    if (err != cudaSuccess) {
      ::munmap(p, bytes);
      return prim::record_cuda_error(err, "cudaHostRegister(slab)", __FILE__, __LINE__);
    }
    *out = pinned_slab{p, bytes, true};
    return status::ok;
  }
#endif
  void* p = nullptr;
  const cudaError_t err = prim::host_alloc(&p, bytes);
  if (err != cudaSuccess) {
    return prim::record_cuda_error(err, "cudaHostAlloc(pinned slab)", __FILE__, __LINE__);
  }
  *out = pinned_slab{p, bytes, false};
  return status::ok;
}

void pinned_slab_source::release(const pinned_slab& slab) const noexcept {
  if (!slab.base) return;
  if (slab.mapped) {
    prim::host_unregister(slab.base);
    ::munmap(slab.base, slab.bytes);
  } else {
    prim::host_free(slab.base);
  }
}

}  // namespace stash
