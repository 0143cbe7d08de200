# style.gp: what every chart shares, loaded first by each plots/*.gp. Not run on its own.
#
# Variables the caller (plots/plot.sh) sets with gnuplot -e:
#   fmt     'png' (pngcairo) or 'svg'
#   out     the image to write
#   series  the lines to draw, as words: stage4 stage5 torch-flash ...
#   titles  their key entries, separated by '|', in the same order
# A chart sets width and height with `eval terminal(width, height)`, places each panel with
# `eval place(left, right, bottom, top)` (screen fractions) and may draw its key alone in a strip
# of its own with `eval keystrip(bottom, top)` followed by a plot of NaN lines.

terminal(w, h) = fmt eq 'svg' \
    ? sprintf("set terminal svg size %d,%d dynamic enhanced font 'Sans,13' background rgb 'white'; set output '%s'", w, h, out) \
    : sprintf("set terminal pngcairo size %d,%d enhanced font 'Sans,13' background rgb 'white'; set output '%s'", w, h, out)

place(l, r, b, t) = sprintf("set lmargin at screen %g; set rmargin at screen %g; set bmargin at screen %g; set tmargin at screen %g", l, r, b, t)
keystrip(b, t) = place(0.02, 0.98, b, t) . "; unset border; unset tics; unset grid; unset xlabel; unset x2label; unset ylabel; unset title; unset logscale; unset object; set xrange [0:1]; set yrange [0:1]"

# field(s, i): the i-th '|'-separated part of s (titles may contain spaces, so word() cannot split them)
bar(s) = strstrt(s, '|')
field(s, i) = i <= 1 ? (bar(s) ? s[1:bar(s) - 1] : s) : (bar(s) ? field(s[bar(s) + 1:], i - 1) : '')

# ---- line styles ----
# Every series carries three marks of its own, so that lines lying on top of one another (stages
# 4, 5 and 6 run within a few percent; stage 9 runs on torch-flash's line) are still told apart:
# a colour, a dash pattern and a marker. Stage N is line style 20 + N (a new stage adds its line
# here). Stages are coloured, with filled markers, no two GPU forward stages (4-9) sharing a marker
# and no two consecutive stages a dash pattern: solid, long dash, dash-dot, in turn. The backward
# stages (10, 16) share a chart with the yardsticks alone: solid, thick, colours apart, stage 16's
# filled triangle showing inside torch-cudnn's open square where the two lines meet. The yardsticks
# are black or grey, thick, with open markers and dash patterns no stage uses, so that they never
# read as one of the stages:
#   11 torch-flash (FlashAttention-2), and cpu-blas (unfused through OpenBLAS), the CPU chart's
#   yardstick, drawn as torch-flash is (the two never share a chart), 12 torch-cudnn, 13 a figure
#   from the FA-2 paper, 14 a formula
set style line 21 lc rgb '#8c564b' lw 2 pt 7 ps 1.2 dt 1
set style line 22 lc rgb '#e377c2' lw 2 pt 5 ps 1.2 dt (16, 5)
set style line 23 lc rgb '#17becf' lw 2 pt 9 ps 1.4 dt (16, 4, 3, 4)
set style line 24 lc rgb '#d62728' lw 2 pt 7 ps 1.3 dt 1
set style line 25 lc rgb '#ff7f0e' lw 2 pt 5 ps 1.2 dt (16, 5)
set style line 26 lc rgb '#b8a500' lw 2 pt 9 ps 1.5 dt (16, 4, 3, 4)
set style line 27 lc rgb '#2ca02c' lw 2 pt 11 ps 1.5 dt 1
set style line 28 lc rgb '#1f77b4' lw 2.5 pt 13 ps 1.5 dt (16, 5)
set style line 29 lc rgb '#9467bd' lw 2.5 pt 15 ps 1.5 dt 1
set style line 30 lc rgb '#00897b' lw 2.5 pt 7 ps 1.3 dt 1
set style line 36 lc rgb '#c2185b' lw 2.5 pt 9 ps 1.6 dt 1
set style line 11 lc rgb '#000000' lw 3.5 pt 6 ps 1.5 dt (8, 6)
set style line 12 lc rgb '#8a8a8a' lw 3.5 pt 4 ps 1.5 dt (2, 4)
set style line 13 lc rgb '#000000' lw 2.5 pt 8 ps 1.8 dt (6, 4, 2, 4)
set style line 14 lc rgb '#808080' lw 2 pt 0 dt (4, 4)

# nudge(k): series k (a key as style() takes) drawn at x · nudge(k) on a log-x chart: one step left,
# none or one step right, so that series whose lines coincide put their markers at one N side by
# side rather than on top of one another: consecutive stages differ (stage N: N mod 3 - 1, so
# stages 4, 5, 6 take 0, right, left), and torch-flash (right) differs from stages 9 (left) and 10
# (none), which run on its line. A series keeps its place in every chart, and no marker strays more
# than a step (NUDGE, in powers of 2: 2^0.1 = 7% of N) from its N. A chart that nudges says so
# under its panels (nudged).
NUDGE = 0.1
nudge_step(k) = stem(k) eq 'torch-flash' ? 1 : stem(k)[1:5] eq 'stage' ? int(stem(k)[6:] + 0) % 3 - 1 : 0
nudge(k) = 2 ** (nudge_step(k) * NUDGE)
nudged = 'markers at each N nudged sideways, series by series, so that coinciding points stay visible'

# style(k): the line style of a series key such as stage4, torch-flash, cpu-blas, stage9@h200, paper
stem(k) = strstrt(k, '@') ? k[1:strstrt(k, '@') - 1] : k
style(k) = stem(k) eq 'torch-flash' || stem(k) eq 'cpu-blas' ? 11 : stem(k) eq 'torch-cudnn' ? 12 : stem(k) eq 'paper' ? 13 \
         : stem(k) eq 'formula' ? 14 : stem(k)[1:5] eq 'stage' ? 20 + int(stem(k)[6:] + 0) : 14

set grid lc rgb '#d8d8d8' lw 1 dt 1
set border lw 1.2
set tics nomirror
set datafile separator whitespace
