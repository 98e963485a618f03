#!/usr/bin/env bash
# Installs the Debian packages stash builds and tests with, idempotently: packages already
# present are not touched, and apt-get runs only when something is missing.
# The CUDA 13 toolkit itself is expected at /usr/local/cuda (or $CUDA_HOME).
set -euo pipefail

pkgs=(cmake ninja-build g++ clang libclang-rt-14-dev ccache
      libglpk-dev nlohmann-json3-dev libcli11-dev libnuma-dev nettle-dev
      libgtest-dev libbenchmark-dev
      python3-venv python3-pip)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "stash: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$cuda_home/bin/nvcc" ]; then
  echo "stash: the CUDA 13 toolkit was not found at $cuda_home (set CUDA_HOME)" >&2
  exit 1
fi
