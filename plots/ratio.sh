#!/usr/bin/env bash
# ratio.sh: one series over another across the benchmark grid, both from one run: a Markdown table
# of their TFLOP/s and the ratio at every point both were measured in that run, then the geometric
# mean, minimum and maximum of the ratios. The comparison is plots/grid.awk's grid_over, the same
# one the README's table (plots/readme_table.sh) and plots/table.sh make.
#   plots/ratio.sh [--csv bench/data/h200.csv] [--dir fwd|bwd] [--commit C] [--min-n 1024] [--dims "64 128"]
#                  [--dtype fp16|bf16] STAGE REF
#   A series of another dtype than --dtype's is named STAGE@DTYPE: plots/ratio.sh stage19@fp8 stage18
#   (stage 19's FP8 rows over stage 18's fp16 ones, both from one run).
#   plots/ratio.sh --dir bwd --min-n 1024 stage10 torch-flash
# The run: --commit C, or else STAGE's latest (the commit of its latest row among the points taken).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
source "$root/bench/csv.sh"
csv="$root/bench/data/h200.csv"
dir=fwd
commit=
minn=0
dims="64 128"
dtype=fp16
usage="usage: plots/ratio.sh [--csv FILE] [--dir fwd|bwd] [--commit C] [--min-n N] [--dims \"64 128\"] [--dtype fp16|bf16] STAGE REF"
while [ $# -gt 0 ]; do
  case $1 in
    --csv) csv=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --commit) commit=$2; shift 2 ;;
    --min-n) minn=$2; shift 2 ;;
    --dims) dims=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    -*) echo "$usage" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -eq 2 ] || { echo "$usage" >&2; exit 2; }
[ -r "$csv" ] || { echo "ratio.sh: cannot read $csv" >&2; exit 2; }
csv_awk -f "$here/grid.awk" -v grid_dtype="$dtype" -v grid_other_dtypes=1 -v dir="$dir" -v x="$1" -v y="$2" -v run="$commit" \
  -v sel="d=$(echo "$dims" | tr -s ' ' ,) nmin=$minn" -v file="${csv#"$root"/}" '
  { grid_add() }
  END {
    if (!grid_over(x, y, dir, run, sel)) {
      if (OV_run == "") printf "ratio.sh: %s has no %s rows on the grid in %s%s\n", x, dir, file, run == "" ? "" : " in run " run > "/dev/stderr"
      else printf "ratio.sh: no point has both %s and %s (%s) in run %s. Runs that measured %s: %s; %s: %s\n",
        x, y, dir, OV_run, x, grid_runs(x, dir), y, grid_runs(y, dir) > "/dev/stderr"
      exit 1
    }
    printf "| d | causal | N | B | H | %s | %s | ratio |\n|---|---|---|---|---|---|---|---|\n", x, y
    for (i = 1; i <= OV_n; i++) {
      split(OV_pt[i], f, " ")
      printf "| %s | %s | %s | %d | %d | %.1f | %.1f | %.3f |\n", f[1], f[2] ? "yes" : "no", f[3], 16384 / f[3], 2048 / f[1], OV_x[i], OV_y[i], OV_q[i]
    }
    printf "\n%d shapes, run %s%s: geometric mean %.3f, min %.3f, max %.3f\n", OV_n, OV_run, grid_dtype == "fp16" ? "" : ", " grid_dtype, OV_gm, OV_min, OV_max
  }' "$csv"
