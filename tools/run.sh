#!/usr/bin/env bash
# The main job (README): `stash demo`.
#   tools/run.sh [OUT_DIR] [stash demo options...]     (default OUT_DIR: out/)
# With a GPU (and the CUDA backend built): measures the link, profiles the built-in training
# workload with CUPTI, plans at the keep-all peak x 1.0, 0.85, 0.7, 0.55 and at the smallest
# feasible budget, runs every plan with the prefetch engine (gradients checked bit for bit
# against keep-all) and prints measured against predicted figures.
# Without one: the same plans on a shipped analytic profile, planned and simulated only;
# every figure is labelled "predicted (no GPU found)".
# Writes OUT_DIR/: profile.json, plan-*.json, trace-*.json (open in ui.perfetto.dev),
# pareto.csv, pareto.svg (and, measured: link.json, skeleton.json). docs/workload.md has
# the details.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/out
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  out=$1
  shift
fi
"$root/tools/deps.sh"
"$root/tools/build.sh" "$root/build" >/dev/null
mkdir -p "$out"
exec "$root/build/tools/stash" demo --out "$out" "$@"
