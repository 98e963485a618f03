#!/usr/bin/env bash
# The GPU check (docs/gpu.md), on a machine with an NVIDIA GPU that may reach no package
# registry: stash from an install prefix with its tests, then ctest there.
#   tests/gpu/check.sh [STEP...]    default: suites peers
#     suites   ctest -L gpu: the C++ and Python suites on the real runtime (a few minutes)
#     bench demo graphs fit peers   ctest -R figures.<step>: the benchmarks BENCHMARKS.md
#              records (Note [The figures tests] in tests/gpu/CMakeLists.txt)
# The prefix is the one `tests/gpu/carry.sh --build` made and carried as .carry/stash when
# it is of these sources and this GPU's architecture (Note [A build made here] in
# carry.sh); else a build here (build-gpu/, dependencies from .carry/debs) installed into
# build-gpu/prefix. Writes the report to $OUT/gpu-check.txt (the device tool's output
# folder), else out/gpu-check.txt; the figures to out/gpu-check/, the main ones copied
# next to the report. STASH_GPU_ARCH overrides the architecture (default: the GPU's).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
start=$(date +%s)
steps=("$@"); ((${#steps[@]})) || steps=(suites peers)
for s in "${steps[@]}"; do
  case $s in suites | bench | demo | graphs | fit | peers) ;;
    *) echo "usage: tests/gpu/check.sh [suites|bench|demo|graphs|fit|peers]..." >&2; exit 2 ;;
  esac
done
report=${OUT:+$OUT/gpu-check.txt}
report=${report:-$root/out/gpu-check.txt}
figures="$root/out/gpu-check"
rm -rf "$figures"
mkdir -p "$figures" "$(dirname "$report")"
: >"$report"
failed=()
say() { echo "$*" | tee -a "$report"; }
# run NAME CMD...: the whole output into the report, its last lines (ctest's summary) here.
run() {
  local name=$1 t0=$(date +%s); shift
  say "== $name: $*"
  "$@" >"$figures/$name.log" 2>&1
  local rc=$?
  cat "$figures/$name.log" >>"$report"
  tail -n 12 "$figures/$name.log"
  say "== $name: exit $rc, $(($(date +%s) - t0)) s"
  ((rc == 0)) || failed+=("$name")
  return $rc
}

say "stash gpu-check, $(date -u '+%Y-%m-%d %H:%M UTC'), steps: ${steps[*]}"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader |
    tee -a "$report"
else
  say "nvidia-smi: not found (every test will skip)"
fi
arch=${STASH_GPU_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
  head -1 | tr -d ' .')}
arch=${arch:-90}
arch=${arch%-real}-real

# --- the prefix: carried (Note [A build made here] in carry.sh), else built here ---------
prefix="$root/.carry/stash"
stamp="$prefix/share/stash/STAMP"
if [ ! -f "$stamp" ]; then
  say "carried prefix: none (tests/gpu/carry.sh --build makes one)"; prefix=""
elif [ "$(sed -n 's/^arch //p' "$stamp")" != "$arch" ]; then
  say "carried prefix: built for $(sed -n 's/^arch //p' "$stamp"), this GPU is $arch"; prefix=""
elif ! changed=$(sha1sum --quiet -c "$prefix/share/stash/SOURCES" 2>&1); then
  say "carried prefix: made from other sources:"; say "$(head -5 <<<"$changed")"; prefix=""
else
  say "carried prefix: $(tr '\n' ' ' <"$stamp")"
fi
if [ -z "$prefix" ]; then
  # The Debian packages carry.sh downloaded, unpacked here (never into /).
  deps="$root/.carry/deps" ma=x86_64-linux-gnu
  if [ ! -f "$deps/.unpacked" ] && ls "$root"/.carry/debs/*.deb >/dev/null 2>&1; then
    for deb in "$root"/.carry/debs/*.deb; do dpkg-deb -x "$deb" "$deps"; done
    touch "$deps/.unpacked"
  fi
  if [ -f "$deps/.unpacked" ]; then
    export CMAKE_PREFIX_PATH="$deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    # Debian puts some headers (asm/, gnu/) in the multiarch folder, searched by default
    # only under /usr/include.
    export CPATH="$deps/usr/include:$deps/usr/include/$ma${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$deps/usr/lib/$ma${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$deps/usr/lib/$ma${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  bdir="$root/build-gpu" prefix="$root/build-gpu/prefix"
  rm -rf "$prefix"
  run build sh -c "tools/build.sh '$bdir' -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_ARCHITECTURES='$arch' -DSTASH_BUILD_BENCHMARKS=ON &&
    cmake --install '$bdir' --prefix '$prefix' && \
    cmake --install '$bdir' --prefix '$prefix' --component tests" || exit 1
fi

# --- the libraries no RUNPATH reaches, the Python side, then ctest ---------------------
# The prefix's lib/ holds the Debian runtime libraries a carried build brings, whose own
# dependencies (GLPK's SuiteSparse, ...) a RUNPATH does not reach; CUDA's are the toolkit's.
libdir=$(dirname "$(find "$prefix" -name libstash.so -print -quit)")
cuda=${CUDA_HOME:-/usr/local/cuda}
export LD_LIBRARY_PATH="$libdir:$cuda/lib64:$cuda/extras/CUPTI/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export STASH_GPU_PYTHON=${STASH_GPU_PYTHON:-$(command -v python3)}
export STASH_FIGURES_DIR="$figures"
# The wheels carry.sh downloaded (Note [The peers' wheels] in carry.sh), installed apart.
site="$root/.carry/site"
if [ ! -f "$site/.installed" ] && ls "$root"/.carry/wheels/*.whl >/dev/null 2>&1; then
  "$STASH_GPU_PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$site" \
    "$root"/.carry/wheels/*.whl >>"$report" 2>&1 && touch "$site/.installed"
fi
[ -f "$site/.installed" ] && export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"

tests="$prefix/libexec/stash/tests"
for s in "${steps[@]}"; do
  if [ "$s" = suites ]; then
    run suites ctest --test-dir "$tests" -L gpu -V --no-tests=error
  else
    run "$s" ctest --test-dir "$tests" -L figures -R "^figures\\.$s(\\.|\$)" -V --no-tests=error
  fi
done

# Next to the report, the figures worth looking at (the device tool brings back 8 files).
n=0
for f in peers/peers.md peers/peers.svg peers/peers.json fit/fit.md fit-lengths/fit.md \
         link.json copy.json demo/pareto.svg; do
  ((n < 7)) && [ -f "$figures/$f" ] && cp "$figures/$f" "$(dirname "$report")/${f//\//-}" &&
    n=$((n + 1))
done
say "gpu-check: $(($(date +%s) - start)) s; report $report; figures $figures"
((${#failed[@]} == 0)) || { say "gpu-check: FAILED: ${failed[*]}"; exit 1; }
say "gpu-check: passed"
