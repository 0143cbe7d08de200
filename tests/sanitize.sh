#!/usr/bin/env bash
# sanitize.sh: compute-sanitizer over a list of runs, side by side; `make sanitize` and
# tests/gpu_suites.sh both run theirs through it. Reads one run a line on stdin,
#   TOOL<tab>PROGRAM<tab>ARGUMENTS      (memcheck, stage14, "--seqlen 130 --dim 256 --causal")
# and runs `compute-sanitizer --tool TOOL --error-exitcode 1 ./PROGRAM --batch 1 --heads 2 --warmup
# 0 --iters 1 ARGUMENTS` for each, JOBS at a time (the first argument; default 4: the GPU takes
# several small problems at once, and racecheck's runs are long). Each run's output is printed
# whole as soon as it ends, under its "== [k/n] compute-sanitizer ..." line, so a run stopped by a
# time limit still shows every run that ended; every run is made even when one fails, so one
# hazard does not hide the runs after it. Then a Synthesis line, and the failed runs.
# Environment:
#   SANITIZE_DIR       where the programs are (default: here);
#   SANITIZE_REFUSED   1: exit 2, a stage refusing the run in one line (a shape this device cannot
#                      take, as designed), counts as refused, not failed; their lines summed by reason;
#   SANITIZE_LIMIT     seconds a run may take (default: no limit);
#   SANITIZE_DEADLINE  a time (seconds since the epoch) after which no run starts (default: none).
# Exit status: 0 when no run failed and at least one passed, 1 otherwise, 2 on bad usage.
set -uo pipefail
jobs=${1:-4}
case "$jobs" in '' | *[!0-9]* | 0) echo "sanitize.sh: JOBS must be a positive number (got '$jobs')" >&2; exit 2 ;; esac
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

n=0
while IFS=$'\t' read -r tool prog args; do
  [ -n "$tool" ] || continue
  n=$((n + 1))
  printf '%s\t%s\t%s\n' "$tool" "$prog" "$args" > "$dir/$n.run"
done
[ "$n" -gt 0 ] || { echo "sanitize.sh: no runs given" >&2; exit 2; }

run_one() { # $1: the run's number; prints its block when it ends, its status into $dir/N.rc
  local k=$1 tool prog args rc limit=${SANITIZE_LIMIT:-0} left
  IFS=$'\t' read -r tool prog args < "$dir/$k.run"
  if [ "${SANITIZE_DEADLINE:-0}" -gt 0 ]; then
    left=$((SANITIZE_DEADLINE - $(date +%s)))
    if [ "$left" -le 0 ]; then echo "not run: the time allowed is spent" > "$dir/$k.out"; rc=124
    elif [ "$limit" -eq 0 ] || [ "$left" -lt "$limit" ]; then limit=$left; fi
  fi
  if [ -z "${rc:-}" ]; then
    # (ARGUMENTS split on spaces, as the Makefile's lists are written: no argument holds a space)
    # shellcheck disable=SC2206
    local cmd=(compute-sanitizer --tool "$tool" --error-exitcode 1 "./$prog" --batch 1 --heads 2 --warmup 0 --iters 1 $args)
    [ "$limit" -gt 0 ] && cmd=(timeout "$limit" "${cmd[@]}")
    (cd "${SANITIZE_DIR:-.}" && "${cmd[@]}") > "$dir/$k.out" 2>&1
    rc=$?
  fi
  { # one block at a time on stdout
    flock 9
    echo "== [$k/$n] compute-sanitizer --tool $tool ./$prog $args"
    cat "$dir/$k.out"
  } 9> "$dir/lock"
  echo "$rc" > "$dir/$k.rc"
}
export -f run_one
export dir n
seq 1 "$n" | xargs -P "$jobs" -I{} bash -c 'run_one {}'

failed=() pass=0 refused=0
for k in $(seq 1 "$n"); do
  IFS=$'\t' read -r tool prog args < "$dir/$k.run"
  rc=$(cat "$dir/$k.rc" 2>/dev/null || echo "not made")
  if [ "$rc" = 0 ]; then pass=$((pass + 1))
  elif [ "$rc" = 2 ] && [ "${SANITIZE_REFUSED:-0}" = 1 ]; then refused=$((refused + 1)); cat "$dir/$k.out" >> "$dir/refusals"
  else failed+=("$tool ./$prog $args (exit $rc)"); fi
done
if [ "$refused" -gt 0 ]; then
  echo "-- the runs refused, by reason:"
  grep -h '^stage[0-9]*: ' "$dir/refusals" | sed 's/^/   /' | sort | uniq -c
fi
echo "Synthesis: Tested: $n | Passing: $pass | Refused (exit 2, one line): $refused | Failing: ${#failed[@]}"
[ ${#failed[@]} -eq 0 ] || { echo "-- failed:"; printf '  %s\n' "${failed[@]}"; }
[ ${#failed[@]} -eq 0 ] && [ "$pass" -gt 0 ]
