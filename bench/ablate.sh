#!/usr/bin/env bash
# ablate.sh: each ablation (bench/ablations/NN_what.cu: stage NN's kernel with one piece taken out,
# built by `make ablations`) timed beside its stage, in one run, over the benchmark grid's shapes
# (16k tokens per batch, hidden 2048), each shape's pair back to back, the pair ROUNDS times in
# alternating order. Every row is checked (a sample of heads and rows, as the stages' own runs).
# A program that refuses a shape (exit 2: the decode stage's ablation takes at most 64 queries) is
# skipped there. Rows go to bench/data/runs/<gpu>_ablations.csv, the stage's column naming the ablation
# ("stage13-no-overlap"); then one line per shape: the ablation's median time over the stage's,
# from this run's rows. Run through `make ablate` on a machine with a GPU.
# Environment: ABLATIONS ("13_no_overlap 14_one_section"; default every one built), SEQLENS, DIMS,
# DTYPES, CAUSAL ("0 1"), WARMUP, ITERS, ROUNDS, FA_COMMIT (the commit the rows name).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/csv.sh
ABLATIONS=${ABLATIONS:-$(for f in bench/ablations/*.cu; do n=${f##*/}; n=${n%.cu}; [ -x "bench/ablations/$n" ] && echo "$n"; done)}
SEQLENS=${SEQLENS:-"1024 4096 16384"}
DIMS=${DIMS:-"64 128 256"}
DTYPES=${DTYPES:-fp16}
CAUSAL=${CAUSAL:-"0 1"}
WARMUP=${WARMUP:-3}
ITERS=${ITERS:-10}
ROUNDS=${ROUNDS:-2}
export FA_COMMIT=${FA_COMMIT:-unknown}
[ -n "$ABLATIONS" ] || { echo "ablate: no ablation built (make ablations)" >&2; exit 2; }

rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
header=""
failed=0
# Rows so far into bench/data/runs/<gpu>_ablations.csv: at the end, or when the run is stopped (a
# time limit's SIGTERM, ^C), so that a run cut short keeps every pair it finished, as bench.sh does.
keep_rows() { csv_keep_rows ablate "bench/data/runs/%s_ablations.csv" "$header" "$rows"; }
trap 'echo "ablate: stopped before the end" >&2; keep_rows; exit 130' INT TERM
run() { # program, then its arguments: its CSV row into $rows (or the line why not)
  local out rc=0
  out=$("$@" --csv 2>&1) || rc=$?
  if [ "$rc" = 2 ]; then return 0; fi # refused (a head dim or dtype it does not take)
  if [ "$rc" != 0 ]; then echo "ablate: $* failed (exit $rc): $(tail -n1 <<< "$out")" >&2; failed=1; return 0; fi
  [ -n "$header" ] || header=$(head -n1 <<< "$out")
  sed -n 2p <<< "$out" >> "$rows"
}
for a in $ABLATIONS; do
  prog="bench/ablations/$a"
  [ -x "$prog" ] || { echo "ablate: $prog is not built (make ablations)" >&2; exit 2; }
  n=${a%%_*}; stage="./stage$((10#$n))"
  [ -x "$stage" ] || { echo "ablate: $stage is not built" >&2; exit 2; }
  # stage 10's ablation changes how --deterministic adds dQ: both run with it; a floor or a part
  # (an ablation whose output is wrong on purpose: 18_free_exp, 18_exp_only, 18_exp_only_mufu, 18_max_exp,
  # 19_free_exp, 19_mm_only, 19_quant_only) runs without the check, its rows marked skip; stage 19
  # takes fp8 alone
  extra=(); case $a in 10_*) extra=(--deterministic) ;; *_free_exp | *_exp_only* | *_max_exp | *_mm_only | *_quant_only) extra=(--no-check) ;; esac
  dtypes=$DTYPES; case $a in 19_*) dtypes=fp8 ;; esac
  for t in $dtypes; do for d in $DIMS; do for N in $SEQLENS; do for c in $CAUSAL; do
    args=(--batch $((16384 / N)) --heads $((2048 / d)) --seqlen "$N" --dim "$d" --dtype "$t" --warmup "$WARMUP" --iters "$ITERS" "${extra[@]}")
    [ "$c" = 1 ] && args+=(--causal)
    for ((r = 0; r < ROUNDS; r++)); do
      if ((r % 2 == 0)); then run "$stage" "${args[@]}"; run "$prog" "${args[@]}";
      else run "$prog" "${args[@]}"; run "$stage" "${args[@]}"; fi
    done
    echo "ablate: $a $t d=$d N=$N causal=$c done" >&2
  done; done; done; done
done
[ -n "$header" ] || { echo "ablate: no rows" >&2; exit 1; }
trap - INT TERM
# the ablation's median time over its stage's, per shape, from this run's rows
{ echo "$header"; cat "$rows"; } | csv_awk '
  function key() { return get("dtype") " d=" get("dim") " N=" get("seqlen") (get("causal") == 1 ? " causal" : "") }
  { s = get("stage"); k = key(); n[s, k]++; t[s, k, n[s, k]] = get("ms_median") + 0; if (!(k in seen)) { seen[k] = 1; keys[++nk] = k }
    if (s ~ /-/) { base = s; sub(/-.*/, "", base); of[s] = base; if (!(s in named)) { named[s] = 1; abl[++na] = s } } }
  function med(s, k,   m, i, j, x, v) { m = n[s, k]; for (i = 1; i <= m; i++) v[i] = t[s, k, i]
    for (i = 2; i <= m; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
    return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2 }
  END { for (i = 1; i <= na; i++) for (j = 1; j <= nk; j++) { s = abl[i]; k = keys[j]
          if (n[s, k] && n[of[s], k]) printf "%-22s %-28s %8.3f ms against %8.3f ms (%s): %.3fx the time\n", s, k, med(s, k), med(of[s], k), of[s], med(s, k) / med(of[s], k) } }'
keep_rows
exit $failed
