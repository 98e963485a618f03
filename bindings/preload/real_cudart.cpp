#include "real_cudart.h"

#include <dlfcn.h>
#include <pthread.h>

// Note [Reaching the real cudart]
// The hooks (hooks.cpp) export cudaMalloc & co. under the version node libcudart.so.13,
// and programs bind those names at that version, so with LD_PRELOAD every call lands
// here first. Two paths lead on to the real runtime:
//  1. The hooks' own pass-through calls use the pointers below, found with
//     dlvsym(RTLD_NEXT, name, "libcudart.so.13"): the next definition after this library
//     in the lookup order, at the exact version the program asked for. dlvsym, not dlsym:
//     an unversioned dlsym may pick an older default version, and dlsym is what
//     malloc-interposers recurse through. When this library was dlopen'ed rather than
//     preloaded, RTLD_NEXT may not see cudart; then the already-loaded libcudart.so.13 is
//     asked directly (RTLD_NOLOAD, so nothing new is loaded).
//  2. The pools (allocator/) are linked into this library from the same static archive
//     libstash.so uses, and cuda_prim.cpp calls cudaMalloc, cudaFree, cudaHostAlloc and
//     cudaFreeHost by name. Inside this library those names would bind to the hooks
//     (the hooks are the first definition in the global scope), so a pool growing a slab
//     would recurse into itself. The link therefore uses `-Wl,--wrap=<name>` for every
//     hooked name (bindings/preload/CMakeLists.txt): undefined references in the other
//     objects, cuda_prim.o among them, are rewritten to __wrap_<name>, defined below over
//     the real pointers, while the hooks' own definitions keep the plain names. The
//     allocator's sources stay untouched and identical to libstash.so's; a new direct
//     call to a hooked name in allocator/ fails to link unless a __wrap_ exists for it,
//     so the rule cannot rot silently.
// Nothing here calls dlsym from inside a hook that dlsym could itself reach (we hook no
// libc function), so there is no recursion through the loader.

namespace stash::preload {

namespace {

constexpr const char* kVersion = "libcudart.so.13";

real_cudart g_real{};
pthread_once_t g_once = PTHREAD_ONCE_INIT;

void* lookup(const char* name) noexcept {
  if (void* f = dlvsym(RTLD_NEXT, name, kVersion)) return f;
  // dlopen'ed after cudart: RTLD_NEXT only searches objects loaded after this one.
  void* lib = dlopen("libcudart.so.13", RTLD_LAZY | RTLD_NOLOAD);
  if (!lib) return nullptr;
  void* f = dlvsym(lib, name, kVersion);
  dlclose(lib);  // drops the reference NOLOAD took; the library stays loaded
  return f;
}

template <class F>
void resolve(F*& slot, const char* name) noexcept {
  slot = reinterpret_cast<F*>(lookup(name));
}

void resolve_all() noexcept {
  resolve(g_real.malloc, "cudaMalloc");
  resolve(g_real.free, "cudaFree");
  resolve(g_real.malloc_async, "cudaMallocAsync");
  resolve(g_real.free_async, "cudaFreeAsync");
  resolve(g_real.malloc_async_ptsz, "cudaMallocAsync_ptsz");
  resolve(g_real.free_async_ptsz, "cudaFreeAsync_ptsz");
  resolve(g_real.malloc_host, "cudaMallocHost");
  resolve(g_real.host_alloc, "cudaHostAlloc");
  resolve(g_real.free_host, "cudaFreeHost");
}

}  // namespace

const real_cudart& real() noexcept {
  pthread_once(&g_once, resolve_all);
  return g_real;
}

}  // namespace stash::preload

// The targets of -Wl,--wrap (Note [Reaching the real cudart]). Hidden: they are for the
// objects linked into this library only.
using stash::preload::real;

#define STASH_WRAP extern "C" __attribute__((visibility("hidden")))

STASH_WRAP cudaError_t __wrap_cudaMalloc(void** p, size_t n) {
  return real().malloc ? real().malloc(p, n) : cudaErrorInitializationError;
}
STASH_WRAP cudaError_t __wrap_cudaFree(void* p) {
  return real().free ? real().free(p) : cudaErrorInitializationError;
}
STASH_WRAP cudaError_t __wrap_cudaMallocAsync(void** p, size_t n, cudaStream_t s) {
  return real().malloc_async ? real().malloc_async(p, n, s) : cudaErrorInitializationError;
}
STASH_WRAP cudaError_t __wrap_cudaFreeAsync(void* p, cudaStream_t s) {
  return real().free_async ? real().free_async(p, s) : cudaErrorInitializationError;
}
STASH_WRAP cudaError_t __wrap_cudaMallocHost(void** p, size_t n) {
  return real().malloc_host ? real().malloc_host(p, n) : cudaErrorInitializationError;
}
STASH_WRAP cudaError_t __wrap_cudaHostAlloc(void** p, size_t n, unsigned int flags) {
  return real().host_alloc ? real().host_alloc(p, n, flags) : cudaErrorInitializationError;
}
STASH_WRAP cudaError_t __wrap_cudaFreeHost(void* p) {
  return real().free_host ? real().free_host(p) : cudaErrorInitializationError;
}
