#!/usr/bin/env bash
# sanitize.sh: the runs of `make sanitize`, side by side. Reads one run a line on stdin,
#   TOOL<tab>PROGRAM<tab>ARGUMENTS      (memcheck, stage14, "--seqlen 130 --dim 256 --causal")
# runs `compute-sanitizer --tool TOOL --error-exitcode 1 ./PROGRAM --batch 1 --heads 2 --warmup 0
# --iters 1 ARGUMENTS` for each, JOBS at a time (the first argument; default 4: the GPU takes
# several small problems at once, and racecheck's runs are long). Each run's output is printed
# whole as soon as it ends, under its "== [k/n] compute-sanitizer ..." line (so a run stopped by a
# time limit still shows every run that ended), then one summary line. Every run is made even when
# one fails, so one hazard does not hide the runs after it.
# Exit status: 0 when every run passed, 1 otherwise (the failed ones listed last).
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
  local k=$1 tool prog args rc
  IFS=$'\t' read -r tool prog args < "$dir/$k.run"
  # (ARGUMENTS split on spaces, as the Makefile's lists are written: no argument holds a space)
  # shellcheck disable=SC2086
  compute-sanitizer --tool "$tool" --error-exitcode 1 "./$prog" --batch 1 --heads 2 --warmup 0 --iters 1 $args \
    > "$dir/$k.out" 2>&1
  rc=$?
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

failed=() missing=0
for k in $(seq 1 "$n"); do
  IFS=$'\t' read -r tool prog args < "$dir/$k.run"
  if [ ! -f "$dir/$k.rc" ]; then missing=$((missing + 1)); continue; fi
  rc=$(cat "$dir/$k.rc")
  [ "$rc" = 0 ] || failed+=("$tool ./$prog $args (exit $rc)")
done
[ "$missing" -eq 0 ] || echo "sanitize: $missing of $n runs not made"
if [ ${#failed[@]} -eq 0 ] && [ "$missing" -eq 0 ]; then
  echo "sanitize: $n runs, all clean"
  exit 0
fi
echo "sanitize: $n runs, ${#failed[@]} failed${failed[*]:+:}"
[ ${#failed[@]} -eq 0 ] || printf '  %s\n' "${failed[@]}"
exit 1
