#!/usr/bin/env bash
# demo_test.sh: `stash demo` end to end, as ctest runs it (CMakeLists.txt here).
#   demo_test.sh STASH OUT_DIR nogpu   plain environment: the real runtime finds no device,
#                                      so the demo plans and simulates a shipped profile
#   demo_test.sh STASH OUT_DIR host [OPTS]  --backend host on the CPU test double (the caller
#                                      sets LD_LIBRARY_PATH): the measured pipeline, small
#                                      sizes; OPTS are passed on (--micro-batches 2)
#   demo_test.sh STASH OUT_DIR badinput  bad options: exit 2 with a message naming them
set -uo pipefail
stash=$1 out=$2 mode=$3
shift 3
extra=("$@")  # host: more demo options (e.g. --micro-batches 2)
rm -rf "$out"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect_line() {  # file, fixed string
  grep -qF -- "$2" "$1" || fail "no line with '$2' in $(basename "$1")"
}
expect_file() {
  [ -s "$out/$1" ] || fail "$out/$1 missing or empty"
}
budgets=(100 85 70 55 min)

case $mode in
nogpu)
  "$stash" demo --out "$out" --pareto-points 12 >"$out.stdout" 2>"$out.stderr"
  rc=$?
  [ $rc -eq 0 ] || fail "exit status $rc (want 0)"
  expect_line "$out.stdout" "stash demo: predicted (no GPU found"
  expect_line "$out.stdout" "measured columns are '-' (no GPU found)"
  expect_line "$out.stdout" "| budget | solver | measured step ms | throughput | measured peak | predicted step ms | predicted peak | vs recompute-all | vs keep-all |"
  # Every budget row: measured columns shown as "-", predicted ones filled.
  for b in "100%" "85%" "70%" "55%" "min"; do
    grep -qE "^\| $b \(.*\) \| greedy \| - \| - \| - \| [0-9]+\.[0-9]+ \| " "$out.stdout" ||
      fail "no predicted row for $b"
  done
  for b in "${budgets[@]}"; do
    expect_file "plan-$b.json"; expect_file "trace-$b.json"; expect_file "memory-$b.svg"
  done
  grep -q "predicted (stash simulate; no GPU found): peak" "$out/memory-70.svg" ||
    fail "memory-70.svg has no predicted series"
  expect_file profile.json
  expect_file pareto.csv
  grep -q "<svg" "$out/pareto.svg" 2>/dev/null || fail "pareto.svg is not an SVG"
  grep -q "predicted (no GPU found" "$out/trace-70.json" || fail "trace-70.json is not labelled"
  ;;
host)
  # No size options: the host backend's own small default model.
  steps=2 graphs=0
  for x in "${extra[@]}"; do [ "$x" = --graphs ] && graphs=1 steps=3; done  # capture + replays
  "$stash" demo --backend host --steps $steps --pareto-points 8 --out "$out" "${extra[@]}" \
    >"$out.stdout" 2>"$out.stderr"
  rc=$?
  [ $rc -eq 0 ] || fail "exit status $rc (want 0)"
  expect_line "$out.stdout" "stash demo: --backend host computes with plain C++ loops, so without size options it runs a small model: --layers 3 --hidden 64 --seq 2048 --batch 2 --ffn-mult 1"
  expect_line "$out.stdout" "stash demo: measured on stash test double (backend host; times: virtual clock of stash's CPU test double"
  expect_line "$out.stdout" "| budget | solver | measured step ms | throughput | measured peak | predicted step ms | predicted peak | vs recompute-all | vs keep-all |"
  expect_line "$out.stdout" "gradients: bitwise equal to keep-all for every plan (and recompute-all)"
  grep -q "GRADIENT MISMATCH" "$out.stdout" && fail "a gradient mismatch was reported"
  if [ $graphs = 1 ]; then
    # Every plan replayed from its captured step, against uncaptured keep-all, bitwise.
    expect_line "$out.stdout" "graphs: every plan and recompute-all ran one eager warm-up step, then its whole step (forward, offloads, prefetches, recompute, backward, update) captured once through the engine and replayed for the other 2; keep-all ran uncaptured"
    expect_line "$out.stdout" "gradients: bitwise equal to keep-all for every plan (and recompute-all), replayed from graphs against uncaptured"
    grep -qE "^host time per step \(the [0-9a-z%]+ plan; enqueue only, median of 12 interleaved rounds\): eager [0-9.]+ ms, graph replay [0-9.]+ ms, ratio graphs/eager [0-9.]+$" "$out.stdout" ||
      fail "no host-time line: $(grep -F 'host time' "$out.stdout")"
  fi
  expect_line "$out.stderr" "profiling unavailable"
  # The keep-all budget runs, measured, at the predicted peak (the pool's in-use peak is
  # the planner's quantity; with keep-all nothing is pending).
  row=$(grep -E "^\| 100% " "$out.stdout")
  [[ $row =~ ^\|\ 100%\ \(([^\)]*)\)\ \|\ greedy\ \|\ [0-9.]+\ \|\ [0-9]+\ tok/s\ \|\ ([^|]*)\ \|\ [0-9.]+\ \|\ ([^|]*)\ \| ]] ||
    fail "the 100% row is not measured: $row"
  [ "${BASH_REMATCH[2]:-x}" = "${BASH_REMATCH[3]:-y}" ] ||
    fail "keep-all measured peak ${BASH_REMATCH[2]:-?} differs from predicted ${BASH_REMATCH[3]:-?}"
  for f in link.json skeleton.json profile.json pareto.csv pareto.svg trace-keep-all.json \
    trace-recompute-all.json trace-100.json plan-100.json trace-min.json plan-min.json; do
    expect_file "$f"
  done
  grep -q '"traceEvents"' "$out/trace-100.json" || fail "trace-100.json is not a trace"
  grep -q '"compute"' "$out/trace-100.json" || fail "trace-100.json has no compute track"
  grep -q "measured (engine trace, last pass): peak" "$out/memory-70.svg" ||
    fail "memory-70.svg has no measured series"
  grep -q "predicted (stash simulate): peak" "$out/memory-70.svg" ||
    fail "memory-70.svg has no predicted series"
  # Note [Measured device bytes]: the engine's trace samples the device pool; the counter's
  # maximum is the pool's held peak, which the table prints as the measured peak.
  for b in 70 min; do
    top=$(python3 -c 'import json, sys
v = [e["args"]["bytes"] for e in json.load(open(sys.argv[1]))["traceEvents"]
     if e.get("ph") == "C" and e["name"] == "device bytes"]
print("%.2f MiB" % (max(v) / 1048576.0) if v else "none")' "$out/trace-$b.json")
    label=$b%; [ $b = min ] && label=min
    meas=$(grep -E "^\| $label \(" "$out.stdout" | awk -F'|' '{gsub(/^ +| +$/, "", $6); print $6}')
    [ "$top" = "$meas" ] || fail "trace-$b.json: device bytes counter peaks at $top, measured peak $meas"
  done
  # The pool's in-use peak of every plan is the simulator's predicted peak, to the byte as
  # rendered (the driver's memory schedule is the planner's model).
  in_use=$(grep -F "the pool's in-use peak alone:" "$out.stdout")
  for b in "100%" "85%" "70%" "55%" "min"; do
    pred=$(grep -E "^\| $b \(" "$out.stdout" | awk -F'|' '{gsub(/^ +| +$/, "", $8); print $8}')
    [ "$pred" = "-" ] && continue
    [[ $in_use == *" $b $pred;"* ]] || fail "in-use peak of $b is not the predicted $pred: $in_use"
    # The measured (held) peak too: offloaded blocks come back in compute-stream order
    # (Note [Handing offloaded blocks back]), not when the host sees their copies end.
    meas=$(grep -E "^\| $b \(" "$out.stdout" | awk -F'|' '{gsub(/^ +| +$/, "", $6); print $6}')
    [ "$meas" = "$pred" ] || fail "measured peak of $b is $meas, predicted $pred"
  done
  grep -q "measured peak over budget" "$out.stdout" && fail "a plan ran over its budget"
  # Note [The demo's targets]: judged from the run's own numbers (the virtual clock's here).
  expect_line "$out.stdout" "targets (Note [The demo's targets]; copy bandwidth: stash bench copy):"
  expect_line "$out.stdout" "  PASS exposed copy time <= 2% of the run where the copy windows fit: 100% 0.00%"
  expect_line "$out.stdout" "  PASS measured peak within the budget, every plan: yes"
  expect_line "$out.stdout" "  PASS predicted step within 5% of measured: worst"
  expect_line "$out.stdout" "  PASS predicted peak within 2% of measured: worst 0.00%"
  grep -qE "^  (PASS|FAIL) throughput at 70% >= 97% of keep-all: [0-9.]+%$" "$out.stdout" ||
    fail "no throughput target line for 70%"
  # Predicted step time within 1% of the measured one, for every plan and both baselines:
  # the profile's step_overhead_ms (the loss, the update and the uploads, which no layer
  # scope covers) closes what was a 5% gap (docs/workload.md).
  within_1pct() {  # label, measured, predicted
    awk -v m="$2" -v p="$3" \
      'BEGIN { d = p - m; if (d < 0) d = -d; exit !(m > 0 && d <= 0.01 * m) }' ||
      fail "$1: predicted step $3 ms is not within 1% of measured $2 ms"
  }
  for b in "100%" "85%" "70%" "55%" "min"; do
    r=$(grep -E "^\| $b \(" "$out.stdout")
    meas=$(awk -F'|' '{gsub(/^ +| +$/, "", $4); print $4}' <<<"$r")
    pred=$(awk -F'|' '{gsub(/^ +| +$/, "", $7); print $7}' <<<"$r")
    [ "$meas" = "-" ] && continue
    within_1pct "$b" "$meas" "$pred"
  done
  base=$(grep -E "^keep-all: " "$out.stdout")
  base_re='^keep-all: ([0-9.]+) ms.*\(predicted ([0-9.]+) ms'
  base_re+='.*recompute-all: ([0-9.]+) ms.*\(predicted ([0-9.]+) ms'
  if [[ $base =~ $base_re ]]; then
    within_1pct keep-all "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
    within_1pct recompute-all "${BASH_REMATCH[3]}" "${BASH_REMATCH[4]}"
  else
    fail "no keep-all / recompute-all line: $base"
  fi
  grep -q '"step_overhead_ms"' "$out/profile.json" || fail "profile.json has no step_overhead_ms"
  ;;
badinput)
  mkdir -p "$out"
  check_bad() {  # expected text, args...
    local want=$1; shift
    "$stash" demo --out "$out/x" "$@" >"$out/bad.stdout" 2>"$out/bad.stderr"
    local rc=$?
    [ $rc -eq 2 ] || fail "demo $* exited $rc (want 2)"
    grep -qF -- "$want" "$out/bad.stderr" || fail "demo $*: stderr does not name '$want': $(cat "$out/bad.stderr")"
  }
  check_bad "--layers must be positive" --layers 0
  check_bad "--hidden must be positive" --hidden -8
  check_bad "--solver must be greedy or ilp" --solver simplex
  check_bad "/nonexistent/profile.json" --profile /nonexistent/profile.json
  check_bad "--backend must be auto, cuda or host" --backend tpu
  check_bad "--steps must be at least 2" --steps 1
  ;;
*) echo "unknown mode $mode"; exit 2 ;;
esac
if [ $fails -ne 0 ]; then
  echo "--- stdout"; cat "$out.stdout" 2>/dev/null; echo "--- stderr"; tail -20 "$out.stderr" 2>/dev/null
  exit 1
fi
echo "demo $mode: ok"
