#!/usr/bin/env bash
# Prepares what tests/gpu/check.sh needs on a GPU machine that reaches no package registry.
#   tests/gpu/carry.sh           the Debian packages stash builds against (GLPK,
#                                nlohmann-json, CLI11, GoogleTest, Google Benchmark, libnuma,
#                                Nettle, and their runtime libraries), downloaded as .deb
#                                files into .carry/debs (about 4.3 MiB), for a build there
#   tests/gpu/carry.sh --build   the same, and a Release build for the GPU made here and
#                                installed with its tests into .carry/stash (Note [A build
#                                made here]), so the GPU machine's minutes go to the checks
#   Both also download the Python wheels the peers benchmark needs and the GPU image lacks
#   (torchtune and what its imports need; Note [The peers' wheels]) into .carry/wheels.
# Then carry ".carry" to the GPU machine (device tool: carry [".carry"]) and run
# tests/gpu/check.sh there. .carry/ is git-ignored.
# Environment (--build): STASH_GPU_ARCH (default 90-real: the H200 the device tool lends).
#
# Note [A build made here]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# .carry/stash is an ordinary install prefix, plain install plus the tests component (Note
# [The installed test set] in cmake/StashTesting.cmake): bin/stash, lib/, include/, share/,
# and libexec/stash/tests with the gpu-labelled tests and their CTestTestfile.cmake. Every
# path in it is relative to where it lies, so it runs wherever it is carried. Beside
# stash's libraries, lib/ holds the Debian runtime libraries they need (GLPK and its
# SuiteSparse, GMP and ltdl, libnuma, Nettle, Google Benchmark: the files of those packages,
# glibc 2.36, which runs on any newer glibc); check.sh puts lib/ on LD_LIBRARY_PATH,
# because a RUNPATH reaches only an object's own dependencies, not GLPK's. CUDA's libraries
# are not carried: they are the GPU machine's. share/stash/STAMP names the commit and the
# architecture; share/stash/SOURCES holds the SHA-1 of every tracked file but Markdown, as
# built (the working tree's, so uncommitted changes are fine). check.sh uses the prefix
# only when every one of those files is the same there (sha1sum -c: no git needed, and a
# stale .carry from an earlier commit is caught) and the GPU's architecture matches.
#
# Note [The peers' wheels]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# python -m stash.bench.peers runs torchtune's OffloadActivations from the real package.
# The GPU image (Python 3.12, torch 2.11; its package list is in the device tool's
# KINDS.md) has transformers, pandas, pyarrow, lxml, sentencepiece, tiktoken, xxhash and
# psutil, but not torchtune, the torchao it imports at its top, or the modules its
# package imports load (datasets, torchdata, omegaconf, blobfile, kagglehub, ...). Those
# travel as wheels for CPython 3.12 on manylinux x86_64, about 11 MiB, at the versions
# tests/python/requirements.txt pins for the CPU tests; check.sh installs them with
# --no-index --no-deps into .carry/site and puts that on PYTHONPATH for the Python steps.
# pandas and pyarrow (67 MiB) would not fit the carry's 64 MiB; the image's are used. If
# the image's pyarrow is older than datasets wants, torchtune's row says so.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
case "${1:-}" in
  --build) build=1 ;;
  "") build=0 ;;
  *) echo "usage: tests/gpu/carry.sh [--build]" >&2; exit 2 ;;
esac
carry="$root/.carry"
# deps/: a build's unpacked copy of debs/ (check.sh), if one was made here: not carried.
rm -rf "$carry/debs" "$carry/deps" "$carry/stash" "$carry/wheels" "$carry/site"
mkdir -p "$carry"

# --- the peers' wheels (Note [The peers' wheels]) -------------------------------------------
req="$root/tests/python/requirements.txt"
pins=()
for p in torchtune torchao torchdata datasets dill multiprocess blobfile pycryptodomex \
         kagglehub kagglesdk omegaconf; do
  pin=$(grep -E "^$p==" "$req") || { echo "stash carry: $p is not pinned in $req" >&2; exit 1; }
  pins+=("$pin")
done
"$("$root/tools/python-env.sh")" -m pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$carry/wheels" "${pins[@]}"
echo "stash carry: ${#pins[@]} wheels, $(du -sh "$carry/wheels" | cut -f1), in $carry/wheels"

# --- the packages a build on the GPU machine needs (when it cannot use a carried one) ------
pkgs=(libglpk-dev libglpk40 libamd2 libcolamd2 libsuitesparseconfig5 libltdl7 libgmp10
      nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
      libbenchmark-dev libbenchmark1debian libnuma-dev libnuma1 nettle-dev libnettle8)
mkdir -p "$carry/debs"
# apt-get download writes into the current directory (as root it warns that the _apt user
# cannot write there, which is harmless).
if ! (cd "$carry/debs" && apt-get -q download "${pkgs[@]}" >download.log 2>&1) ||
   [ "$(ls "$carry"/debs/*.deb | wc -l)" -ne "${#pkgs[@]}" ]; then
  cat "$carry/debs/download.log" >&2
  echo "stash carry: expected ${#pkgs[@]} packages in $carry/debs (apt-get update first?)" >&2
  exit 1
fi
echo "stash carry: ${#pkgs[@]} packages, $(du -sh "$carry/debs" | cut -f1), in $carry/debs"
((build)) || exit 0

# --- the build made here (Note [A build made here]) -----------------------------------------
arch=${STASH_GPU_ARCH:-90-real}
bdir="$root/build-gpu"
prefix="$carry/stash"
"$root/tools/deps.sh"
echo "stash carry: building for $arch in $bdir (Release; this takes a while on few cores)"
"$root/tools/build.sh" "$bdir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DSTASH_BUILD_BENCHMARKS=ON
cmake --install "$bdir" --prefix "$prefix" >/dev/null
cmake --install "$bdir" --prefix "$prefix" --component tests >/dev/null
libdir=$(dirname "$(find "$prefix" -name libstash.so -print -quit)")  # lib, lib64, ...
for pkg in libglpk40 libamd2 libcolamd2 libsuitesparseconfig5 libltdl7 libgmp10 libnuma1 \
           libnettle8 libbenchmark1debian; do
  dpkg -L "$pkg" | grep -E '/lib[^/]*\.so\.[^/]+$' | xargs -r cp -a -t "$libdir"
done
commit=$(git -C "$root" rev-parse HEAD)
[ -n "$(git -C "$root" status --porcelain --untracked-files=no | head -1)" ] &&
  commit+=" with uncommitted changes"
printf 'commit %s\narch %s\nbuilt %s\n' "$commit" "$arch" "$(date -u '+%Y-%m-%d %H:%M UTC')" \
  >"$prefix/share/stash/STAMP"
# The sources it was built from, by content: check.sh checks them without git. Markdown
# is left out: documentation changes neither the build nor what the tests read.
(cd "$root" && git ls-files -z -- . ':!:*.md' | xargs -0 sha1sum) >"$prefix/share/stash/SOURCES"
echo "stash carry: installed $(du -sh "$prefix" | cut -f1) into $prefix ($(du -sh "$carry" | cut -f1) to carry)"
