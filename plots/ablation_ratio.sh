#!/usr/bin/env bash
# ablation_ratio.sh: a stage's time over each variant's, from a CSV of timing rows with a "round"
# column, where each round times the stage beside its variants (ablations, floors) at the same shapes
# (a run file under bench/data/runs/). Per variant and head dim, the range over shapes and rounds of
# the stage's time (its rows averaged within a round and shape) over the variant's: above 1, the
# variant is faster.
#   plots/ablation_ratio.sh [--stage stage19] FILE
#   plots/ablation_ratio.sh bench/data/runs/h200_1aa5952_stage19_ablations.csv
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$(dirname "$here")/bench/csv.sh"
stage=stage19
usage="usage: plots/ablation_ratio.sh [--stage STAGE] FILE"
while [ $# -gt 0 ]; do
  case $1 in
    --stage) [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }; stage=$2; shift 2 ;;
    -*) echo "$usage" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -eq 1 ] || { echo "$usage" >&2; exit 2; }
[ -r "$1" ] || { echo "ablation_ratio.sh: cannot read $1" >&2; exit 2; }
csv_awk -v stage="$stage" '
  { k = get("dim") " " get("seqlen") " " get("causal") " " get("round")
    if (get("stage") == stage) { s[k] += get("ms_median"); n[k]++ }
    else { t[get("stage"), k] = get("ms_median"); names[get("stage")]; dims[get("stage"), get("dim")] } }
  END { for (a in names) for (d = 64; d <= 256; d *= 2) if ((a, d) in dims) { lo = hi = ""
          for (x in t) { split(x, p, SUBSEP); split(p[2], q, " "); if (p[1] != a || q[1] != d || !(p[2] in n)) continue
            r = (s[p[2]] / n[p[2]]) / t[x]; if (lo == "" || r < lo) lo = r; if (hi == "" || r > hi) hi = r }
          if (lo != "") printf "%-24s d=%-3d %s / variant %.3f to %.3f\n", a, d, stage, lo, hi } }' "$1" | sort
