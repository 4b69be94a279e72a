/* The dot products of Q4_K and Q5_K (quant/kformat.h says what each computes; layouts: quant/reference.h).
 *
 * A super-block's weight j of sub-block s (32 weights, s < 8) is d * sc_s * q - dmin * m_s, so with int8
 * activations (x = dx * qx, llama.cpp's Q8_K) its dot is
 *     dx * (d * sum_s sc_s * dot(q_s, qx_s) - dmin * sum_s m_s * sum(qx_s))
 * where the integer part is exact and sum(qx_s) is two of the activations' bsums. Every path below computes these
 * same two integers per block (isum and msum) and only then goes to fp32, so the scalar, AVX2 and AVX-512 dots agree
 * up to fp32 summation order. Ranges (q <= 31, sc, m <= 63, |qx| <= 127): maddubs's 16-bit pair sums <= 2 * 31 * 127
 * (no saturation), each madd with a scale <= 2 * 7874 * 63, a block's isum <= 256 * 31 * 127 * 63 < 2^31.
 *
 * The exact dot (fp32 activations) dequantizes a block once for every row, as the reference does (d * sc first,
 * then times q, less dmin * m), and FMAs it with each row (AVX-512: by table lookup, quant/dots_k45_avx512.h);
 * without AVX2 the driver's own dequantizing dot runs. */
#ifndef QUANT_DOTS_Q4K_Q5K_H
#define QUANT_DOTS_Q4K_Q5K_H
#include "quant/kformat.h"

#define K45_BYTES(five) ((five) ? 176 : 144) /* a block: d, dmin, 12 scale bytes, (Q5_K: 32 qh bytes), 128 of nibbles */
#define K45_QL(five) ((five) ? 48 : 16)      /* byte offset of its nibbles */

/* The 8 scales and 8 minimums of a super-block (k4_scale_min's 6 bits each) from its 12 scale bytes, as bytes of a
 * word each, four lanes at a time: sc 0..3 and m 0..3 are the low 6 bits of bytes 0..3 and 4..7; sc and m 4..7 take
 * their low 4 bits from bytes 8..11 and their top 2 from the top bits of bytes 0..3 and 4..7. */
static inline void k45_scales(const uint8_t *raw, uint64_t *sc, uint64_t *mn) {
    uint32_t u0, u1, u2;
    memcpy(&u0, raw, 4);
    memcpy(&u1, raw + 4, 4);
    memcpy(&u2, raw + 8, 4);
    const uint32_t low6 = 0x3f3f3f3fu, low4 = 0x0f0f0f0fu, top2 = 0x03030303u;
    *sc = (uint64_t)(u0 & low6) | (uint64_t)((u2 & low4) | (((u0 >> 6) & top2) << 4)) << 32;
    *mn = (uint64_t)(u1 & low6) | (uint64_t)(((u2 >> 4) & low4) | (((u1 >> 6) & top2) << 4)) << 32;
}

/* The same as 8 bytes each, for the paths that take one scale at a time. */
static inline void k45_scale_bytes(const uint8_t *blk, uint8_t sc[8], uint8_t mn[8]) {
    uint64_t sc8, mn8;
    k45_scales(blk + 4, &sc8, &mn8);
    memcpy(sc, &sc8, 8);
    memcpy(mn, &mn8, 8);
}

/* The 256 quants of a block in weight order: each 64 weights c are the low then the high nibbles of 32 bytes, plus
 * (Q5_K) bits 2c and 2c + 1 of the 32 qh bytes as their fifth bits. */
static inline void k45_quants(int five, const uint8_t *blk, uint8_t q[QK_K]) {
    const uint8_t *qh = blk + 16, *ql = blk + K45_QL(five);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = (uint8_t)((ql[32 * c + l] & 15) | (five ? ((qh[l] >> (2 * c)) & 1) << 4 : 0));
            q[64 * c + 32 + l] = (uint8_t)((ql[32 * c + l] >> 4) | (five ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0));
        }
}

/* The int8 dot without SIMD: the reference for the others (same integers, one fp32 step per block and row). */
static __attribute__((unused)) void k45_dot_q8_scalar(int five, const uint8_t *wrow, int nb, const ActBlockK *act, int64_t act_row, int nr,
                              float *sums) {
    uint8_t q[QK_K], sc[8], mn[8];
    for (int r = 0; r < nr; r++) sums[r] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * K45_BYTES(five);
        k45_scale_bytes(blk, sc, mn);
        k45_quants(five, blk, q);
        const float d = fp16_at(blk), dmin = fp16_at(blk + 2);
        for (int r = 0; r < nr; r++) {
            const ActBlockK *a = act + r * act_row + b;
            int32_t isum = 0, msum = 0;
            for (int s = 0; s < 8; s++) {
                int32_t dot = 0;
                for (int l = 0; l < 32; l++) dot += q[32 * s + l] * a->qs[32 * s + l];
                isum += sc[s] * dot;
                msum += mn[s] * (a->bsums[2 * s] + a->bsums[2 * s + 1]);
            }
            sums[r] += a->d * (d * (float)isum - dmin * (float)msum);
        }
    }
}

#ifdef QL_AVX2
/* The weight row K45_PREFETCH bytes ahead of block blk (past its end: the next row's start, which the thread most often
 * takes next; a prefetch does not fault). One thread's 1-row Q4_K stream (48 distinct 2048 x 8192 matrices, this
 * 2-core Xeon VM, shared and noisy) went from 6.6-6.8 GB/s with the hardware prefetcher alone to 7.3-10 with this,
 * interleaved runs; 1 to 3 KB ahead measured alike. */
#ifndef K45_PREFETCH
#define K45_PREFETCH 2048
#endif
static inline void k45_prefetch(const uint8_t *blk) {
    for (int l = 0; l < 3; l++) _mm_prefetch((const char *)(blk + K45_PREFETCH + 64 * l), _MM_HINT_T0);
}

/* Each scale (minimum) as the int16 pair that multiplies the activations' bsums 2s and 2s + 1. */
static inline __m256i k45_pair_mins(uint64_t mn8) {
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_cvtsi64_si128((long long)mn8), dup));
}

/* acc += dx * (d * isum - dmin * msum) lane by lane; msum's lanes: the minimums times the activations' bsums. */
static inline __m256 k45_block_end(__m256 acc, __m256i isum, const ActBlockK *a, __m256i mins, __m256 d, __m256 dmin) {
    const __m256i msum = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), mins);
    const __m256 t = _mm256_fmsub_ps(_mm256_cvtepi32_ps(isum), d, _mm256_mul_ps(_mm256_cvtepi32_ps(msum), dmin));
    return _mm256_fmadd_ps(t, _mm256_broadcast_ss(&a->d), acc);
}

/* The AVX2 int8 dot for NR rows (a constant after inlining): per 64 weights c, one 32-byte load gives sub-block 2c
 * (low nibbles) and 2c + 1 (high), each maddubs'd with its 32 activations and madd'd with its scale (the int16
 * broadcast of sc_s), so each row costs 2 maddubs, 2 madd and 2 adds per 64 weights. */
static inline __attribute__((always_inline)) void k45_dot_q8_avx2(int five, const uint8_t *wrow, int nb,
                                                                  const ActBlockK *act, int64_t act_row, int NR,
                                                                  float *sums) {
    const __m256i nib = _mm256_set1_epi8(0x0f), bit4 = _mm256_set1_epi8(0x10);
    __m256 acc[KQ_ROWS];
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * K45_BYTES(five), *ql = blk + K45_QL(five);
        k45_prefetch(blk);
        uint64_t sc8, mn8;
        k45_scales(blk + 4, &sc8, &mn8);
        const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
        __m256i h = five ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
        __m256i isum[KQ_ROWS];
        for (int r = 0; r < NR; r++) isum[r] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(ql + 32 * c));
            __m256i lo = _mm256_and_si256(w, nib), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), nib);
            if (five) { /* h holds qh shifted down by 2c: bit 0 is sub-block 2c's fifth bit, bit 1 2c + 1's */
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(h, 4), bit4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(h, 3), bit4));
                h = _mm256_srli_epi16(h, 2);
            }
            /* int16 element 2c (2c + 1) of `scales` in every lane */
            const __m256i s_lo = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)(0x0100 * (4 * c + 1) + 4 * c)));
            const __m256i s_hi = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)(0x0100 * (4 * c + 3) + 4 * c + 2)));
            for (int r = 0; r < NR; r++) {
                const int8_t *x = act[r * act_row + b].qs + 64 * c;
                const __m256i p_lo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)x));
                const __m256i p_hi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 32)));
                isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(_mm256_madd_epi16(p_lo, s_lo),
                                                                     _mm256_madd_epi16(p_hi, s_hi)));
                K_PIN(isum[r]);
            }
        }
        const __m256i mins = k45_pair_mins(mn8);
        const __m256 d = _mm256_set1_ps(fp16_at(blk)), dmin = _mm256_set1_ps(fp16_at(blk + 2));
        for (int r = 0; r < NR; r++) acc[r] = k45_block_end(acc[r], isum[r], act + r * act_row + b, mins, d, dmin);
    }
    for (int r = 0; r < NR; r++) sums[r] = hsum8(acc[r]);
}

/* The exact dot for NR rows: 8 weights at a time from 8 bytes of nibbles (and 8 of qh), dequantized as the
 * reference does, then one FMA per row. */
static inline __attribute__((always_inline)) void k45_dot_f32_avx2(int five, const uint8_t *wrow, int nb,
                                                                   const float *x, int64_t x_row, int NR,
                                                                   float *sums) {
    const __m256i nib = _mm256_set1_epi32(15), one = _mm256_set1_epi32(1);
    __m256 acc[KQ_ROWS];
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * K45_BYTES(five), *qh = blk + 16, *ql = blk + K45_QL(five);
        k45_prefetch(blk);
        uint8_t sc[8], mn[8];
        k45_scale_bytes(blk, sc, mn);
        const float d = fp16_at(blk), dmin = fp16_at(blk + 2);
        const float *xb = x + (int64_t)b * QK_K;
        for (int c = 0; c < 4; c++) {
            const __m256 d_lo = _mm256_set1_ps(d * (float)sc[2 * c]), m_lo = _mm256_set1_ps(dmin * (float)mn[2 * c]);
            const __m256 d_hi = _mm256_set1_ps(d * (float)sc[2 * c + 1]);
            const __m256 m_hi = _mm256_set1_ps(dmin * (float)mn[2 * c + 1]);
            for (int g = 0; g < 4; g++) {
                const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(ql + 32 * c + 8 * g)));
                __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_srli_epi32(v, 4);
                if (five) {
                    const __m256i hv = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qh + 8 * g)));
                    lo = _mm256_or_si256(lo, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hv, 2 * c), one), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hv, 2 * c + 1), one), 4));
                }
                const __m256 w_lo = _mm256_sub_ps(_mm256_mul_ps(d_lo, _mm256_cvtepi32_ps(lo)), m_lo);
                const __m256 w_hi = _mm256_sub_ps(_mm256_mul_ps(d_hi, _mm256_cvtepi32_ps(hi)), m_hi);
                for (int r = 0; r < NR; r++) {
                    const float *xr = xb + r * x_row + 64 * c + 8 * g;
                    acc[r] = _mm256_fmadd_ps(w_lo, _mm256_loadu_ps(xr), acc[r]);
                    acc[r] = _mm256_fmadd_ps(w_hi, _mm256_loadu_ps(xr + 32), acc[r]);
                }
            }
        }
    }
    for (int r = 0; r < NR; r++) sums[r] = hsum8(acc[r]);
}
#endif

#include "quant/dots_k45_avx512.h"

#ifndef K45_Q8_ROWS
/* AVX2's 16 registers hold 8 rows' integer sums beside the block's nibbles and scales (their fp32 sums are touched
 * once a block); pinned (K_PIN), a pass of 8 ran 5 rows at 63 G MACs/s a thread where passes of 4 + 1 ran 46 (Zen 3) */
#define K45_Q8_ROWS 8
#endif

/* The dots for a runtime row count nr <= KQ_ROWS, in passes of K45_Q8_ROWS rows (int8) or 4 (exact), each row count
 * compiled with its constants so that the accumulators stay in registers. */
#define K45_PASSES(WIDTH, CASES, CALL)                                    \
    for (int r0 = 0; r0 < nr; r0 += (WIDTH)) {                            \
        const int n = nr - r0 < (WIDTH) ? nr - r0 : (WIDTH);              \
        CASES(CALL)                                                       \
    }
#define K45_CASES(CALL)     \
    switch (n) {            \
    case 1: CALL(1); break; \
    case 2: CALL(2); break; \
    case 3: CALL(3); break; \
    default: CALL(4); break; \
    }
#define K45_WIDE_CASES(CALL) \
    switch (n) {             \
    case 1: CALL(1); break;  \
    case 2: CALL(2); break;  \
    case 3: CALL(3); break;  \
    case 4: CALL(4); break;  \
    case 5: CALL(5); break;  \
    case 6: CALL(6); break;  \
    case 7: CALL(7); break;  \
    default: CALL(8); break; \
    }

static inline __attribute__((always_inline)) void k45_dot_q8(int five, const uint8_t *wrow, int nb, const void *act,
                                                             int64_t act_row, int nr, float *sums) {
    const ActBlockK *a = (const ActBlockK *)act;
#if defined(K45_ZMM)
#define K45_Q8(N) k45_dot_q8_zmm(five, wrow, nb, a + r0 * act_row, act_row, N, sums + r0)
    K45_PASSES(K45_Q8_ROWS, K45_WIDE_CASES, K45_Q8)
#elif defined(QL_AVX2)
#define K45_Q8(N) k45_dot_q8_avx2(five, wrow, nb, a + r0 * act_row, act_row, N, sums + r0)
    K45_PASSES(K45_Q8_ROWS, K45_WIDE_CASES, K45_Q8)
#else
    k45_dot_q8_scalar(five, wrow, nb, a, act_row, nr, sums);
#endif
}
static void q4_k_dot_q8(const uint8_t *w, int nb, const void *act, int64_t act_row, int nr, float *sums) {
    k45_dot_q8(0, w, nb, act, act_row, nr, sums);
}
static void q5_k_dot_q8(const uint8_t *w, int nb, const void *act, int64_t act_row, int nr, float *sums) {
    k45_dot_q8(1, w, nb, act, act_row, nr, sums);
}
#define Q4_K_DOT_Q8 q4_k_dot_q8
#define Q5_K_DOT_Q8 q5_k_dot_q8

#ifdef QL_AVX2
#ifdef K45_ZMM
#define K45_F32(N) k45_dot_f32_zmm(five, wrow, nb, x + r0 * x_row, x_row, N, sums + r0)
#else
#define K45_F32(N) k45_dot_f32_avx2(five, wrow, nb, x + r0 * x_row, x_row, N, sums + r0)
#endif
static inline __attribute__((always_inline)) void k45_dot_f32(int five, const uint8_t *wrow, int nb, const float *x,
                                                              int64_t x_row, int nr, float *sums) {
    K45_PASSES(4, K45_CASES, K45_F32)
}
static void q4_k_dot_f32(const uint8_t *w, int nb, const float *x, int64_t x_row, int nr, float *sums) {
    k45_dot_f32(0, w, nb, x, x_row, nr, sums);
}
static void q5_k_dot_f32(const uint8_t *w, int nb, const float *x, int64_t x_row, int nr, float *sums) {
    k45_dot_f32(1, w, nb, x, x_row, nr, sums);
}
#define Q4_K_DOT_F32 q4_k_dot_f32
#define Q5_K_DOT_F32 q5_k_dot_f32
#else
#define Q4_K_DOT_F32 NULL /* the driver's dequantizing dot is the scalar one */
#define Q5_K_DOT_F32 NULL
#endif
#endif
