#!/usr/bin/env bash
# bench_cpu.sh: the CPU stages (1 to 3) over a range of sequence lengths at one shape,
# B = 1, H = 8, d = 64, not causal, fp32, and beside them the yardstick cpu-blas (bench/cpu_blas:
# unfused attention through OpenBLAS), appended to bench/data/cpu.csv. Run it through
# `make bench-cpu` (any machine; no GPU needed; it builds bench/cpu_blas where libopenblas-dev is
# installed) and commit the CSV: the CPU chart and the memory chart are drawn from it.
#
# Each row is the harness's CSV row (`--csv`, which prints common/report.c's header above it: the
# time, GFLOP/s in the tflops column times 1000, and extra_bytes, the peak scratch the tracked
# allocator saw) plus one column, machine, naming the processor (commas dropped) and how many
# cores it had, so rows from different machines stay apart. The file's header is the stages'
# header plus ",machine", checked against the one already there. cpu-blas prints the same
# columns (extra_bytes: its N x N score matrix) and runs on as many threads as the stages'
# OpenMP (OMP_NUM_THREADS, else every core: its threads column says how many); where
# bench/cpu_blas was not built (no BLAS) it is skipped with a one-line note.
# Stage 1 holds the N x N score matrix (4 N^2 bytes) and runs single-threaded, one head after
# another: it stops at CAP_stage1 (default 4096: 64 MiB, about 8 s a run for the 8 heads on one
# core; at 8192 a run would take half a minute and the stage's 4 runs two minutes).
# Environment: STAGES ("stage1 stage2 stage3"), SEQLENS, BATCH, HEADS, DIM, WARMUP, ITERS,
# CAP_stageN, FA_COMMIT, BLAS (the yardstick's binary, bench/cpu_blas; empty: not run), CPU_CSV
# (the file appended to, bench/data/cpu.csv: another to try a run without touching the data).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/csv.sh
STAGES=${STAGES:-"stage1 stage2 stage3"}
SEQLENS=${SEQLENS:-"256 512 1024 2048 4096 8192 16384"}
BATCH=${BATCH:-1}
HEADS=${HEADS:-8}
DIM=${DIM:-64}
WARMUP=${WARMUP:-1}
ITERS=${ITERS:-3}
CAP_stage1=${CAP_stage1:-4096}
BLAS=${BLAS-bench/cpu_blas}
export FA_COMMIT=${FA_COMMIT:-unknown}

model=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || true)
[ -n "$model" ] || model=$(uname -m)
machine="$(echo "$model" | tr -s ' ,' ' ') ($(nproc) cores)"

# the yardstick runs where it was built (make bench-cpu builds it where a BLAS is installed), on
# the stages' threads: OpenBLAS's as many as OpenMP's, and OpenMP's idle threads (its softmax
# loop) asleep rather than spinning against OpenBLAS's between the two matrix multiplies
series=$STAGES
if [ -n "$BLAS" ] && [ -x "$BLAS" ]; then
  series="$series cpu-blas"
  threads=${OMP_NUM_THREADS:-$(nproc)}
elif [ -n "$BLAS" ]; then
  echo "cpu-blas ... skipped: no $BLAS (no BLAS here: apt-get install libopenblas-dev, then make bench-cpu)" >&2
fi

out=${CPU_CSV:-bench/data/cpu.csv}
failed=0
for s in $series; do
  cap_var="CAP_${s//-/_}"
  cap=${!cap_var:-0}
  if [ "$s" = cpu-blas ]; then
    cmd=(env OPENBLAS_NUM_THREADS="$threads" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}" "$BLAS")
  else
    cmd=("./$s")
  fi
  for n in $SEQLENS; do
    if [ "$cap" -gt 0 ] && [ "$n" -gt "$cap" ]; then
      echo "$s N=$n ... skipped (N capped at $cap for $s)" >&2
      continue
    fi
    if out_s=$("${cmd[@]}" --batch "$BATCH" --heads "$HEADS" --seqlen "$n" --dim "$DIM" --warmup "$WARMUP" --iters "$ITERS" --csv); then :; else
      echo "$s N=$n ... FAILED (exit $?)" >&2
      failed=1
      [ -n "$out_s" ] || continue
    fi
    # the stage's header and row, each with the machine column after it (appended row by row, so
    # an interrupted run keeps the rows it finished)
    printf '%s,%s\n' "$(sed -n 2p <<< "$out_s")" "$machine" | csv_append "$out" "$(head -n1 <<< "$out_s"),machine"
    # GFLOP/s from the time (the tflops column keeps three decimals, too few for a CPU)
    echo "$s B=$BATCH H=$HEADS N=$n ... $(csv_awk '{ printf "%.2f GFLOP/s, extra %d bytes, %d thread(s), check %s",
      4 * get("batch") * get("heads") * get("seqlen") * get("seqlen") * get("dim") / (get("causal") ? 2 : 1) / (get("ms_median") * 1e-3) / 1e9,
      get("extra_bytes"), get("threads"), get("check") }' <<< "$out_s")" >&2
  done
done
echo "bench-cpu: rows appended to $out ($machine)" >&2
exit $failed
