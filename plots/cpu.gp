# cpu.gp: chart (f), the CPU stages' GFLOP/s against sequence length, and the yardstick cpu-blas
# (bench/data/cpu.csv, from make bench-cpu). Rendered by plots/plot.sh (make plots), which sets,
# besides style.gp's variables: data (lines "series N gflops") and heading (up to five lines).
load 'style.gp'
eval terminal(1100, 800)

set multiplot title heading font ',14'
eval place(0.08, 0.97, 0.28, 0.82)
set logscale x 2
set xrange [180:23000]
set xtics ('256' 256, '512' 512, '1k' 1024, '2k' 2048, '4k' 4096, '8k' 8192, '16k' 16384)
set xlabel 'sequence length N (tokens)'
set ylabel 'GFLOP/s (4·B·H·N^2·d FLOPs / time)'
set yrange [0:*]
unset key
plot for [i = 1:words(series)] data using (strcol(1) eq word(series, i) ? $2 : NaN):3 \
     with linespoints ls style(word(series, i)) notitle

eval keystrip(0.01, 0.16)
set key center center horizontal Left reverse spacing 1.3 samplen 5 box font ',13'
plot for [i = 1:words(series)] NaN with linespoints ls style(word(series, i)) title field(titles, i)
unset multiplot
