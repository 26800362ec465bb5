/* kernels/cuda/attn_combine.cuh — the split decode attention's combine
 * (flash-decoding's second step), shared by the backend's k_attn_combine and
 * the integer GEMV's input launch that runs it for the output projection
 * (trellis_cuda_gemv_attn): the same arithmetic, so both give the same bits.
 *
 * The partial results of one (row, head) are `splits` records of hd + 2
 * floats: [0, hd) the split's unnormalised output Σ e^(s − m) v, hd its
 * largest score m, hd + 1 its sum of exponentials l (0: the split had no
 * keys). out = Σ_s e^(m_s − M) o_s / Σ_s e^(m_s − M) l_s, splits in order. */
#ifndef SPARQ_KERNELS_CUDA_ATTN_COMBINE_CUH
#define SPARQ_KERNELS_CUDA_ATTN_COMBINE_CUH

/* M (the largest score of the splits with keys) and 1 / Σ e^(m_s − M) l_s. */
__device__ __forceinline__ void attn_combine_scale(const float *pb, int hd, int splits, float &M, float &inv)
{
    M = -INFINITY;
    for (int s = 0; s < splits; s++)
        if (pb[(size_t)s * (hd + 2) + hd + 1] > 0.f) M = fmaxf(M, pb[(size_t)s * (hd + 2) + hd]);
    float L = 0.f;
    for (int s = 0; s < splits; s++) {
        const float l = pb[(size_t)s * (hd + 2) + hd + 1];
        if (l > 0.f) L = fmaf(expf(pb[(size_t)s * (hd + 2) + hd] - M), l, L);
    }
    inv = 1.0f / L;
}

/* Output dimension i of the (row, head) whose records start at pb. */
__device__ __forceinline__ float attn_combine_dim(const float *pb, int hd, int splits, float M, float inv, int i)
{
    float a = 0.f;
    for (int s = 0; s < splits; s++) {
        const float l = pb[(size_t)s * (hd + 2) + hd + 1];
        if (l > 0.f) a = fmaf(expf(pb[(size_t)s * (hd + 2) + hd] - M), pb[(size_t)s * (hd + 2) + i], a);
    }
    return a * inv;
}

#endif
