#!/usr/bin/env bash
# plot.sh: draw plots/<gpu>_fwd.png (and _bwd.png where backward rows exist) from every
# plots/data/<gpu>.csv: TFLOP/s against sequence length, one panel per (head dim, causal), one
# line per stage and per PyTorch backend. Where a shape was measured more than once, the last
# row wins, so a plot shows the latest benchmark run. Needs gnuplot (gnuplot-nox).
set -euo pipefail
cd "$(dirname "$0")"
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 2; }
shopt -s nullglob
csvs=(data/*.csv)
[ ${#csvs[@]} -gt 0 ] || { echo "plot.sh: no CSV under plots/data/ yet: run make bench on a GPU first" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for csv in "${csvs[@]}"; do
  gpu=$(basename "$csv" .csv)
  # the latest row of each (stage, direction, dim, seqlen, causal), sorted for line plots
  # (grid shapes only: B = 16384 / N and H = 2048 / d; other rows, such as B = H = 1, stay out)
  awk -F, 'NR > 1 && $5 * $7 == 16384 && $6 * $8 == 2048 { key = $1 FS $2 FS $8 FS $7 FS $9; last[key] = $0 }
           END { for (k in last) print last[k] }' "$csv" \
    | sort -t, -k1,1 -k2,2 -k8,8n -k9,9n -k7,7n > "$tmp/latest.csv"
  for dir in fwd bwd; do
    stages=$(awk -F, -v d="$dir" '$2 == d { print $1 }' "$tmp/latest.csv" | sort -u | sort -V)
    [ -n "$stages" ] || continue
    {
      echo "set terminal pngcairo size 1400,1000 font ',11'"
      echo "set output '${gpu}_${dir}.png'"
      echo "set datafile separator ','"
      echo "set logscale x 2; set grid; set key top left opaque box; set yrange [0:*]; set xlabel 'sequence length N'; set ylabel 'TFLOP/s'"
      echo "set multiplot layout 2,2 title '$gpu, $dir, fp16, batch x heads = 16k tokens x 2048 hidden'"
      for d in 64 128; do for c in 0 1; do
        echo "set title 'd = $d, $([ $c = 1 ] && echo causal || echo 'not causal')'"
        plot="plot"
        for s in $stages; do
          plot="$plot '$tmp/latest.csv' using (strcol(1) eq '$s' && strcol(2) eq '$dir' && \$8 == $d && \$9 == $c ? \$7 : 1/0):12 with linespoints title '$s',"
        done
        echo "${plot%,}"
      done; done
      echo "unset multiplot"
    } > "$tmp/plot.gp"
    gnuplot "$tmp/plot.gp"
    echo "plots/${gpu}_${dir}.png"
  done
done
