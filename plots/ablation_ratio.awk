# ablation_ratio.awk: for a CSV of timing rows with a "round" column (column 21) where each round times the
# stage ("stage19" rows, averaged within the round and shape) beside variants, print per variant and head dim
# the range over shapes and rounds of the stage's time over the variant's (above 1: the variant is faster).
# Run: awk -v stage=stage19 -f plots/ablation_ratio.awk bench/data/runs/h200_1aa5952_stage19_ablations.csv | sort
BEGIN { FS = "," }
NR > 1 { k = $8 " " $7 " " $9 " " $21; if ($1 == stage) { s[k] += $10; n[k]++ } else { t[$1 SUBSEP k] = $10; names[$1] = 1; dims[$1 SUBSEP $8] = 1 } }
END { for (a in names) for (d = 64; d <= 256; d *= 2) if ((a SUBSEP d) in dims) { lo = 9; hi = 0
        for (x in t) { split(x, p, SUBSEP); if (p[1] != a) continue; split(p[2], q, " "); if (q[1] != d) continue
          r = (s[p[2]] / n[p[2]]) / t[x]; if (r < lo) lo = r; if (r > hi) hi = r }
        printf "%-22s d=%-3d stage / variant %.3f to %.3f\n", a, d, lo, hi } }
