#!/usr/bin/env bash
# table.sh: a Markdown table of TFLOP/s from a benchmark CSV, for the notes and the README
# (never typed by hand). The latest row of each shape of the benchmark grid wins, as in plot.sh.
#   plots/table.sh [--csv plots/data/h200.csv] [--dir fwd|bwd] [--commit C] STAGE...   (--commit: rows of one run only)
#   plots/table.sh stage4 torch-flash torch-cudnn
set -euo pipefail
csv="$(dirname "$0")/data/h200.csv"
dir=fwd
commit=
while [ $# -gt 0 ]; do
  case $1 in
    --csv) csv=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --commit) commit=$2; shift 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: plots/table.sh [--csv FILE] [--dir fwd|bwd] STAGE..." >&2; exit 2; }
[ -r "$csv" ] || { echo "table.sh: cannot read $csv" >&2; exit 2; }
awk -F, -v commit="$commit" -v dir="$dir" -v stages="$*" '
  NR > 1 && $2 == dir && (commit == "" || $15 == commit) && $5 * $7 == 16384 && $6 * $8 == 2048 { tf[$1 FS $8 FS $7 FS $9] = $12; if (!($7 in seen)) { seen[$7]; ns[++n] = $7 }
                        if (!($8 in dseen)) { dseen[$8]; nd[++m] = $8 } }
  END {
    k = split(stages, st, " ")
    # sort sequence lengths and dims numerically (few of them: insertion sort)
    for (i = 2; i <= n; i++) for (j = i; j > 1 && ns[j] + 0 < ns[j - 1] + 0; j--) { t = ns[j]; ns[j] = ns[j - 1]; ns[j - 1] = t }
    for (i = 2; i <= m; i++) for (j = i; j > 1 && nd[j] + 0 < nd[j - 1] + 0; j--) { t = nd[j]; nd[j] = nd[j - 1]; nd[j - 1] = t }
    hdr = "| d | N |"; sep = "|---|---|"
    for (s = 1; s <= k; s++) { hdr = hdr " " st[s] " | " st[s] " causal |"; sep = sep "---|---|" }
    print hdr; print sep
    for (a = 1; a <= m; a++) for (b = 1; b <= n; b++) {
      line = "| " nd[a] " | " ns[b] " |"
      for (s = 1; s <= k; s++) for (c = 0; c <= 1; c++) {
        key = st[s] FS nd[a] FS ns[b] FS c
        line = line " " ((key in tf) ? sprintf("%.1f", tf[key]) : "–") " |"
      }
      print line
    }
  }' "$csv"
