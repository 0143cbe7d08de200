#!/usr/bin/env bash
# readme_table.sh: the README's results table, from the measured CSVs alone (never typed by hand):
# each stage's forward speed at one point of the benchmark grid, its speedup over the stage before
# it and its ratio to FlashAttention-2 (torch-flash) measured in the same run, then the GPU, the
# CPU machine and the commits the rows come from. `make plots` runs it with --splice README.md,
# which rewrites the lines between <!-- results:begin --> and <!-- results:end -->; without
# --splice the table goes to stdout.
#   plots/readme_table.sh [--gpu h200] [--seqlen 4096] [--dim 64] [--splice README.md]
#
# Rules: the latest row of a shape wins (as in the charts). CPU stages: B = H = 1, from
# plots/data/cpu.csv. GPU stages: the grid's shape at that N and d (B = 16384 / N, H = 2048 / d),
# from plots/data/<gpu>.csv. Ratios only within one run: where two stages were measured in
# different runs, their speedup is the ratio of their ratios to torch-flash, each in its own run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
gpu=""
n=4096
d=64
splice=""
while [ $# -gt 0 ]; do
  case $1 in
    --gpu) gpu=$2; shift 2 ;;
    --seqlen) n=$2; shift 2 ;;
    --dim) d=$2; shift 2 ;;
    --splice) splice=$2; shift 2 ;;
    *) echo "usage: plots/readme_table.sh [--gpu GPU] [--seqlen N] [--dim d] [--splice README.md]" >&2; exit 2 ;;
  esac
done
if [ -z "$gpu" ]; then # the GPU with the most rows
  gpu=$(for f in "$here"/data/*.csv; do
          case $(basename "$f") in cpu.csv | *_hbm.csv) continue ;; esac
          echo "$(wc -l < "$f") $(basename "$f" .csv)"
        done | sort -rn | awk 'NR == 1 { print $2 }')
fi
gcsv="$here/data/$gpu.csv"
ccsv="$here/data/cpu.csv"
[ -n "$gpu" ] && [ -r "$gcsv" ] || { echo "readme_table.sh: no GPU CSV under plots/data/" >&2; exit 2; }
[ -r "$ccsv" ] || ccsv=/dev/null

table=$(awk -F, -v N="$n" -v D="$d" -v gpu="$gpu" -v gfile="$(basename "$gcsv")" '
  # stage s over the grid points in t (TFLOP/s by stage, d, causal, N) against torch-flash in the
  # same run (fl, by d, causal, N, run): sets nm (points), lsum (sum of log ratios), lo and hi
  function grid_ratio(s, t, run, fl,    sk, f, fk, q) {
    nm = 0; lsum = 0; lo = 1e9; hi = 0
    for (sk in t) {
      split(sk, f, FS); if (f[1] != s) continue
      fk = f[2] FS f[3] FS f[4] FS run[sk]
      if (!(fk in fl)) continue
      q = t[sk] / fl[fk]; nm++; lsum += log(q); if (q < lo) lo = q; if (q > hi) hi = q
    }
    return nm
  }
  FILENAME ~ /labels\.csv$/ { if (FNR > 1) label[$1] = substr($0, length($1) + 2); next }
  FNR == 1 { next }
  # CPU rows: one (batch, head); GFLOP/s from the time (4 N^2 d FLOPs per head)
  FILENAME ~ /cpu\.csv$/ {
    if ($2 == "fwd" && $5 == 1 && $6 == 1 && $7 == N && $8 == D && $9 == 0) {
      cpu[$1] = 4 * N * N * D / ($10 * 1e-3) / 1e9; crun[$1] = $15; mach[$1] = $18; th[$1] = $17 }
    next
  }
  # GPU rows: grid shapes only
  $5 * $7 != 16384 || $6 * $8 != 2048 { next }
  $7 == N && $8 == D && $9 == 0 {
    k = $1 FS $2; tf[k] = $12; run[k] = $15
    if ($1 == "torch-flash") fl[$2 FS $15] = $12
  }
  # every grid shape with N >= 1024, for the last stage against FlashAttention-2
  $2 == "fwd" && $7 >= 1024 { sk = $1 FS $8 FS $9 FS $7; gtf[sk] = $12; grun[sk] = $15
                               if ($1 == "torch-flash") gfl[$8 FS $9 FS $7 FS $15] = $12 }
  # ... and the backward stages against FlashAttention-2 backward
  $2 == "bwd" && $7 >= 1024 { sk = $1 FS $8 FS $9 FS $7; btf[sk] = $12; brun[sk] = $15
                               if ($1 == "torch-flash") bfl[$8 FS $9 FS $7 FS $15] = $12 }
  END {
    dagger = 0
    printf "| stage | idea | forward, N = %d, d = %d | × previous stage | × FlashAttention-2, same run | run |\n", N, D
    print "|---|---|---|---|---|---|"
    prev = ""
    for (i = 1; i <= 3; i++) {
      s = "stage" i
      if (!(s in cpu)) { prev = ""; continue }
      sp = (prev != "" && mach[prev] == mach[s]) ? sprintf("%.2f×", cpu[s] / cpu[prev]) : "–"
      printf "| %d | %s | %.2f GFLOP/s (CPU, %d thread%s) | %s | – | %s |\n", i, label[s], cpu[s], th[s], th[s] == 1 ? "" : "s", sp, crun[s]
      prev = s; cpus = cpus (cpus == "" ? "" : ", ") i; crunall[crun[s]]
    }
    prev = ""
    for (i = 4; i <= 99; i++) {
      s = "stage" i; k = s FS "fwd"
      if (!(k in tf)) continue
      r = run[k]
      if (prev == "") sp = (i == 4 && cpus != "") ? "– (CPU to GPU)" : "–"
      else if (run[prev] == r) sp = sprintf("%.2f×", tf[k] / tf[prev])
      else if (("fwd" FS r) in fl && ("fwd" FS run[prev]) in fl) {
        sp = sprintf("%.2f× †", (tf[k] / fl["fwd" FS r]) / (tf[prev] / fl["fwd" FS run[prev]])); dagger = 1 }
      else sp = "–"
      fa = (("fwd" FS r) in fl) ? sprintf("%.2f×", tf[k] / fl["fwd" FS r]) : "–"
      printf "| %d | %s | %.1f TFLOP/s | %s | %s | %s |\n", i, label[s], tf[k], sp, fa, r
      prev = k; last = s
      if (!(r in rs)) { rs[r]; rorder[++nr] = r }
      who[r] = who[r] (who[r] == "" ? "" : ", ") i
    }
    for (i = 4; i <= 99; i++) { # backward rows (stage 9), beside torch-flash backward
      s = "stage" i; k = s FS "bwd"
      if (!(k in tf)) continue
      r = run[k]
      fa = (("bwd" FS r) in fl) ? sprintf("%.2f× (backward)", tf[k] / fl["bwd" FS r]) : "–"
      printf "| %d | %s | backward: %.1f TFLOP/s | – | %s | %s |\n", i, label[s], tf[k], fa, r
      if (!(r in rs)) { rs[r]; rorder[++nr] = r }
      who[r] = who[r] (who[r] == "" ? "" : ", ") i " backward"
    }
    print ""
    if (cpus != "") {
      m = ""; for (c in crunall) m = m (m == "" ? "" : ", ") c
      printf "- CPU (stage%s %s): fp32, one (batch, head), on %s; `plots/data/cpu.csv` (`make bench-cpu`), commit %s.\n", index(cpus, ",") ? "s" : "", cpus, mach["stage1"] != "" ? mach["stage1"] : mach["stage3"], m
    }
    printf "- GPU: %s, fp16, B = %d, H = %d (the benchmark grid at this N and d); `plots/data/%s` (`make bench`), runs (commit) ", toupper(gpu), 16384 / N, 2048 / D, gfile
    for (j = 1; j <= nr; j++) printf "%s%s (stage%s %s)", (j > 1 ? ", " : ""), rorder[j], index(who[rorder[j]], ",") ? "s" : "", who[rorder[j]]
    printf ".\n- FlashAttention-2 is PyTorch'"'"'s `scaled_dot_product_attention` with its flash backend (torch-flash), timed in the same run: "
    for (j = 1; j <= nr; j++) if (("fwd" FS rorder[j]) in fl) printf "%s%.1f TFLOP/s in %s", (j > 1 ? ", " : ""), fl["fwd" FS rorder[j]], rorder[j]
    for (j = 1; j <= nr; j++) if (("bwd" FS rorder[j]) in fl && index(who[rorder[j]], "backward"))
      printf "; its backward %.1f TFLOP/s in %s", fl["bwd" FS rorder[j]], rorder[j]
    print "."
    if (dagger) print "- † the two stages come from different runs: the ratio of their ratios to torch-flash, each measured in its own run."
    # the last forward stage against FlashAttention-2 over the grid (N >= 1024)
    if (grid_ratio(last, gtf, grun, gfl) > 0)
      printf "- Over the grid'"'"'s %d points with N ≥ 1024 (d = 64 and 128, causal and not), stage %s runs at %.2f to %.2f times FlashAttention-2'"'"'s speed, geometric mean %.2f (each point against torch-flash in its own run).\n", nm, substr(last, 6), lo, hi, exp(lsum / nm)
    # each backward stage against FlashAttention-2 backward over the grid (N >= 1024)
    for (i = 4; i <= 99; i++)
      if (grid_ratio("stage" i, btf, brun, bfl) > 0)
        printf "- Backward, over the same %d points: stage %d runs at %.2f to %.2f times FlashAttention-2'"'"'s backward, geometric mean %.2f.\n", nm, i, lo, hi, exp(lsum / nm)
  }' "$here/labels.csv" "$ccsv" "$gcsv")

if [ -z "$splice" ]; then
  echo "$table"
  exit 0
fi
grep -q '^<!-- results:begin -->$' "$splice" && grep -q '^<!-- results:end -->$' "$splice" ||
  { echo "readme_table.sh: $splice has no <!-- results:begin --> / <!-- results:end --> lines" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
awk -v table="$table" '
  /^<!-- results:begin -->$/ { print; print "<!-- generated by plots/readme_table.sh (make plots) from plots/data/*.csv: do not edit by hand -->"; print table; skip = 1; next }
  /^<!-- results:end -->$/ { skip = 0 }
  !skip' "$splice" > "$out"
cmp -s "$out" "$splice" || cat "$out" > "$splice"
