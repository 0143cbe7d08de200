#!/usr/bin/env bash
# bench_cpu.sh: the CPU stages (1 to 3) over a range of sequence lengths, one (batch, head) at
# d = 64, not causal, fp32, appended to plots/data/cpu.csv. Run it through `make bench-cpu` (any
# machine; no GPU needed) and commit the CSV: the CPU chart and the memory chart are drawn from it.
#
# Each row is the harness's CSV row (`--csv-row`: the time, GFLOP/s in the tflops column times
# 1000, and extra_bytes, the peak scratch the tracked allocator saw) plus one column, machine,
# naming the processor and how many cores it had, so rows from different machines stay apart.
# Stage 1 holds the N x N score matrix (4 N^2 bytes) and runs single-threaded: it stops at
# CAP_stage1 (default 8192: 256 MiB, a few seconds a run on one core).
# Environment: STAGES ("stage1 stage2 stage3"), SEQLENS, DIM, WARMUP, ITERS, CAP_stageN, FA_COMMIT.
set -euo pipefail
cd "$(dirname "$0")/.."
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

out=plots/data/cpu.csv
header="stage,direction,gpu,dtype,batch,heads,seqlen,dim,causal,ms_median,ms_min,tflops,max_err,check,commit,extra_bytes,threads,machine"
mkdir -p plots/data
[ -s "$out" ] || echo "$header" > "$out"
failed=0
for s in $STAGES; do
  cap_var="CAP_$s"
  cap=${!cap_var:-0}
  for n in $SEQLENS; do
    if [ "$cap" -gt 0 ] && [ "$n" -gt "$cap" ]; then
      echo "$s N=$n ... skipped (N capped at $cap for $s)" >&2
      continue
    fi
    if row=$("./$s" --batch 1 --heads 1 --seqlen "$n" --dim "$DIM" --warmup "$WARMUP" --iters "$ITERS" --csv-row); then :; else
      echo "$s N=$n ... FAILED (exit $?)" >&2
      failed=1
      [ -n "$row" ] || continue
    fi
    echo "$row,$machine" >> "$out"
    # GFLOP/s from the time (the tflops column keeps three decimals, too few for a CPU)
    echo "$s N=$n ... $(echo "$row" | awk -F, '{ printf "%.2f GFLOP/s, extra %d bytes, check %s",
      4 * $5 * $6 * $7 * $7 * $8 / ($9 ? 2 : 1) / ($10 * 1e-3) / 1e9, $16, $14 }')" >&2
  done
done
echo "bench-cpu: rows appended to $out ($machine)" >&2
exit $failed
