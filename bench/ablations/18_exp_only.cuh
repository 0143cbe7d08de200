/* 18_exp_only.cuh: the softmax of the floors 18_exp_only.cu, 18_exp_only_mufu.cu and 18_max_exp.cu, put
 * in place of stage 18's (tile_softmax) for their configurations' negative POLY_EVERY: -k takes every
 * k-th n8 tile of S's columns by the polynomial, the rest on MUFU (-64, more n8 tiles than a tile has:
 * all on MUFU); -128: softmax.cuh's online softmax, the row max as well, without O's rescale.
 * Included after stages/18_exp2_two_pipes.cu. */
#ifndef ABLATION_18_EXP_ONLY_CUH
#define ABLATION_18_EXP_ONLY_CUH

namespace {
/* A softmax of its exponentials and their row sums alone, P = exp2(scale_log2 S), l_i += rowsum(P),
 * every EVERY-th n8 tile by the polynomial; no max, no rescale (the result is wrong; only its time
 * counts). The sums stay: the stage's vote reads l_i, which is what keeps every exponential above
 * the wait for P V. */
template <int EVERY>
struct exponentials_only {
    template <int M_TILES, int KT>
    static __device__ __forceinline__ bool run(float (&S)[M_TILES][KT][4], float (&)[M_TILES][2],
                                               float (&l_i)[M_TILES][2], float (&alpha)[M_TILES][2],
                                               bool (&moved)[M_TILES][2], float scale_log2)
    {
#pragma unroll
        for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < KT; nt++)
#pragma unroll
                    for (int e = 2 * h; e < 2 * h + 2; e++) {
                        const float x = S[mt][nt][e] * scale_log2;
                        S[mt][nt][e] = nt % EVERY == EVERY - 1 ? exp2_poly(x) : exp2_approx(x);
                        sum += S[mt][nt][e];
                    }
                alpha[mt][h] = 1.f, moved[mt][h] = false, l_i[mt][h] += sum;
            }
        return false;
    }
};
/* The floor with the row max too: softmax.cuh's online_softmax (the max, the exponentials on MUFU,
 * l_i's exact update), and no rescale of O ever (the result is wrong where a row's max rises after
 * its first tiles; only its time counts): what an online softmax does short of rescaling O. Stage 17
 * adds the vote and the rare rescale to it, and keeps the max stale where this keeps it exact. */
struct max_and_exponentials {
    template <int M_TILES, int KT>
    static __device__ __forceinline__ bool run(float (&S)[M_TILES][KT][4], float (&m_i)[M_TILES][2],
                                               float (&l_i)[M_TILES][2], float (&alpha)[M_TILES][2],
                                               bool (&moved)[M_TILES][2], float scale_log2)
    {
        online_softmax(S, m_i, l_i, alpha, scale_log2);
#pragma unroll
        for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) alpha[mt][h] = 1.f, moved[mt][h] = false;
        return false;
    }
};
/* the POLY_EVERY the floors' configurations take: -8 (stage 18's share at d = 64), -64 (none), -128
 * (the max too, none) */
template <>
struct tile_softmax<-8> : exponentials_only<8> {};
template <>
struct tile_softmax<-64> : exponentials_only<64> {};
template <>
struct tile_softmax<-128> : max_and_exponentials {};
} // namespace

#endif
