// inject_probe: does what the CUDA driver does with CUDA_INJECTION64_PATH (dlopen it,
// call InitializeInjection) and exits 5, so that the injection library's start-up and
// exit paths, and `stash profile`'s reading of them, run on machines without a driver.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

int main() {
  const char* path = std::getenv("CUDA_INJECTION64_PATH");
  if (!path) {
    std::fprintf(stderr, "inject_probe: CUDA_INJECTION64_PATH is not set\n");
    return 1;
  }
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::fprintf(stderr, "inject_probe: %s\n", dlerror());
    return 1;
  }
  auto init = reinterpret_cast<int (*)()>(dlsym(h, "InitializeInjection"));
  if (!init || init() != 1) return 1;
  return 5;
}
