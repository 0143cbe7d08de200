#!/usr/bin/env bash
# bench_ncu.sh: the HBM bytes of each GPU stage, two ways, at one shape (B = 4, H = 16, N = 4096,
# d = 64, fp16, not causal): what the stage's loop structure moves (its formula, printed by
# `./stageN --counters --csv`) and the DRAM bytes Nsight Compute measures for the stage's kernel,
# first launch, clocks left alone. Appended to bench/data/<gpu>_hbm.csv, which `make plots` draws
# as plots/<gpu>_hbm.png. A row is the stage's counters row as --counters --csv prints it (under
# common/report.c's header, which is the file's, checked against the one there) and two columns
# more, dram_read_bytes and dram_write_bytes. Run through `make bench-ncu` on a machine with a GPU
# and Nsight Compute (ncu, part of the CUDA Toolkit); reading DRAM counters may need root or the
# driver's profiling permission (NVreg_RestrictProfilingToAdminUsers=0).
#
# Environment: STAGES ("stage4 ... stage9": forward stages), BATCH, HEADS, SEQLEN, DIM, CAUSAL
# (1 for --causal), NCU (the ncu to use), FA_COMMIT (the commit in the CSV).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/csv.sh
STAGES=${STAGES:-"stage4 stage5 stage6 stage7 stage8 stage9"}
BATCH=${BATCH:-4}
HEADS=${HEADS:-16}
SEQLEN=${SEQLEN:-4096}
DIM=${DIM:-64}
CAUSAL=${CAUSAL:-0}
NCU=${NCU:-ncu}
export FA_COMMIT=${FA_COMMIT:-unknown}
command -v "$NCU" >/dev/null || {
  echo "bench-ncu: Nsight Compute's ncu not found: it comes with the CUDA Toolkit (or set NCU=/path/to/ncu)" >&2; exit 2; }

shape=(--batch "$BATCH" --heads "$HEADS" --seqlen "$SEQLEN" --dim "$DIM")
[ "$CAUSAL" = 1 ] && shape+=(--causal)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
for s in $STAGES; do
  # 1. the formula: --counters --csv prints the result's header and row, then the counters' header
  #    and row; the second block is kept whole, and its columns are read by name
  if ! "./$s" "${shape[@]}" --warmup 0 --iters 1 --counters --csv > "$tmp/out.csv"; then
    echo "$s: --counters failed" >&2; failed=1; continue
  fi
  sed -n '3,$p' "$tmp/out.csv" > "$tmp/counters.csv"
  if [ "$(wc -l < "$tmp/counters.csv")" -ne 2 ] ||
     [ -z "$(csv_awk '{ print get("hbm_formula_bytes") }' "$tmp/counters.csv")" ]; then
    echo "$s: no counters CSV block with the formula's bytes in its output:" >&2; cat "$tmp/out.csv" >&2
    failed=1; continue
  fi

  # 2. the measurement: the stage's own kernel (its name starts with the stage's), first launch
  #    only, the GPU's clocks as they are; ncu's CSV goes to its log file, the stage's line to stdout
  if ! "$NCU" --clock-control none --launch-count 1 -k "regex:${s}_" \
       --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv --print-units base \
       --log-file "$tmp/ncu.csv" "./$s" "${shape[@]}" --warmup 0 --iters 1 --no-check > "$tmp/run.txt"; then
    echo "$s: ncu failed (see its messages above)" >&2; failed=1; continue
  fi
  # ncu --csv: one quoted row per metric; the value column may carry thousands separators, and a
  # unit other than byte (should --print-units base be ignored) is scaled back to bytes
  dram=$(awk '
    /^"/ { n = split(substr($0, 2, length($0) - 2), f, "\",\"")
           if (!hdr) { for (i = 1; i <= n; i++) c[f[i]] = i; hdr = 1; next }
           v = f[c["Metric Value"]]; gsub(/,/, "", v); u = f[c["Metric Unit"]]
           m = (u == "Kbyte") ? 1e3 : (u == "Mbyte") ? 1e6 : (u == "Gbyte") ? 1e9 : (u == "Tbyte") ? 1e12 : 1
           val[f[c["Metric Name"]]] = v * m }
    END { if (("dram__bytes_read.sum" in val) && ("dram__bytes_write.sum" in val))
            printf "%.0f %.0f", val["dram__bytes_read.sum"], val["dram__bytes_write.sum"] }' "$tmp/ncu.csv")
  if [ -z "$dram" ]; then
    echo "$s: no dram__bytes_read.sum / dram__bytes_write.sum in ncu's output:" >&2
    cat "$tmp/ncu.csv" >&2
    failed=1
    continue
  fi
  gpu=$(csv_awk '{ print get("gpu") }' "$tmp/counters.csv")
  out="bench/data/${gpu}_hbm.csv"
  read -r dram_read dram_write <<< "$dram"
  echo "$(sed -n 2p "$tmp/counters.csv"),$dram_read,$dram_write" |
    csv_append "$out" "$(head -n1 "$tmp/counters.csv"),dram_read_bytes,dram_write_bytes"
  echo "$s: formula $(csv_awk '{ printf "%.3f", get("hbm_formula_bytes") / 1e9 }' "$tmp/counters.csv") GB," \
       "DRAM read + written $(awk -v r="$dram_read" -v w="$dram_write" 'BEGIN { printf "%.3f + %.3f GB", r / 1e9, w / 1e9 }') -> $out" >&2
done
exit $failed
