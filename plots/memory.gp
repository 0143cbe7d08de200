# memory.gp: chart (d), the memory one (batch, head) needs against N, measured: stage 1's N x N
# score matrix (quadratic) beside stage 3 and stage 9 (linear). Rendered by plots/plot.sh
# (make plots), which sets, besides style.gp's variables: data (lines "series N bytes") and heading.
load 'style.gp'
eval terminal(1100, 900)

set multiplot title heading font ',14'
eval place(0.11, 0.97, 0.3, 0.88)
set logscale x 2
set xrange [180:23000]
set xtics ('256' 256, '512' 512, '1k' 1024, '2k' 2048, '4k' 4096, '8k' 8192, '16k' 16384)
set xlabel 'sequence length N (tokens)'
set logscale y 4
set yrange [65536:2**32]
set ytics ('64 KiB' 2**16, '256 KiB' 2**18, '1 MiB' 2**20, '4 MiB' 2**22, '16 MiB' 2**24, '64 MiB' 2**26, \
           '256 MiB' 2**28, '1 GiB' 2**30, '4 GiB' 2**32)
set ylabel 'bytes for one (batch, head): Q, K, V, O, L + scratch'
unset key
plot 4 * x**2 with lines ls 14 notitle, \
     for [i = 1:words(series)] data using (strcol(1) eq word(series, i) ? $2 : NaN):3 \
     with linespoints ls style(word(series, i)) notitle

eval keystrip(0.01, 0.19)
set key center center vertical Left reverse spacing 1.3 samplen 5 box font ',13'
plot NaN with lines ls 14 title '4·N^2 bytes: one N × N fp32 score matrix (formula, for reference)', \
     for [i = 1:words(series)] NaN with linespoints ls style(word(series, i)) title field(titles, i)
unset multiplot
