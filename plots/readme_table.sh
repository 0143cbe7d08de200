#!/usr/bin/env bash
# readme_table.sh: the README's results table, from the measured CSVs alone (never typed by hand):
# each stage's forward speed at one point of the benchmark grid, its speedup over the stage before
# it and its ratio to FlashAttention-2 (torch-flash) measured in the same run (a backward stage:
# its backward speed, and its speedup over the backward stage before it), then the GPU, the CPU
# machine and the commits the rows come from, and, over the grid, stage 9 (forward) against
# FlashAttention-2 and each backward stage against FlashAttention-2's backward, cuDNN's and the
# backward stage before it, the fastest of them named. Every GPU ratio is plots/grid.awk's, the
# comparison plots/ratio.sh and plots/table.sh make. `make plots` runs it with --splice README.md,
# which rewrites the lines between <!-- results:begin --> and <!-- results:end -->; without
# --splice the table goes to stdout.
#   plots/readme_table.sh [--gpu h200] [--seqlen 4096] [--dim 64] [--splice README.md]
#
# The stages, in order, are the Makefile's (csv_stage_lists in bench/csv.sh); one not measured
# yet gets a row that says so. Rules: the latest row of a shape wins. CPU stages: from
# bench/data/cpu.csv at the (batch, heads) of its latest row (d = 64, not causal: B = 1, H = 8 since
# the benchmark's shape, B = H = 1 before; rows at another shape stay out), which the footnote names;
# a speedup only against a row of the same commit and machine; the yardstick cpu-blas (unfused
# through OpenBLAS) named in the footnote where it was measured, with the ratio of stage 3 to it. GPU stages:
# the grid's shape at that N and d (B = 16384 / N, H = 2048 / d), from bench/data/<gpu>.csv, a
# stage's latest run that also timed torch-flash there, else its latest run (fp16; a stage that
# runs FP8 alone, stage 19, its fp8 rows, marked so); its
# speedup over the stage before it from that run, or, where that stage was not measured in it, the
# ratio of their ratios to torch-flash, each in its own run (†).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
source "$root/bench/csv.sh"
data="$root/bench/data"
gpu=""
n=4096
d=64
splice=""
# the comparisons over the grid (N >= GRID_MIN_N, d = 64 and 128, causal and not): the forward
# stage at FlashAttention-2's speed, and every backward stage (BWD_BINS, below)
FWD_STAGE=stage9
GRID_MIN_N=1024
while [ $# -gt 0 ]; do
  case $1 in --gpu | --seqlen | --dim | --splice)
    [ $# -ge 2 ] || { echo "plots/readme_table.sh: $1 needs a value (usage: plots/readme_table.sh [--gpu GPU] [--seqlen N] [--dim d] [--splice README.md])" >&2; exit 2; } ;;
  esac
  case $1 in
    --gpu) gpu=$2; shift 2 ;;
    --seqlen) n=$2; shift 2 ;;
    --dim) d=$2; shift 2 ;;
    --splice) splice=$2; shift 2 ;;
    *) echo "usage: plots/readme_table.sh [--gpu GPU] [--seqlen N] [--dim d] [--splice README.md]" >&2; exit 2 ;;
  esac
done
csv_stage_lists   # CPU_BINS, GPU_BINS, FWD_BINS: the stages the Makefile lists
# the backward stages, in order: the GPU stages whose rows are not forward (GPU_BINS less FWD_BINS)
BWD_BINS=$(for s in $GPU_BINS; do case " $FWD_BINS " in *" $s "*) ;; *) printf '%s ' "$s" ;; esac; done)
if [ -z "$gpu" ]; then # the GPU with the most rows
  gpu=$(for f in "$data"/*.csv; do
          case $(basename "$f") in cpu.csv | *_hbm.csv | *_decode.csv | *_matmul.csv) continue ;; esac
          echo "$(wc -l < "$f") $(basename "$f" .csv)"
        done | sort -rn | awk 'NR == 1 { print $2 }')
fi
gcsv="$data/$gpu.csv"
ccsv="$data/cpu.csv"
[ -n "$gpu" ] && [ -r "$gcsv" ] || { echo "readme_table.sh: no GPU CSV under bench/data/" >&2; exit 2; }
[ -r "$ccsv" ] || ccsv=/dev/null

table=$(csv_awk -f "$here/grid.awk" -v grid_other_dtypes=1 -v N="$n" -v D="$d" -v gpu="$gpu" -v gfile="${gcsv#"$root"/}" \
  -v cpu_bins="$CPU_BINS" -v gpu_bins="$GPU_BINS" -v fwd_stage="$FWD_STAGE" -v bwd_bins="$BWD_BINS" -v minn="$GRID_MIN_N" '
  function num(s) { return substr(s, 6) }
  function list(a, n,    i, out) { for (i = 1; i <= n; i++) out = out (i > 1 ? ", " : "") a[i]; return out }
  # a run named in the footnote, with what it measured ("4", "10 backward")
  # the run a stage'"'"'s row comes from: its latest that also timed torch-flash at the point, so that
  # the row'"'"'s ratio to FlashAttention-2 is from one run; else its latest (pt: the point, set in END)
  function with_fa(s, dir,    r) { r = grid_latest_with(s, "torch-flash", dir, pt); return r != "" ? r : grid_latest(s, dir, pt) }
  function credit(r, what) { if (!(r in rs)) { rs[r]; rorder[++nr] = r }; who[r] = who[r] (who[r] == "" ? "" : ", ") what; whon[r]++ }
  FILENAME ~ /labels\.csv$/ { label[get("series")] = get("label"); next }
  # CPU rows at N, d, not causal, by (batch, heads); the shape of the file'"'"'s latest row (at d = 64,
  # not causal: the CPU chart'"'"'s) is the one shown. GFLOP/s from the time (4 B H N^2 d FLOPs).
  FILENAME ~ /cpu\.csv$/ {
    if (get("direction") == "fwd" && get("dim") == 64 && get("causal") == 0) cshape = get("batch") " " get("heads")
    if (get("direction") == "fwd" && get("seqlen") == N && get("dim") == D && get("causal") == 0) {
      k = get("stage") " " get("batch") " " get("heads")
      cgf[k] = 4 * get("batch") * get("heads") * N * N * D / (get("ms_median") * 1e-3) / 1e9
      ccr[k] = get("commit"); cmach[k] = get("machine"); cth[k] = get("threads") }
    next
  }
  { grid_add() }
  END {
    # the CPU rows of the shape shown: cpu[s] GFLOP/s, crun, mach, th
    split(cshape, cs, " ")
    for (k in cgf) { split(k, f, " "); if (f[2] " " f[3] == cshape) { s = f[1]; cpu[s] = cgf[k]; crun[s] = ccr[k]; mach[s] = cmach[k]; th[s] = cth[k] } }
    cpu_shape = (cs[1] == 1 && cs[2] == 1) ? "one (batch, head)" : "B = " cs[1] ", H = " cs[2]
    pt = "d=" D " causal=0 n=" N
    dagger = 0
    printf "| stage | idea | forward, N = %d, d = %d | × previous stage | × FlashAttention-2, same run | run |\n", N, D
    print "|---|---|---|---|---|---|"
    nc = split(cpu_bins, cb, " "); ng = split(gpu_bins, gb, " "); nbw = split(bwd_bins, bw, " ")
    for (i = 2; i <= nbw; i++) prev_bwd[bw[i]] = bw[i - 1]   # the backward stage before each
    prev = ""
    for (i = 1; i <= nc; i++) {
      s = cb[i]
      if (!(s in cpu)) { printf "| %s | %s | not measured yet (`make bench-cpu`) | – | – | – |\n", num(s), label[s]; prev = ""; continue }
      sp = (prev != "" && mach[prev] == mach[s] && crun[prev] == crun[s]) ? sprintf("%.2f×", cpu[s] / cpu[prev]) : "–"
      printf "| %s | %s | %.2f GFLOP/s (CPU, %d thread%s) | %s | – | %s |\n", num(s), label[s], cpu[s], th[s], th[s] == 1 ? "" : "s", sp, crun[s]
      prev = s; cpus[++ncpu] = num(s); if (!(crun[s] in crunseen)) { crunseen[crun[s]]; cruns[++ncrun] = crun[s] }
      if (machine == "") machine = mach[s]
    }
    for (i = 1; i <= ng; i++) {
      s = gb[i]; p = (i > 1) ? gb[i - 1] : ""
      r = with_fa(s, "fwd"); rb = with_fa(s, "bwd")
      # a stage that runs FP8 alone (stage 19): its fp8 rows, series s@fp8, over the stage before in fp16
      sf = s; fp8 = ""
      if (r == "" && rb == "" && grid_latest(s "@fp8", "fwd", pt) != "") { sf = s "@fp8"; fp8 = " (FP8)"; r = with_fa(sf, "fwd"); anyfp8 = 1 }
      if (r == "" && rb == "") { printf "| %s | %s | not measured yet (`make bench`) | – | – | – |\n", num(s), label[s]; continue }
      if (r != "") {
        # × the stage before: from this run, else via torch-flash in each one'"'"'s run
        if (i == 1) sp = ncpu ? "– (CPU to GPU)" : "–"
        else if (grid_over(sf, p, "fwd", r, pt)) sp = sprintf("%.2f×", OV_q[1])
        else if (grid_via(sf, p, "torch-flash", "fwd", pt)) { sp = sprintf("%.2f× †", OV_q[1]); dagger = 1 }
        else sp = "–"
        fa = grid_over(sf, "torch-flash", "fwd", r, pt) ? sprintf("%.2f×", OV_q[1]) : "–"
        printf "| %s | %s | %.1f TFLOP/s%s | %s | %s | %s |\n", num(s), label[s], grid_tf(sf, "fwd", r, "" D " 0 " N), fp8, sp, fa, r
        credit(r, num(s))
        if (grid_tf("torch-flash", "fwd", r, "" D " 0 " N) != "") flrun[r] = grid_tf("torch-flash", "fwd", r, "" D " 0 " N)
      }
      if (rb != "") {
        # × the backward stage before it (not the stage numbered before, a forward): as above
        pb = (s in prev_bwd) ? prev_bwd[s] : ""
        if (pb == "") sp = "–"
        else if (grid_over(s, pb, "bwd", rb, pt)) sp = sprintf("%.2f× (over stage %s)", OV_q[1], num(pb))
        else if (grid_via(s, pb, "torch-flash", "bwd", pt)) { sp = sprintf("%.2f× † (over stage %s)", OV_q[1], num(pb)); dagger = 1 }
        else sp = "–"
        fa = grid_over(s, "torch-flash", "bwd", rb, pt) ? sprintf("%.2f× (backward)", OV_q[1]) : "–"
        printf "| %s | %s | backward: %.1f TFLOP/s | %s | %s | %s |\n", num(s), label[s], grid_tf(s, "bwd", rb, "" D " 0 " N), sp, fa, rb
        credit(rb, num(s) " backward")
        if (grid_tf("torch-flash", "bwd", rb, "" D " 0 " N) != "") flbrun[rb] = grid_tf("torch-flash", "bwd", rb, "" D " 0 " N)
      }
    }
    print ""
    if (ncpu) {
      printf "- CPU (stage%s %s): fp32, %s, on %s; `bench/data/cpu.csv` (`make bench-cpu`), commit %s", (ncpu > 1 ? "s" : ""), list(cpus, ncpu), cpu_shape, machine, list(cruns, ncrun)
      # the yardstick: unfused attention through OpenBLAS, in the same file at the same shape
      if ("cpu-blas" in cpu) {
        printf "; the yardstick, unfused attention through OpenBLAS (cpu-blas, %d thread%s): %.2f GFLOP/s in %s", th["cpu-blas"], th["cpu-blas"] == 1 ? "" : "s", cpu["cpu-blas"], crun["cpu-blas"]
        if (cb[nc] in cpu && mach[cb[nc]] == mach["cpu-blas"] && crun[cb[nc]] == crun["cpu-blas"]) printf " (stage %s: %.2f× of it)", num(cb[nc]), cpu[cb[nc]] / cpu["cpu-blas"]
      }
      print "."
    }
    printf "- GPU: %s, fp16%s, B = %d, H = %d (the benchmark grid at this N and d); `%s` (`make bench`)", toupper(gpu),
      anyfp8 ? " (FP8: e4m3 from fp16 inputs, the quantization included; its × previous stage is over that stage in fp16)" : "",
      16384 / N, 2048 / D, gfile
    if (nr) {
      printf ", runs (commit) "
      for (j = 1; j <= nr; j++) printf "%s%s (stage%s %s)", (j > 1 ? ", " : ""), rorder[j], (whon[rorder[j]] > 1 ? "s" : ""), who[rorder[j]]
    }
    print "."
    if (nr) {
      printf "- FlashAttention-2 is PyTorch'"'"'s `scaled_dot_product_attention` with its flash backend (torch-flash), timed in the same run: "
      k = 0
      for (j = 1; j <= nr; j++) if (rorder[j] in flrun) printf "%s%.1f TFLOP/s in %s", (k++ ? ", " : ""), flrun[rorder[j]], rorder[j]
      for (j = 1; j <= nr; j++) if (rorder[j] in flbrun) printf "%s%.1f TFLOP/s backward in %s", (k++ ? "; " : ""), flbrun[rorder[j]], rorder[j]
      if (!k) printf "not in these runs"
      print "."
    }
    if (dagger) print "- † the two stages come from different runs: the ratio of their ratios to torch-flash, each measured in its own run."
    # the forward stage at FlashAttention-2'"'"'s speed against it over the grid
    grid = "d=64,128 nmin=" minn
    over = sprintf("over the grid'"'"'s %%d points with N ≥ %d (d = 64 and 128, causal and not)", minn)
    s = fwd_stage
    if (grid_over(s, "torch-flash", "fwd", "", grid))
      printf "- Forward, " over ": stage %s runs at %.2f to %.2f times FlashAttention-2'"'"'s speed, geometric mean %.2f (run %s, both measured in it; `plots/ratio.sh --min-n %d --commit %s %s torch-flash`).\n",
        OV_n, num(s), OV_min, OV_max, OV_gm, OV_run, minn, OV_run, s
    else if (OV_run == "")
      printf "- Stage %s against FlashAttention-2 over the grid: not measured yet (no stage %s forward rows in `%s`; `make bench`).\n", num(s), num(s), gfile
    else
      printf "- Stage %s against FlashAttention-2 over the grid: torch-flash was not measured in stage %s'"'"'s run %s.\n", num(s), num(s), OV_run
    # each backward stage over the grid, in its latest run: against FlashAttention-2'"'"'s backward,
    # cuDNN'"'"'s and the backward stage before it, each where measured in that run; the one with the
    # highest geometric mean over FlashAttention-2'"'"'s (so over every other, each in its own run) is
    # named the course'"'"'s fastest, where more than one was measured
    nbm = 0; best = ""
    for (i = 1; i <= nbw; i++)
      if (grid_over(bw[i], "torch-flash", "bwd", "", grid)) { nbm++; if (best == "" || OV_gm > best_gm) { best = bw[i]; best_gm = OV_gm } }
    for (i = 1; i <= nbw; i++) {
      s = bw[i]
      if (!grid_over(s, "torch-flash", "bwd", "", grid)) {
        if (OV_run == "") printf "- Stage %s against FlashAttention-2'"'"'s backward over the grid: not measured yet (no stage %s backward rows in `%s`; `make bench`).\n", num(s), num(s), gfile
        else printf "- Stage %s against FlashAttention-2'"'"'s backward over the grid: torch-flash was not measured in stage %s'"'"'s run %s.\n", num(s), num(s), OV_run
        continue
      }
      r = OV_run; n0 = OV_n; np = 0; refs = "torch-flash"
      part[++np] = sprintf("%.2f to %.2f times FlashAttention-2'"'"'s backward (geometric mean %.2f)", OV_min, OV_max, OV_gm)
      if (grid_over(s, "torch-cudnn", "bwd", r, grid)) {
        part[++np] = sprintf("%.2f to %.2f times cuDNN'"'"'s (geometric mean %.2f%s)", OV_min, OV_max, OV_gm, OV_n == n0 ? "" : sprintf(", %d points", OV_n))
        refs = refs ", torch-cudnn"
      }
      if ((s in prev_bwd) && grid_over(s, prev_bwd[s], "bwd", r, grid)) {
        part[++np] = sprintf("%.2f to %.2f times stage %s'"'"'s (geometric mean %.2f%s)", OV_min, OV_max, num(prev_bwd[s]), OV_gm, OV_n == n0 ? "" : sprintf(", %d points", OV_n))
        refs = refs ", " prev_bwd[s]
      }
      line = part[1]
      for (j = 2; j <= np; j++) line = line (j == np ? " and " : ", ") part[j]
      printf "- Backward, " over ": stage %s%s runs at %s; run %s, all measured in it (`plots/ratio.sh --dir bwd --min-n %d --commit %s %s REF`, REF %s).\n",
        n0, num(s), (s == best && nbm > 1) ? ", the course'"'"'s fastest backward," : "", line, r, minn, r, s, refs
    }
  }' "$here/labels.csv" "$ccsv" "$gcsv")

# Generation (the decode stages, bench/data/<gpu>_decode.csv from make bench-decode): the latest
# run (the commit of the file's last stage row) at B = 1 and 8 and three cache lengths, each stage
# at its own slices (a shape's first row of the stage in a run; the second is its --splits 1, the
# training kernel's grid), against stage 15's target: at N_kv >= 16k a kernel that only reads
# its K and V (the run's hbm-read row of the shape) takes at least 85% of its time, and no PyTorch
# backend of that run is faster (bench/bench_decode.sh --verdict checks both). The file's rows
# named stage14 are stage 15's kernel, measured before the renumbering: shown as 15.
dcsv="$data/${gpu}_decode.csv"
DECODE_BATCHES="1 8"
DECODE_KV_LENS="4096 16384 131072"
DECODE_READ_SHARE=85
if [ -r "$dcsv" ]; then
  decode=$(csv_awk -v batches="$DECODE_BATCHES" -v kvs="$DECODE_KV_LENS" -v share="$DECODE_READ_SHARE" -v dfile="${dcsv#"$root"/}" '
    function shown(s) { return s == "stage14" ? "15" : substr(s, 6) } # (stage14 here: the decode kernel before the renumbering)
    FNR == 1 { next }
    get("stage") ~ /^stage/ { last = get("commit") }
    { row[NR] = $0; com[NR] = get("commit") }
    END {
      if (last == "") exit
      nk = split(kvs, kv, " "); nbs = split(batches, bs, " ")
      for (i = 1; i <= NR; i++) {
        if (com[i] != last) continue
        $0 = row[i]; s = get("stage"); key = get("batch") " " get("kv_len"); ms = get("ms_median") * 1e3
        if (s ~ /^torch-/) { tt[s " " key] = ms; if (!(s in isb)) { isb[s]; bk[++nb] = s }; continue } # (the later wins)
        if (s == "hbm-read") { rd[key] = ms; continue }
        if (s !~ /^stage/) continue
        if (++cnt[s " " key] % 2 == 0) { one[s " " key] = ms; continue } # (a run at the same commit again: the later pair)
        if (!(s in seen)) { seen[s]; st[++ns] = s; if (s == "stage14") renamed = 1 }
        t[s " " key] = ms; sp[s " " key] = get("splits"); copy = get("copy_gbps")
        shape = sprintf("%s query heads over %s KV heads, d = %s, %s", get("heads"), get("kv_heads"), get("dim"), get("dtype"))
      }
      for (i = 1; i <= nb; i++) for (bi = 1; bi <= nbs; bi++) for (k = 1; k <= nk; k++) {
        key = bs[bi] " " kv[k]
        if ((bk[i] " " key) in tt && (!(key in best) || tt[bk[i] " " key] < best[key])) { best[key] = tt[bk[i] " " key]; who[key] = bk[i] }
      }
      printf "\n\nGeneration (`make bench-decode`): one query per head against a KV cache of N_kv positions, %s; `%s`, run %s. The target: at N_kv ≥ 16k stage 15 takes at most 1 / %.2f of the time of a kernel that only reads its K and V (the read takes at least %d%% of its time), and from N_kv ≥ 4k no PyTorch backend is faster; `bench/bench_decode.sh --verdict %s` checks both on the run'"'"'s rows, and exits 1 where a claim fails (a device-to-device copy of 1 GiB ran at %.1f GB/s in it).%s\n\n", shape, dfile, last, share / 100, share, last, copy, renamed ? " Rows named stage14 in the file are stage 15, measured when it was numbered 14." : ""
      nr = 0; for (key in rd) nr++ # (runs before bench-decode timed the read have no such rows: no column)
      printf "| stage | B | N_kv | time |%s --splits 1 (a block per batch and KV head) | the fastest PyTorch backend, same run |\n", nr ? " a kernel that only reads K and V | its share of the stage'"'"'s time |" : ""
      print "|---|---|---|---|---|---|" (nr ? "---|---|" : "")
      for (j = 1; j <= ns; j++) for (bi = 1; bi <= nbs; bi++) for (k = 1; k <= nk; k++) {
        key = bs[bi] " " kv[k]; sk = st[j] " " key
        if (!(sk in t)) continue
        if (!nr) readcols = ""
        else if (!(key in rd)) readcols = " – | – |"
        else readcols = sprintf(" %.1f µs | %.1f%%%s |", rd[key], 100 * rd[key] / t[sk],
                                kv[k] >= 16384 ? (100 * rd[key] >= share * t[sk] ? " (≥ " share "%)" : " (under " share "%)") : "")
        printf "| %s | %s | %s | %.1f µs (%s slices) |%s %s | %s |\n", shown(st[j]), bs[bi], kv[k], t[sk], sp[sk], readcols,
          (sk in one) ? sprintf("%.1f µs", one[sk]) : "–",
          (key in best) ? sprintf("%s %.1f µs: stage %s %.2f× as fast", who[key], best[key], shown(st[j]), best[key] / t[sk]) : "–"
      }
    }' "$dcsv")
  table+=$decode
fi

if [ -z "$splice" ]; then
  echo "$table"
  exit 0
fi
grep -q '^<!-- results:begin -->$' "$splice" && grep -q '^<!-- results:end -->$' "$splice" ||
  { echo "readme_table.sh: $splice has no <!-- results:begin --> / <!-- results:end --> lines" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
awk -v table="$table" '
  /^<!-- results:begin -->$/ { print; print "<!-- generated by plots/readme_table.sh (make plots) from bench/data/*.csv: do not edit by hand -->"; print table; skip = 1; next }
  /^<!-- results:end -->$/ { skip = 0 }
  !skip' "$splice" > "$out"
cmp -s "$out" "$splice" || cat "$out" > "$splice"
