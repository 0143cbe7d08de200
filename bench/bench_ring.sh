#!/usr/bin/env bash
# bench_ring.sh: stage 20 (ring attention) across P GPUs, weak scaling. For each P in GPU_COUNTS
# (those of 2, 4, 8 that this machine has) and each N in SEQLENS, causal and not, B = 1, H = HEADS,
# d = DIM, fp16, two runs of stage20:
#   - the ring: ./stage20 --gpus P --seqlen N (each rank a GPU of its own: NCCL, the stage's own
#     choice where P GPUs are there; a P beyond this machine's GPUs is skipped);
#   - the baseline, one GPU on 1/P of the work: the single-GPU forward the ring calls per block
#     (BASE: stage14 on Hopper, stage9 elsewhere) at N1 = N / sqrt(P) rounded to a multiple of 128,
#     so that N1^2 = N^2 / P: the FLOPs of one rank's share (causal or not, the same 1/P), with no
#     chunks, merges or transfers at all, so the efficiency counts every cost of the ring;
#   - efficiency = (tflops_P / P) / tflops_1: the ring's throughput per GPU over one GPU's on the
#     share, which is T_1 / T_P when N1^2 = N^2 / P exactly (the TFLOP/s keep N1's rounding out).
# Rows appended to bench/data/<gpu>x<P>_ring.csv (not the grid's bench/data/<gpu>.csv): the
# stage's columns (common/report.c), then gpus (P; 1 for the baseline) and efficiency (empty for
# the baseline), after each N. A line per pair on stderr; a pair whose run fails (a shape this
# machine's memory refuses, say) is skipped with its reason, and the others still run.
# Environment: GPU_COUNTS ("2 4 8"), SEQLENS ("131072 262144 524288 1048576"), HEADS (16), DIM
# (128), WARMUP (2), ITERS (5), BASE (stage14, or stage9 off Hopper), FA_COMMIT. A run stopped early
# (a time limit, ^C) keeps the rows of the P it was on.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/csv.sh
GPU_COUNTS=${GPU_COUNTS:-"2 4 8"}
SEQLENS=${SEQLENS:-"131072 262144 524288 1048576"}
HEADS=${HEADS:-16}
DIM=${DIM:-128}
WARMUP=${WARMUP:-2}
ITERS=${ITERS:-5}
have=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
BASE=${BASE:-$([ "$cc" = 9.0 ] && echo stage14 || echo stage9)}
[ "$have" -ge 1 ] || { echo "bench_ring: no GPU here" >&2; exit 3; }
# the stage's own columns (a small run's --csv header), and the file's: those, gpus, efficiency
stage_header=$(./stage20 --gpus 1 --seqlen 128 --batch 1 --heads 1 --iters 1 --warmup 0 --csv | head -1)
header="$stage_header,gpus,efficiency"

run() { # STAGE N causal [flags...]: one CSV row of ./STAGE on B = 1, H = HEADS, d = DIM
  local stage=$1 n=$2 causal=$3
  shift 3
  ./"$stage" --seqlen "$n" --batch 1 --heads "$HEADS" --dim "$DIM" $causal --warmup "$WARMUP" --iters "$ITERS" --csv-row "$@"
}
for P in $GPU_COUNTS; do
  if [ "$P" -gt "$have" ]; then echo "bench_ring: P=$P skipped: $have GPU(s) here" >&2; continue; fi
  rows=$(mktemp)
  trap 'csv_keep_rows bench_ring "bench/data/%sx${P}_ring.csv" "$header" "$rows"; rm -f "$rows"; exit 130' TERM INT
  for N in $SEQLENS; do
    N1=$(awk -v n="$N" -v p="$P" 'BEGIN { x = int(n / sqrt(p) / 128 + 0.5) * 128; print x < 128 ? 128 : x }')
    for causal in "" --causal; do
      # (a failed run has already said why on stderr)
      if ! ring=$(run stage20 "$N" "$causal" --gpus "$P") || ! base=$(run "$BASE" "$N1" "$causal"); then
        echo "bench_ring: P=$P N=$N ${causal:-full}: skipped (a run failed)" >&2
        continue
      fi
      eff=$(printf '%s\n%s\n%s\n' "$stage_header" "$ring" "$base" | csv_awk -v p="$P" '
        { t[NR] = get("tflops") + 0 } END { printf "%.3f", t[2] / p / t[3] }')
      printf '%s,%d,%s\n%s,1,\n' "$ring" "$P" "$eff" "$base" >> "$rows"
      echo "bench_ring: P=$P N=$N ${causal:-full}: efficiency $eff (baseline N1=$N1 on one GPU)" >&2
    done
    csv_keep_rows bench_ring "bench/data/%sx${P}_ring.csv" "$header" "$rows"
  done
  trap - TERM INT
  rm -f "$rows"
done
