/* mma.cuh: the only inline PTX in the project. Tensor-core mma.sync, ldmatrix, cp.async and
 * the small conversions around them, each as a named helper.
 *
 * Fragment layouts follow the PTX ISA ("Matrix Fragments for mma.m16n8k16"). Within a warp,
 *   lane = threadIdx.x % 32,  g = groupID = lane >> 2 (0..7),  t = tid_in_group = lane & 3 (0..3).
 * A 32-bit register holding two 16-bit elements keeps the lower-indexed one in its low half.
 *
 * Turing (sm_75, e.g. the T4). The stages keep one code path; what Turing lacks is made up here,
 * behind the same calls, where the code is compiled for an architecture below sm_80
 * (__CUDA_ARCH__ < 800: TURING_PATH below):
 *   - mma.sync m16n8k16 (sm_80) is two m16n8k8 (sm_75), the first over k = 0..7, the second over
 *     k = 8..15: the k16 fragments are exactly the two k8 ones side by side (see mma_m16n8k16_f16);
 *   - cp.async (sm_80) is a plain 16-byte load and shared-memory store: the copy is complete when
 *     the call returns, so cp_async_commit and cp_async_wait have nothing to do. A kernel's
 *     barriers stay right: it only starts a copy into a buffer no warp still reads (an async copy
 *     may land at once too), and it reads the buffer only after a wait and a __syncthreads;
 *   - bf16 tensor-core mma does not exist before sm_80: mma_m16n8k16_bf16 traps there, and the
 *     runner refuses bf16 before any launch (gpu_dtype_check in common/cuda/runner.cu: exit 2);
 *   - ldmatrix (sm_75), ex2.approx and the conversions are the same on both.
 */
#ifndef MMA_CUH
#define MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* Compiled for Turing (sm_75): no m16n8k16 mma, no cp.async, no bf16 mma. Host code and the
 * sm_80+ compiles see 0. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define TURING_PATH 1
#else
#define TURING_PATH 0
#endif

/* ---- mma.sync m16n8k16: D = A * B + C, 16-bit inputs, fp32 accumulate ----
 *
 * A is 16x16 (row-major, "row"), B is 16x8 (K x N, "col"), C/D are 16x8 fp32.
 *   a[0] = A[g    ][2t, 2t+1]     a[1] = A[g + 8][2t, 2t+1]
 *   a[2] = A[g    ][2t+8, 2t+9]   a[3] = A[g + 8][2t+8, 2t+9]
 *   b[0] = B[2t, 2t+1  ][g]       b[1] = B[2t+8, 2t+9][g]       (two k rows of column g)
 *   c[0], c[1] = C[g    ][2t], C[g    ][2t+1]
 *   c[2], c[3] = C[g + 8][2t], C[g + 8][2t+1]
 * Note that the C layout of two adjacent n8 tiles (columns 0-7 and 8-15) is exactly the A layout
 * of one k16 tile: pack (c[0],c[1]) of tile 0 -> a[0], (c[2],c[3]) of tile 0 -> a[1],
 * (c[0],c[1]) of tile 1 -> a[2], (c[2],c[3]) of tile 1 -> a[3]. That is how P stays in registers. */
/* Turing's m16n8k8 (fp16 only): A is 16x8, B is 8x8, C/D as above.
 *   a[0] = A[g][2t, 2t+1]   a[1] = A[g + 8][2t, 2t+1]   b = B[2t, 2t+1][g]
 * These are the m16n8k16 fragments of columns (A) and rows (B) 0-7 alone: a[0], a[1], b[0] of a
 * k16 step are one k8 step, a[2], a[3], b[1] the next. */
static __device__ __forceinline__ void mma_m16n8k8_f16(float c[4], uint32_t a0, uint32_t a1, uint32_t b)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(b));
}

static __device__ __forceinline__ void mma_m16n8k16_f16(float c[4], const uint32_t a[4], const uint32_t b[2])
{
#if TURING_PATH
    mma_m16n8k8_f16(c, a[0], a[1], b[0]); /* k = 0..7 */
    mma_m16n8k8_f16(c, a[2], a[3], b[1]); /* k = 8..15, accumulated onto the first */
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* Same layouts, bf16 inputs (sm_80 and newer: Turing's tensor cores take no bf16, and a kernel
 * compiled for it stops here; the runner never launches one). */
static __device__ __forceinline__ void mma_m16n8k16_bf16(float c[4], const uint32_t a[4], const uint32_t b[2])
{
#if TURING_PATH
    (void)c, (void)a, (void)b;
    __trap();
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* ---- ldmatrix: 8x8 tiles of 16-bit elements from shared memory into fragments ----
 *
 * Each lane passes the address of one 16-byte row (8 elements, 16-byte aligned):
 *   lanes 0-7 give rows 0-7 of matrix 0, lanes 8-15 of matrix 1, lanes 16-23 of matrix 2,
 *   lanes 24-31 of matrix 3 (x2: only lanes 0-15 are read, matrices 0 and 1).
 * Without .trans, r[k] = M_k[g][2t, 2t+1]    (row g of matrix k, the layout of a[] and c[]).
 * With    .trans, r[k] = M_k[2t, 2t+1][g]    (column g: the layout of b[] when M_k is stored
 *                                             k-major, e.g. V stored [key][dim]). */
/* The same from a 32-bit shared-memory address (what __cvta_generic_to_shared gives): lets a
 * kernel do its address arithmetic in 32 bits. */
static __device__ __forceinline__ void ldmatrix_x4_at(uint32_t r[4], unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

static __device__ __forceinline__ void ldmatrix_x4_trans_at(uint32_t r[4], unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

static __device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *smem)
{
    ldmatrix_x4_at(r, (unsigned)__cvta_generic_to_shared(smem));
}

static __device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *smem)
{
    ldmatrix_x4_trans_at(r, (unsigned)__cvta_generic_to_shared(smem));
}

static __device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void *smem)
{
    unsigned addr = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr)
                 : "memory");
}

static __device__ __forceinline__ void ldmatrix_x2_trans(uint32_t r[2], const void *smem)
{
    unsigned addr = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr)
                 : "memory");
}

/* ---- cp.async: global -> shared copies that bypass registers (and L1, .cg) ----
 *
 * Each thread copies its own 16 bytes; both addresses 16-byte aligned. The copies of one thread
 * form a group at cp_async_commit(); cp_async_wait<N>() waits until at most N of that thread's
 * groups are still in flight. Other threads' copies are visible only after a __syncthreads()
 * that follows their wait.
 * Turing: a load into registers and a store to shared memory, done when the call returns (the
 * load still bypasses L1, __ldcg); the group calls are empty. What a kernel loses there is the
 * overlap: a warp waits for its own loads at the store, and only other warps compute meanwhile. */
static __device__ __forceinline__ void cp_async_16(void *smem, const void *gmem)
{
#if TURING_PATH
    *(uint4 *)smem = __ldcg((const uint4 *)gmem);
#else
    unsigned addr = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(gmem) : "memory");
#endif
}

/* Tail variant: when !valid, reads 0 bytes (src-size 0) and writes 16 zero bytes. Pass a gmem
 * address that is valid anyway (e.g. row 0 of the tensor): the caller never forms a pointer
 * past the end. */
static __device__ __forceinline__ void cp_async_16_zfill(void *smem, const void *gmem, bool valid)
{
#if TURING_PATH
    *(uint4 *)smem = valid ? __ldcg((const uint4 *)gmem) : make_uint4(0, 0, 0, 0);
#else
    unsigned addr = (unsigned)__cvta_generic_to_shared(smem);
    int src_size = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem), "r"(src_size)
                 : "memory");
#endif
}

/* Four bytes (one float), with the same zero-fill tail rule; through L1 (.ca: the 4-byte size
 * has no .cg form). */
static __device__ __forceinline__ void cp_async_4_zfill(void *smem, const void *gmem, bool valid)
{
#if TURING_PATH
    *(float *)smem = valid ? *(const float *)gmem : 0.f;
#else
    unsigned addr = (unsigned)__cvta_generic_to_shared(smem);
    int src_size = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(addr), "l"(gmem), "r"(src_size)
                 : "memory");
#endif
}

static __device__ __forceinline__ void cp_async_commit()
{
#if !TURING_PATH /* Turing: every copy is already complete */
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
static __device__ __forceinline__ void cp_async_wait()
{
#if !TURING_PATH /* Turing: nothing in flight */
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* ---- conversions ---- */

/* Two floats -> one register of two fp16 (lo in the low half: the lower column index). */
static __device__ __forceinline__ uint32_t pack_half2(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

static __device__ __forceinline__ uint32_t pack_bf162(float lo, float hi)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* ---- the 16-bit input type as a template parameter ----
 * A kernel written for T = __half or __nv_bfloat16 calls mma16<T>::mma and mma16<T>::pack, so one
 * kernel serves both dtypes (the layouts are the same; only the instruction differs). */
template <typename T>
struct mma16;
template <>
struct mma16<__half> {
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], const uint32_t b[2])
    {
        mma_m16n8k16_f16(c, a, b);
    }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) { return pack_half2(lo, hi); }
};
template <>
struct mma16<__nv_bfloat16> {
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], const uint32_t b[2])
    {
        mma_m16n8k16_bf16(c, a, b);
    }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) { return pack_bf162(lo, hi); }
};

/* 2^x with one MUFU instruction (ex2.approx, flush-to-zero; rel. error ~2^-22). 2^-inf = +0. */
static __device__ __forceinline__ float exp2_approx(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#endif
