#!/usr/bin/env bash
# plot.sh: every chart and the README's results table, drawn from the measured CSVs in
# plots/data/ and nothing else, so it runs on any machine (no GPU, no Python). Run: `make plots`.
# Needs gnuplot with the pngcairo and svg terminals (Debian/Ubuntu: apt-get install gnuplot-nox).
#
# From each GPU's plots/data/<gpu>.csv (`make bench`), benchmark-grid rows only (B = 16384 / N,
# H = 2048 / d; rows such as B = H = 1 stay out), the latest row of each shape winning:
#   plots/<gpu>_fwd      (a) forward TFLOP/s against N: a line per stage, torch-flash, torch-cudnn
#   plots/<gpu>_speedup  (b) each stage's speedup over stage 4 at d = 64, the FA-2 paper's beside it
#   plots/<gpu>_bwd      (c) backward TFLOP/s against N: stage 9 beside torch-flash, torch-cudnn
#   plots/<gpu>_hbm      (e) HBM bytes per stage at one shape: the stage's formula beside the DRAM
#                            bytes Nsight Compute measured (plots/data/<gpu>_hbm.csv, `make bench-ncu`)
# From plots/data/cpu.csv (`make bench-cpu`) and the GPU files:
#   plots/memory         (d) memory for one (batch, head) against N: stage 1, 3 (CPU) and 8 (GPU)
#   plots/cpu            (f) the CPU stages' GFLOP/s against N
# each as .png and .svg; the chart itself is plots/<name>.gp, this script only prepares its data.
# Then README.md's results table, between its markers, from plots/readme_table.sh.
set -euo pipefail
cd "$(dirname "$0")"
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 2; }
shopt -s nullglob
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- helpers ----
# The key entry of a series: "stage 4: FA-1 on the GPU", "torch-flash: ..." (labels.csv).
title_of() {
  awk -F, -v s="$1" 'NR > 1 && $1 == s { lab = substr($0, length($1) + 2) }
    END { if (s ~ /^stage[0-9]+$/) printf "stage %s: %s", substr(s, 6), lab; else printf "%s%s", s, lab == "" ? "" : ": " lab }' labels.csv
}
# Render plots/NAME.gp to NAME.png and NAME.svg. Arguments after the chart: gnuplot assignments.
render() {
  local chart=$1 name=$2; shift 2
  local vars
  vars=$(printf '%s; ' "$@")
  for fmt in png svg; do
    gnuplot -e "fmt='$fmt'; out='$name.$fmt'; $vars" "$chart.gp"
  done
  echo "plots/$name.png, plots/$name.svg"
}
# A gnuplot string assignment, name="value", double-quoted so that \n in a title breaks the line.
gpstr() { local v=${2//\\/\\\\}; v=${v//\\\\n/\\n}; printf '%s="%s"' "$1" "${v//\"/\\\"}"; }
# Series keys (stdin, one a line, repeats allowed) in drawing order: stages by number, then
# torch-flash, then the rest.
order_series() { sort -u | sort -V | awk '/^stage/ { print; next } $0 == "torch-flash" { print; next } { rest[++n] = $0 }
                                         END { for (i = 1; i <= n; i++) print rest[i] }'; }
# The '|'-separated key entries of the series given as arguments.
titles_of() { local t="" s; for s in "$@"; do t="$t${t:+|}$(title_of "${s%%@*}")"; done; echo "$t"; }
# "b934f3e (stage4, stage5); 13022c3 (stage8, torch-flash)": the runs behind "series commit" lines.
runs_of() {
  sort -u | awk '{ who[$2] = who[$2] (who[$2] == "" ? "" : ", ") $1; if (!($2 in seen)) { seen[$2]; order[++n] = $2 } }
    END { for (i = 1; i <= n; i++) printf "%s%s (%s)", (i > 1 ? "; " : ""), order[i], who[order[i]] }'
}

gpu_csvs=()
for f in data/*.csv; do
  case $(basename "$f") in cpu.csv | *_hbm.csv) ;; *) gpu_csvs+=("$f") ;; esac
done

for csv in "${gpu_csvs[@]}"; do
  gpu=$(basename "$csv" .csv)
  GPU=$(echo "$gpu" | tr 'a-z' 'A-Z')
  # the latest grid row of each (stage, direction, d, causal, N)
  awk -F, 'NR > 1 && $5 * $7 == 16384 && $6 * $8 == 2048 { last[$1 FS $2 FS $8 FS $9 FS $7] = $0 }
           END { for (k in last) print last[k] }' "$csv" > "$tmp/latest.csv"

  # ---- (a) forward and (c) backward TFLOP/s: one chart per direction ----
  for dir in fwd bwd; do
    awk -F, -v dir="$dir" '$2 == dir { print $1, $8, $9, $7, $12 }' "$tmp/latest.csv" | sort -k1,1 -k2,2n -k3,3n -k4,4n > "$tmp/$dir.dat"
    mapfile -t series < <(cut -d' ' -f1 "$tmp/$dir.dat" | order_series)
    if [ ${#series[@]} -eq 0 ]; then
      echo "plot.sh: $csv has no $dir rows on the benchmark grid: no plots/${gpu}_$dir chart" >&2
      continue
    fi
    runs=$(awk -F, -v dir="$dir" '$2 == dir { print $1, $15 }' "$tmp/latest.csv" | runs_of)
    what=$([ "$dir" = fwd ] && echo Forward || echo Backward)
    flops=$([ "$dir" = fwd ] && echo "4·B·H·N^2·d FLOPs" || echo "2.5 × 4·B·H·N^2·d FLOPs")
    heading="$what speed, $GPU, fp16, B·N = 16k tokens, H·d = 2048 ($flops, halved when causal)\\nthe latest run of each line, by commit: $runs"
    note="torch-flash, torch-cudnn: PyTorch's scaled_dot_product_attention with its FlashAttention-2 and cuDNN backends"
    if ! printf '%s\n' "${series[@]}" | grep -q '^stage'; then
      note="No stage has $dir rows yet: stage 9 (the backward) appears here once make bench records them.\\n$note"
    fi
    render flops "${gpu}_$dir" "$(gpstr data "$tmp/$dir.dat")" "$(gpstr series "${series[*]}")" \
      "$(gpstr titles "$(titles_of "${series[@]}")")" "$(gpstr heading "$heading")" "$(gpstr note "$note")" \
      "$(gpstr dir "$dir")"
  done

  # ---- (b) speedup over stage 4 at d = 64 ----
  # A stage's speedup is taken within one run where stage 4 was measured in the same run. Where
  # they come from different runs, each is first divided by torch-flash measured in its own run,
  # and the speedup is the ratio of those ratios (so only numbers from one run are compared).
  awk -F, -v cross="$tmp/cross.txt" '
    NR > 1 && $2 == "fwd" && $8 == 64 && $5 * $7 == 16384 && $6 * $8 == 2048 {
      k = $1 FS $9 FS $7; tf[k FS $15] = $12; run[k] = $15
      if ($1 == "torch-flash") fl[$9 FS $7 FS $15] = $12
    }
    END {
      for (k in run) {
        split(k, f, FS); s = f[1]; c = f[2]; n = f[3]
        if (s !~ /^stage[0-9]+$/ || s == "stage4" || !(("stage4" FS c FS n) in run)) continue
        r = run[k]; r4 = run["stage4" FS c FS n]; a = tf[k FS r]; b = tf["stage4" FS c FS n FS r4]
        if (r == r4) sp = a / b
        else if ((c FS n FS r) in fl && (c FS n FS r4) in fl) { sp = (a / fl[c FS n FS r]) / (b / fl[c FS n FS r4]); via[s] = r; base = r4 }
        else continue
        print s, c, n, sp
      }
      for (s in via) print s, via[s], base > cross
    }' "$csv" | sort -k1,1V -k2,2n -k3,3n > "$tmp/speedup.dat"
  touch "$tmp/cross.txt"
  tail -n +2 anchors/fa2_paper_a100.csv | tr ',' ' ' > "$tmp/paper.dat"   # seqlen speedup
  mapfile -t series < <(cut -d' ' -f1 "$tmp/speedup.dat" | order_series)
  if [ ${#series[@]} -gt 0 ]; then
    titles=""
    for s in "${series[@]}"; do
      t=$(title_of "$s")
      if grep -q "^$s " "$tmp/cross.txt"; then t="$t †"; fi
      titles="$titles${titles:+|}$t"
    done
    note=$(sort -V "$tmp/cross.txt" | awk '{ s = s (s == "" ? "" : ", ") "stage " substr($1, 6) " (" $2 ")"; base = $3 }
      END { if (s != "") printf "† %s measured in another run than stage 4 (%s): speedup = (stage / torch-flash in its run) ÷ (stage 4 / torch-flash in stage 4'"'"'s run)", s, base }')
    runs=$(awk -F, '$2 == "fwd" && $8 == 64 && $1 ~ /^stage/ { print $1, $15 }' "$tmp/latest.csv" | runs_of)
    heading="Speedup over stage 4 (FA-1), forward, d = 64, $GPU, fp16, B·N = 16k, H = 32\\nruns (commit): $runs"
    render speedup "${gpu}_speedup" "$(gpstr data "$tmp/speedup.dat")" "$(gpstr series "${series[*]}")" \
      "$(gpstr titles "$titles")" "$(gpstr heading "$heading")" "$(gpstr note "$note")" \
      "$(gpstr paper "$tmp/paper.dat")"
  else
    echo "plot.sh: $csv has no stage 4 rows at d = 64 beside another stage's: no plots/${gpu}_speedup chart" >&2
  fi

  # ---- (e) HBM bytes: the formula beside Nsight Compute ----
  hbm="data/${gpu}_hbm.csv"
  if [ -s "$hbm" ]; then
    # the latest row of each stage, in stage order:
    #   idx stage Q KV O O_work rowstats dram_read dram_write B H N d dtype causal commit
    awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
      { last[$c["stage"]] = $c["stage"] " " $c["hbm_q_bytes"] " " $c["hbm_kv_bytes"] " " $c["hbm_o_bytes"] " " \
          $c["hbm_o_work_bytes"] " " $c["hbm_rowstats_bytes"] " " $c["dram_read_bytes"] " " $c["dram_write_bytes"] " " \
          $c["batch"] " " $c["heads"] " " $c["seqlen"] " " $c["dim"] " " $c["dtype"] " " $c["causal"] " " $c["commit"] }
      END { for (s in last) print last[s] }' "$hbm" | sort -k1,1V | awk '{ print NR, $0 }' > "$tmp/hbm.dat"
    shape=$(awk '{ s[sprintf("B = %s, H = %s, N = %s, d = %s, %s, %s", $10, $11, $12, $13, $14, $15 == 1 ? "causal" : "not causal")] }
      END { for (k in s) { printf "%s%s", n++ ? " / " : "", k } }' "$tmp/hbm.dat")
    runs=$(awk '{ print $2, $16 }' "$tmp/hbm.dat" | runs_of)
    heading="HBM bytes of one forward, $GPU, $shape\\nleft bar: the stage's formula (what its loop structure moves), term by term\\nright bar: the DRAM bytes Nsight Compute measured, first launch; runs (commit): $runs"
    render hbm "${gpu}_hbm" "$(gpstr data "$tmp/hbm.dat")" "$(gpstr heading "$heading")"
  else
    echo "plot.sh: no $hbm: the HBM chart (formula against Nsight Compute) needs make bench-ncu on a GPU with ncu; not drawn" >&2
  fi
done

# ---- (f) the CPU stages' GFLOP/s, and (d) memory against N ----
cpu=data/cpu.csv
if [ -s "$cpu" ]; then
  # latest row of each (stage, N) at B = H = 1, d = 64, not causal. GFLOP/s from ms_median (the
  # tflops column keeps three decimals, too few for a CPU): 4 N^2 d FLOPs per (batch, head).
  awk -F, 'NR > 1 && $2 == "fwd" && $5 == 1 && $6 == 1 && $8 == 64 && $9 == 0 { last[$1 FS $7] = $0 }
           END { for (k in last) print last[k] }' "$cpu" | sort -t, -k1,1V -k7,7n > "$tmp/cpu_latest.csv"
  awk -F, '{ print $1, $7, 4 * $7 * $7 * $8 / ($10 * 1e-3) / 1e9 }' "$tmp/cpu_latest.csv" > "$tmp/cpu.dat"
  mapfile -t series < <(cut -d' ' -f1 "$tmp/cpu.dat" | order_series)
  titles=""
  for s in "${series[@]}"; do
    th=$(awk -F, -v s="$s" '$1 == s { t = $17 } END { print t }' "$tmp/cpu_latest.csv")
    titles="$titles${titles:+|}$(title_of "$s") ($th thread$([ "$th" = 1 ] || echo s))"
  done
  machine=$(cut -d, -f18 "$tmp/cpu_latest.csv" | sort -u | paste -sd';' | sed 's/;/; /g')
  runs=$(awk -F, '{ print $1, $15 }' "$tmp/cpu_latest.csv" | runs_of)
  cap=$(awk '{ if ($1 == "stage1" && $2 > m1) m1 = $2; if ($2 > m) m = $2 } END { if (m1 && m1 < m) printf "\\nstage 1 (4·N^2 bytes of scores) measured up to N = %d", m1 }' "$tmp/cpu.dat")
  heading="CPU stages, fp32, one (batch, head), d = 64, not causal, on $machine$cap\\nruns (commit): $runs"
  render cpu cpu "$(gpstr data "$tmp/cpu.dat")" "$(gpstr series "${series[*]}")" "$(gpstr titles "$titles")" \
    "$(gpstr heading "$heading")"

  # memory for one (batch, head): Q, K, V, O (4 N d elements at the row's dtype), L (N fp32) and
  # the scratch the harness measured (extra_bytes); the CPU stages at B = H = 1, stage 8 from
  # each GPU's grid rows (d = 64, not causal), divided by B * H (it allocates no scratch).
  awk -F, '$1 == "stage1" || $1 == "stage3" { print $1 "@cpu", $7, 4 * $7 * $8 * 4 + 4 * $7 + $16 }' \
    "$tmp/cpu_latest.csv" > "$tmp/memory.dat"
  mem_titles=()
  for s in stage1 stage3; do
    if grep -q "^$s@cpu " "$tmp/memory.dat"; then mem_titles+=("$(title_of "$s") (CPU, fp32)"); fi
  done
  for csv in "${gpu_csvs[@]}"; do
    gpu=$(basename "$csv" .csv)
    awk -F, -v g="$gpu" 'NR > 1 && $1 == "stage8" && $2 == "fwd" && $8 == 64 && $9 == 0 && $5 * $7 == 16384 && $6 * $8 == 2048 {
        e = ($4 == "fp32") ? 4 : 2; last[$7] = "stage8@" g " " $7 " " (4 * $7 * $8 * e + 4 * $7) + $16 / ($5 * $6) }
      END { for (n in last) print last[n] }' "$csv" | sort -k2,2n > "$tmp/mem_gpu.dat"
    if [ -s "$tmp/mem_gpu.dat" ]; then
      cat "$tmp/mem_gpu.dat" >> "$tmp/memory.dat"
      mem_titles+=("$(title_of stage8) ($(echo "$gpu" | tr 'a-z' 'A-Z'), fp16)")
    fi
  done
  mapfile -t series < <(cut -d' ' -f1 "$tmp/memory.dat" | awk '!seen[$0]++')
  titles=$(printf '%s|' "${mem_titles[@]}")
  heading="Memory for one (batch, head) against N, d = 64, measured\\nQ, K, V, O at the stage's dtype + L in fp32 + the scratch the harness measured (stage 8 needs none)"
  render memory memory "$(gpstr data "$tmp/memory.dat")" "$(gpstr series "${series[*]}")" "$(gpstr titles "${titles%|}")" \
    "$(gpstr heading "$heading")"
else
  echo "plot.sh: no $cpu: the CPU and memory charts need make bench-cpu; not drawn" >&2
fi

# ---- the README's results table ----
if [ ${#gpu_csvs[@]} -gt 0 ]; then
  ./readme_table.sh --splice ../README.md
  echo "README.md: results table"
else
  echo "plot.sh: no GPU CSV under plots/data/ (make bench on a GPU): README.md's results table left as it is" >&2
fi
