#!/usr/bin/env bash
# plot.sh: every chart and the README's results table, drawn from the measured CSVs in
# bench/data/ and nothing else, so it runs on any machine (no GPU, no Python). Run: `make plots`.
# Needs gnuplot with the pngcairo and svg terminals (Debian/Ubuntu: apt-get install gnuplot-nox).
# Columns are read by name (bench/csv.sh); the comparisons are plots/grid.awk's.
#
# From each GPU's bench/data/<gpu>.csv (`make bench`), benchmark-grid rows only (B = 16384 / N,
# H = 2048 / d; rows such as B = H = 1 stay out), the latest row of each shape winning:
#   plots/<gpu>_fwd      (a) forward TFLOP/s against N: a line per stage, torch-flash, torch-cudnn
#   plots/<gpu>_speedup  (b) each stage's speedup over stage 4 at d = 64, the FA-2 paper's beside it
#                            (bench/data/anchors/fa2_paper_a100.csv); stage 4's blocks on a top axis,
#                            shaded where they are fewer than the SMs, and a caption on why ours grow
#                            with N
#   plots/<gpu>_bwd      (c) backward TFLOP/s against N: the backward stages (GPU_BINS less FWD_BINS:
#                            stages 10 and 16) beside torch-flash, torch-cudnn
#   plots/<gpu>_hbm      (e) HBM bytes per stage at one shape: the stage's formula beside the DRAM
#                            bytes Nsight Compute measured (bench/data/<gpu>_hbm.csv, `make bench-ncu`),
#                            with a caption on why a measured bar falls short of its formula (the L2)
# From bench/data/cpu.csv (`make bench-cpu`) and the GPU files:
#   plots/memory         (d) memory for one (batch, head) against N: stages 1, 3 (CPU) and 9 (GPU)
#   plots/cpu            (f) the CPU stages' GFLOP/s against N, and the yardstick cpu-blas (unfused,
#                            OpenBLAS) as torch-flash is drawn on the GPU charts; at the shape of
#                            the latest run (B, H), rows at another shape left out and counted
# each as .png and .svg; the chart itself is plots/<name>.gp, this script only prepares its data.
# A stage of the Makefile's list with no rows yet is named under the chart, not drawn.
# Then README.md's results table, between its markers, from plots/readme_table.sh (README=FILE
# splices it into FILE instead).
# To try the charts on other data (rows not committed, a stage not measured yet): DATA=DIR reads
# DIR/*.csv and DIR/anchors/ instead of bench/data/, OUTDIR=DIR writes the images there instead
# of plots/; with DATA set the README's table (which reads bench/data/ alone) is left as it is.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd .. && pwd)
source ../bench/csv.sh
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 2; }
shopt -s nullglob
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
data=$(cd "${DATA:-$root/bench/data}" && pwd)
outdir=$(mkdir -p "${OUTDIR:-.}" && cd "${OUTDIR:-.}" && pwd)
MEM_GPU_STAGE=stage9   # the GPU stage the memory chart draws: the production forward
GRID_STAGE=stage8      # the first stage with a block per Q tile; the stages before it, one per (batch, head)
README=${README:-$root/README.md}
csv_stage_lists   # CPU_BINS, GPU_BINS, FWD_BINS: the stages the Makefile lists

# ---- helpers ----
# The key entry of a series: "stage 4: FA-1 on the GPU", "torch-flash: ..." (labels.csv).
title_of() {
  csv_awk -v s="$1" 'get("series") == s { lab = get("label") }
    END { if (s ~ /^stage[0-9]+$/) printf "stage %s: %s", substr(s, 6), lab; else printf "%s%s", s, lab == "" ? "" : ": " lab }' labels.csv
}
# Render plots/NAME.gp to NAME.png and NAME.svg. Arguments after the chart: gnuplot assignments.
render() {
  local chart=$1 name=$2; shift 2
  local vars
  vars=$(printf '%s; ' "$@")
  for fmt in png svg; do
    gnuplot -e "fmt='$fmt'; out='$outdir/$name.$fmt'; $vars" "$chart.gp"
  done
  echo "${outdir#"$root"/}/$name.png, ${outdir#"$root"/}/$name.svg"
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
# The '; '-separated list on stdin (runs_of's) broken into lines of at most $1 characters, joined
# by a literal \n (a title line too long for its chart otherwise runs off the image).
wrap_list() { awk -v w="$1" '{ n = split($0, p, "; "); line = ""; out = ""
    for (i = 1; i <= n; i++) {
      if (line != "" && length(line) + 2 + length(p[i]) > w) { out = out line ";\\n"; line = p[i] }
      else line = line (line == "" ? "" : "; ") p[i] }
    printf "%s%s", out, line }'; }
# The text on stdin broken between words into lines of at most $1 characters, joined by a literal
# \n: a caption for a narrow column of a chart.
wrap_text() { awk -v w="$1" '{ for (i = 1; i <= NF; i++) {
      if (line != "" && length(line) + 1 + length($i) > w) { out = out line "\\n"; line = $i }
      else line = line (line == "" ? "" : " ") $i } }
    END { printf "%s%s", out, line }'; }
# "4k" for 4096, "512" for 512: N as the charts' axes write it
kilo() { if [ "$1" -ge 1024 ]; then echo "$(($1 / 1024))k"; else echo "$1"; fi; }
# What the charts say about a GPU, from its datasheet, where it is listed here (nothing otherwise,
# and the charts leave the number out): its SM count and its L2 cache.
gpu_sms() { case $1 in h200) echo 132 ;; a100) echo 108 ;; esac; }
gpu_l2() { case $1 in h200) echo "50 MiB" ;; a100) echo "40 MiB" ;; esac; }
# "stages 8, 9" / "stage 10": the stages given as arguments (stageN), for a sentence.
stages_phrase() { [ $# -gt 0 ] || return 0; printf 'stage%s %s' "$([ $# -gt 1 ] && echo s)" "$(printf '%s\n' "$@" | sed 's/^stage//' | paste -sd, | sed 's/,/, /g')"; }

gpu_csvs=()
for f in "$data"/*.csv; do
  case $(basename "$f") in cpu.csv | *_hbm.csv | *_decode.csv | *_matmul.csv) ;; *) gpu_csvs+=("$f") ;; esac
done

for csv in "${gpu_csvs[@]}"; do
  gpu=$(basename "$csv" .csv)
  GPU=$(echo "$gpu" | tr 'a-z' 'A-Z')
  # "Not measured yet on this GPU (make bench): stages 8, 9": the stages of the Makefile's list
  # that should have rows in direction $1 (forward: FWD_BINS; backward: the other GPU stages) and
  # have none in this file
  missing_note() {
    local m
    read -r -a m <<< "$(csv_awk -v dir="$1" -v bins="$GPU_BINS" -v fwd="$FWD_BINS" '
      get("direction") == dir { seen[get("stage")] }
      END { split(fwd, f, " "); for (i in f) isfwd[f[i]]; n = split(bins, b, " ")
            for (i = 1; i <= n; i++) if (!(b[i] in seen) && ((b[i] in isfwd) == (dir == "fwd"))) printf "%s ", b[i] }' "$csv")"
    if [ ${#m[@]} -gt 0 ]; then echo "Not measured yet on this GPU (make bench): $(stages_phrase "${m[@]}")"; fi
  }

  # ---- (a) forward and (c) backward TFLOP/s: one chart per direction ----
  # the latest grid row of each (series, d, causal, N) at the head dims flops.gp draws (64, 128):
  # "series d causal N tflops", and the runs of those rows alone (the heading names no run whose
  # rows are at another d only)
  for dir in fwd bwd; do
    csv_awk -f grid.awk -v dir="$dir" -v runs="$tmp/runs.txt" '{ grid_add() }
      END { for (k in G_last) { split(k, f, SUBSEP); if (f[2] != dir) continue
              split(f[3], p, " "); if (p[1] != 64 && p[1] != 128) continue; print f[1], p[1], p[2], p[3], grid_tf(f[1], dir, G_last[k], f[3]); print f[1], G_last[k] > runs } }' "$csv" |
      sort -k1,1 -k2,2n -k3,3n -k4,4n > "$tmp/$dir.dat"
    mapfile -t series < <(cut -d' ' -f1 "$tmp/$dir.dat" | order_series)
    if [ ${#series[@]} -eq 0 ]; then
      echo "plot.sh: ${csv#"$root"/} has no $dir rows on the benchmark grid: no ${outdir#"$root"/}/${gpu}_$dir chart" >&2
      continue
    fi
    runs=$(runs_of < "$tmp/runs.txt" | wrap_list 110)
    what=$([ "$dir" = fwd ] && echo Forward || echo Backward)
    flops=$([ "$dir" = fwd ] && echo "4·B·H·N^2·d FLOPs" || echo "2.5 × 4·B·H·N^2·d FLOPs")
    heading="$what speed, $GPU, fp16, B·N = 16k tokens, H·d = 2048 ($flops, halved when causal)\\nthe latest run of each line, by commit: $runs"
    note="torch-flash, torch-cudnn: PyTorch's scaled_dot_product_attention with its FlashAttention-2 and cuDNN backends"
    missing=$(missing_note "$dir")
    if [ -n "$missing" ]; then note="$missing\\n$note"; fi
    render flops "${gpu}_$dir" "$(gpstr data "$tmp/$dir.dat")" "$(gpstr series "${series[*]}")" \
      "$(gpstr titles "$(titles_of "${series[@]}")")" "$(gpstr heading "$heading")" "$(gpstr note "$note")" \
      "$(gpstr dir "$dir")"
  done

  # ---- (b) speedup over stage 4 at d = 64 ----
  # At each point, a stage's latest run: its speedup is taken in that run where stage 4 was
  # measured in it too (grid_over); else each is first divided by torch-flash in its latest run
  # that timed it, and the speedup is the ratio of those ratios (grid_via), so only numbers from one run are
  # compared. Lines "stage causal N speedup"; the stages taken across runs go to cross.txt, the
  # runs every line was drawn from to used.txt.
  : > "$tmp/cross.txt"; : > "$tmp/used.txt"
  csv_awk -f grid.awk -v cross="$tmp/cross.txt" -v used="$tmp/used.txt" '{ grid_add() }
    END {
      for (k in G_last) {
        split(k, f, SUBSEP); s = f[1]; split(f[3], p, " ")
        if (s !~ /^stage[0-9]+$/ || s == "stage4" || f[2] != "fwd" || p[1] != 64) continue
        sel = "d=64 causal=" p[2] " n=" p[3]
        if (grid_over(s, "stage4", "fwd", "", sel)) { print s, p[2], p[3], OV_q[1]; print s, OV_run > used; print "stage4", OV_run > used }
        else if (grid_via(s, "stage4", "torch-flash", "fwd", sel)) {
          print s, p[2], p[3], OV_q[1]; print s, OV_run, OV_run_y > cross; print s, OV_run > used; print "stage4", OV_run_y > used }
      }
    }' "$csv" | sort -k1,1V -k2,2n -k3,3n > "$tmp/speedup.dat"
  paper_csv="$data/anchors/fa2_paper_a100.csv"
  if [ -s "$paper_csv" ]; then
    csv_awk '{ print get("seqlen"), get("speedup") }' "$paper_csv" > "$tmp/paper.dat"
  else
    echo "NaN NaN" > "$tmp/paper.dat"   # drawn as nothing; the note says why
  fi
  mapfile -t series < <(cut -d' ' -f1 "$tmp/speedup.dat" | order_series)
  if [ ${#series[@]} -gt 0 ]; then
    titles=""
    for s in "${series[@]}"; do
      t=$(title_of "$s")
      if grep -q "^$s " "$tmp/cross.txt"; then t="$t †"; fi
      titles="$titles${titles:+|}$t"
    done
    note=$(sort -u "$tmp/cross.txt" | sort -V | awk '{ if (!($1 in seen)) { seen[$1]; e = "stage " substr($1, 6) " (" $2 ")"
        # a line of at most about 110 characters (a longer one runs off the image)
        if (s != "" && length(line) + length(e) > 110) { s = s ",\\n"; line = "" } else if (s != "") s = s ", "
        s = s e; line = line e ", " }; base = $3 }
      END { if (s != "") printf "† %s measured in another run than stage 4 (%s):\\nspeedup = (stage / torch-flash in its run) ÷ (stage 4 / torch-flash in stage 4'"'"'s run)", s, base }')
    # a stage with rows at d = 64 but no speedup (neither stage 4 nor torch-flash in its run)
    read -r -a unpaired <<< "$(csv_awk -v drawn=" ${series[*]} " '
      get("direction") == "fwd" && get("dim") == 64 && get("stage") ~ /^stage[0-9]+$/ && get("stage") != "stage4" &&
      get("batch") * get("seqlen") == 16384 && get("heads") * get("dim") == 2048 && index(drawn, " " get("stage") " ") == 0 { s[get("stage")] }
      END { for (k in s) print k }' "$csv" | sort -V | paste -sd' ')"
    if [ ${#unpaired[@]} -gt 0 ]; then
      note="${note}${note:+\\n}$(stages_phrase "${unpaired[@]}"): measured, but with neither stage 4 nor torch-flash in the same run, so no speedup drawn"
    fi
    missing=$(missing_note fwd)
    if [ -n "$missing" ]; then note="$missing${note:+\\n}$note"; fi
    if [ ! -s "$paper_csv" ]; then note="${note}${note:+\\n}The FA-2 paper's figures: no ${paper_csv#"$root"/}, not drawn"; fi
    # Why ours grow with N while the paper's stay near 2×: the grid of stages 4 to 7 at d = 64 is
    # B·H = (16384 / N) · (2048 / 64) blocks, one per (batch, head); under the SM count the rest idle.
    sms=$(gpu_sms "$gpu")
    heads=$((2048 / 64))
    last_bh=$(( ${GRID_STAGE#stage} - 1 ))
    why="Stages 4 to $last_bh launch one block per (batch, head), B·H = $heads · 16384 / N blocks (top axis)"
    idle_n=""
    for n in 512 1024 2048 4096 8192 16384; do
      if [ -n "$sms" ] && [ $((heads * 16384 / n)) -lt "$sms" ]; then idle_n=$n; break; fi
    done
    if [ -n "$idle_n" ]; then
      why="$why,\\nfewer than the $GPU's $sms SMs from N = $(kilo "$idle_n") on (shaded; $heads at N = 16k), leaving most SMs idle."
    else
      why="$why,\\nat long N too few to fill the $GPU's SMs."
    fi
    # what the grid over Q tiles bought, where a stage that has it is drawn
    grid_drawn=""
    for s in "${series[@]}"; do if [ "${s#stage}" -ge "${GRID_STAGE#stage}" ]; then grid_drawn=1; fi; done
    why="$why From stage ${GRID_STAGE#stage} on, a block per Q tile\\nas well fills them$([ -n "$grid_drawn" ] && echo ", and the speedup grows with N" || echo " (not measured yet here)"). The paper's figures: FA-2 over FA-1's own CUDA implementation, on an A100 (108 SMs)."
    runs=$(sort -V "$tmp/used.txt" | runs_of | wrap_list 110) # the runs the lines were drawn from
    heading="Speedup over stage 4 (FA-1), forward, d = 64, $GPU, fp16, B·N = 16k, H = $heads\\nruns (commit): $runs"
    render speedup "${gpu}_speedup" "$(gpstr data "$tmp/speedup.dat")" "$(gpstr series "${series[*]}")" \
      "$(gpstr titles "$titles")" "$(gpstr heading "$heading")" "$(gpstr note "$note")" \
      "$(gpstr paper "$tmp/paper.dat")" "$(gpstr why "$why")" "sms=${sms:-0}" "heads=$heads"
  else
    echo "plot.sh: ${csv#"$root"/} has no stage 4 rows at d = 64 beside another stage's: no ${outdir#"$root"/}/${gpu}_speedup chart" >&2
  fi

  # ---- (e) HBM bytes: the formula beside Nsight Compute ----
  hbm="$data/${gpu}_hbm.csv"
  if [ -s "$hbm" ]; then
    # the latest row of each stage, in stage order, as hbm.gp reads it:
    #   idx stage Q KV O O_work rowstats dram_read dram_write
    # and beside it the shapes (one, unless the rows disagree) and the runs ("stage commit")
    # and the stages whose measured bytes fall under 90% of the formula ("stage9 0.61 2.22", GB)
    csv_awk -v dat="$tmp/hbm.dat" -v shapes="$tmp/hbm_shape.txt" -v runs="$tmp/hbm_runs.txt" -v below="$tmp/hbm_below.txt" '
      { s = get("stage")
        last[s] = get("hbm_q_bytes") " " get("hbm_kv_bytes") " " get("hbm_o_bytes") " " get("hbm_o_work_bytes") " " \
                  get("hbm_rowstats_bytes") " " get("dram_read_bytes") " " get("dram_write_bytes")
        shape[s] = sprintf("B = %s, H = %s, N = %s, d = %s, %s, %s", get("batch"), get("heads"), get("seqlen"), get("dim"),
                           get("dtype"), get("causal") == 1 ? "causal" : "not causal")
        run[s] = get("commit") }
      END {
        n = 0; for (s in last) st[++n] = s
        for (i = 2; i <= n; i++) for (j = i; j > 1 && substr(st[j], 6) + 0 < substr(st[j - 1], 6) + 0; j--) { t = st[j]; st[j] = st[j - 1]; st[j - 1] = t }
        for (i = 1; i <= n; i++) {
          print i, st[i], last[st[i]] > dat; print st[i], run[st[i]] > runs
          split(last[st[i]], b, " "); f = b[1] + b[2] + b[3] + b[4] + b[5]; m = b[6] + b[7]
          if (b[6] != "" && f > 0 && m < 0.9 * f) printf "%s %.2f %.2f\n", st[i], m / 1e9, f / 1e9 > below
          if (!(shape[st[i]] in seen)) { seen[shape[st[i]]]; printf "%s%s", k++ ? " / " : "", shape[st[i]] > shapes }
        } }' "$hbm"
    touch "$tmp/hbm_below.txt"
    shape=$(cat "$tmp/hbm_shape.txt")
    runs=$(runs_of < "$tmp/hbm_runs.txt" | wrap_list 110)
    # the stages make bench-ncu measures (the forward GPU stages) with no row here yet
    read -r -a ncu_missing <<< "$(csv_awk -v bins="$FWD_BINS" '{ seen[get("stage")] }
      END { n = split(bins, b, " "); for (i = 1; i <= n; i++) if (!(b[i] in seen)) printf "%s ", b[i] }' "$hbm")"
    heading="HBM bytes of one forward, $GPU, at the shape Nsight Compute measured: $shape\\nleft bar: the stage's formula (what its loop structure moves), term by term\\nright bar: the DRAM bytes Nsight Compute measured, first launch\\nruns (commit): $runs"
    # under the chart: why a measured bar can fall short of its formula, where one does here
    l2=$(gpu_l2 "$gpu")
    l2=${l2:+the L2 cache ($l2 on the $GPU)}
    if [ -s "$tmp/hbm_below.txt" ]; then
      below=$(sort -V "$tmp/hbm_below.txt" | awk '{ printf "%s%s: %s GB against %s", (NR > 1 ? "; " : ""), "stage " substr($1, 6), $2, $3 }')
      note="Why a measured bar falls short of its formula ($below): ${l2:-the L2 cache} serves $([ "$(wc -l < "$tmp/hbm_below.txt")" -gt 1 ] && echo their || echo its) repeated reads of the same K/V tiles, so DRAM sees less than the loop structure requests."
    else
      note="Every stage's measured bytes are within 10% of its formula at this shape: DRAM sees what the loop structure requests."
    fi
    note=$(wrap_text 38 <<< "$note")
    if [ ${#ncu_missing[@]} -gt 0 ]; then
      note="$note\\n\\n$(wrap_text 38 <<< "Not measured yet (make bench-ncu): $(stages_phrase "${ncu_missing[@]}")")"
    fi
    render hbm "${gpu}_hbm" "$(gpstr data "$tmp/hbm.dat")" "$(gpstr heading "$heading")" "$(gpstr note "$note")"
  else
    echo "plot.sh: no ${hbm#"$root"/}: the HBM chart (formula against Nsight Compute) needs make bench-ncu on a GPU with ncu; not drawn" >&2
  fi
done

# ---- (f) the CPU stages' GFLOP/s, and (d) memory against N ----
cpu="$data/cpu.csv"
if [ -s "$cpu" ]; then
  # The CPU rows are drawn at one shape, the latest run's: the (batch, heads) of the file's last
  # row at d = 64, not causal (rows at another shape, such as the first runs' B = H = 1 beside
  # today's B = 1, H = 8, stay out, and the chart says how many). "B H" into cpu_shape.
  csv_awk 'get("direction") == "fwd" && get("dim") == 64 && get("causal") == 0 { s = get("batch") " " get("heads") }
    END { print s }' "$cpu" > "$tmp/cpu_shape"
  read -r cpu_b cpu_h < "$tmp/cpu_shape"
  if [ "$cpu_b" = 1 ] && [ "$cpu_h" = 1 ]; then cpu_shape_text="one (batch, head)"; else cpu_shape_text="B = $cpu_b, H = $cpu_h"; fi
  # the latest row of each (series, N) at that shape, d = 64, not causal, into
  #   cpu.dat      "series N gflops": GFLOP/s from ms_median (the tflops column keeps three
  #                decimals, too few for a CPU; 4·B·H·N^2·d FLOPs)
  #   memory.dat   "stage@cpu N bytes" for stages 1 and 3: one (batch, head)'s Q, K, V, O in fp32
  #                (4 N d elements) and L (N fp32), and the scratch the harness measured
  #                (extra_bytes: the run's, whatever its B and H; stage 1 holds one head's N x N)
  #   cpu_meta.txt "series threads commit", machines.txt the processors, cpu_cap.txt stage 1's
  #   cap, cpu_other.txt the rows at other shapes ("B = 1, H = 1: 20 rows")
  csv_awk -v B="$cpu_b" -v H="$cpu_h" -v dat="$tmp/cpu.dat" -v mem="$tmp/memory.dat" -v meta="$tmp/cpu_meta.txt" \
          -v machines="$tmp/machines.txt" -v capf="$tmp/cpu_cap.txt" -v otherf="$tmp/cpu_other.txt" '
    get("direction") == "fwd" && get("dim") == 64 && get("causal") == 0 && (get("batch") != B || get("heads") != H) {
      o = "B = " get("batch") ", H = " get("heads"); if (!(o in other)) oorder[++no] = o; other[o]++; next }
    get("direction") == "fwd" && get("dim") == 64 && get("causal") == 0 {
      s = get("stage"); n = get("seqlen"); d = get("dim"); k = s " " n
      if (!(k in gf)) keys[++nk] = k
      gf[k] = 4 * B * H * n * n * d / (get("ms_median") * 1e-3) / 1e9
      bytes[k] = 4 * n * d * 4 + 4 * n + get("extra_bytes")
      th[s] = get("threads"); run[s] = get("commit"); mach[k] = get("machine")
      if (s == "stage1" && n + 0 > m1) m1 = n + 0
      if (s ~ /^stage/ && n + 0 > m) m = n + 0 }
    END {
      for (i = 1; i <= nk; i++) {
        print keys[i], gf[keys[i]] > dat; split(keys[i], f, " ")
        if (f[1] == "stage1" || f[1] == "stage3") print f[1] "@cpu", f[2], bytes[keys[i]] > mem }
      for (s in th) print s, th[s], run[s] > meta
      for (k in mach) print mach[k] > machines
      if (m1 && m1 < m) printf "\\nstage 1 (4·N^2 bytes of scores, one thread) measured up to N = %d", m1 > capf
      for (i = 1; i <= no; i++) printf "%s%s: %d rows", (i > 1 ? "; " : ""), oorder[i], other[oorder[i]] > otherf
    }' "$cpu"
  touch "$tmp/cpu.dat" "$tmp/memory.dat" "$tmp/cpu_meta.txt" "$tmp/machines.txt" "$tmp/cpu_cap.txt" "$tmp/cpu_other.txt"
  sort -k1,1V -k2,2n -o "$tmp/cpu.dat" "$tmp/cpu.dat"
  sort -k1,1V -k2,2n -o "$tmp/memory.dat" "$tmp/memory.dat"
  mapfile -t series < <(cut -d' ' -f1 "$tmp/cpu.dat" | order_series)
  titles=""
  for s in "${series[@]}"; do
    th=$(awk -v s="$s" '$1 == s { print $2 }' "$tmp/cpu_meta.txt")
    titles="$titles${titles:+|}$(title_of "$s") ($th thread$([ "$th" = 1 ] || echo s))"
  done
  machine=$(sort -u "$tmp/machines.txt" | paste -sd';' | sed 's/;/; /g')
  runs=$(awk '{ print $1, $3 }' "$tmp/cpu_meta.txt" | sort -V | runs_of)
  heading="CPU stages, fp32, $cpu_shape_text, d = 64, not causal, on $machine$(cat "$tmp/cpu_cap.txt")\\nruns (commit): $runs"
  # the yardstick, as torch-flash is on the GPU charts: drawn where measured, else named
  if ! grep -q '^cpu-blas ' "$tmp/cpu.dat"; then
    heading="$heading\\ncpu-blas: not measured yet (make bench-cpu with libopenblas-dev)"
  fi
  if [ -s "$tmp/cpu_other.txt" ]; then
    heading="$heading\\nnot drawn, measured at another shape: $(cat "$tmp/cpu_other.txt")"
  fi
  render cpu cpu "$(gpstr data "$tmp/cpu.dat")" "$(gpstr series "${series[*]}")" "$(gpstr titles "$titles")" \
    "$(gpstr heading "$heading")"

  # memory for one (batch, head): the CPU stages 1 and 3 at the CPU rows' shape (above), and the production
  # GPU forward from each GPU's grid rows (d = 64, not causal): Q, K, V, O at the row's dtype, L in
  # fp32 and the scratch it measured, divided by B * H (it allocates none). Lines "series N bytes".
  mem_titles=()
  for s in stage1 stage3; do
    if grep -q "^$s@cpu " "$tmp/memory.dat"; then mem_titles+=("$(title_of "$s") (CPU, fp32)"); fi
  done
  mem_missing=""
  for csv in "${gpu_csvs[@]}"; do
    gpu=$(basename "$csv" .csv)
    csv_awk -v s="$MEM_GPU_STAGE" -v g="$gpu" '
      get("stage") == s && get("direction") == "fwd" && get("dim") == 64 && get("causal") == 0 &&
      get("batch") * get("seqlen") == 16384 && get("heads") * get("dim") == 2048 {
        n = get("seqlen"); d = get("dim"); e = (get("dtype") == "fp32") ? 4 : 2
        last[n] = s "@" g " " n " " (4 * n * d * e + 4 * n) + get("extra_bytes") / (get("batch") * get("heads")) }
      END { for (n in last) print last[n] }' "$csv" | sort -k2,2n > "$tmp/mem_gpu.dat"
    if [ -s "$tmp/mem_gpu.dat" ]; then
      cat "$tmp/mem_gpu.dat" >> "$tmp/memory.dat"
      mem_titles+=("$(title_of "$MEM_GPU_STAGE") ($(echo "$gpu" | tr 'a-z' 'A-Z'), fp16)")
    else
      mem_missing="$mem_missing${mem_missing:+; }$(echo "$gpu" | tr 'a-z' 'A-Z')"
    fi
  done
  mapfile -t series < <(cut -d' ' -f1 "$tmp/memory.dat" | awk '!seen[$0]++')
  titles=$(printf '%s|' "${mem_titles[@]}")
  n_gpu=${MEM_GPU_STAGE#stage}
  heading="Memory for one (batch, head) against N, d = 64, measured\\nQ, K, V, O at the stage's dtype + L in fp32 + the scratch the harness measured (stage $n_gpu needs none)"
  if [ "$cpu_shape_text" != "one (batch, head)" ]; then
    heading="$heading\\nCPU stages: the scratch of a run at $cpu_shape_text, whole (stage 1 holds one head's N x N at a time)"
  fi
  if [ -n "$mem_missing" ]; then
    heading="$heading\\nstage $n_gpu on the GPU ($mem_missing): no rows yet (make bench), not drawn"
  fi
  render memory memory "$(gpstr data "$tmp/memory.dat")" "$(gpstr series "${series[*]}")" "$(gpstr titles "${titles%|}")" \
    "$(gpstr heading "$heading")"
else
  echo "plot.sh: no ${cpu#"$root"/}: the CPU and memory charts need make bench-cpu; not drawn" >&2
fi

# ---- the README's results table ----
if [ -n "${DATA:-}" ]; then
  echo "plot.sh: DATA=$DATA: the README's results table (drawn from bench/data/ alone) left as it is" >&2
elif [ ${#gpu_csvs[@]} -gt 0 ]; then
  ./readme_table.sh --splice "$README"
  echo "${README#"$root"/}: results table"
else
  echo "plot.sh: no GPU CSV under bench/data/ (make bench on a GPU): ${README#"$root"/}'s results table left as it is" >&2
fi
