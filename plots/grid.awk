# grid.awk: the benchmark grid run by run, and one series over another across it. The one
# implementation of "stage X over stage Y" behind plots/ratio.sh, plots/table.sh,
# plots/readme_table.sh and the speedup chart (plots/plot.sh). Functions only: load it after
# bench/csv.awk, as csv_awk -f plots/grid.awk 'program' bench/data/h200.csv (bench/csv.sh).
#
# The grid is the FA-2 paper's: B = 16384 / N, H = 2048 / d, in one dtype (fp16, or the awk variable
# grid_dtype: -v grid_dtype=bf16); other rows are left out, or, with -v grid_other_dtypes=1, kept
# as series of their own named STAGE@DTYPE (stage19@fp8 beside stage18: FP8 over fp16). A run is one
# `make bench`, named by the commit in its rows; within a run the latest row of a shape wins. A
# point is "d causal N". A selection says which points a comparison takes, as words:
# "d=64,128 causal=0 nmin=1024 nmax=4096"; a part left out takes every value, "" the whole grid.
#
#   grid_add()                       on each row of a GPU CSV: keeps it if it is on the grid
#   grid_tf(s, dir, run, p)          s's TFLOP/s at point p in that run ("" if not measured)
#   grid_latest(s, dir, sel)         the run of s's latest row among the points sel takes ("" if none)
#   grid_runs(s, dir)                the runs that measured s, oldest first, space-separated
#   grid_points(sel)                 the points sel takes that any row has, in order of d, causal,
#                                    N, into GP[1..n]; returns n
#   grid_over(x, y, dir, run, sel)   x over y, both from one run: run "" is x's latest over sel
#   grid_latest_with(s, ref, dir, sel)  the latest run that measured both s and ref at a point of sel
#   grid_via(x, y, ref, dir, sel)    x over y when no run has both: x / ref in x's latest run with
#                                    ref over sel, divided by y / ref in y's (ref is torch-flash:
#                                    each stage against FlashAttention-2 in its own run)
# Both comparisons return the number of points that have every number they need, and set OV_n
# (that number), OV_gm (the geometric mean of the ratios), OV_min, OV_max, OV_run (x's run),
# OV_run_y (y's run), and for i = 1..OV_n: OV_pt[i], OV_x[i] and OV_y[i] (x's and y's TFLOP/s),
# OV_q[i] (the ratio).

function grid_add(    s, dir, r, p) {
    if (get("batch") * get("seqlen") != 16384 || get("heads") * get("dim") != 2048) return 0
    s = get("stage")
    if (get("dtype") != (grid_dtype == "" ? "fp16" : grid_dtype)) {
        if (!grid_other_dtypes) return 0
        s = s "@" get("dtype")
    }
    dir = get("direction"); r = get("commit")
    p = (get("dim") + 0) " " (get("causal") + 0) " " (get("seqlen") + 0)
    G_tf[s, dir, r, p] = get("tflops")
    G_last[s, dir, p] = r
    G_pos[s, dir, p] = ++G_rows
    G_pt[p] = 1
    G_has[s, dir, r] = 1
    if (!(r in G_runpos)) { G_runpos[r] = ++G_nruns; G_run[G_nruns] = r }
    return 1
}

function grid_tf(s, dir, run, p) { return ((s, dir, run, p) in G_tf) ? G_tf[s, dir, run, p] : "" }

function grid_runs(s, dir,    i, out) {
    out = ""
    for (i = 1; i <= G_nruns; i++)
        if ((s, dir, G_run[i]) in G_has) out = out (out == "" ? "" : " ") G_run[i]
    return out
}

# whether point p ("d causal N") is one that selection sel takes
function grid_takes(p, sel,    f, w, nw, i, kv, vals, nv, j, ok) {
    split(p, f, " ")
    nw = split(sel, w, " ")
    for (i = 1; i <= nw; i++) {
        split(w[i], kv, "=")
        if (kv[1] == "nmin") { if (f[3] + 0 < kv[2] + 0) return 0; continue }
        if (kv[1] == "nmax") { if (f[3] + 0 > kv[2] + 0) return 0; continue }
        if (kv[1] != "d" && kv[1] != "causal" && kv[1] != "n") {
            printf "grid.awk: no such selection \"%s\" (d=, causal=, n=, nmin=, nmax=)\n", w[i] > "/dev/stderr"
            csv_failed = 1; exit 2
        }
        nv = split(kv[2], vals, ","); ok = 0
        for (j = 1; j <= nv; j++)
            if ((kv[1] == "d" ? f[1] : kv[1] == "causal" ? f[2] : f[3]) + 0 == vals[j] + 0) ok = 1
        if (!ok) return 0
    }
    return 1
}

function grid_points(sel,    p, n, i, j, t) {
    n = 0
    for (p in G_pt) if (grid_takes(p, sel)) GP[++n] = p
    for (i = 2; i <= n; i++)
        for (j = i; j > 1 && grid_before(GP[j], GP[j - 1]); j--) { t = GP[j]; GP[j] = GP[j - 1]; GP[j - 1] = t }
    return n
}
function grid_before(a, b,    fa, fb) {
    split(a, fa, " "); split(b, fb, " ")
    if (fa[1] + 0 != fb[1] + 0) return fa[1] + 0 < fb[1] + 0
    if (fa[2] + 0 != fb[2] + 0) return fa[2] + 0 < fb[2] + 0
    return fa[3] + 0 < fb[3] + 0
}

function grid_latest(s, dir, sel,    p, best, run) {
    best = 0; run = ""
    for (p in G_pt)
        if (((s, dir, p) in G_pos) && G_pos[s, dir, p] > best && grid_takes(p, sel)) { best = G_pos[s, dir, p]; run = G_last[s, dir, p] }
    return run
}

# the latest run in which s and ref were both measured at some point sel takes ("" if none)
function grid_latest_with(s, ref, dir, sel,    n, i, j) {
    n = grid_points(sel)
    for (i = G_nruns; i >= 1; i--)
        for (j = 1; j <= n; j++)
            if (grid_tf(s, dir, G_run[i], GP[j]) != "" && grid_tf(ref, dir, G_run[i], GP[j]) != "") return G_run[i]
    return ""
}

function grid_over(x, y, dir, run, sel,    n, i, a, b) {
    ov_start()
    if (run == "") run = grid_latest(x, dir, sel)
    OV_run = OV_run_y = run
    if (run == "") return 0
    n = grid_points(sel)
    for (i = 1; i <= n; i++) {
        a = grid_tf(x, dir, run, GP[i]); b = grid_tf(y, dir, run, GP[i])
        if (a != "" && b + 0 > 0) ov_point(GP[i], a, b, a / b)
    }
    return ov_end()
}

function grid_via(x, y, ref, dir, sel,    n, i, a, b, ra, rb) {
    ov_start()
    OV_run = grid_latest_with(x, ref, dir, sel); OV_run_y = grid_latest_with(y, ref, dir, sel)
    if (OV_run == "" || OV_run_y == "") return 0
    n = grid_points(sel)
    for (i = 1; i <= n; i++) {
        a = grid_tf(x, dir, OV_run, GP[i]); ra = grid_tf(ref, dir, OV_run, GP[i])
        b = grid_tf(y, dir, OV_run_y, GP[i]); rb = grid_tf(ref, dir, OV_run_y, GP[i])
        if (a != "" && ra + 0 > 0 && b + 0 > 0 && rb + 0 > 0) ov_point(GP[i], a, b, (a / ra) / (b / rb))
    }
    return ov_end()
}

function ov_start() { OV_n = 0; OV_lsum = 0; OV_min = OV_max = OV_gm = ""; split("", OV_pt); split("", OV_x); split("", OV_y); split("", OV_q) }
function ov_point(p, a, b, q) {
    OV_n++; OV_pt[OV_n] = p; OV_x[OV_n] = a; OV_y[OV_n] = b; OV_q[OV_n] = q; OV_lsum += log(q)
    if (OV_min == "" || q < OV_min) OV_min = q
    if (OV_max == "" || q > OV_max) OV_max = q
}
function ov_end() { if (OV_n) OV_gm = exp(OV_lsum / OV_n); return OV_n }
