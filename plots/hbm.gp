# hbm.gp: chart (e), the HBM bytes of one forward per GPU stage: the stage's formula (what its
# loop structure moves, split into Q, K and V, O, the O workspace and m, l, L) beside the DRAM
# bytes Nsight Compute measured (read and written). Rendered by plots/plot.sh (make plots) from
# bench/data/<gpu>_hbm.csv (make bench-ncu), which sets, besides style.gp's variables: data
# (lines "idx stage Q KV O O_work rowstats read write"), heading and note (the caption under the
# key: why a measured bar falls short of its formula, the stages not measured yet; "\n" between
# lines, each short enough for the column beside the bars).
load 'style.gp'
eval terminal(1300, 820)

set multiplot title heading font ',14'
eval place(0.07, 0.68, 0.1, 0.8)
set style fill solid 0.9 border rgb '#303030'
set boxwidth 0.36
stats data using 1 nooutput   # the stages drawn, idx 1 .. STATS_max: room for both bars of each
set xrange [0.4:STATS_max + 0.6]
set yrange [0:*]
set ylabel 'bytes moved to and from HBM (GB, 10^9 bytes)'
set xlabel 'GPU stage'
if (strlen(note) > 0) { set label 1 note at screen 0.71, 0.53 left font ',13' tc rgb '#202020' noenhanced }
set key at screen 0.71, 0.8 left top vertical Left reverse spacing 1.3 box font ',13'
# left bar at idx - 0.2 (formula, stacked), right bar at idx + 0.2 (measured, stacked)
GB = 1e9
plot data using 1:(NaN):xtic(sprintf('stage %s', strcol(2)[6:])) notitle, \
     ''   using ($1 - 0.2):(($3 + $4 + $5 + $6 + $7) / GB) with boxes lc rgb '#9467bd' title 'formula: m, l, L', \
     ''   using ($1 - 0.2):(($3 + $4 + $5 + $6) / GB) with boxes lc rgb '#d62728' title 'formula: O workspace (fp32)', \
     ''   using ($1 - 0.2):(($3 + $4 + $5) / GB) with boxes lc rgb '#2ca02c' title 'formula: O', \
     ''   using ($1 - 0.2):(($3 + $4) / GB) with boxes lc rgb '#1f77b4' title 'formula: K, V', \
     ''   using ($1 - 0.2):($3 / GB) with boxes lc rgb '#ff7f0e' title 'formula: Q', \
     ''   using ($1 + 0.2):(($8 + $9) / GB) with boxes lc rgb '#c8c8c8' title 'measured: DRAM written', \
     ''   using ($1 + 0.2):($8 / GB) with boxes lc rgb '#505050' title 'measured: DRAM read', \
     ''   using ($1 - 0.2):(($3 + $4 + $5 + $6 + $7) / GB):(sprintf('%.2f', ($3 + $4 + $5 + $6 + $7) / GB)) \
          with labels offset 0, 0.8 font ',12' notitle, \
     ''   using ($1 + 0.2):(($8 + $9) / GB):(sprintf('%.2f', ($8 + $9) / GB)) with labels offset 0, 0.8 font ',12' notitle
unset multiplot
