#!/usr/bin/env bash
# The one-shot GPU check (docs/gpu.md): build, the gpu-labelled tests, the link and
# copy benchmarks, the engine's submit path with the real runtime, `stash demo`, and
# stash.torch.fit on a Hugging Face Llama (python -m stash.bench.fit), the peers benchmark
# (python -m stash.bench.peers: stash beside checkpointing, selective checkpointing,
# save_on_cpu, torchtune and torch.compile's memory budget on a bf16 Llama that fills most
# of an H200), fit under FSDP2 and the shared link (ranks), with every figure in one
# report file. The default steps, "build tests ranks peers", are meant to finish in about
# 6 minutes on an H200 with a carried build; bench, demo and fit (measured on an H200
# before, and fit's targets are in the peers table's stash rows) run when named.
#   tools/gpu-check.sh [REPORT]     default: $OUT/gpu-check.txt when $OUT is set (the
#                                   device tool's output folder), else out/gpu-check.txt
# Every step runs stash from an install prefix with its tests component (Note [The
# installed test set] in cmake/StashTesting.cmake): the one `tools/gpu-carry.sh --build`
# made and carried as .carry/stash, when it is of these sources and this GPU's
# architecture (Note [A build made here] in gpu-carry.sh); otherwise step build builds
# here and installs into build-gpu/prefix. It never calls apt-get: a GPU machine may reach
# no package registry. A build here takes its dependencies from .carry/debs (gpu-carry.sh),
# unpacked into .carry/deps, or else from the machine.
# Environment: STASH_GPU_ARCH (default: the first GPU's compute capability, e.g. 90-real),
# STASH_GPU_CHECK_STEPS (default "build tests ranks peers"; all: "build tests bench demo
# fit graphs ranks peers"), STASH_GPU_BUILD_DIR (default build-gpu/),
# STASH_GPU_FIT_SIZE (the fit step's model: h200, default, or tiny), STASH_GPU_FIT_SHARES
# (default 85,70,55: % of keep-all) and STASH_GPU_FIT_GIB (default 40: GiB budgets),
# STASH_GPU_PEERS_SIZE (default h200-fill; h200 is half the layers at half the batch) and
# STASH_GPU_PEERS_COMPILE (torch.compile's budgets, default 0.3,0.5,0.7).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
start=$(date +%s)
report=${1:-${OUT:+$OUT/gpu-check.txt}}
report=${report:-$root/out/gpu-check.txt}
mkdir -p "$(dirname "$report")"
# Everything the steps write goes to out_dir; the report and a few files worth looking at
# are copied next to the report at the end (the device tool brings back at most 8 files).
out_dir="$root/out/gpu-check"
rm -rf "$out_dir"
mkdir -p "$out_dir"
: >"$report"
steps=${STASH_GPU_CHECK_STEPS:-build tests ranks peers}
failed=()

say() { echo "$*" | tee -a "$report"; }
# run NAME TIMEOUT CMD...: runs a step, its output into the report, its status noted.
run() {
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  say ""
  say "== $name: $*"
  timeout "$limit" "$@" 2>&1 | tee -a "$report"
  local rc=${PIPESTATUS[0]}
  say "== $name: exit $rc, $(( $(date +%s) - t0 )) s"
  [ "$rc" -eq 0 ] || failed+=("$name (exit $rc)")
  return "$rc"
}
want() { [[ " $steps " == *" $1 "* ]]; }

# The git HEAD here can be older than the files (the device tool has sent a newer tree with
# an older .git); a carried build names the commit its sources are, below.
say "stash gpu-check, $(date -u '+%Y-%m-%d %H:%M UTC'), git HEAD here $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv 2>&1 | tee -a "$report"
else
  say "nvidia-smi: not found"
fi

arch=${STASH_GPU_ARCH:-}
if [ -z "$arch" ] && command -v nvidia-smi >/dev/null; then
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [ -n "$cc" ] && arch="${cc}-real"
fi
arch=${arch:-90-real}

# --- stash: the carried prefix (Note [A build made here] in tools/gpu-carry.sh) -------------
prefix="$root/.carry/stash"
if [ -f "$prefix/share/stash/STAMP" ]; then
  stamp_arch=$(sed -n 's/^arch //p' "$prefix/share/stash/STAMP")
  changed=$(sha1sum --quiet -c "$prefix/share/stash/SOURCES" 2>&1 | head -5)
  if [ "$stamp_arch" != "$arch" ]; then
    say "carried prefix: for $stamp_arch, this GPU wants $arch"; prefix=""
  elif [ -n "$changed" ]; then
    say "carried prefix: made from other sources than these:"; say "$changed"; prefix=""
  else
    say "carried prefix: $(tr '\n' ' ' <"$prefix/share/stash/STAMP")-> $prefix"
  fi
else
  say "carried prefix: none (tools/gpu-carry.sh --build makes one)"; prefix=""
fi

# --- or a build here, installed the same way ------------------------------------------------
if [ -z "$prefix" ]; then
  want build || { say "no usable carried prefix, and step build was not asked for"; exit 1; }
  if ls "$root"/.carry/debs/*.deb >/dev/null 2>&1; then
    deps="$root/.carry/deps"
    if [ ! -f "$deps/.unpacked" ]; then
      mkdir -p "$deps"
      for deb in "$root"/.carry/debs/*.deb; do dpkg-deb -x "$deb" "$deps"; done
      touch "$deps/.unpacked"
    fi
    ma=x86_64-linux-gnu
    export CMAKE_PREFIX_PATH="$deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    # Debian splits some headers into the multiarch folder (e.g. asm/, gnu/), which the
    # compiler searches by default only under /usr/include.
    export CPATH="$deps/usr/include:$deps/usr/include/$ma${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$deps/usr/lib/$ma${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$deps/usr/lib/$ma${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    say "dependencies: $(ls "$root"/.carry/debs/*.deb | wc -l) carried packages unpacked into $deps"
  else
    say "dependencies: no .carry/debs (tools/gpu-carry.sh); using the machine's own packages"
  fi
  bdir=${STASH_GPU_BUILD_DIR:-$root/build-gpu}
  prefix="$bdir/prefix"
  export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  run configure 300 cmake -S "$root" -B "$bdir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_ARCHITECTURES="$arch" -DSTASH_BUILD_BENCHMARKS=ON ||
    { say "configure failed: see above"; exit 1; }
  run build 600 cmake --build "$bdir" --parallel "$(nproc)" || { say "build failed"; exit 1; }
  rm -rf "$prefix"
  run install 120 sh -c "cmake --install '$bdir' --prefix '$prefix' >/dev/null &&
    cmake --install '$bdir' --prefix '$prefix' --component tests >/dev/null" ||
    { say "install failed"; exit 1; }
fi
libdir=$(dirname "$(find "$prefix" -name libstash.so -print -quit)")  # lib, lib64, ...
tests="$prefix/libexec/stash/tests"
stash="$prefix/bin/stash"
# The prefix's lib/ for the Debian libraries carried there, whose own dependencies no
# RUNPATH reaches; then CUDA's: the loader's, else the toolkit's folders, else the CUDA
# wheels beside torch.
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cuda=${CUDA_HOME:-/usr/local/cuda}
cuda_dirs=("$cuda"/lib64 "$cuda"/extras/CUPTI/lib64 "$cuda"/targets/*/lib)
for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
  cuda_dirs+=("$d"/nvidia/*/lib)
done
for lib in libcudart.so.13 libcublas.so.13 libcupti.so.13; do
  ldconfig -p 2>/dev/null | grep -qF "$lib " && continue
  for d in "${cuda_dirs[@]}"; do
    [ -e "$d/$lib" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d" && say "$lib: $d" && break
  done
done
missing=$(ldd "$stash" "$tests"/* "$libdir"/libstash*.so 2>/dev/null | grep 'not found' | sort -u)
if [ -n "$missing" ]; then
  say "libraries not found:"; say "$missing"; exit 1
fi
# The GPU Python tests' interpreter (the installed CTestTestfile.cmake reads it).
STASH_GPU_PYTHON=$(command -v python3)
export STASH_GPU_PYTHON

# The C++ suites through ctest; the GPU Python tests (ctest's python.offload_gpu,
# python.fit_gpu and python.fit_graphs_gpu: processes of their own, as the pluggable
# allocator is for a process's life) through pytest itself, verbose with each test's time
# and a per-test limit, so that one slow or hanging test shows which and leaves the others
# their time.
if want tests; then
  run "ctest -L gpu (C++ suites)" 240 ctest --test-dir "$tests" -L gpu -E '^python\.' \
    --output-on-failure --timeout 120
  per_test=(); python3 -c 'import pytest_timeout' 2>/dev/null && per_test=(--timeout=240)
  for name in offload fit fit_graphs; do
    PYTHONPATH="$tests/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
      PYTHONDONTWRITEBYTECODE=1 STASH_LIB_DIR="$libdir" \
      run "python.${name}_gpu" 540 python3 -m pytest -v -rs -s -p no:cacheprovider \
        --durations=0 "${per_test[@]}" --junitxml="$out_dir/pytest-$name-gpu.xml" \
        "$tests/python/test_${name}_gpu.py"
  done
fi

if want bench; then
  run "stash bench link" 120 "$stash" bench link --json "$out_dir/link.json"
  run "stash bench copy" 120 "$stash" bench copy --json "$out_dir/copy.json"
  if [ -x "$tests/runtime_engine_bench" ]; then
    run "engine submit path (real runtime)" 120 "$tests/runtime_engine_bench" \
      --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
  fi
fi

if want demo; then
  run "stash demo" 300 "$stash" demo --out "$out_dir/demo"
fi

# stash.torch.fit on a Hugging Face Llama sized for the H200 (bf16, SDPA), with the machine's
# own torch and transformers: keep-all, then 85%, 70%, 55% of its peak and a 40 GiB budget.
# The peers' wheels (Note [The peers' wheels] in gpu-carry.sh), for the Python steps only.
pypath="$tests/python"  # the package, installed with the tests
if ls "$root"/.carry/wheels/*.whl >/dev/null 2>&1 && { want peers || want fit || want graphs; }; then
  if [ ! -f "$root/.carry/site/.installed" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$root/.carry/site" "$root"/.carry/wheels/*.whl 2>&1 | tee -a "$report" &&
      touch "$root/.carry/site/.installed"
  fi
  [ -f "$root/.carry/site/.installed" ] && pypath+=":$root/.carry/site" &&
    say "python: $(ls "$root"/.carry/wheels/*.whl | wc -l) carried wheels in $root/.carry/site"
fi

if want fit; then
  PYTHONPATH="$pypath${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
    STASH_LIB_DIR="$libdir" \
    run "stash.bench.fit (Llama, bf16)" 300 python3 -m stash.bench.fit \
      --size "${STASH_GPU_FIT_SIZE:-h200}" \
      --shares "${STASH_GPU_FIT_SHARES:-85,70,55}" --gib "${STASH_GPU_FIT_GIB:-40}" \
      --steps 5 --out "$out_dir/fit"
  # Issue 20: a new length on most steps (a quarter of the model's longest to all of it)
  # and one injected fault at 70%: every step's max_memory_allocated within its shape's
  # budget, at most two measuring steps, losses bitwise with keep-all (else it fails).
  lengths=1024-4096
  [ "${STASH_GPU_FIT_SIZE:-h200}" = tiny ] && lengths=64-256
  PYTHONPATH="$pypath${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
    STASH_LIB_DIR="$libdir" \
    run "stash.bench.fit (Llama, bf16, new lengths, a fault)" 300 python3 -m stash.bench.fit \
      --size "${STASH_GPU_FIT_SIZE:-h200}" --shares 70 --gib "" --steps 12 \
      --lengths "$lengths" --fault-at 3 --out "$out_dir/fit-lengths"
fi

# Issue 23: under CUDA graphs. The built-in workload captured and replayed (gradients bit
# for bit, host time per step with graphs against eager), and stash.torch.fit with the
# training step captured by torch.cuda.graph (losses and parameters bitwise with the eager
# plan, max_memory_allocated within the budget) and make_graphed_callables refused by name.
if want graphs; then
  run "stash demo --graphs" 300 "$stash" demo --graphs --steps 3 --out "$out_dir/demo-graphs"
  if ! want tests; then  # step tests runs these with the other GPU Python tests
    PYTHONPATH="$pypath${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
      STASH_LIB_DIR="$libdir" \
      run "fit under torch.cuda.graph" 300 python3 -m pytest -q -rs -s -p no:cacheprovider \
        "$tests/python/test_fit_graphs_gpu.py"
  fi
fi

# stash.torch.fit under FSDP2 on NCCL at world size 1, and the link as 2 and 4 processes on
# this one GPU share it against one alone (ctest python.ranks_gpu, its figures printed).
if want ranks; then
  run "fit under FSDP2, the shared link" 240 ctest --test-dir "$tests" -R '^python.ranks_gpu$' \
    -V --timeout 200
fi

# The peers on a Llama that fills most of the H200 (bf16, SDPA): keep-all, full and
# selective checkpointing, save_on_cpu, torchtune, torch.compile's memory budgets, and
# stash.torch.fit at each one's measured peak and at 85%, 70% and 55% of keep-all's.
if want peers; then
  PYTHONPATH="$pypath${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
    STASH_LIB_DIR="$libdir" \
    run "stash.bench.peers (Llama, bf16)" 480 python3 -m stash.bench.peers \
      --size "${STASH_GPU_PEERS_SIZE:-h200-fill}" --steps 4 --warmup 1 \
      --compile-budgets "${STASH_GPU_PEERS_COMPILE:-0.3,0.5,0.7}" --out "$out_dir/peers"
fi

# Next to the report: the figures' sources (at most 7 files besides the report: the first
# 7 of these that exist).
keep=("$out_dir/peers/peers.json" "$out_dir/peers/peers.svg" "$out_dir/peers/peers.md"
      "$out_dir/fit/fit.json" "$out_dir/link.json" "$out_dir/copy.json"
      "$out_dir/demo/profile.json" "$out_dir/demo/pareto.svg" "$out_dir/demo/trace-70.json"
      "$out_dir/demo/memory-70.svg")
kept=0
for f in "${keep[@]}"; do
  if ((kept < 7)) && [ -f "$f" ] && [ "$(dirname "$f")" != "$(dirname "$report")" ]; then
    cp "$f" "$(dirname "$report")/" && kept=$((kept + 1))
  fi
done

say ""
say "gpu-check: $(( $(date +%s) - start )) s in all; report: $report; everything: $out_dir"
if ((${#failed[@]})); then
  say "gpu-check: FAILED steps: ${failed[*]}"
  exit 1
fi
say "gpu-check: every step passed"
