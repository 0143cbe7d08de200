# speedup.gp: chart (b), each GPU stage's forward speedup over stage 4 (FA-1) against N at d = 64,
# with the FlashAttention-2 paper's A100 figures for FA-2 over FA-1 beside ours.
# Rendered by plots/plot.sh (make plots), which sets, besides style.gp's variables: data (lines
# "series causal N speedup"), paper (lines "seqlen speedup" from bench/data/anchors/fa2_paper_a100.csv),
# heading and note (under the key, or '').
load 'style.gp'
eval terminal(1500, 900)

set multiplot title heading font ',15'
set logscale x 2
set xrange [360:23000]
set xtics ('512' 512, '1k' 1024, '2k' 2048, '4k' 4096, '8k' 8192, '16k' 16384)
set xlabel 'sequence length N (tokens)'
set logscale y 2
set yrange [0.8:64]
set ytics ('1×' 1, '2×' 2, '4×' 4, '8×' 8, '16×' 16, '32×' 32, '64×' 64)
set ylabel 'speedup over stage 4 (ratio of TFLOP/s)'
unset key

eval place(0.07, 0.49, 0.4, 0.84)
set title 'not causal (the FA-2 paper'."'".'s figures: not causal, d = 64, A100)' font ',14'
plot 1 with lines ls 14 notitle, \
     for [i = 1:words(series)] data using (strcol(1) eq word(series, i) && $2 == 0 ? $3 : NaN):4 \
         with linespoints ls style(word(series, i)) notitle, \
     paper using 1:2 with linespoints ls style('paper') notitle

eval place(0.56, 0.98, 0.4, 0.84)
set title 'causal' font ',14'
plot 1 with lines ls 14 notitle, \
     for [i = 1:words(series)] data using (strcol(1) eq word(series, i) && $2 == 1 ? $3 : NaN):4 \
         with linespoints ls style(word(series, i)) notitle

# one key for both panels, in a strip under them
eval keystrip(0.06, 0.27)
set key center center horizontal Left reverse spacing 1.3 samplen 5 box font ',13'
if (strlen(note) > 0) { set label 1 note at screen 0.5, 0.03 center font ',12' tc rgb '#404040' noenhanced }
plot 1 / 0 with lines ls 14 title 'stage 4 (= 1×)', \
     for [i = 1:words(series)] NaN with linespoints ls style(word(series, i)) title field(titles, i), \
     NaN with linespoints ls style('paper') title 'FA-2 paper, A100: FlashAttention-2 over FlashAttention (FA-1)'
unset multiplot
