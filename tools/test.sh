#!/usr/bin/env bash
# The test command (README, .ci/run).
#   tools/test.sh            deps, the Python test environment (tools/python-env.sh: a venv
#                            with pinned torch, transformers, pytest), build, ctest: cpu,
#                            preload and python labels (python.install builds and
#                            installs the wheel there first), then the
#                            cpu suite again under ASan+UBSan (build-asan/); gpu-labelled
#                            tests run too and skip cleanly without a device.
#   tools/test.sh --quick    skip the sanitizer pass.
#   tools/test.sh --tsan     only the cpu suite under ThreadSanitizer (build-tsan/).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mode=full
case "${1:-}" in
  --quick) mode=quick ;;
  --tsan) mode=tsan ;;
  "") ;;
  *) echo "usage: tools/test.sh [--quick|--tsan]" >&2; exit 2 ;;
esac
tools/deps.sh
jobs=$(nproc)

if [ "$mode" = tsan ]; then
  tools/build.sh build-tsan -DSTASH_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSTASH_BUILD_BENCHMARKS=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
  TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan -L cpu --output-on-failure -j "$jobs"
  exit 0
fi

echo "== stash: Python test environment (tools/python-env.sh)" >&2
py=$(tools/python-env.sh)
echo "== stash: build (build/)" >&2
tools/build.sh build -DSTASH_TEST_PYTHON="$py"
echo "== stash: ctest (build/)" >&2
ctest --test-dir build --output-on-failure -j "$jobs"

if [ "$mode" = full ]; then
  echo "== stash: ASan+UBSan cpu suite (build-asan/)" >&2
  tools/build.sh build-asan -DSTASH_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug \
    -DSTASH_BUILD_BENCHMARKS=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan -L cpu -LE 'preload|python' --output-on-failure -j "$jobs"
fi
