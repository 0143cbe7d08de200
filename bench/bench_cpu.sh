#!/usr/bin/env bash
# bench_cpu.sh: the CPU stages (1 to 3) over a range of sequence lengths, one (batch, head) at
# d = 64, not causal, fp32, appended to bench/data/cpu.csv. Run it through `make bench-cpu` (any
# machine; no GPU needed) and commit the CSV: the CPU chart and the memory chart are drawn from it.
#
# Each row is the harness's CSV row (`--csv`, which prints common/report.c's header above it: the
# time, GFLOP/s in the tflops column times 1000, and extra_bytes, the peak scratch the tracked
# allocator saw) plus one column, machine, naming the processor (commas dropped) and how many
# cores it had, so rows from different machines stay apart. The file's header is the stages'
# header plus ",machine", checked against the one already there.
# Stage 1 holds the N x N score matrix (4 N^2 bytes) and runs single-threaded: it stops at
# CAP_stage1 (default 8192: 256 MiB, a few seconds a run on one core).
# Environment: STAGES ("stage1 stage2 stage3"), SEQLENS, DIM, WARMUP, ITERS, CAP_stageN, FA_COMMIT.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/csv.sh
STAGES=${STAGES:-"stage1 stage2 stage3"}
SEQLENS=${SEQLENS:-"256 512 1024 2048 4096 8192 16384"}
DIM=${DIM:-64}
WARMUP=${WARMUP:-1}
ITERS=${ITERS:-3}
CAP_stage1=${CAP_stage1:-8192}
export FA_COMMIT=${FA_COMMIT:-unknown}

model=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || true)
[ -n "$model" ] || model=$(uname -m)
machine="$(echo "$model" | tr -s ' ,' ' ') ($(nproc) cores)"

out=bench/data/cpu.csv
failed=0
for s in $STAGES; do
  cap_var="CAP_$s"
  cap=${!cap_var:-0}
  for n in $SEQLENS; do
    if [ "$cap" -gt 0 ] && [ "$n" -gt "$cap" ]; then
      echo "$s N=$n ... skipped (N capped at $cap for $s)" >&2
      continue
    fi
    if out_s=$("./$s" --batch 1 --heads 1 --seqlen "$n" --dim "$DIM" --warmup "$WARMUP" --iters "$ITERS" --csv); then :; else
      echo "$s N=$n ... FAILED (exit $?)" >&2
      failed=1
      [ -n "$out_s" ] || continue
    fi
    # the stage's header and row, each with the machine column after it (appended row by row, so
    # an interrupted run keeps the rows it finished)
    printf '%s,%s\n' "$(sed -n 2p <<< "$out_s")" "$machine" | csv_append "$out" "$(head -n1 <<< "$out_s"),machine"
    # GFLOP/s from the time (the tflops column keeps three decimals, too few for a CPU)
    echo "$s N=$n ... $(csv_awk '{ printf "%.2f GFLOP/s, extra %d bytes, check %s",
      4 * get("batch") * get("heads") * get("seqlen") * get("seqlen") * get("dim") / (get("causal") ? 2 : 1) / (get("ms_median") * 1e-3) / 1e9,
      get("extra_bytes"), get("check") }' <<< "$out_s")" >&2
  done
done
echo "bench-cpu: rows appended to $out ($machine)" >&2
exit $failed
