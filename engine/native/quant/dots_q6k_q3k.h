/* The dot products of Q6_K and Q3_K (quant/kformat.h says what each computes). Both are 256-weight super-blocks of
 * 16 sub-blocks of 16 weights, each with an int8 scale, and one fp16 d: w = d * sc[i] * (u - off), with u unsigned
 * (Q6_K: 6 bits, off 32; Q3_K: 3 bits, off 4). One kernel serves both, a weight chunk of 32 at a time:
 *   Q6_K (210 bytes): ql[128] low nibbles, qh[64] high 2-bit pairs, int8 scales[16], fp16 d;
 *     chunk c = 4n + k (n: half of 128, k < 4) is ql[64n + 32 (k & 1) + l] >> 4 (k >> 1), with the pair
 *     (qh[32n + l] >> 2k) & 3 above it;
 *   Q3_K (110 bytes): hmask[32] third bits, qs[64] 2-bit pairs, 12 bytes of 6-bit scales (each less 32), fp16 d;
 *     chunk c = 4n + k is (qs[32n + l] >> 2k) & 3 with bit c of hmask[l] above it.
 * (llama.cpp's ggml-common.h; quant/reference.h dequantizes the same way.)
 *
 * int8 activations (ActBlockK: x ~= d_x * a): a block's dot is exact integer arithmetic, sum_i sc[i] * (sum over
 * sub-block i of u a) - off * sum_i sc[i] * bsums[i], scaled once by d * d_x. The unsigned u is what AVX2's maddubs
 * needs on one side; no step saturates: |u a| pairs <= 2 * 63 * 128 < 2^15, a block's sum < 63 * 128 * 128 * 256
 * < 2^31. The exact dot (fp32 activations) dequantizes each chunk as the reference does ((d * sc) * (u - off), here
 * one fma: exact in (u - off), so rounded once like the reference's product) and multiplies it into every row. */
#ifndef QUANT_DOTS_Q6K_Q3K_H
#define QUANT_DOTS_Q6K_Q3K_H
#include "quant/kformat.h"

#define K63_BYTES(t) ((t) == Q6_K ? 210 : 110)
#define K63_OFF(t) ((t) == Q6_K ? 32 : 4)
#define K63_D(t) ((t) == Q6_K ? 208 : 108) /* byte offset of the fp16 d */
/* Activation rows a pass of these kernels multiplies (the driver passes up to KQ_ROWS): what the accumulators hold
 * in registers. The int8 dot keeps one accumulator a row: 8 rows fit AVX2's 16 registers as AVX-512's 32 (at 8 rows
 * on a Xeon, 5 rows cost 1.14x one row from memory, against 1.23x in passes of 4). The exact dot keeps two a row:
 * 4 rows on AVX2. */
#define K63_ROWS 8
#ifndef K63_F32_ROWS
#if defined(__AVX512F__)
#define K63_F32_ROWS 8
#else
#define K63_F32_ROWS 4
#endif
#endif

/* Q3_K's 16 scales (each less 32) from its 12 bytes: sub-blocks 0..7 have their low nibble in bytes 0..7's low
 * nibbles, 8..15 in their high nibbles; the two high bits of sub-block j are bits 2 (j / 4) of byte 8 + j % 4. Four
 * sub-blocks at a time, as 32-bit words of the bytes. */
static inline void q3k_scales_fast(const uint8_t *raw, int8_t out[16]) {
    uint32_t a[3], s[4];
    memcpy(a, raw, 12);
    const uint32_t lo = 0x0f0f0f0fu, hi = 0x03030303u;
    s[0] = (a[0] & lo) | ((a[2] & hi) << 4);
    s[1] = (a[1] & lo) | (((a[2] >> 2) & hi) << 4);
    s[2] = ((a[0] >> 4) & lo) | (((a[2] >> 4) & hi) << 4);
    s[3] = ((a[1] >> 4) & lo) | (((a[2] >> 6) & hi) << 4);
    uint8_t u[16];
    memcpy(u, s, 16);
    for (int j = 0; j < 16; j++) out[j] = (int8_t)(u[j] - 32);
}

/* A block's weights as signed integers q = u - off, its 16 scales and its d (the scalar path). */
static inline void k63_unpack(int qtype, const uint8_t *blk, int8_t q[QK_K], int8_t sc[16], float *d) {
    *d = fp16_at(blk + K63_D(qtype));
    if (qtype == Q6_K) {
        memcpy(sc, blk + 192, 16);
        for (int c = 0; c < 8; c++) {
            const int n = c / 4, k = c % 4;
            const uint8_t *ql = blk + 64 * n + 32 * (k & 1), *qh = blk + 128 + 32 * n;
            for (int l = 0; l < 32; l++)
                q[32 * c + l] = (int8_t)((((ql[l] >> (4 * (k >> 1))) & 15) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32);
        }
    } else {
        q3k_scales_fast(blk + 96, sc);
        for (int c = 0; c < 8; c++) {
            const uint8_t *qs = blk + 32 + 32 * (c / 4);
            for (int l = 0; l < 32; l++)
                q[32 * c + l] = (int8_t)(((qs[l] >> (2 * (c % 4))) & 3) | (((blk[l] >> c) & 1) << 2)) - 4;
        }
    }
}

static inline __attribute__((always_inline)) void k63_dot_q8_scalar(int qtype, const uint8_t *wrow, int nb,
                                                                    const ActBlockK *act, int64_t act_row, int nr,
                                                                    float *sums) {
    int8_t q[QK_K], sc[16];
    float d;
    for (int r = 0; r < nr; r++) sums[r] = 0.0f;
    for (int b = 0; b < nb; b++) {
        k63_unpack(qtype, wrow + (int64_t)b * K63_BYTES(qtype), q, sc, &d);
        for (int r = 0; r < nr; r++) {
            const ActBlockK *a = act + r * act_row + b;
            int32_t total = 0;
            for (int i = 0; i < 16; i++) {
                int32_t s = 0;
                for (int j = 16 * i; j < 16 * i + 16; j++) s += q[j] * a->qs[j];
                total += sc[i] * s;
            }
            sums[r] += d * a->d * (float)total;
        }
    }
}

static inline __attribute__((always_inline)) void k63_dot_f32_scalar(int qtype, const uint8_t *wrow, int nb,
                                                                     const float *x, int64_t x_row, int nr,
                                                                     float *sums) {
    int8_t q[QK_K], sc[16];
    float d, w[QK_K];
    for (int r = 0; r < nr; r++) sums[r] = 0.0f;
    for (int b = 0; b < nb; b++) {
        k63_unpack(qtype, wrow + (int64_t)b * K63_BYTES(qtype), q, sc, &d);
        for (int j = 0; j < QK_K; j++) w[j] = d * (float)sc[j / 16] * (float)q[j];
        for (int r = 0; r < nr; r++) {
            const float *xb = x + r * x_row + (int64_t)b * QK_K;
            float s = 0.0f;
            for (int j = 0; j < QK_K; j++) s += w[j] * xb[j];
            sums[r] += s;
        }
    }
}

#ifdef QL_AVX2
/* int32 lanes += the products of int16 pairs: one vpdpwssd where the CPU has AVX-VNNI (or AVX-512 VNNI), else
 * madd + add. */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define K63_DPWSSD(acc, a, b) _mm256_dpwssd_epi32(acc, a, b)
#elif defined(__AVXVNNI__)
#define K63_DPWSSD(acc, a, b) _mm256_dpwssd_avx_epi32(acc, a, b)
#else
#define K63_DPWSSD(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#endif

/* The block K63_PREFETCH bytes ahead requested now: a weight row is one sequential stream, but the hardware
 * prefetcher alone left the 1-row GEMV ~15% below the Q8_0 kernel (which prefetches) from memory on this Xeon;
 * with it, level. Past the last row this names memory it never reads: a prefetch does not fault. */
#ifndef K63_PREFETCH
#define K63_PREFETCH 4096
#endif
static inline __attribute__((always_inline)) void k63_prefetch(int qtype, const uint8_t *blk) {
    const uintptr_t ahead = (uintptr_t)blk + K63_PREFETCH;
    for (int l = 0; l < K63_BYTES(qtype); l += 64) _mm_prefetch((const char *)(ahead + (uintptr_t)l), _MM_HINT_T0);
}

/* Chunk c = 4n + k of a block as 32 unsigned bytes u (Q6_K: 0..63; Q3_K: 0..7), from the layouts above; k is a
 * constant after inlining, n need not be. */
static inline __attribute__((always_inline)) __m256i k63_chunk_nk(int qtype, const uint8_t *blk, int n, int k) {
    if (qtype == Q6_K) {
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 64 * n + 32 * (k & 1)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
        const __m256i low = _mm256_and_si256(k < 2 ? ql : _mm256_srli_epi16(ql, 4), _mm256_set1_epi8(0x0f));
        /* the pair (bits 2k, 2k + 1) to bits 4, 5: 16-bit shifts, whose bits crossing bytes the mask drops */
        const __m256i pair = k == 0 ? _mm256_slli_epi16(qh, 4)
                             : k == 1 ? _mm256_slli_epi16(qh, 2)
                             : k == 2 ? qh
                                      : _mm256_srli_epi16(qh, 2);
        return _mm256_or_si256(low, _mm256_and_si256(pair, _mm256_set1_epi8(0x30)));
    }
    const __m256i qs = _mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * n));
    /* the mask's bits 4n.. down to bits 0.. (bits crossing bytes go to bits >= 4 of the byte below: dropped below) */
    const __m256i hm = _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)blk), _mm_cvtsi32_si128(4 * n));
    const __m256i two = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * k), _mm256_set1_epi8(3));
    /* bit k of the shifted mask to bit 2 */
    const __m256i third = k < 2 ? _mm256_slli_epi16(hm, 2 - k) : _mm256_srli_epi16(hm, k - 2);
    return _mm256_or_si256(two, _mm256_and_si256(third, _mm256_set1_epi8(4)));
}
static inline __attribute__((always_inline)) __m256i k63_chunk(int qtype, const uint8_t *blk, int c) {
    return k63_chunk_nk(qtype, blk, c / 4, c % 4);
}

/* The 16 int8 scales of a block. */
static inline __attribute__((always_inline)) __m128i k63_scales(int qtype, const uint8_t *blk) {
    if (qtype == Q6_K) return _mm_loadu_si128((const __m128i *)(blk + 192));
    /* q3k_scales_fast in lanes (no round trip through memory): words [a0, a1, a0 >> 4, a1 >> 4] hold the low
     * nibbles, a2 >> [0, 2, 4, 6] the high pairs */
    uint32_t a[3];
    memcpy(a, blk + 96, 12);
    const __m128i words = _mm_setr_epi32((int)a[0], (int)a[1], (int)a[0], (int)a[1]);
    const __m128i lo = _mm_srlv_epi32(words, _mm_setr_epi32(0, 0, 4, 4));
    const __m128i hi = _mm_srlv_epi32(_mm_set1_epi32((int)a[2]), _mm_setr_epi32(0, 2, 4, 6));
    const __m128i v = _mm_or_si128(_mm_and_si128(lo, _mm_set1_epi8(0x0f)),
                                   _mm_slli_epi32(_mm_and_si128(hi, _mm_set1_epi8(0x03)), 4));
    return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

/* Sub-blocks 2c and 2c + 1's scales as int16 lanes 0..7 and 8..15: the pairs maddubs makes of chunk c. */
static inline __attribute__((always_inline)) __m256i k63_chunk_scales(__m128i sc8, int c) {
    const __m128i pick = _mm_set_epi64x((long long)(0x0101010101010101ull * (uint64_t)(2 * c + 1)),
                                        (long long)(0x0101010101010101ull * (uint64_t)(2 * c)));
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick));
}

static inline __attribute__((always_inline)) void k63_dot_q8_avx2(int qtype, const uint8_t *wrow, int nb,
                                                                  const ActBlockK *act, int64_t act_row, int NR,
                                                                  float *sums) {
    __m256 accf[K63_ROWS];
    for (int r = 0; r < NR; r++) accf[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * K63_BYTES(qtype);
        k63_prefetch(qtype, blk);
        const __m128i sc8 = k63_scales(qtype, blk);
        /* off * sc, the weight of each sub-block's activation sum (|.| <= 4096 * 2032: no overflow) */
        const __m256i sc_off = _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc8), qtype == Q6_K ? 5 : 2);
        __m256i acc[K63_ROWS];
        for (int r = 0; r < NR; r++) {
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)act[r * act_row + b].bsums);
            acc[r] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(bsums, sc_off));
        }
        /* each half of the block a loop turn (unrolled, GCC computed every chunk first and spilled them at 4+
         * rows), its four chunks one after the other: 5 to 8 rows ran 1.5-1.9x faster on a Zen 3 EPYC */
#pragma GCC unroll 1
        for (int n = 0; n < 2; n++)
            for (int k = 0; k < 4; k++) {
                const int c = 4 * n + k;
                __m256i u = k63_chunk_nk(qtype, blk, n, k), s = k63_chunk_scales(sc8, c);
                K_PIN(u);
                K_PIN(s);
                for (int r = 0; r < NR; r++) {
                    const __m256i a = _mm256_loadu_si256((const __m256i *)(act[r * act_row + b].qs + 32 * c));
                    acc[r] = K63_DPWSSD(acc[r], _mm256_maddubs_epi16(u, a), s);
                    K_PIN(acc[r]);
                }
            }
        const float d = fp16_at(blk + K63_D(qtype));
        for (int r = 0; r < NR; r++) {
            const __m256 scale = _mm256_set1_ps(d * act[r * act_row + b].d);
            accf[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r]), scale, accf[r]);
        }
    }
    for (int r = 0; r < NR; r++) sums[r] = hsum8(accf[r]);
}

/* Exact: each chunk's 32 weights dequantized into 4 vectors once, then FMAs into every row; 2 accumulators a row
 * (4 for one row, whose FMA latency chains, not their count, would bound it). */
static inline __attribute__((always_inline)) void k63_dot_f32_avx2(int qtype, const uint8_t *wrow, int nb,
                                                                   const float *x, int64_t x_row, int NR,
                                                                   float *sums) {
    enum { ACC = 4 };
    const int acc_n = NR == 1 ? ACC : 2;
    __m256 acc[K63_ROWS][ACC];
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < ACC; j++) acc[r][j] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * K63_BYTES(qtype);
        k63_prefetch(qtype, blk);
        int8_t sc[16];
        _mm_storeu_si128((__m128i *)sc, k63_scales(qtype, blk));
        const float d = fp16_at(blk + K63_D(qtype));
        for (int c = 0; c < 8; c++) {
            const __m256i u = k63_chunk(qtype, blk, c);
            const __m128i halves[2] = {_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)};
            __m256 w[4];
            for (int h = 0; h < 2; h++) {
                const __m256 s = _mm256_set1_ps(d * (float)sc[2 * c + h]);
                const __m256 neg = _mm256_mul_ps(s, _mm256_set1_ps(-(float)K63_OFF(qtype))); /* exact: 2^k */
                const __m128i v = halves[h];
                w[2 * h] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), neg);
                w[2 * h + 1] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))), neg);
            }
            for (int r = 0; r < NR; r++) {
                const float *xc = x + r * x_row + (int64_t)b * QK_K + 32 * c;
                for (int j = 0; j < 4; j++) {
                    __m256 *t = &acc[r][acc_n == 4 ? j : j & 1];
                    *t = _mm256_fmadd_ps(w[j], _mm256_loadu_ps(xc + 8 * j), *t);
                }
            }
        }
    }
    for (int r = 0; r < NR; r++) {
        __m256 t = _mm256_add_ps(acc[r][0], acc[r][1]);
        if (acc_n == 4) t = _mm256_add_ps(t, _mm256_add_ps(acc[r][2], acc[r][3]));
        sums[r] = hsum8(t);
    }
}
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
/* AVX-512 (this Xeon): two chunks a 512-bit vector, so a row's share of a block (the part that grows with the rows)
 * is 4 maddubs + 4 vpdpwssd instead of 8 + 8 (or 8 + 16 without VNNI). Chunks 2p and 2p + 1 of a block as 64
 * unsigned bytes (Q6_K: both from one 64-byte load of ql; Q3_K: one 32-byte half of qs in both halves). */
static inline __attribute__((always_inline)) __m512i k63_chunk_pair(int qtype, const uint8_t *blk, int p) {
    const int n = p / 2, j = p % 2; /* chunks 4n + 2j, 4n + 2j + 1 */
    if (qtype == Q6_K) {
        const __m512i ql = _mm512_loadu_si512((const void *)(blk + 64 * n));
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n)));
        /* halves k = 2j and 2j + 1: low nibbles (j = 0) or high ones, the pair bits 2k, 2k + 1 to bits 4, 5 */
        const __m512i low = _mm512_and_si512(j == 0 ? ql : _mm512_srli_epi16(ql, 4), _mm512_set1_epi8(0x0f));
        /* left by 4 and 2 (j = 0), right by 0 and 2 (j = 1) */
        const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16(j == 0 ? 4 : 0), _mm256_set1_epi16(2), 1);
        const __m512i pair = j == 0 ? _mm512_sllv_epi16(qh, shift) : _mm512_srlv_epi16(qh, shift);
        return _mm512_or_si512(low, _mm512_and_si512(pair, _mm512_set1_epi8(0x30)));
    }
    const int c = 4 * n + 2 * j;
    const __m512i qs = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * n)));
    const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)blk));
    const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16(4 * j), _mm256_set1_epi16(4 * j + 2), 1);
    const __m512i two = _mm512_and_si512(_mm512_srlv_epi16(qs, shift), _mm512_set1_epi8(3));
    const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << c)), _mm256_set1_epi8((char)(2 << c)), 1);
    return _mm512_mask_add_epi8(two, _mm512_test_epi8_mask(hm, bit), two, _mm512_set1_epi8(4)); /* + 4 where set */
}

static inline __attribute__((always_inline)) void k63_dot_q8_avx512(int qtype, const uint8_t *wrow, int nb,
                                                                    const ActBlockK *act, int64_t act_row, int NR,
                                                                    float *sums) {
    __m512 accf[K63_ROWS];
    for (int r = 0; r < NR; r++) accf[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * K63_BYTES(qtype);
        k63_prefetch(qtype, blk);
        const __m256i sc16 = _mm256_cvtepi8_epi16(k63_scales(qtype, blk));
        const __m256i sc_off = _mm256_slli_epi16(sc16, qtype == Q6_K ? 5 : 2);
        const __m256i neg_off = _mm256_sub_epi16(_mm256_setzero_si256(), sc_off);
        /* two chains a row (even and odd chunk pairs) where few rows leave the dpwssd latency exposed */
        const int chains = NR <= 2 ? 2 : 1;
        __m512i acc[K63_ROWS][2];
        for (int r = 0; r < NR; r++) {
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)act[r * act_row + b].bsums);
            acc[r][0] = _mm512_zextsi256_si512(_mm256_madd_epi16(bsums, neg_off));
            acc[r][1] = _mm512_setzero_si512();
        }
        for (int p = 0; p < 4; p++) {
            const __m512i u = k63_chunk_pair(qtype, blk, p);
            /* scales 4p .. 4p + 3, each over the 8 int16 pairs of its 16 weights */
            const __m512i pick = _mm512_add_epi16(_mm512_set1_epi16((short)(4 * p)),
                                                  _mm512_set_epi64(0x0003000300030003ll, 0x0003000300030003ll,
                                                                   0x0002000200020002ll, 0x0002000200020002ll,
                                                                   0x0001000100010001ll, 0x0001000100010001ll, 0, 0));
            const __m512i s = _mm512_permutexvar_epi16(pick, _mm512_castsi256_si512(sc16));
            for (int r = 0; r < NR; r++) {
                const __m512i a = _mm512_loadu_si512((const void *)(act[r * act_row + b].qs + 64 * p));
                const int i = chains == 2 ? p & 1 : 0;
                acc[r][i] = _mm512_dpwssd_epi32(acc[r][i], _mm512_maddubs_epi16(u, a), s);
            }
        }
        const float d = fp16_at(blk + K63_D(qtype));
        for (int r = 0; r < NR; r++) {
            const __m512i sum = chains == 2 ? _mm512_add_epi32(acc[r][0], acc[r][1]) : acc[r][0];
            accf[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(d * act[r * act_row + b].d), accf[r]);
        }
    }
    for (int r = 0; r < NR; r++) sums[r] = _mm512_reduce_add_ps(accf[r]);
}

/* Exact: a sub-block of 16 weights is one 512-bit vector of fp32, (d sc) * u - off (d sc) by one fma. */
static inline __attribute__((always_inline)) void k63_dot_f32_avx512(int qtype, const uint8_t *wrow, int nb,
                                                                     const float *x, int64_t x_row, int NR,
                                                                     float *sums) {
    enum { ACC = 4 };
    const int acc_n = NR == 1 ? ACC : 2;
    __m512 acc[K63_ROWS][ACC];
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < ACC; j++) acc[r][j] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * K63_BYTES(qtype);
        k63_prefetch(qtype, blk);
        float s[16], neg[16]; /* d sc and -off d sc per sub-block, read back as broadcasts */
        const __m512 ds = _mm512_mul_ps(_mm512_set1_ps(fp16_at(blk + K63_D(qtype))),
                                        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(k63_scales(qtype, blk))));
        _mm512_storeu_ps(s, ds);
        _mm512_storeu_ps(neg, _mm512_mul_ps(ds, _mm512_set1_ps(-(float)K63_OFF(qtype)))); /* exact: 2^k */
        for (int c = 0; c < 8; c++) {
            const __m256i u = k63_chunk(qtype, blk, c);
            const __m128i halves[2] = {_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)};
            __m512 w[2];
            for (int h = 0; h < 2; h++) {
                const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(halves[h]));
                w[h] = _mm512_fmadd_ps(_mm512_set1_ps(s[2 * c + h]), q, _mm512_set1_ps(neg[2 * c + h]));
            }
            for (int r = 0; r < NR; r++) {
                const float *xc = x + r * x_row + (int64_t)b * QK_K + 32 * c;
                for (int h = 0; h < 2; h++) {
                    __m512 *t = &acc[r][acc_n == 4 ? 2 * (c & 1) + h : h];
                    *t = _mm512_fmadd_ps(w[h], _mm512_loadu_ps(xc + 16 * h), *t);
                }
            }
        }
    }
    for (int r = 0; r < NR; r++) {
        __m512 t = _mm512_add_ps(acc[r][0], acc[r][1]);
        if (acc_n == 4) t = _mm512_add_ps(t, _mm512_add_ps(acc[r][2], acc[r][3]));
        sums[r] = _mm512_reduce_add_ps(t);
    }
}
#define K63_DOT_Q8 k63_dot_q8_avx512
#define K63_DOT_F32 k63_dot_f32_avx512
#else
#define K63_DOT_Q8 k63_dot_q8_avx2
#define K63_DOT_F32 k63_dot_f32_avx2
#endif
#else
#define K63_DOT_Q8 k63_dot_q8_scalar
#define K63_DOT_F32 k63_dot_f32_scalar
#endif

/* The QFormat entry points: passes of up to K63_ROWS rows (K63_F32_ROWS exact), each row count compiled on its own
 * so that the accumulators stay in registers (and correct for any KQ_ROWS). */
#define K63_CASES_4(CALL)       \
    case 1: CALL(1); break;     \
    case 2: CALL(2); break;     \
    case 3: CALL(3); break;
#define K63_CASES_8(CALL)       \
    K63_CASES_4(CALL)           \
    case 4: CALL(4); break;     \
    case 5: CALL(5); break;     \
    case 6: CALL(6); break;     \
    case 7: CALL(7); break;
#if K63_F32_ROWS == 8
#define K63_F32_CASES K63_CASES_8
#else
#define K63_F32_CASES K63_CASES_4
#endif
#define K63_ENTRY(NAME, T)                                                                                            \
    static void NAME##_dot_q8(const uint8_t *wrow, int nb, const void *act, int64_t act_row, int nr, float *sums) { \
        for (int r0 = 0; r0 < nr; r0 += K63_ROWS) {                                                                 \
            const ActBlockK *a = (const ActBlockK *)act + r0 * act_row;                                             \
            const int n = nr - r0 < K63_ROWS ? nr - r0 : K63_ROWS;                                                  \
            float *s = sums + r0;                                                                                   \
            switch (n) {                                                                                            \
                K63_CASES_8(NAME##_Q8_CALL)                                                                         \
            default: NAME##_Q8_CALL(K63_ROWS); break;                                                               \
            }                                                                                                       \
        }                                                                                                           \
    }                                                                                                               \
    static void NAME##_dot_f32(const uint8_t *wrow, int nb, const float *x, int64_t x_row, int nr, float *sums) {  \
        for (int r0 = 0; r0 < nr; r0 += K63_F32_ROWS) {                                                             \
            const float *xr = x + r0 * x_row;                                                                       \
            const int n = nr - r0 < K63_F32_ROWS ? nr - r0 : K63_F32_ROWS;                                          \
            float *s = sums + r0;                                                                                   \
            switch (n) {                                                                                            \
                K63_F32_CASES(NAME##_F32_CALL)                                                                      \
            default: NAME##_F32_CALL(K63_F32_ROWS); break;                                                          \
            }                                                                                                       \
        }                                                                                                           \
    }
#define q6k_Q8_CALL(N) K63_DOT_Q8(Q6_K, wrow, nb, a, act_row, N, s)
#define q6k_F32_CALL(N) K63_DOT_F32(Q6_K, wrow, nb, xr, x_row, N, s)
#define q3k_Q8_CALL(N) K63_DOT_Q8(Q3_K, wrow, nb, a, act_row, N, s)
#define q3k_F32_CALL(N) K63_DOT_F32(Q3_K, wrow, nb, xr, x_row, N, s)
K63_ENTRY(q6k, Q6_K)
K63_ENTRY(q3k, Q3_K)
#undef K63_ENTRY

#define Q6_K_DOT_F32 q6k_dot_f32
#define Q6_K_DOT_Q8 q6k_dot_q8
#define Q3_K_DOT_F32 q3k_dot_f32
#define Q3_K_DOT_Q8 q3k_dot_q8
#endif
