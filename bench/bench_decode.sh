#!/usr/bin/env bash
# bench_decode.sh: the decode stages (stage 15) at the shapes of generation, measured as what they
# are, memory-bound: one query per head (N = 1) against a KV cache of N_kv = 1k .. 128k positions,
# B = 1 and 8, H = 32 query heads over H_kv = 8 KV heads, d = 128, fp16. In one run:
#   - the device's copy bandwidth (bench/copy_bw: cudaMemcpy of 1 GiB device to device, 2 x bytes
#     over the time), before the stages and again after them, each timed twice: back to back, and
#     with the L2 flushed before each copy (about 1% faster on an H200, probably because a copy that
#     starts with the last one's dirty lines in L2 writes them back); the highest is the run's
#     copy_gbps, which the rows' pct_of_copy are shares of (a reference; the claim is the read's);
#   - each stage with --flush-l2 (K and V come from HBM, as in a decoder where other layers ran in
#     between), at its own number of slices and at --splits 1 (one block per (batch, KV head, row
#     tile): the training kernel's grid, the waste this stage removes);
#   - a copy with the same HBM traffic as each shape's K and V, timed the same way (stage
#     d2d-copy: bench/copy_bw --bytes --flush-l2), the fixed cost of one timed run of that size,
#     and a kernel that only reads K's and V's bytes (stage hbm-read: copy_bw --read --flush-l2),
#     about the floor of any kernel that reads them: stage 15's claim is stated against it;
#   - PyTorch's scaled_dot_product_attention, every CUDA backend that takes the shape
#     (bench/torch_decode.py: K and V grouped where the backend takes it, repeated per head where not),
#     with the same L2 flush, when python3 with CUDA-enabled torch is present.
# Rows appended to bench/data/<gpu>_decode.csv: the stages' columns (common/report.c: kv_len,
# kv_heads and splits among them), then
#   gqa          native (K, V read at H_kv heads) or repeated (torch, K and V repeat_interleave'd)
#   kv_bytes     2 B H_kv N_kv d x 2 bytes: K and V read once, the least any implementation reads
#   kv_gbps      kv_bytes / ms_median
#   copy_gbps    the copy bandwidth measured in this run
#   pct_of_copy  100 kv_gbps / copy_gbps
# and on stderr a line per stage row and a verdict on stage 15's claims (verdict, below): at
# N_kv >= 16k its time is at most 1 / 0.85 of the time of the hbm-read row of its shape (a kernel
# that only reads its K and V: the read takes >= 85% of the stage's time), and at N_kv >= 4k no
# torch backend is faster.
#   bench/bench_decode.sh                          measure, append the rows, print the verdict
#   bench/bench_decode.sh --verdict COMMIT [CSV]   the verdict of a run already in the CSV (the rows
#                                                  of that commit; default the first of
#                                                  bench/data/*_decode.csv), measuring nothing
# Environment: STAGES ("stage15"; with --verdict: every stageN row of the run), BATCHES, KV_LENS,
# HEADS, KV_HEADS, DIM, WARMUP, ITERS, FA_COMMIT, DECODE_CSV (the file appended to; default
# bench/data/<gpu>_decode.csv), TORCH=0 (no torch rows).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/csv.sh
stages_given=${STAGES-}
STAGES=${STAGES:-stage15}

# The claims, from one run's rows (a CSV on stdin: its header, then the run's rows with the
# bandwidth columns). $1: the stages judged (empty: every stageN among the rows). A stage's first
# row at a shape is its own rule, the second its --splits 1 (the ablation; a run at the same
# commit again: the later pair). Its time t against that run's rows of the same shape:
#   - hbm-read (copy_bw --read of the shape's K and V bytes, --flush-l2, timed as the stage is):
#     at N_kv >= 16k, t <= read / 0.85, i.e. the read takes at least 85% of the stage's time;
#   - the fastest torch backend: at N_kv >= 4k, t <= its time.
# The shares come from the times in the CSV (ms_median to 0.1 us), not from a rounded percentage.
# Prints a line per stage row and the verdict on stderr; returns 0 when every claim holds, 1 when
# one fails or a row it needs is missing.
READ_SHARE=85   # percent
verdict() {
  csv_awk -v stages="$1" -v share="$READ_SHARE" '
    BEGIN { n = split(stages, st, " "); for (i = 1; i <= n; i++) isstage[st[i]] = 1 }
    { key = get("batch") " " get("kv_len"); s = get("stage"); ms = get("ms_median") + 0
      if (s ~ /^torch-/) { if (!(key in best) || ms < best[key]) { best[key] = ms; who[key] = s } ; next }
      if (s == "d2d-copy") { copy_ms[key] = ms; next }
      if (s == "hbm-read") { read_ms[key] = ms; next }
      if (n ? !(s in isstage) : s !~ /^stage[0-9]+$/) next
      k = s " " key
      if (++cnt[k] % 2 == 0) { one[k] = ms; next }
      if (!(k in t)) order[++m] = k
      t[k] = ms; sp[k] = get("splits"); pct[k] = 100 * get("kv_bytes") / (ms * 1e-3) / 1e9 / get("copy_gbps") }
    END {
      if (!m) { print "bench_decode: no stage rows to judge" > "/dev/stderr"; exit 1 }
      failed = 0; missing = 0
      for (i = 1; i <= m; i++) {
        k = order[i]; split(k, f, " "); key = f[2] " " f[3]; nkv = f[3] + 0
        line = sprintf("%s B=%s N_kv=%6d: %7.1f us (%s slices; --splits 1: %s us)", f[1], f[2], nkv, 1e3 * t[k], sp[k],
                       (k in one) ? sprintf("%.1f", 1e3 * one[k]) : "-")
        if (key in read_ms) line = line sprintf(", a read of its K, V %.1f us (%6.2f%% of its time)", 1e3 * read_ms[key], 100 * read_ms[key] / t[k])
        if (key in copy_ms) line = line sprintf(", a copy of them %.1f us", 1e3 * copy_ms[key])
        line = line sprintf(", %.1f%% of the copy bandwidth", pct[k])
        if (key in best) line = line sprintf(", best torch %s %.1f us: %.2fx", who[key], 1e3 * best[key], best[key] / t[k])
        mark = ""
        if (nkv >= 16384 && !(key in read_ms)) { mark = mark " [no hbm-read row]"; missing = 1 }
        else if (nkv >= 16384 && 100 * read_ms[key] < share * t[k]) { mark = mark sprintf(" [slower than the read / %.2f]", share / 100); failed = 1 }
        if (nkv >= 4096 && !(key in best)) { mark = mark " [no torch row]"; missing = 1 }
        else if (nkv >= 4096 && t[k] > best[key]) { mark = mark " [slower than torch]"; failed = 1 }
        print line mark > "/dev/stderr"
      }
      if (failed) print "bench_decode: a claim FAILS in this run (rows marked above)" > "/dev/stderr"
      else if (missing) print "bench_decode: the claims hold where they could be checked; rows are missing (marked above)" > "/dev/stderr"
      else printf "bench_decode: the claims hold in this run (N_kv >= 16k: within the time of a read of K and V / %.2f; N_kv >= 4k: no torch backend faster)\n", share / 100 > "/dev/stderr"
      exit failed || missing
    }'
}

if [ "${1:-}" = --verdict ]; then
  [ $# -ge 2 ] && [ $# -le 3 ] || { echo "usage: bench/bench_decode.sh [--verdict COMMIT [CSV]]" >&2; exit 2; }
  commit=$2
  decode_csvs=(bench/data/*_decode.csv)
  csv=${3:-${decode_csvs[0]}}
  [ -r "$csv" ] || { echo "bench_decode: no decode CSV to read ($csv)" >&2; exit 2; }
  run=$( { head -n1 "$csv"; csv_awk -v c="$commit" 'get("commit") == c' "$csv"; } )
  [ "$(wc -l <<< "$run")" -gt 1 ] || { echo "bench_decode: no rows of commit $commit in $csv" >&2; exit 2; }
  echo "bench_decode: the run of $commit in $csv (copy bandwidth $(csv_awk 'NR == 2 { print get("copy_gbps") }' <<< "$run") GB/s)" >&2
  verdict "$stages_given" <<< "$run"
  exit
fi
[ $# -eq 0 ] || { echo "usage: bench/bench_decode.sh [--verdict COMMIT [CSV]]" >&2; exit 2; }
BATCHES=${BATCHES:-"1 8"}
KV_LENS=${KV_LENS:-"1024 2048 4096 8192 16384 32768 65536 131072"}
HEADS=${HEADS:-32}
KV_HEADS=${KV_HEADS:-8}
DIM=${DIM:-128}
WARMUP=${WARMUP:-5}
ITERS=${ITERS:-30}
export FA_COMMIT=${FA_COMMIT:-unknown}

rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
[ -x bench/copy_bw ] || { echo "bench_decode: bench/copy_bw is not built (make bench/copy_bw)" >&2; exit 2; }
copy_gbps() { # the faster of the two ways of timing the copy
  local plain flushed
  plain=$(bench/copy_bw --warmup 3 --iters 20 | csv_awk '{ print get("copy_gbps") }') || return 1
  flushed=$(bench/copy_bw --flush-l2 --warmup 3 --iters 20 | csv_awk '{ print get("copy_gbps") }') || return 1
  awk -v a="$plain" -v b="$flushed" 'BEGIN { print (a > b ? a : b) }'
}
copy_before=$(copy_gbps)

header=""
failed=0
copy_after=""
# The rows so far, with their bandwidth columns, into the CSV: at the end, or when the run is
# stopped (a time limit's SIGTERM, ^C), so that a run cut short keeps every row it finished. The
# rows' copy_gbps is the larger of the copy bandwidths measured before and after (before alone if stopped).
keep_rows() {
  [ -n "$header" ] && [ -s "$rows" ] || return 0
  copy=$(awk -v a="$copy_before" -v b="${copy_after:-0}" 'BEGIN { print (a > b ? a : b) }')
  local h=$header
  [[ $h == *,gqa ]] || h="$h,gqa" # the stages' rows carry their gqa column already
  full=$( { echo "$h"; cat "$rows"; } | csv_awk -v copy="$copy" '
    BEGIN { OFS = "," }
    { bytes = 4 * get("batch") * get("kv_heads") * get("kv_len") * get("dim"); gbps = bytes / (get("ms_median") * 1e-3) / 1e9
      printf "%s,%.0f,%.1f,%.1f,%.1f\n", $0, bytes, gbps, copy, 100 * gbps / copy }')
  local gpu out
  gpu=$( { echo "$h"; head -n1 "$rows"; } | csv_awk '{ print get("gpu") }')
  out=${DECODE_CSV:-bench/data/${gpu}_decode.csv}
  csv_append "$out" "$h,kv_bytes,kv_gbps,copy_gbps,pct_of_copy" <<< "$full"
  echo "bench_decode: $(wc -l <<< "$full") rows appended to $out" >&2
  : > "$rows"
}
torch_pid=
# (each step may fail, torch already gone or killed, and set -e must not end the trap before keep_rows)
trap 'echo "bench_decode: stopped before the end" >&2; if [ -n "$torch_pid" ]; then kill "$torch_pid" 2>/dev/null || :; wait "$torch_pid" || :; fi; keep_rows; exit 130' INT TERM
for s in $STAGES; do for b in $BATCHES; do for nkv in $KV_LENS; do for split in "" 1; do
  label="$s B=$b N_kv=$nkv${split:+ --splits $split}"
  args=(--batch "$b" --heads "$HEADS" --kv-heads "$KV_HEADS" --seqlen 1 --kv-len "$nkv" --dim "$DIM"
        --flush-l2 --warmup "$WARMUP" --iters "$ITERS" --csv)
  [ -n "$split" ] && args+=(--splits "$split")
  if out=$("./$s" "${args[@]}"); then :; else
    echo "$label ... FAILED (exit $?)" >&2
    failed=1
    [ -n "$out" ] || continue
  fi
  h=$(head -n1 <<< "$out")
  [ -n "$header" ] || header=$h
  if [ "$h" != "$header" ]; then
    echo "bench_decode: ./$s --csv printed another header than the runs before it" >&2
    exit 2
  fi
  printf '%s,native\n' "$(sed -n 2p <<< "$out")" >> "$rows"
  echo "$label ... $(csv_awk '{ printf "%.1f us, %.0f GB/s of K, V, %s slices, check %s", 1e3 * get("ms_median"),
    4 * get("batch") * get("kv_heads") * get("kv_len") * get("dim") / (get("ms_median") * 1e-3) / 1e9, get("splits"),
    get("check") }' <<< "$out")" >&2
done; done; done; done
[ -n "$header" ] || { echo "bench_decode: no stage printed a row" >&2; exit 1; }
header="$header,gqa"

# The fixed cost of one timed run, two ways, each timed as the stages are (bench/copy_bw --flush-l2:
# the L2 emptied before each, events around one run): stage "d2d-copy", a device-to-device copy
# with the HBM traffic of each shape's K and V (half of the bytes read, half written); stage
# "hbm-read", a kernel that only reads all of them and does nothing else (copy_bw --read), about
# the floor of any kernel that reads them, and the time stage 15's claim is stated against
# (copy_bw --read-ring, stage 15's own stream computing nothing, is up to 1 us faster below
# 128 MiB and slower at 256: bench/data/runs/15_split_kv.md). The 1 GiB copy above
# is the bandwidth; these are the most it gives a single run of that size. A row per shape and
# kind, in the stages' columns (the shape of the first stage's row of it, their times, no check;
# kv_gbps and pct_of_copy computed as the stages' are).
for b in $BATCHES; do for nkv in $KV_LENS; do for kind in d2d-copy hbm-read; do
  kvb=$((4 * b * KV_HEADS * nkv * DIM))
  case $kind in
    d2d-copy) args=(--bytes $((kvb / 2))) ;;
    hbm-read) args=(--read --bytes "$kvb") ;;
  esac
  if ! cp=$(bench/copy_bw "${args[@]}" --flush-l2 --warmup "$WARMUP" --iters "$ITERS" 2> /dev/null); then
    echo "$kind B=$b N_kv=$nkv ... FAILED" >&2
    failed=1
    continue
  fi
  ms=$(csv_awk '{ print get("ms_median") }' <<< "$cp")
  mn=$(csv_awk '{ print get("ms_min") }' <<< "$cp")
  { echo "$header"; cat "$rows"; } | csv_awk -v b="$b" -v nkv="$nkv" -v ms="$ms" -v mn="$mn" -v kind="$kind" '
    BEGIN { OFS = "," }
    !done && get("batch") == b && get("kv_len") == nkv {
      $col["stage"] = kind; $col["ms_median"] = ms; $col["ms_min"] = mn; $col["tflops"] = ""
      $col["max_err"] = ""; $col["check"] = "skip"; $col["extra_bytes"] = 0; $col["splits"] = ""; $col["gqa"] = "-"
      print; done = 1 }' >> "$rows"
  echo "$kind B=$b N_kv=$nkv ... $(awk -v ms="$ms" -v bytes="$kvb" -v kind="$kind" 'BEGIN {
    printf "%.1f us, %.0f GB/s %s", 1e3 * ms, bytes / (ms * 1e-3) / 1e9, kind == "d2d-copy" ? "read + written" : "read" }')" >&2
done; done; done

if [ "${TORCH:-1}" != 0 ] && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  # shellcheck disable=SC2086
  # in the background, so that a stop reaches the trap at once (it stops torch and keeps the rows)
  python3 -u bench/torch_decode.py --columns "$header" --batches $BATCHES --kv-lens $KV_LENS --heads "$HEADS" \
    --kv-heads "$KV_HEADS" --seqlen 1 --dim "$DIM" --warmup "$WARMUP" --iters "$ITERS" >> "$rows" &
  torch_pid=$!
  wait "$torch_pid" || failed=1
  torch_pid=
else
  echo "bench_decode: no torch rows this run (python3 with CUDA-enabled torch not found, or TORCH=0)" >&2
fi

copy_after=$(copy_gbps)
keep_rows
echo "bench_decode: copy bandwidth $copy_before GB/s before the runs, $copy_after after; $copy is the rows' copy_gbps" >&2

# the claims, from this run's rows
{ echo "$header,kv_bytes,kv_gbps,copy_gbps,pct_of_copy"; echo "$full"; } | verdict "$STAGES" || :
exit $failed
