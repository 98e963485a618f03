#!/usr/bin/env bash
# The main job (README). `stash demo` (profile the built-in CUDA workload, plan at several
# budgets, run each plan with the engine) does not exist yet; until it does, this runs the
# most complete end-to-end path stash has today, on a shipped analytic profile:
#   profile-model -> plan (greedy, ilp, and the LP lower bound) -> check -> simulate
#   (Perfetto trace) -> pareto (CSV + SVG)
# Everything it prints is PREDICTED by the planner's models; nothing runs on a GPU.
#   tools/run.sh [OUT_DIR]      (default out/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/out}
"$root/tools/deps.sh"
"$root/tools/build.sh" "$root/build" >/dev/null
stash="$root/build/tools/stash"
mkdir -p "$out"

echo "stash run: the demo is not built yet; running plan -> simulate -> pareto on an analytic profile."
echo "           All figures below are predicted (no GPU run)."
profile="$out/llama3-8b_h200.json"
"$stash" profile-model --arch llama3-8b --batch 4 --seq 4096 --device h200 -o "$profile"

# Budget: 70% of the keep-all peak, as the targets in the issues use.
budget=70%
for solver in greedy ilp; do
  echo
  echo "== stash plan --solver $solver --budget $budget (of the keep-all peak)"
  "$stash" plan --profile "$profile" --budget "$budget" --solver "$solver" -o "$out/plan-$solver.json"
done
echo
echo "== stash check"
"$stash" check --profile "$profile" --plan "$out/plan-greedy.json"
echo
echo "== stash simulate (trace: $out/trace.json, open in ui.perfetto.dev)"
"$stash" simulate --profile "$profile" --plan "$out/plan-greedy.json" --trace "$out/trace.json"
echo
echo "== stash pareto (curve: $out/pareto.csv, $out/pareto.svg)"
"$stash" pareto --profile "$profile" -o "$out/pareto.csv" --svg "$out/pareto.svg"
