#!/usr/bin/env bash
# Prepares what tools/gpu-check.sh needs on a GPU machine that reaches no package registry:
# the Debian packages stash builds against (GLPK, nlohmann-json, CLI11, GoogleTest,
# Google Benchmark, libnuma, OpenSSL's libcrypto, and their runtime libraries), downloaded
# here as .deb files into .carry/debs (about 7 MiB; .carry/ is git-ignored).
#   tools/gpu-carry.sh          then carry ".carry" to the GPU machine (device tool: carry
#                               [".carry"]) and run tools/gpu-check.sh there.
# gpu-check.sh unpacks them with `dpkg-deb -x` into .carry/prefix (never into /) and points
# CMake, the compiler, the linker and the loader at that prefix. The packages are Debian
# 12's amd64 builds (glibc 2.36), which run on any newer glibc (Ubuntu 24.04 has 2.39).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.carry/debs"
pkgs=(libglpk-dev libglpk40 libamd2 libcolamd2 libsuitesparseconfig5 libltdl7 libgmp10
      nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
      libbenchmark-dev libbenchmark1debian libnuma-dev libnuma1 libssl-dev libssl3)
mkdir -p "$dest"
rm -f "$dest"/*.deb
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
