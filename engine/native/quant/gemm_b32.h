/* The batch GEMM of Q5_0, Q5_1 and IQ4_NL under AVX2 (kq_gemm's hook for them; included by quant/generic.h after
 * quant_linear.c has included quant/legacy_gemm.h, whose tiled int8 GEMM it runs).
 *
 * Once unpacked, these blocks are the legacy formats': Q5 q (0..31) is Q4's unsigned nibbles with the minimum m (Q5_1)
 * or -16 d (Q5_0, as Q4_0's -8 d), and four of its maddubs sums still fit 16 bits (4 * 2 * 31 * 127 < 2^15), so it
 * goes in Q4's quads; IQ4_NL's levels (|q| <= 127) are Q8_0's signed q, in pairs. The driver's GEMM instead called
 * the dots 4 activation rows at a time per weight row, converting and scaling every block for every row: the
 * tiles' 4 x 2 register blocking and Q4's one conversion per four blocks run SmolLM2's Q5_0 linears at 64 and 256
 * rows ~1.8x as fast. Integer products are exact; results equal the dots' up to fp32 summation order. */
#ifndef QUANT_GEMM_B32_H
#define QUANT_GEMM_B32_H
#ifdef QL_AVX2
#include "quant/dots_b32_iq4.h"

/* The legacy type whose GEMM multiplies a format's unpacked blocks. */
static int b32_gemm_type(int fmt) { return fmt == IQ4_NL ? Q8_0 : Q4_1; }

/* Weight rows [0, ni) of a tile, unpacked into the legacy GEMM's layout (unpack_tile's for these formats). */
static void b32_unpack_tile(int fmt, const uint8_t *w, int64_t w_row_bytes, int ni, int nb, GemmLayout L, WTile t) {
    const int bb = b32_block_bytes(fmt);
    for (int i = 0; i < ni; i++) {
        uint8_t *u = t.u + i * L.cw;
        int8_t *s = t.s + i * L.cw;
        float *d8 = t.d8 + i * L.sw, *m = t.m + i * nb;
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = w + (int64_t)i * w_row_bytes + (int64_t)b * bb;
            const float d = fp16_at(blk);
            const __m256i q = b32_weights(fmt, blk);
            gemm_place_scale(L, d8, b, d);
            if (fmt == IQ4_NL) {
                gemm_place_block(L, s, b, q);
                gemm_place_block(L, u, b, _mm256_sign_epi8(q, q));
            } else { /* Q5_0's q - 16 back to q */
                gemm_place_block(L, u, b, fmt == Q5_0 ? _mm256_add_epi8(q, _mm256_set1_epi8(16)) : q);
                m[b] = fmt == Q5_1 ? fp16_at(blk + 2) : -16.0f * d;
            }
        }
        if ((nb - L.nq * GEMM_QUAD) & 1) { /* the last pair's zero partner */
            gemm_place_block(L, u, nb, _mm256_setzero_si256());
            gemm_place_block(L, s, nb, _mm256_setzero_si256());
            gemm_place_scale(L, d8, nb, 0.0f);
        }
    }
}

/* quant_gemm_q8 for these formats: the legacy tiled GEMM over their unpacked blocks. 0, or -2 (memory). */
static int b32_gemm(int fmt, const uint8_t *w, int64_t w_row_bytes, int out_features, int in_features, const float *x,
                    int64_t x_row, int rows, const float *bias, float *y, int64_t y_row, int num_threads) {
    return tiled_gemm(b32_gemm_type(fmt), b32_unpack_tile, fmt, w, w_row_bytes, out_features, in_features, x, x_row,
                      rows, bias, y, y_row, num_threads);
}
#endif
#endif
