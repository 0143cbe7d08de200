# flops.gp: TFLOP/s against sequence length, one panel per (head dim, causal), a line per stage
# and per PyTorch backend: the FlashAttention-2 paper's benchmark figure, redone stage by stage.
# Charts (a) forward and (c) backward. Rendered by plots/plot.sh (make plots), which sets, besides
# style.gp's variables: data (lines "series d causal N tflops"), dir ('fwd' or 'bwd'), heading
# (the title, "\n" between lines) and note (lines under the panels, or ''; style.gp's line on the
# nudged markers is added to it).
load 'style.gp'
eval terminal(1500, 1450)

set multiplot title heading font ',15'
set logscale x 2
set xrange [360:23000]
set xtics ('512' 512, '1k' 1024, '2k' 2048, '4k' 4096, '8k' 8192, '16k' 16384)
set xlabel 'sequence length N (tokens)'
set ylabel sprintf('%s TFLOP/s', dir eq 'fwd' ? 'forward' : 'backward')
set yrange [0:*]
unset key
panel = 0
do for [d in '64 128'] {
  do for [c in '0 1'] {
    # panels: d = 64 on top, d = 128 below; not causal left, causal right
    x0 = c eq '0' ? 0.07 : 0.56
    y0 = d eq '64' ? 0.61 : 0.26
    eval place(x0, x0 + 0.42, y0, y0 + 0.26)
    set title sprintf('d = %s, %s', d, c eq '1' ? 'causal' : 'not causal') font ',14'
    # each series nudged sideways a little (style.gp's nudge), so that coinciding markers show
    plot for [i = 1:words(series)] data \
         using (strcol(1) eq word(series, i) && $2 == d + 0 && $3 == c + 0 ? $4 * nudge(word(series, i)) : NaN):5 \
         with linespoints ls style(word(series, i)) notitle
  }
}
# one key for the four panels, in a strip under them
eval keystrip(0.005, 0.17)
set key center center horizontal Left reverse spacing 1.3 samplen 6 box font ',13'
caption = strlen(note) > 0 ? note . "\n" . nudged : nudged
# a label's first line sits at its y and the others below it: raise it a line's height (0.015 of
# the height) for each line past two, so that its last line stays above the key's strip
lines = 1
do for [i = 1:strlen(caption)] { if (caption[i:i] eq "\n") { lines = lines + 1 } }
set label 1 caption at screen 0.5, 0.2 + 0.014 * (lines > 2 ? lines - 2 : 0) center font ',13' tc rgb '#404040' noenhanced
plot for [i = 1:words(series)] NaN with linespoints ls style(word(series, i)) title field(titles, i)
unset multiplot
