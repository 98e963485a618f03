// with_device COMMAND [ARGS...]: runs COMMAND when the CUDA runtime sees a device, and
// otherwise prints the marker ctest's SKIP_REGULAR_EXPRESSION matches (STASH_SKIP_REGEX,
// as the .gpu suites' shared main does) and exits 0, so that ctest reports a skip. The
// figures tests (tests/gpu/CMakeLists.txt) run through it: a benchmark on a machine with
// no device is skipped, not run on the CPU, and not failed.
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <cuda_runtime_api.h>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: with_device COMMAND [ARGS...]\n");
    return 2;
  }
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    std::printf("[ STASH NO DEVICE ] %s not run: %s\n", argv[1],
                err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
    return 0;
  }
  std::fflush(stdout);
  execvp(argv[1], argv + 1);
  std::fprintf(stderr, "with_device: cannot run %s: %s\n", argv[1], std::strerror(errno));
  return 127;
}
