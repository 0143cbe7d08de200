#!/usr/bin/env bash
# ratio.sh: a Markdown table of one stage's TFLOP/s against a reference (torch-flash, say) at every
# shape both have in a benchmark CSV, the ratio per shape, and the geometric mean, minimum and
# maximum of the ratios. The latest row of each shape wins, as in plot.sh and table.sh.
#   plots/ratio.sh [--csv plots/data/h200.csv] [--dir fwd|bwd] [--min-n 1024] [--dims "64 128"] [--commit C] STAGE REF
set -euo pipefail
csv="$(dirname "$0")/data/h200.csv"
dir=fwd
commit=
minn=0
dims="64 128"
while [ $# -gt 0 ]; do
  case $1 in
    --csv) csv=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --commit) commit=$2; shift 2 ;;
    --min-n) minn=$2; shift 2 ;;
    --dims) dims=$2; shift 2 ;;
    *) break ;;
  esac
done
[ $# -eq 2 ] || { echo "usage: plots/ratio.sh [--csv FILE] [--dir fwd|bwd] [--min-n N] [--dims \"64 128\"] STAGE REF" >&2; exit 2; }
[ -r "$csv" ] || { echo "ratio.sh: cannot read $csv" >&2; exit 2; }
awk -F, -v commit="$commit" -v dir="$dir" -v st="$1" -v ref="$2" -v minn="$minn" -v dims="$dims" '
  BEGIN { nd = split(dims, dl, " "); for (k = 1; k <= nd; k++) want[dl[k]] = 1 }
  NR > 1 && $2 == dir && (commit == "" || $15 == commit) && ($1 == st || $1 == ref) && ($8 in want) && $7 + 0 >= minn + 0 {
    key = $8 FS $7 FS $9 FS $5 FS $6
    tf[$1 FS key] = $12
    if (!(key in seen)) { seen[key]; keys[++n] = key }
  }
  END {
    # order: d, then causal, then N (insertion sort on a numeric composite)
    for (i = 1; i <= n; i++) { split(keys[i], f, FS); ord[i] = f[1] * 1e9 + f[3] * 1e8 + f[2] }
    for (i = 2; i <= n; i++) for (j = i; j > 1 && ord[j] < ord[j - 1]; j--) {
      t = ord[j]; ord[j] = ord[j - 1]; ord[j - 1] = t; t = keys[j]; keys[j] = keys[j - 1]; keys[j - 1] = t }
    printf "| d | causal | N | B | H | %s | %s | ratio |\n|---|---|---|---|---|---|---|---|\n", st, ref
    m = 0; lsum = 0; lo = 1e9; hi = 0
    for (i = 1; i <= n; i++) {
      a = tf[st FS keys[i]]; b = tf[ref FS keys[i]]
      if (a == "" || b == "" || b + 0 == 0) continue
      split(keys[i], f, FS); r = a / b; m++; lsum += log(r); if (r < lo) lo = r; if (r > hi) hi = r
      printf "| %s | %s | %s | %s | %s | %.1f | %.1f | %.3f |\n", f[1], f[3] ? "yes" : "no", f[2], f[4], f[5], a, b, r
    }
    if (m == 0) { print "ratio.sh: no shape has both " st " and " ref > "/dev/stderr"; exit 1 }
    printf "\n%d shapes: geometric mean %.3f, min %.3f, max %.3f\n", m, exp(lsum / m), lo, hi
  }' "$csv"
