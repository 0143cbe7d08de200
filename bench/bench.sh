#!/usr/bin/env bash
# bench.sh: every GPU stage over the FlashAttention-2 paper's grid, plus PyTorch's
# scaled_dot_product_attention (flash and cuDNN backends) when python3 with torch is present,
# in one run, appended to bench/data/<gpu>.csv (a run stopped early, by a time limit or ^C, keeps
# the rows it finished), and the ceiling, torch.matmul at 8192^3 (bench/torch_matmul.py), appended
# to bench/data/<gpu>_matmul.csv. Run through `make bench` on a machine with a GPU.
# A stage that measures a backward (stage 10) prints bwd rows: its own binary says so.
#
# The grid: 16k tokens per batch (B = 16384 / N), hidden size 2048 (H = 2048 / d),
# d in {64, 128}, N in {512 ... 16384}, causal and not, fp16 (DTYPES="fp16 bf16" adds bf16 rows,
# DTYPES="fp16 fp8" stage 19's FP8 rows, beside the 16-bit stages' fp16 ones: torch has no FP8 attention;
# the charts and tables read the fp16 rows, plots/ratio.sh --dtype bf16 the others). A stage that
# refuses a dtype or a head dim (exit 2) is skipped there with its one line, not counted a failure.
# The columns are the stages' own: each stage runs with --csv, which prints common/report.c's
# header above its row; the header goes to the file (checked against the one there) and to
# torch_sdpa.py, which fills the same columns by name.
# Environment: STAGES ("stage4 stage5 ..."), SEQLENS, DIMS, DTYPES, WARMUP, ITERS; TORCH_DIRECTIONS
# ("fwd bwd", or "fwd": torch's forward alone, for a run of forward stages); CAP_stageN=8192 caps
# a slow stage's N (say why in its note); FA_COMMIT names the commit in the CSV; TORCH=0 leaves out
# torch's rows and the matmul (the stages alone, against each other).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/csv.sh
STAGES=${STAGES:-stage4}
SEQLENS=${SEQLENS:-"512 1024 2048 4096 8192 16384"}
DIMS=${DIMS:-"64 128"}
DTYPES=${DTYPES:-fp16}
WARMUP=${WARMUP:-3}
TORCH=${TORCH:-1}
ITERS=${ITERS:-10}
export FA_COMMIT=${FA_COMMIT:-unknown}

rows=$(mktemp)
err=$(mktemp)
header=""
# Rows so far into bench/data/<gpu>.csv: at the end, or when the run is stopped (a time limit's
# SIGTERM, ^C), so a long run that is cut short still keeps every row it finished (each complete
# and checked); the message says how many.
keep_rows() { csv_keep_rows bench "bench/data/%s.csv" "$header" "$rows"; }
trap 'rm -f "$rows" "$err"' EXIT
torch_pid=
# (each step may fail, torch already gone or killed, and set -e must not end the trap before keep_rows)
trap 'echo "bench: stopped before the end" >&2; if [ -n "$torch_pid" ]; then kill "$torch_pid" 2>/dev/null || :; wait "$torch_pid" || :; fi; keep_rows; exit 130' INT TERM
total=0
for s in $STAGES; do for t in $DTYPES; do for d in $DIMS; do for n in $SEQLENS; do for c in 0 1; do total=$((total + 1)); done; done; done; done; done
k=0
failed=0
for s in $STAGES; do
  cap_var="CAP_$s"
  cap=${!cap_var:-0}
  for t in $DTYPES; do for d in $DIMS; do for n in $SEQLENS; do for c in 0 1; do
    k=$((k + 1))
    label="$s $t d=$d N=$n $([ $c = 1 ] && echo causal || echo full)"
    if [ "$cap" -gt 0 ] && [ "$n" -gt "$cap" ]; then
      echo "[$k/$total] $label ... skipped (N capped at $cap for $s)" >&2
      continue
    fi
    args=(--batch $((16384 / n)) --heads $((2048 / d)) --seqlen "$n" --dim "$d" --dtype "$t" --warmup "$WARMUP" --iters "$ITERS" --csv)
    [ "$c" = 1 ] && args+=(--causal)
    if out=$("./$s" "${args[@]}" 2> "$err"); then cat "$err" >&2; else
      rc=$?
      if [ "$rc" = 2 ]; then # the stage refuses this dtype or head dim: its one line, and on
        echo "[$k/$total] $label ... skipped: $(head -n1 "$err")" >&2
        continue
      fi
      cat "$err" >&2
      echo "[$k/$total] $label ... FAILED (exit $rc)" >&2
      failed=1
      [ -n "$out" ] || continue
    fi
    # the header, then the row
    h=$(head -n1 <<< "$out")
    if [ -z "$header" ]; then header=$h; fi
    if [ "$h" != "$header" ]; then
      echo "bench: ./$s --csv printed another header than the stages before it:" >&2
      echo "  $h" >&2
      echo "  $header" >&2
      exit 2
    fi
    sed -n 2p <<< "$out" >> "$rows"
    echo "[$k/$total] $label ... $(csv_awk '{ printf "%s TFLOP/s, check %s", get("tflops"), get("check") }' <<< "$out")" >&2
  done; done; done; done
done

if [ -z "$header" ]; then
  echo "bench: no stage printed a row (so no header either): no torch rows, nothing written" >&2
  exit 1
fi
if [ "$TORCH" = 0 ]; then
  echo "bench: TORCH=0: no torch-flash / torch-cudnn rows and no matmul this run" >&2
elif python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  # in the background, so that a stop reaches the trap at once (it stops torch and keeps its rows)
  # (torch's attention has no fp8: its rows in the 16-bit dtypes asked for; the matmul has all)
  sdpa_dtypes=$(tr ' ' '\n' <<< "$DTYPES" | grep -v '^fp8$' | tr '\n' ' ')
  if [ -n "${sdpa_dtypes// }" ]; then
    python3 -u bench/torch_sdpa.py --columns "$header" --seqlens $SEQLENS --dims $DIMS --dtypes $sdpa_dtypes \
      --directions ${TORCH_DIRECTIONS:-fwd bwd} --warmup "$WARMUP" --iters "$ITERS" >> "$rows" &
    torch_pid=$!
    wait "$torch_pid" || failed=1
    torch_pid=
  fi
  # the ceiling in the same run: torch.matmul at 8192^3, into bench/data/<gpu>_matmul.csv
  python3 -u bench/torch_matmul.py --dtypes $DTYPES --warmup "$WARMUP" --iters "$ITERS" || failed=1
else
  echo "bench: python3 with CUDA-enabled torch not found: no torch-flash / torch-cudnn rows this run" >&2
fi

[ -s "$rows" ] || { echo "bench: no results" >&2; exit 1; }
keep_rows
exit $failed
