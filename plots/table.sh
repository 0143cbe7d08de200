#!/usr/bin/env bash
# table.sh: a Markdown table of TFLOP/s across the benchmark grid, two columns per series (not
# causal, causal), every number from one run, for the notes (never typed by hand). Under it, each
# stage over the stage listed before it and the last stage over each yardstick listed (or every series
# over --over S), across the grid, from the same run: plots/grid.awk's grid_over, the comparison
# plots/ratio.sh and the README's table (plots/readme_table.sh) make.
#   plots/table.sh [--csv bench/data/h200.csv] [--dir fwd|bwd] [--commit C] [--over S] STAGE...
#   plots/table.sh --commit b934f3e stage4 stage6 stage7 torch-flash
# The run: --commit C, or else the first series's latest (the commit of its latest grid row).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
source "$root/bench/csv.sh"
csv="$root/bench/data/h200.csv"
dir=fwd
commit=
over=
usage="usage: plots/table.sh [--csv FILE] [--dir fwd|bwd] [--commit C] [--over S] STAGE..."
while [ $# -gt 0 ]; do
  case $1 in
    --csv) csv=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --commit) commit=$2; shift 2 ;;
    --over) over=$2; shift 2 ;;
    -*) echo "$usage" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "$usage" >&2; exit 2; }
[ -r "$csv" ] || { echo "table.sh: cannot read $csv" >&2; exit 2; }
csv_awk -f "$here/grid.awk" -v dir="$dir" -v run="$commit" -v over="$over" -v stages="$*" -v file="${csv#"$root"/}" '
  { grid_add() }
  END {
    k = split(stages, st, " ")
    if (run == "") run = grid_latest(st[1], dir, "")
    if (run == "") { printf "table.sh: %s has no %s rows on the grid in %s\n", st[1], dir, file > "/dev/stderr"; exit 1 }
    hdr = "| d | N |"; sep = "|---|---|"
    for (s = 1; s <= k; s++) { hdr = hdr " " st[s] " | " st[s] " causal |"; sep = sep "---|---|" }
    print hdr; print sep
    # the (d, N) rows: every grid point any of the series has in this run, not causal then causal
    n = grid_points("causal=0")
    for (i = 1; i <= n; i++) { split(GP[i], f, " "); dn[i] = f[1] " " f[3]; seen[dn[i]] }
    m = grid_points("causal=1")
    for (i = 1; i <= m; i++) { split(GP[i], f, " "); if (!((f[1] " " f[3]) in seen)) dn[++n] = f[1] " " f[3]; seen[f[1] " " f[3]] }
    for (i = 2; i <= n; i++) for (j = i; j > 1 && grid_before(dn[j] " 0", dn[j - 1] " 0"); j--) { t = dn[j]; dn[j] = dn[j - 1]; dn[j - 1] = t }
    for (i = 1; i <= n; i++) {
      split(dn[i], f, " "); line = "| " f[1] " | " f[2] " |"; any = 0
      for (s = 1; s <= k; s++) for (c = 0; c <= 1; c++) {
        v = grid_tf(st[s], dir, run, f[1] " " c " " f[2])
        line = line " " (v == "" ? "–" : sprintf("%.1f", v)) " |"; if (v != "") any = 1
      }
      if (any) print line
    }
    printf "\nRun %s (%s, %s):\n", run, file, dir == "fwd" ? "forward" : "backward"
    for (s = 1; s <= k; s++) if (grid_runs(st[s], dir) !~ ("(^| )" run "( |$)")) printf "- %s: not measured in this run\n", st[s]
    # the comparisons: with --over S, every other series over S; else each stage over the stage
    # listed before it, and the last stage listed over each yardstick (torch-flash, ...)
    last = ""; np = 0
    for (s = 1; s <= k; s++) {
      if (over != "") { if (st[s] != over) { px[++np] = st[s]; py[np] = over }; continue }
      if (st[s] ~ /^stage/) { if (last != "") { px[++np] = st[s]; py[np] = last }; last = st[s] }
      else if (last != "") { px[++np] = last; py[np] = st[s] }
    }
    for (i = 1; i <= np; i++)
      if (grid_over(px[i], py[i], dir, run, ""))
        printf "- %s over %s, %d points: geometric mean %.3f, min %.3f, max %.3f\n", px[i], py[i], OV_n, OV_gm, OV_min, OV_max
  }' "$csv"
