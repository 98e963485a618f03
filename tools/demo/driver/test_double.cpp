// test_double.cpp: Note [The test double seam] (test_double.h).
#include "tools/demo/driver/test_double.h"

#include <dlfcn.h>

namespace stash::workload::test_double {

bool loaded() noexcept { return dlsym(RTLD_DEFAULT, "stashdbl_probe") != nullptr; }

enqueue_compute_fn enqueue_compute() noexcept {
  return reinterpret_cast<enqueue_compute_fn>(dlsym(RTLD_DEFAULT, "stashdbl_enqueue_compute"));
}

}  // namespace stash::workload::test_double
