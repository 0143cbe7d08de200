/* runner.cu: the GPU half of the harness. Inputs to the device in the stage's dtype, the output
 * poisoned, one checked run (a stage with a workspace: its second call, first_call), the warm-up,
 * then the timed runs between CUDA events; the stage's forward itself only launches kernels. Also
 * the device query and device buffers (gpu.h). */
#include "common/cuda/gpu.h"
#include "common/cuda/l2_flush.cuh"
#include "common/half.h"
#include "common/harness.h"
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

/* ---- device query and buffers ---- */

struct gpu_info gpu_query(void)
{
    struct gpu_info g;
    memset(&g, 0, sizeof g);
    int dev;
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    snprintf(g.name, sizeof g.name, "%s", p.name);
    g.l2_bytes = p.l2CacheSize;
    /* slug: lower case, the vendor words dropped, anything else that is not a letter or digit a '-' */
    const char *s = p.name;
    for (const char *drop : {"NVIDIA ", "GeForce ", "Tesla "})
        if (!strncmp(s, drop, strlen(drop))) s += strlen(drop);
    size_t k = 0;
    for (; *s && k + 1 < sizeof g.slug; s++)
        g.slug[k++] = isalnum((unsigned char)*s) ? (char)tolower((unsigned char)*s) : '-';
    while (k && g.slug[k - 1] == '-') k--;
    g.slug[k] = 0;
    return g;
}

struct dbuf dbuf_alloc(size_t bytes)
{
    struct dbuf b = {NULL, bytes};
    if (bytes) CUDA_CHECK(cudaMalloc(&b.p, bytes));
    return b;
}

void dbuf_free(struct dbuf *b)
{
    if (b->p) CUDA_CHECK(cudaFree(b->p));
    b->p = NULL;
    b->bytes = 0;
}

/* ---- what the device is, and what of this build runs on it ---- */

/* An empty kernel, compiled like every stage (the Makefile's CUDA_ARCH): its attributes say which
 * of the build's code the device runs. */
static __global__ void probe_kernel() {}

/* The probe's attributes on the current device: ptxVersion is the virtual architecture its code
 * was compiled for, binaryVersion the machine code the device runs (its own cubin, an older
 * compatible one, or one JIT-compiled from PTX). Returns the CUDA error when the build holds no
 * code this device can run. */
static cudaError_t probe_attributes(cudaFuncAttributes *fa)
{
    cudaError_t err = cudaFuncGetAttributes(fa, probe_kernel);
    if (err != cudaSuccess) cudaGetLastError(); /* not sticky: clear it */
    return err;
}

extern "C" int gpu_available(char *why, size_t n)
{
    int count = 0, driver = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    /* No driver at all reads to the runtime as a driver too old for it (cudaErrorInsufficientDriver,
     * with cudaDriverGetVersion 0): a machine without an NVIDIA GPU, said in those words. A driver
     * that is there but older than this build's runtime is said so. */
    if (err == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) {
        snprintf(why, n, "the NVIDIA driver (CUDA %d.%d) is older than the CUDA runtime this was built with (%d.%d): "
                 "update the driver", driver / 1000, driver % 1000 / 10, CUDART_VERSION / 1000,
                 CUDART_VERSION % 1000 / 10);
        return 1;
    }
    if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice || (err == cudaSuccess && count == 0)) {
        cudaGetLastError(); /* not sticky: clear it */
        snprintf(why, n, "no NVIDIA GPU or driver found");
        return 1;
    }
    if (err != cudaSuccess) {
        cudaGetLastError();
        snprintf(why, n, "no usable CUDA device (%s)", cudaGetErrorString(err));
        return 1;
    }
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    if (10 * p.major + p.minor < 75) {
        snprintf(why, n, "%s is sm_%d%d; the GPU stages need sm_75 or newer (ldmatrix, mma.sync)", p.name, p.major,
                 p.minor);
        return 1;
    }
    cudaFuncAttributes fa;
    if ((err = probe_attributes(&fa)) != cudaSuccess) {
        snprintf(why, n, "this build has no GPU code %s (sm_%d%d) can run (%s): build with make CUDA_ARCH=\"%d%d\"",
                 p.name, p.major, p.minor, cudaGetErrorString(err), p.major, p.minor);
        return 1;
    }
    return 0;
}

extern "C" int gpu_code_arch(void)
{
    static int arch = 0; /* one device per process: asked once */
    if (!arch) {
        cudaFuncAttributes fa;
        CUDA_CHECK(probe_attributes(&fa));
        arch = fa.ptxVersion;
    }
    return arch;
}

/* "sm_90", or what runs there when it is not the device's own code: "sm_89, running sm_80 code",
 * "sm_90, running compute_75 PTX" (JIT-compiled by the driver). */
static void arch_text(char *buf, size_t n)
{
    int dev = 0;
    cudaDeviceProp p;
    cudaFuncAttributes fa;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    CUDA_CHECK(probe_attributes(&fa));
    const int sm = 10 * p.major + p.minor;
    if (fa.ptxVersion == sm) snprintf(buf, n, "sm_%d", sm);
    else if (fa.binaryVersion == sm) snprintf(buf, n, "sm_%d, running compute_%d PTX", sm, fa.ptxVersion);
    else snprintf(buf, n, "sm_%d, running sm_%d code", sm, fa.binaryVersion);
}

extern "C" int gpu_dtype_check(enum dtype dt, const char *who, char *why, size_t n)
{
    const int code = gpu_code_arch();
    if (dt != DT_BF16 || code >= 80) return 0;
    int dev = 0;
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    if (10 * p.major + p.minor < 80)
        snprintf(why, n, "%s: bf16 needs a GPU of compute capability 8.0 or newer (bf16 tensor cores); this is %s, sm_%d%d: "
                 "use --dtype fp16", who, p.name, p.major, p.minor);
    else
        snprintf(why, n, "%s: bf16 needs code built for sm_80 or newer; this build runs compute_%d code on %s: use "
                 "--dtype fp16, or build with CUDA_ARCH 80 or 90", who, code, p.name);
    return 1;
}

extern "C" size_t gpu_smem_limit(void)
{
    static size_t limit = 0; /* one device per process, one environment: worked out once */
    if (!limit) {
        int dev = 0, optin = 0;
        char why[160];
        size_t cap;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        if (smem_cap_bytes(&cap, why, sizeof why)) { /* the stage binaries refuse it earlier (parse_opts) */
            fprintf(stderr, "%s\n", why);
            exit(EXIT_USAGE);
        }
        limit = cap && cap < (size_t)optin ? cap : (size_t)optin;
    }
    return limit;
}

/* The summary's words for the tiles `st` takes for this problem: "Br=128 Bc=64 Bs=32, 96.0 of
 * 227 KiB shared memory" (and "(ATTN_SMEM_CAP_KB=99)" where the cap sets the limit). Returns 0,
 * or EXIT_USAGE with one line in `why` when no configuration of the stage fits. */
static int tiles_text(const struct stage *st, const struct shape *sh, enum dtype dt, int deterministic, char *buf,
                      size_t buf_n, char *why, size_t n)
{
    buf[0] = 0;
    if (!st->tiles) return 0;
    struct attn_args a;
    memset(&a, 0, sizeof a);
    a.sh = *sh, a.dtype = dt, a.deterministic = deterministic;
    struct tile_config c;
    const size_t limit = gpu_smem_limit();
    if (st->tiles(&a, st->measures_backward, limit, &c)) {
        snprintf(why, n, "%s: %s", st->name, c.text);
        return EXIT_USAGE;
    }
    size_t cap;
    char cap_words[64] = "";
    if (!smem_cap_bytes(&cap, why, n) && cap && cap == limit)
        snprintf(cap_words, sizeof cap_words, " (ATTN_SMEM_CAP_KB=%zu)", cap / 1024);
    snprintf(buf, buf_n, "%s, %.1f of %zu KiB shared memory%s", c.text, c.smem_bytes / 1024.0, limit / 1024,
             cap_words);
    return 0;
}

extern "C" int gpu_arch_check(int arch_sm, const char *who, char *why, size_t n)
{
    if (!arch_sm) return 0;
    int dev = 0;
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    const int sm = 10 * p.major + p.minor;
    if (sm == arch_sm) return 0;
    if (arch_sm == 90)
        snprintf(why, n, "%s needs a Hopper GPU (H100/H200, sm_90); this is %s, sm_%d", who, p.name, sm);
    else
        snprintf(why, n, "%s needs a GPU of compute capability %d.%d (sm_%d); this is %s, sm_%d", who, arch_sm / 10,
                 arch_sm % 10, arch_sm, p.name, sm);
    return 1;
}

/* ---- one problem on the device ---- */

/* Q, K, V converted to the stage's dtype on the host and copied over; O, L and the stage's
 * workspace allocated, the workspace zeroed (once: a stage may keep state there from one call to
 * the next, stage 15 its merge's counters, which must start at zero and which each call leaves at
 * zero). Everything a forward call needs, allocated before any timing starts. */
struct gpu_problem {
    struct dbuf Q, K, V, O, L, work;
    struct attn_args args;
    const struct rank_hooks *ranks; /* a multi-rank stage's hooks (ranks_setup), else NULL */
};

static struct dbuf upload(const float *x, size_t n, enum dtype dt)
{
    dt = dtype_io(dt); /* an fp8 stage is handed fp16 */
    struct dbuf b = dbuf_alloc(n * dtype_size(dt));
    if (dt == DT_F32) {
        CUDA_CHECK(cudaMemcpy(b.p, x, n * sizeof(float), cudaMemcpyHostToDevice));
        return b;
    }
    std::vector<uint16_t> h(n);
    for (size_t k = 0; k < n; k++) h[k] = dt == DT_F16 ? f32_to_f16(x[k]) : f32_to_bf16(x[k]);
    CUDA_CHECK(cudaMemcpy(b.p, h.data(), n * 2, cudaMemcpyHostToDevice));
    return b;
}

static void download(float *x, const struct dbuf *b, size_t n, enum dtype dt)
{
    dt = dtype_io(dt); /* an fp8 stage returns fp16 */
    if (dt == DT_F32) {
        CUDA_CHECK(cudaMemcpy(x, b->p, n * sizeof(float), cudaMemcpyDeviceToHost));
        return;
    }
    std::vector<uint16_t> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), b->p, n * 2, cudaMemcpyDeviceToHost));
    for (size_t k = 0; k < n; k++) x[k] = dt == DT_F16 ? f16_to_f32(h[k]) : bf16_to_f32(h[k]);
}

static void problem_init(struct gpu_problem *g, const struct stage *st, const struct shape *sh, enum dtype dt,
                         int deterministic, int hadamard, const float *Q, const float *K, const float *V)
{
    size_t n = shape_elems(sh), rows = shape_rows(sh), nkv = shape_kv_elems(sh); /* K, V: [B, H_kv, N_kv, d] */
    g->Q = upload(Q, n, dt), g->K = upload(K, nkv, dt), g->V = upload(V, nkv, dt);
    g->O = dbuf_alloc(n * dtype_size(dt));
    g->L = dbuf_alloc(rows * sizeof(float));
    memset(&g->args, 0, sizeof g->args);
    g->args.sh = *sh;
    g->args.dtype = dt;
    g->args.deterministic = deterministic;
    g->args.hadamard = hadamard;
    g->work = dbuf_alloc(st->workspace_bytes ? st->workspace_bytes(&g->args) : 0);
    if (g->work.p) CUDA_CHECK(cudaMemset(g->work.p, 0, g->work.bytes));
    g->args.Q = g->Q.p, g->args.K = g->K.p, g->args.V = g->V.p;
    g->args.O = g->O.p, g->args.L = (float *)g->L.p, g->args.work = g->work.p;
    g->ranks = NULL;
}

/* A multi-rank stage: its ranks set up on their devices from the problem's inputs (struct
 * rank_hooks), P = gpus (0: one per device) over `transport`, before any run. 0 for any other. */
static int ranks_setup(const struct stage *st, struct gpu_problem *g, int gpus, int transport, char *why, size_t n)
{
    if (!st->ranks) return 0;
    g->args.gpus = gpus, g->args.transport = transport;
    g->ranks = st->ranks; /* problem_free tears down what setup made, even where it failed halfway */
    if (int rc = st->ranks->setup(&g->args, why, n)) return stage_failed(st, rc, why, n);
    return 0;
}

static void problem_free(struct gpu_problem *g)
{
    if (g->ranks) g->ranks->teardown(&g->args); /* it leaves device 0 current */
    struct dbuf *all[] = {&g->Q, &g->K, &g->V, &g->O, &g->L, &g->work};
    for (struct dbuf *b : all) dbuf_free(b);
}

/* A stage with a workspace: one call before the checked one, on other queries (zeros: every key
 * weighs the same, so each slice's partial result differs from the checked call's). The checked
 * call is then the second on its workspace, as every timed call after it is: one that relied on
 * state the first left wrong (stage 15's counters not back at zero), or folded in a partial result
 * the first left behind, fails the check. */
static int first_call(const struct stage *st, struct gpu_problem *g, char *why, size_t n)
{
    if (!g->work.p) return 0;
    struct dbuf zeros = dbuf_alloc(g->Q.bytes);
    CUDA_CHECK(cudaMemset(zeros.p, 0, zeros.bytes));
    struct attn_args a = g->args;
    a.Q = zeros.p;
    int rc = st->forward(&a, why, n);
    if (!rc) CUDA_CHECK(cudaDeviceSynchronize());
    dbuf_free(&zeros);
    return rc ? stage_failed(st, rc, why, n) : 0;
}

/* Poison O and L (all bits set: NaN in fp32, fp16 and bf16), run once, and bring O and L back. */
static int checked_run(const struct stage *st, struct gpu_problem *g, float *O, float *L, char *why, size_t n)
{
    CUDA_CHECK(cudaMemset(g->O.p, 0xff, g->O.bytes));
    CUDA_CHECK(cudaMemset(g->L.p, 0xff, g->L.bytes));
    if (int rc = st->forward(&g->args, why, n)) return stage_failed(st, rc, why, n);
    /* a multi-rank stage: its ranks' O and L gathered into the problem's (outside any timing) */
    if (g->ranks)
        if (int rc = g->ranks->collect(&g->args, why, n)) return stage_failed(st, rc, why, n);
    CUDA_CHECK(cudaDeviceSynchronize()); /* errors inside the kernel surface here */
    download(O, &g->O, shape_elems(&g->args.sh), g->args.dtype);
    download(L, &g->L, shape_rows(&g->args.sh), DT_F32);
    return 0;
}

/* The counting build of the stage's kernel (args.counters set), run once on poisoned outputs;
 * its tallies into counts[N_COUNTERS]. */
static int counted_run(const struct stage *st, struct gpu_problem *g, float *O, float *L,
                       unsigned long long *counts, char *why, size_t n)
{
    struct dbuf c = dbuf_alloc(N_COUNTERS * sizeof(unsigned long long));
    CUDA_CHECK(cudaMemset(c.p, 0, c.bytes));
    g->args.counters = (unsigned long long *)c.p;
    int rc = checked_run(st, g, O, L, why, n);
    g->args.counters = NULL;
    if (!rc) CUDA_CHECK(cudaMemcpy(counts, c.p, c.bytes, cudaMemcpyDeviceToHost));
    dbuf_free(&c);
    return rc;
}

static int forward_host(const struct stage *st, const struct shape *sh, enum dtype dt, int hadamard, int gpus,
                        int transport, const float *Q, const float *K, const float *V, float *O, float *L,
                        unsigned long long *counts, char *why, size_t n)
{
    if (gpu_available(why, n) || gpu_arch_check(st->arch_sm, st->name, why, n)) return EXIT_NO_DEVICE;
    if (gpu_dtype_check(dt, st->name, why, n)) return EXIT_USAGE;
    struct gpu_problem g;
    problem_init(&g, st, sh, dt, 0, hadamard, Q, K, V);
    int rc = ranks_setup(st, &g, gpus, transport, why, n);
    if (!rc) rc = first_call(st, &g, why, n);
    if (!rc) rc = counts ? counted_run(st, &g, O, L, counts, why, n) : checked_run(st, &g, O, L, why, n);
    problem_free(&g);
    return rc;
}

extern "C" int gpu_forward_host(const struct stage *st, const struct shape *sh, enum dtype dt, int hadamard,
                                const float *Q, const float *K, const float *V, float *O, float *L,
                                unsigned long long *counts, char *why, size_t n)
{
    return forward_host(st, sh, dt, hadamard, 0, TRANSPORT_AUTO, Q, K, V, O, L, counts, why, n);
}

extern "C" int gpu_forward_ranks_host(const struct stage *st, const struct shape *sh, enum dtype dt, int gpus,
                                      int transport, const float *Q, const float *K, const float *V, float *O,
                                      float *L, char *why, size_t n)
{
    return forward_host(st, sh, dt, 0, gpus, transport, Q, K, V, O, L, NULL, why, n);
}

/* The rest of the warm-up (the checked run was the first), then o->iters runs of fn, each between
 * two CUDA events; with --flush-l2 a buffer twice the L2's size is read before each run
 * (common/cuda/l2_flush.cuh), outside the events, so every run starts with its inputs in HBM
 * rather than in L2. The median and minimum go into r. */
static void timed_runs(attn_fn fn, const struct attn_args *args, const struct opts *o, const struct gpu_info *info,
                       struct result *r)
{
    char why[512];
    for (int w = 1; w < o->warmup; w++) fn(args, why, sizeof why);
    LAUNCH_CHECK();
    struct dbuf flush = dbuf_alloc(o->flush_l2 ? 2 * (size_t)info->l2_bytes : 0), sink = dbuf_alloc(o->flush_l2 ? 4 : 0);
    if (flush.p) CUDA_CHECK(cudaMemset(flush.p, 0, flush.bytes));
    std::vector<cudaEvent_t> start(o->iters), stop(o->iters);
    for (int it = 0; it < o->iters; it++) {
        CUDA_CHECK(cudaEventCreate(&start[it]));
        CUDA_CHECK(cudaEventCreate(&stop[it]));
    }
    for (int it = 0; it < o->iters; it++) {
        if (flush.p) l2_flush(flush.p, flush.bytes, (unsigned *)sink.p);
        CUDA_CHECK(cudaEventRecord(start[it]));
        fn(args, why, sizeof why);
        CUDA_CHECK(cudaEventRecord(stop[it]));
    }
    LAUNCH_CHECK();
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> t(o->iters);
    for (int it = 0; it < o->iters; it++) {
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start[it], stop[it]));
        t[it] = ms;
        CUDA_CHECK(cudaEventDestroy(start[it]));
        CUDA_CHECK(cudaEventDestroy(stop[it]));
    }
    r->ms_median = median_min(t.data(), o->iters, &r->ms_min);
    r->threads = 1;
    dbuf_free(&flush);
    dbuf_free(&sink);
}

extern "C" int gpu_run_stage(const struct stage *st, const struct opts *o, const float *Q, const float *K,
                             const float *V, float *O, float *L, struct result *r)
{
    char why[512];
    struct gpu_info info = gpu_query();
    snprintf(r->gpu, sizeof r->gpu, "%s", info.slug);
    snprintf(r->device_name, sizeof r->device_name, "%s", info.name);
    arch_text(r->arch, sizeof r->arch);
    if (int rc = tiles_text(st, &o->sh, o->dtype, 0, r->tiles, sizeof r->tiles, why, sizeof why)) {
        fprintf(stderr, "%s\n", why); /* no configuration fits: refused before anything is allocated */
        return rc;
    }
    struct gpu_problem g;
    problem_init(&g, st, &o->sh, o->dtype, 0, o->hadamard, Q, K, V);
    r->extra_bytes = g.work.bytes;
    int rc = ranks_setup(st, &g, o->gpus, o->transport, why, sizeof why);
    if (!rc) rc = first_call(st, &g, why, sizeof why);
    if (!rc) rc = checked_run(st, &g, O, L, why, sizeof why); /* the checked run is the first warm-up */
    if (rc) {
        fprintf(stderr, "%s\n", why);
        problem_free(&g);
        return rc;
    }
    timed_runs(st->forward, &g.args, o, &info, r);
    if (g.ranks) g.ranks->report(&g.args, r->ranks, sizeof r->ranks); /* a line per rank, one for all */

    /* --counters: after the timed runs, the counting build once, into scratch host outputs (the
     * checked O and L above stay what the harness checks) */
    if (o->counters) {
        std::vector<float> O2(shape_elems(&o->sh)), L2(shape_rows(&o->sh));
        if ((rc = counted_run(st, &g, O2.data(), L2.data(), r->counts, why, sizeof why))) {
            fprintf(stderr, "%s\n", why);
            problem_free(&g);
            return rc;
        }
        r->counted = 1;
    }
    problem_free(&g);
    return 0;
}

/* ---- the backward ---- */

/* A forward problem plus dO and the three gradients. */
struct gpu_bwd_problem {
    struct gpu_problem f;
    struct dbuf dO, dQ, dK, dV;
};

static void bwd_init(struct gpu_bwd_problem *g, const struct stage *st, const struct shape *sh, enum dtype dt,
                     int deterministic, const float *Q, const float *K, const float *V, const float *dO)
{
    size_t n = shape_elems(sh);
    problem_init(&g->f, st, sh, dt, deterministic, 0, Q, K, V);
    g->dO = upload(dO, n, dt);
    g->dQ = dbuf_alloc(n * dtype_size(dt));
    g->dK = dbuf_alloc(n * dtype_size(dt));
    g->dV = dbuf_alloc(n * dtype_size(dt));
    g->f.args.dO = g->dO.p;
    g->f.args.dQ = g->dQ.p, g->f.args.dK = g->dK.p, g->f.args.dV = g->dV.p;
}

static void bwd_free(struct gpu_bwd_problem *g)
{
    struct dbuf *all[] = {&g->dO, &g->dQ, &g->dK, &g->dV};
    for (struct dbuf *b : all) dbuf_free(b);
    problem_free(&g->f);
}

/* The stage's forward once (O and L for the backward), then the backward on poisoned gradients,
 * and the gradients back to the host. */
static int bwd_checked_run(const struct stage *st, struct gpu_bwd_problem *g, float *dQ, float *dK, float *dV,
                           float *O, float *L, char *why, size_t n)
{
    if (int rc = st->forward(&g->f.args, why, n)) return stage_failed(st, rc, why, n);
    if (O) download(O, &g->f.O, shape_elems(&g->f.args.sh), g->f.args.dtype);
    if (L) download(L, &g->f.L, shape_rows(&g->f.args.sh), DT_F32);
    struct dbuf *grads[3] = {&g->dQ, &g->dK, &g->dV};
    for (struct dbuf *b : grads) CUDA_CHECK(cudaMemset(b->p, 0xff, b->bytes));
    if (int rc = st->backward(&g->f.args, why, n)) return stage_failed(st, rc, why, n);
    CUDA_CHECK(cudaDeviceSynchronize());
    size_t elems = shape_elems(&g->f.args.sh);
    download(dQ, &g->dQ, elems, g->f.args.dtype);
    download(dK, &g->dK, elems, g->f.args.dtype);
    download(dV, &g->dV, elems, g->f.args.dtype);
    return 0;
}

extern "C" int gpu_backward_host(const struct stage *st, const struct shape *sh, enum dtype dt, int deterministic,
                                 const float *Q, const float *K, const float *V, const float *dO, float *dQ,
                                 float *dK, float *dV, char *why, size_t n)
{
    if (gpu_available(why, n) || gpu_arch_check(st->arch_sm, st->name, why, n)) return EXIT_NO_DEVICE;
    if (gpu_dtype_check(dt, st->name, why, n)) return EXIT_USAGE;
    struct gpu_bwd_problem g;
    bwd_init(&g, st, sh, dt, deterministic, Q, K, V, dO);
    int rc = bwd_checked_run(st, &g, dQ, dK, dV, NULL, NULL, why, n);
    bwd_free(&g);
    return rc;
}

extern "C" int gpu_run_backward(const struct stage *st, const struct opts *o, const float *Q, const float *K,
                                const float *V, const float *dO, float *dQ, float *dK, float *dV, float *O, float *L,
                                struct result *r)
{
    char why[512];
    struct gpu_info info = gpu_query();
    snprintf(r->gpu, sizeof r->gpu, "%s", info.slug);
    snprintf(r->device_name, sizeof r->device_name, "%s", info.name);
    arch_text(r->arch, sizeof r->arch);
    if (int rc = tiles_text(st, &o->sh, o->dtype, o->deterministic, r->tiles, sizeof r->tiles, why, sizeof why)) {
        fprintf(stderr, "%s\n", why);
        return rc;
    }
    struct gpu_bwd_problem g;
    bwd_init(&g, st, &o->sh, o->dtype, o->deterministic, Q, K, V, dO);
    r->extra_bytes = g.f.work.bytes;
    int rc = bwd_checked_run(st, &g, dQ, dK, dV, O, L, why, sizeof why); /* also the first warm-up */
    if (rc) {
        fprintf(stderr, "%s\n", why);
        bwd_free(&g);
        return rc;
    }
    timed_runs(st->backward, &g.f.args, o, &info, r);
    bwd_free(&g);
    return 0;
}
