#!/usr/bin/env bash
# Configures and builds stash into a build directory.
#   tools/build.sh [BUILD_DIR] [extra cmake -D options...]
# Default BUILD_DIR is build/. Uses Ninja and ccache when present.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bdir=${1:-$root/build}; shift || true
cuda_home=${CUDA_HOME:-/usr/local/cuda}
export PATH="$cuda_home/bin:$PATH"
# ccache hits across checkouts (CI clones into a fresh folder): hash paths relative to the
# repository root, and not the build directory.
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
if [ ! -f "$bdir/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$bdir" "${gen[@]}" -DCMAKE_CUDA_COMPILER="$cuda_home/bin/nvcc" "$@"
elif (($#)); then
  cmake -S "$root" -B "$bdir" "$@"
fi
cmake --build "$bdir" --parallel "$(nproc)"
