/* timeline.cuh: when each block of a kernel reaches the points it marks, on one clock for all SMs.
 *
 * Instrumentation for an ablation, never for a stage's own build. A kernel written with a probe
 * type (stage 15's `tiles<..., Probe>`) calls Probe::at(mark) at the points of its work it names
 * (mark 0 must be the block's start); the stage's own probe does nothing there. timeline_probe
 * instead has thread 0 of every block stamp %globaltimer (nanoseconds, one clock for every SM, so
 * that the blocks' stamps compare) at each mark, and note the block's SM at mark 0. Before each
 * launch the host side names the grid (timeline_watch); at the program's end the last launch's
 * stamps are summarized on stderr and written, a row per block, to a CSV for a plot
 * (timeline_report): per mark the first, median, 90th-percentile and last block in microseconds
 * after the first block's start, the blocks' own durations, and how many blocks each SM ran.
 *
 * A stamp is a store to global memory by one thread: it costs a few instructions per mark and
 * block, and the kernel's registers may change, so a timeline build's times are close to the
 * stage's, not the stage's (compare its time by events with the stage's, in the same call).
 * Used by bench/ablations/15_timeline.cu. */
#ifndef TIMELINE_CUH
#define TIMELINE_CUH
#include <algorithm>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

constexpr int TIMELINE_MAX_BLOCKS = 16384; /* blocks past these are not stamped */
constexpr int TIMELINE_MAX_MARKS = 15;

/* [block][mark], then the block's SM in the last column. One per program (a header of the
 * ablation's one translation unit). */
static __device__ unsigned long long timeline_stamps[TIMELINE_MAX_BLOCKS][TIMELINE_MAX_MARKS + 1];

/* The probe: MARKS marks, 0 the block's start (which also clears the block's stamps of the last
 * launch, so that a mark this launch did not reach reads 0, "not reached"). */
template <int MARKS>
struct timeline_probe {
    static_assert(MARKS >= 1 && MARKS <= TIMELINE_MAX_MARKS, "marks fit the stamps' row");
    static constexpr bool on = true;
    static __device__ __forceinline__ void at(int mark)
    {
        const unsigned b = blockIdx.y * gridDim.x + blockIdx.x;
        if (threadIdx.x != 0 || b >= TIMELINE_MAX_BLOCKS) return;
        unsigned long long now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        timeline_stamps[b][mark] = now;
        if (mark == 0) {
            unsigned sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            timeline_stamps[b][TIMELINE_MAX_MARKS] = sm;
            for (int e = 1; e < MARKS; e++) timeline_stamps[b][e] = 0;
        }
    }
};

/* A mark's CSV column ("loop_end_us") and its words in the summary ("loop end"). */
struct timeline_mark {
    const char *column, *words;
};

/* What the report needs, set by timeline_watch before each launch: the last launch's is reported. */
static struct {
    const char *who, *csv_path;
    const timeline_mark *marks;
    int n_marks;
    unsigned grid_x, grid_y;
} timeline_last;

/* At the program's end: the summary on stderr, and a row per block to timeline_last.csv_path. */
static void timeline_report()
{
    const auto &L = timeline_last;
    const unsigned blocks = std::min<unsigned>(L.grid_x * L.grid_y, TIMELINE_MAX_BLOCKS), W = TIMELINE_MAX_MARKS + 1;
    std::vector<unsigned long long> st((size_t)blocks * W);
    if (!blocks || cudaMemcpyFromSymbol(st.data(), timeline_stamps, st.size() * sizeof st[0]) != cudaSuccess) {
        fprintf(stderr, "%s timeline: no stamps to read (%s)\n", L.who, cudaGetErrorString(cudaGetLastError()));
        return;
    }
    auto stamp = [&](unsigned b, int e) { return st[(size_t)b * W + e]; };
    unsigned long long t0 = ~0ULL;
    for (unsigned b = 0; b < blocks; b++) t0 = std::min(t0, stamp(b, 0));
    auto us = [&](unsigned b, int e) { return (stamp(b, e) - t0) / 1000.0; };
    fprintf(stderr, "%s timeline of the last launch: %u blocks (%u x %u), us after the first block's start\n", L.who,
            blocks, L.grid_x, L.grid_y);
    fprintf(stderr, "  %-26s %8s %8s %8s %8s %7s\n", "mark", "first", "median", "90%", "last", "blocks");
    std::vector<double> v;
    auto row = [&](const char *name) {
        std::sort(v.begin(), v.end());
        if (v.empty()) return;
        fprintf(stderr, "  %-26s %8.2f %8.2f %8.2f %8.2f %7zu\n", name, v.front(), v[v.size() / 2],
                v[std::min(v.size() - 1, v.size() * 9 / 10)], v.back(), v.size());
    };
    for (int e = 0; e < L.n_marks; e++) {
        v.clear();
        for (unsigned b = 0; b < blocks; b++)
            if (stamp(b, e)) v.push_back(us(b, e));
        row(L.marks[e].words);
    }
    v.clear(); /* from its start to its last mark: the last mark is the block's end */
    for (unsigned b = 0; b < blocks; b++)
        if (stamp(b, L.n_marks - 1)) v.push_back(us(b, L.n_marks - 1) - us(b, 0));
    row("a block's own time");
    std::vector<int> per_sm, hist;
    for (unsigned b = 0; b < blocks; b++) {
        const unsigned sm = (unsigned)stamp(b, TIMELINE_MAX_MARKS);
        if (sm >= per_sm.size()) per_sm.resize(sm + 1, 0);
        per_sm[sm]++;
    }
    for (int c : per_sm) {
        if ((size_t)c >= hist.size()) hist.resize(c + 1, 0);
        hist[c]++;
    }
    fprintf(stderr, "  SMs by blocks run:");
    for (size_t c = 0; c < hist.size(); c++)
        if (hist[c]) fprintf(stderr, " %d SMs ran %zu", hist[c], c);
    fprintf(stderr, "\n");
    FILE *f = fopen(L.csv_path, "w");
    if (!f) {
        fprintf(stderr, "%s timeline: cannot write %s\n", L.who, L.csv_path);
        return;
    }
    fprintf(f, "block,x,y,sm");
    for (int e = 0; e < L.n_marks; e++) fprintf(f, ",%s", L.marks[e].column);
    fprintf(f, "\n");
    for (unsigned b = 0; b < blocks; b++) {
        fprintf(f, "%u,%u,%u,%llu", b, b % L.grid_x, b / L.grid_x, stamp(b, TIMELINE_MAX_MARKS));
        for (int e = 0; e < L.n_marks; e++) {
            if (stamp(b, e)) fprintf(f, ",%.3f", us(b, e));
            else fprintf(f, ",");
        }
        fprintf(f, "\n");
    }
    fclose(f);
    fprintf(stderr, "  a row per block in %s\n", L.csv_path);
}

/* Before each launch of a grid (grid_x, grid_y) whose kernel stamps n_marks marks: the report at
 * the program's end is the last launch's, its rows written to csv_path. */
static void timeline_watch(const char *who, const timeline_mark *marks, int n_marks, unsigned grid_x,
                           unsigned grid_y, const char *csv_path)
{
    static const bool registered = !atexit(timeline_report);
    (void)registered;
    timeline_last = {who, csv_path, marks, n_marks, grid_x, grid_y};
}

#endif
