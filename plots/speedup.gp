# speedup.gp: chart (b), each GPU stage's forward speedup over stage 4 (FA-1) against N at d = 64,
# with the FlashAttention-2 paper's A100 figures for FA-2 over FA-1 beside ours.
# Rendered by plots/plot.sh (make plots), which sets, besides style.gp's variables: data (lines
# "series causal N speedup"), paper (lines "seqlen speedup" from bench/data/anchors/fa2_paper_a100.csv),
# heading, note (under the key, or ''), why (the caption that says why ours grow with N, "\n"
# between lines), heads (H at d = 64) and sms (the GPU's SM count, 0 if not known).
#
# The top axis gives stage 4's grid at each N: one block per (batch, head), B·H = heads · 16384 / N
# blocks. Where that is fewer than the SMs (sms > 0) the panel is shaded: there stages 4 to 7 leave
# SMs idle, and a stage with a block per Q tile pulls away.
load 'style.gp'
eval terminal(1500, 1000)

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

# the top axis: stage 4's blocks at each N of the grid
set logscale x2 2
set x2range [360:23000]
set x2tics ('1024' 512) font ',12' tc rgb '#505050'
do for [k = 10:14] { set x2tics add (sprintf('%d', heads * 16384 / 2**k) 2**k) }
set x2label (sms > 0 ? sprintf("stage 4's blocks, B·H (shaded: fewer than the %d SMs)", sms) : "stage 4's blocks, B·H") \
    font ',12' tc rgb '#505050' offset 0, -0.3
set grid xtics ytics
if (sms > 0) {
  set object 1 rect from first heads * 16384.0 / sms, graph 0 to graph 1, graph 1 behind fc rgb '#ececec' fs solid 1.0 noborder
}

eval place(0.07, 0.49, 0.44, 0.81)
set title 'not causal (the FA-2 paper'."'".'s figures: not causal, d = 64, A100)' font ',14' offset 0, 0.6
plot 1 with lines ls 14 notitle, \
     for [i = 1:words(series)] data using (strcol(1) eq word(series, i) && $2 == 0 ? $3 * nudge(word(series, i)) : NaN):4 \
         with linespoints ls style(word(series, i)) notitle, \
     paper using ($1 * nudge('paper')):2 with linespoints ls style('paper') notitle

eval place(0.56, 0.98, 0.44, 0.81)
set title 'causal' font ',14'
plot 1 with lines ls 14 notitle, \
     for [i = 1:words(series)] data using (strcol(1) eq word(series, i) && $2 == 1 ? $3 * nudge(word(series, i)) : NaN):4 \
         with linespoints ls style(word(series, i)) notitle

# one key for both panels, in a strip under them, then the caption: why, and the notes
eval keystrip(0.2, 0.375)
set key center center vertical Left reverse maxrows 7 spacing 1.2 samplen 6 box font ',13'
set label 1 why at screen 0.5, 0.175 center font ',13' tc rgb '#202020' noenhanced
caption = strlen(note) > 0 ? note . "\n" . nudged : nudged
set label 2 caption at screen 0.5, 0.1 center font ',12' tc rgb '#404040' noenhanced
plot 1 / 0 with lines ls 14 title 'stage 4 (= 1×)', \
     for [i = 1:words(series)] NaN with linespoints ls style(word(series, i)) title field(titles, i), \
     NaN with linespoints ls style('paper') title 'FA-2 paper, A100: FA-2 over FA-1'
unset multiplot
