#!/usr/bin/env bash
# Prepares what tools/gpu-check.sh needs on a GPU machine that reaches no package registry.
#   tools/gpu-carry.sh           the Debian packages stash builds against (GLPK,
#                                nlohmann-json, CLI11, GoogleTest, Google Benchmark, libnuma,
#                                Nettle, and their runtime libraries), downloaded
#                                as .deb files into .carry/debs (about 7 MiB)
#   tools/gpu-carry.sh --build   the same, and a Release build for the GPU made here, staged
#                                into .carry/build-gpu (Note [A build made here]), so the GPU
#                                machine's minutes go to the checks rather than to nvcc
#                                Both also download the Python wheels the peers benchmark
#                                needs and the GPU image lacks (torchtune and what its
#                                imports need; Note [The peers' wheels]) into .carry/wheels
# Then carry ".carry" to the GPU machine (device tool: carry [".carry"]) and run
# tools/gpu-check.sh there. .carry/ is git-ignored.
# gpu-check.sh unpacks the packages with `dpkg-deb -x` into .carry/prefix (never into /) and
# points CMake, the compiler, the linker and the loader at that prefix. They are Debian 12's
# amd64 builds (glibc 2.36), which run on any newer glibc (Ubuntu 24.04 has 2.39).
# Environment (--build): STASH_GPU_ARCH (default 90-real: the H200 the device tool lends).
#
# Note [A build made here]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# A build tree holds absolute paths (ctest's files, RUNPATHs, the tests' data paths), so it
# is configured through a fixed path, /tmp/stash-gpu-root, a link to this checkout, with
# its build folder at /tmp/stash-gpu-root/build-gpu. gpu-check.sh points the same link at
# its own checkout and puts the staged tree back at build-gpu/: every path in it then holds
# there. Staged: the tree without objects, static libraries and Ninja's state (ctest needs
# its files, the programs and the shared libraries). build-gpu/STAMP names the commit and
# the architecture; build-gpu/SOURCES holds the SHA-1 of every tracked file but Markdown, as
# built (the working tree's, so uncommitted changes are fine). gpu-check.sh uses the staged
# build only when every one of those files is the same there (sha1sum -c: no git needed,
# and a stale .carry left from an earlier commit is caught) and the GPU's architecture
# matches; otherwise it builds afresh. The GPU Python test's interpreter is
# /tmp/stash-gpu-python, which gpu-check.sh writes there as a wrapper around the machine's
# python3 (the one with a CUDA torch).
#
# Note [Why the carry is a build tree, not an install]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# `cmake --install` makes a relocatable prefix (cmake/StashInstall.cmake: $ORIGIN RUNPATHs,
# no path of the build or the source tree), which would need neither the fixed link nor the
# copy back to build-gpu/. But the check's first step is `ctest -L gpu`, and what ctest runs
# cannot be installed that way: CTestTestfile.cmake names every program, argument and
# environment by absolute path; the test programs read data from the source tree
# (STASH_SOURCE_DIR compiled in); the GPU Python tests are registered with the source tree's
# paths and STASH_GPU_PYTHON. An installed `tests` component would need a test registry of
# its own, relative paths in all of those, and still the sources beside it: more than the
# one link it would replace. The other steps (bench, demo, fit) run the CLI and the
# libraries of that same tree, so a prefix beside it would be a second copy to carry and
# to check against the sources. The carry stays the staged tree; the fixed path is what
# makes it valid on the GPU machine, and SOURCES what tells it the sources changed.
#
# Note [The peers' wheels]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# python -m stash.bench.peers runs torchtune's OffloadActivations from the real package.
# The GPU image (Python 3.12, torch 2.11; its package list is in the device tool's
# KINDS.md) has transformers, pandas, pyarrow, lxml, sentencepiece, tiktoken, xxhash and
# psutil, but not torchtune, the torchao it imports at its top, or the modules its
# package imports load (datasets, torchdata, omegaconf, blobfile, kagglehub, ...). Those
# travel as wheels for CPython 3.12 on manylinux x86_64, about 11 MiB, at the versions
# tests/python/requirements.txt pins for the CPU tests; gpu-check.sh installs them with
# --no-index --no-deps into .carry/site and puts that on PYTHONPATH for the Python steps.
# pandas and pyarrow (67 MiB) would not fit the carry's 64 MiB; the image's are used. If
# the image's pyarrow is older than datasets wants, torchtune's row says so.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=0
case "${1:-}" in
  --build) build=1 ;;
  "") ;;
  *) echo "usage: tools/gpu-carry.sh [--build]" >&2; exit 2 ;;
esac
dest="$root/.carry/debs"
pkgs=(libglpk-dev libglpk40 libamd2 libcolamd2 libsuitesparseconfig5 libltdl7 libgmp10
      nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
      libbenchmark-dev libbenchmark1debian libnuma-dev libnuma1 nettle-dev libnettle8)
mkdir -p "$dest"
rm -f "$dest"/*.deb
rm -rf "$root/.carry/prefix"  # gpu-check.sh's unpacked copy, if one was made here: not carried
# apt-get download writes into the current directory (as root it warns that the _apt user
# cannot write there, which is harmless).
if ! (cd "$dest" && apt-get -q download "${pkgs[@]}" >"$dest/download.log" 2>&1); then
  cat "$dest/download.log" >&2
  echo "stash gpu-carry: apt-get download failed (run apt-get update first?)" >&2
  exit 1
fi
n=$(ls "$dest"/*.deb 2>/dev/null | wc -l)
if [ "$n" -ne "${#pkgs[@]}" ]; then
  echo "stash gpu-carry: expected ${#pkgs[@]} packages, got $n in $dest (apt-get update first?)" >&2
  exit 1
fi
echo "stash gpu-carry: $n packages, $(du -sh "$dest" | cut -f1), in $dest"

# --- the peers' wheels (Note [The peers' wheels]) -------------------------------------------
wheels="$root/.carry/wheels"
req="$root/tests/python/requirements.txt"
peer_pkgs=(torchtune torchao torchdata datasets dill multiprocess blobfile pycryptodomex
           kagglehub kagglesdk omegaconf)
pins=()
for p in "${peer_pkgs[@]}"; do
  pin=$(grep -E "^$p==" "$req") || { echo "stash gpu-carry: $p is not pinned in $req" >&2; exit 1; }
  pins+=("$pin")
done
rm -rf "$wheels" "$root/.carry/site"
py=$("$root/tools/python-env.sh")
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$wheels" "${pins[@]}"
echo "stash gpu-carry: ${#pins[@]} wheels, $(du -sh "$wheels" | cut -f1), in $wheels"
((build)) || exit 0

# --- the build made here (Note [A build made here]) -----------------------------------------
link=/tmp/stash-gpu-root
arch=${STASH_GPU_ARCH:-90-real}
commit=$(git -C "$root" rev-parse HEAD)
[ -n "$(git -C "$root" status --porcelain --untracked-files=no | head -1)" ] &&
  commit+=" with uncommitted changes"
"$root/tools/deps.sh"
ln -sfn "$root" "$link"
bdir="$link/build-gpu"
echo "stash gpu-carry: building for $arch in $bdir (Release; this takes a while on few cores)"
"$link/tools/build.sh" "$bdir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DSTASH_BUILD_BENCHMARKS=ON -DSTASH_GPU_PYTHON=/tmp/stash-gpu-python
stage="$root/.carry/build-gpu"
rm -rf "$stage"
mkdir -p "$stage"
# tests/install/{prefix,consumer}: what the install test (label cpu) leaves in a build tree
# that ran it; ctest -L gpu does not use them.
tar -C "$bdir" --exclude='*.o' --exclude='*.a' --exclude='CMakeFiles' --exclude='.ninja_*' \
    --exclude='Testing' --exclude='./tests/install/prefix' --exclude='./tests/install/consumer' \
    -cf - . | tar -C "$stage" -xf -
printf 'commit %s\narch %s\nbuilt %s\n' "$commit" "$arch" "$(date -u '+%Y-%m-%d %H:%M UTC')" \
  >"$stage/STAMP"
# The sources it was built from, by content: gpu-check.sh checks them without git. Markdown
# is left out: documentation changes neither the build nor what the tests read.
(cd "$root" && git ls-files -z -- . ':!:*.md' | xargs -0 sha1sum) >"$stage/SOURCES"
echo "stash gpu-carry: staged $(du -sh "$stage" | cut -f1) in $stage ($(du -sh "$root/.carry" | cut -f1) to carry)"
