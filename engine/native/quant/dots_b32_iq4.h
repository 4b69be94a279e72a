/* The dot products of Q5_0, Q5_1, IQ4_NL (blocks of 32) and IQ4_XS (256: eight sub-blocks of 32 with 6-bit scales);
 * quant/kformat.h says what each computes.
 *
 * Each block's weights become 32 bytes in weight order once, for every activation row: signed for Q5_0 (q - 16) and
 * the IQ4 formats (their level), whose dot with int8 activations takes maddubs's sign trick (|w| times x with w's
 * sign: |w|, |x| <= 127, so a pair sums to at most 2 * 127 * 127 < 2^15 and never saturates); unsigned for Q5_1 (q
 * <= 31), whose minimum comes from the activations' block sums (m * s). The integer dot of a block is exact; a block
 * of 32 then costs one int->float conversion and one FMA by d * dx a row (IQ4_XS: its sub-blocks' scales multiply
 * in 32-bit integers, one conversion a super-block); two activation rows share that conversion, scale and FMA in one
 * vector (hadd). With AVX-512 VNNI (256-bit: no frequency cost) a block's products and their sum are one vpdpbusd,
 * and the fifth bits a mask register (4 rows 1.3x faster than the AVX2 build on this Xeon). The exact dots
 * dequantize each block to fp32 as the reference does (the same products) and FMA it into every row. Without AVX2:
 * the same integer math, scalar. Results equal the scalar computation up to fp32 summation order. The batch GEMM of
 * the blocks of 32 is quant/gemm_b32.h. */
#ifndef QUANT_DOTS_B32_IQ4_H
#define QUANT_DOTS_B32_IQ4_H
#include "quant/kformat.h"

static inline int b32_block_bytes(int fmt) { return fmt == Q5_0 ? 22 : fmt == Q5_1 ? 24 : 18; }

/* Block `blk`'s 32 integer weights: Q5_0 q - 16, Q5_1 q (0..31), IQ4_NL its level. */
static inline void b32_ints(int fmt, const uint8_t *blk, int8_t *q) {
    const uint8_t *qs = blk + (fmt == Q5_0 ? 6 : fmt == Q5_1 ? 8 : 2);
    uint32_t qh = 0;
    if (fmt != IQ4_NL) memcpy(&qh, blk + (fmt == Q5_1 ? 4 : 2), 4);
    for (int j = 0; j < QK / 2; j++) {
        if (fmt == IQ4_NL) {
            q[j] = IQ4_LEVELS[qs[j] & 15], q[j + 16] = IQ4_LEVELS[qs[j] >> 4];
        } else {
            const int off = fmt == Q5_0 ? 16 : 0;
            q[j] = (int8_t)(((qs[j] & 15) | (((qh >> j) & 1) << 4)) - off);
            q[j + 16] = (int8_t)(((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - off);
        }
    }
}

/* IQ4_XS sub-block ib's scale, ls - 32 (ls of 6 bits: low nibble in scales_l, high 2 bits in scales_h). */
static inline int iq4xs_scale(const uint8_t *blk, int ib) {
    const int sh = blk[2] | (blk[3] << 8);
    return (((blk[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)) - 32;
}

#ifdef QL_AVX2
#if defined(__AVX512BW__) && defined(__AVX512VL__)
#define B32_MASKS 1 /* bits to byte masks in one instruction */
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define B32_VNNI 1 /* u8 x s8 products summed by 4 into int32 in one instruction */
#endif

/* The weight rows stream, each read once a call: the dots prefetch 2 KB (5 of SmolLM2's 576-wide Q5_0 rows) ahead,
 * which took its 30 layers' int8 GEMV on one thread from 16.8 to 10.4 ms (1 KB: 11.2, 4 KB: 10.5); left to the
 * hardware prefetcher the rows' few hundred bytes each kept it waiting on memory. */
#define B32_PREFETCH 2048
/* 16 bytes of nibbles as 32 bytes in weight order: the low nibbles (weights 0..15), then the high ones (16..31). */
static inline __m256i b32_nibbles(const uint8_t *qs) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0f));
}

/* `value` in byte j where bit j of the 32 bits is set, else 0. */
static inline __m256i b32_bits_to_bytes(uint32_t bits, char value) {
#ifdef B32_MASKS
    return _mm256_maskz_mov_epi8(bits, _mm256_set1_epi8(value));
#else
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), /* byte j: bits' byte j / 8 */
                                               _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                                                                  0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(value));
#endif
}

static inline __m256i iq4_lookup(__m256i nibbles) {
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)IQ4_LEVELS)), nibbles);
}

/* Block `blk`'s weights as b32_ints gives them. Q5_0: q - 16 is the nibble with 0xf0 (-16) where the fifth bit is
 * clear; Q5_1: the nibble with 0x10 where it is set. */
static inline __attribute__((always_inline)) __m256i b32_weights(int fmt, const uint8_t *blk) {
    if (fmt == IQ4_NL) return iq4_lookup(b32_nibbles(blk + 2));
    uint32_t qh;
    memcpy(&qh, blk + (fmt == Q5_1 ? 4 : 2), 4);
    const __m256i high = fmt == Q5_0 ? b32_bits_to_bytes(~qh, (char)0xf0) : b32_bits_to_bytes(qh, 0x10);
    return _mm256_or_si256(b32_nibbles(blk + (fmt == Q5_1 ? 8 : 6)), high);
}

/* The 8 int32 partial sums of u . x (u unsigned bytes, x signed; each pair of products < 2^15). */
static inline __m256i b32_udot(__m256i u, __m256i x) {
#ifdef B32_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
#endif
}

static inline __m256 b32_fp16_splat(const uint8_t *p) {
    int16_t h;
    memcpy(&h, p, 2);
    return _mm256_cvtph_ps(_mm_set1_epi16(h));
}

/* Row r's integer dot with the block (w its weights, u = |w|, or w for Q5_1): 8 int32 partial sums. */
static inline __attribute__((always_inline)) __m256i b32_row_dot(int fmt, __m256i w, __m256i u, const ActBlock32 *a) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)a->qs);
    return b32_udot(u, fmt == Q5_1 ? x : _mm256_sign_epi8(x, w));
}

/* One block's step for NR activation rows: acc[r / 2] += its integer dots times d dx, two rows a vector (hadd puts
 * row r's partial sums in lanes 0, 1, 4, 5 and row r + 1's in 2, 3, 6, 7: one conversion, scale and FMA for both);
 * mins[r] += m s (Q5_1). */
static inline __attribute__((always_inline)) void b32_q8_step(int fmt, const uint8_t *blk, const ActBlock32 *a,
                                                              int64_t act_row, int NR, __m256 *acc, float *mins) {
    const __m256i w = b32_weights(fmt, blk);
    const __m256i u = fmt == Q5_1 ? w : _mm256_sign_epi8(w, w);
    const __m256 d = b32_fp16_splat(blk);
    const float m = fmt == Q5_1 ? fp16_at(blk + 2) : 0.0f;
    int r = 0;
    for (; r + 1 < NR; r += 2) {
        const ActBlock32 *a0 = a + r * act_row, *a1 = a0 + act_row;
        const __m256i p = _mm256_hadd_epi32(b32_row_dot(fmt, w, u, a0), b32_row_dot(fmt, w, u, a1));
        const __m256 dx = _mm256_shuffle_ps(_mm256_broadcast_ss(&a0->d), _mm256_broadcast_ss(&a1->d), 0);
        acc[r / 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(d, dx), acc[r / 2]);
    }
    if (r < NR) { /* the odd row as the first of a pair whose second is zero: the same lanes and sums as paired */
        const ActBlock32 *ar = a + r * act_row;
        const __m256i p = _mm256_hadd_epi32(b32_row_dot(fmt, w, u, ar), _mm256_setzero_si256());
        const __m256 scale = _mm256_mul_ps(d, _mm256_broadcast_ss(&ar->d));
        acc[r / 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[r / 2]);
    }
    if (fmt == Q5_1) /* fused explicitly: left to the compiler, AVX-512's 8 rows rounded apart */
        for (r = 0; r < NR; r++) mins[r] = fmaf(m, a[r * act_row].s, mins[r]);
}

/* dot_q8 for NR rows (a constant after inlining): blocks in pairs, each of a pair into its own accumulators (two FMA
 * chains, so that the dot is not bound by the FMA's latency). Every row takes the same operations in the same order
 * whatever NR is (a lone row is summed as a pair's first), so a row's result does not depend on the call's row
 * count: speculative decoding verifies several rows of one sequence in a step and needs each to be what one row
 * would have been. */
static inline __attribute__((always_inline)) void b32_dot_q8_rows(int fmt, const uint8_t *wrow, int nb,
                                                                  const ActBlock32 *act, int64_t act_row, int NR,
                                                                  float *sums) {
    const int bb = b32_block_bytes(fmt), NV = (NR + 1) / 2;
    __m256 acc0[KQ_ROWS / 2], acc1[KQ_ROWS / 2];
    float mins[KQ_ROWS];
    for (int v = 0; v < NV; v++) acc0[v] = acc1[v] = _mm256_setzero_ps();
    for (int r = 0; r < NR; r++) mins[r] = 0.0f;
    int b = 0;
    for (; b + 1 < nb; b += 2) {
        _mm_prefetch((const char *)(wrow + (int64_t)b * bb + B32_PREFETCH), _MM_HINT_T0); /* every 36..48 bytes */
        b32_q8_step(fmt, wrow + (int64_t)b * bb, act + b, act_row, NR, acc0, mins);
        b32_q8_step(fmt, wrow + (int64_t)(b + 1) * bb, act + b + 1, act_row, NR, acc1, mins);
    }
    if (b < nb) b32_q8_step(fmt, wrow + (int64_t)b * bb, act + b, act_row, NR, acc0, mins);
    for (int v = 0; v < NV; v++) {
        const __m256 t = _mm256_add_ps(acc0[v], acc1[v]);
        /* lanes 0, 1 (and 4, 5): row 2v; 2, 3 (6, 7): row 2v + 1 (zeros for a lone row) */
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        h = _mm_hadd_ps(h, h);
        sums[2 * v] = _mm_cvtss_f32(h) + mins[2 * v];
        if (2 * v + 1 < NR) sums[2 * v + 1] = _mm_cvtss_f32(_mm_movehdup_ps(h)) + mins[2 * v + 1];
    }
}

/* The 32 weights of a block of integers w (b32_weights's) as fp32: d * w (+ m), as the reference computes them. */
static inline __attribute__((always_inline)) void b32_to_f32(__m256i w, int is_signed, __m256 d, __m256 m, int add_m,
                                                             __m256 out[4]) {
    const __m128i lo = _mm256_castsi256_si128(w), hi = _mm256_extracti128_si256(w, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; k++) {
        const __m256i q = is_signed ? _mm256_cvtepi8_epi32(parts[k]) : _mm256_cvtepu8_epi32(parts[k]);
        out[k] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
        if (add_m) out[k] = _mm256_add_ps(out[k], m);
    }
}

/* acc[r][k % NA] += w[k] * x row r's 32 floats, for NR rows; NA accumulators a row (4 for one or two rows: short
 * FMA chains; fewer for more, within the 16 registers). */
static inline __attribute__((always_inline)) void f32_block_fma(const __m256 w[4], const float *x, int64_t x_row,
                                                                int NR, __m256 acc[][4]) {
    const int NA = NR <= 2 ? 4 : NR <= 4 ? 2 : 1;
    for (int r = 0; r < NR; r++)
        for (int k = 0; k < 4; k++)
            acc[r][k % NA] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(x + r * x_row + 8 * k), acc[r][k % NA]);
}

static inline __attribute__((always_inline)) void f32_sums(__m256 acc[][4], int NR, float *sums) {
    for (int r = 0; r < NR; r++)
        sums[r] = hsum8(_mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3])));
}

static inline __attribute__((always_inline)) void b32_dot_f32_rows(int fmt, const uint8_t *wrow, int nb,
                                                                   const float *x, int64_t x_row, int NR,
                                                                   float *sums) {
    const int bb = b32_block_bytes(fmt);
    __m256 acc[KQ_ROWS][4];
    for (int r = 0; r < NR; r++)
        for (int k = 0; k < 4; k++) acc[r][k] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * bb;
        if (b % 2 == 0) _mm_prefetch((const char *)(blk + B32_PREFETCH), _MM_HINT_T0);
        __m256 w[4];
        const __m256 m = fmt == Q5_1 ? b32_fp16_splat(blk + 2) : _mm256_setzero_ps();
        b32_to_f32(b32_weights(fmt, blk), fmt != Q5_1, b32_fp16_splat(blk), m, fmt == Q5_1, w);
        f32_block_fma(w, x + b * QK, x_row, NR, acc);
    }
    f32_sums(acc, NR, sums);
}

/* Prefetches 64 bytes apart at most, a super-block's 136 bytes with three: every line of the stream is named. */
static inline void iq4xs_prefetch(const uint8_t *blk) {
    for (int off = 0; off < 136; off += 64) _mm_prefetch((const char *)(blk + B32_PREFETCH + off), _MM_HINT_T0);
}

/* IQ4_XS sub-block ib's 32 weights (its levels, signed) from the super-block's 128 bytes of nibbles. */
static inline __m256i iq4xs_sub_block(const uint8_t *blk, int ib) { return iq4_lookup(b32_nibbles(blk + 8 + 16 * ib)); }

/* IQ4_XS with Q8_K activations: per row, each sub-block's maddubs pairs times its scale (madd: 2 * 32258 * 32 per
 * lane, eight sub-blocks < 2^31) summed in int32, then one conversion and FMA by d dx a super-block. */
static inline __attribute__((always_inline)) void iq4xs_dot_q8_rows(const uint8_t *wrow, int nb, const ActBlockK *act,
                                                                    int64_t act_row, int NR, float *sums) {
    __m256 acc[KQ_ROWS];
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * 136;
        iq4xs_prefetch(blk);
        __m256i isum[KQ_ROWS];
        for (int r = 0; r < NR; r++) isum[r] = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const __m256i w = iq4xs_sub_block(blk, ib), u = _mm256_sign_epi8(w, w);
            const __m256i scale = _mm256_set1_epi16((int16_t)iq4xs_scale(blk, ib));
            for (int r = 0; r < NR; r++) {
                const __m256i x = _mm256_loadu_si256((const __m256i *)(act[r * act_row + b].qs + 32 * ib));
                const __m256i pairs = _mm256_maddubs_epi16(u, _mm256_sign_epi8(x, w));
#ifdef B32_VNNI
                isum[r] = _mm256_dpwssd_epi32(isum[r], pairs, scale);
#else
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(pairs, scale));
#endif
            }
        }
        const __m256 d = b32_fp16_splat(blk);
        for (int r = 0; r < NR; r++) {
            const __m256 scale = _mm256_mul_ps(d, _mm256_broadcast_ss(&act[r * act_row + b].d));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), scale, acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) sums[r] = hsum8(acc[r]);
}

/* IQ4_XS exact: each sub-block dequantized to fp32 (d * (ls - 32) * level, as the reference) and FMA'd into every
 * row. */
static inline __attribute__((always_inline)) void iq4xs_dot_f32_rows(const uint8_t *wrow, int nb, const float *x,
                                                                     int64_t x_row, int NR, float *sums) {
    __m256 acc[KQ_ROWS][4];
    for (int r = 0; r < NR; r++)
        for (int k = 0; k < 4; k++) acc[r][k] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * 136;
        iq4xs_prefetch(blk);
        const float d = fp16_at(blk);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            __m256 w[4];
            const __m256 dl = _mm256_set1_ps(d * (float)iq4xs_scale(blk, ib));
            b32_to_f32(iq4xs_sub_block(blk, ib), 1, dl, dl, 0, w);
            f32_block_fma(w, x + (int64_t)b * QK_K + 32 * ib, x_row, NR, acc);
        }
    }
    f32_sums(acc, NR, sums);
}

#else /* scalar */

static inline void b32_dot_q8_rows(int fmt, const uint8_t *wrow, int nb, const ActBlock32 *act, int64_t act_row,
                                   int nr, float *sums) {
    const int bb = b32_block_bytes(fmt);
    float mins[KQ_ROWS] = {0};
    int8_t q[QK];
    for (int r = 0; r < nr; r++) sums[r] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * bb;
        b32_ints(fmt, blk, q);
        const float d = fp16_at(blk), m = fmt == Q5_1 ? fp16_at(blk + 2) : 0.0f;
        for (int r = 0; r < nr; r++) {
            const ActBlock32 *a = act + r * act_row + b;
            int dot = 0;
            for (int j = 0; j < QK; j++) dot += q[j] * a->qs[j];
            sums[r] += d * a->d * (float)dot;
            mins[r] += m * a->s;
        }
    }
    for (int r = 0; r < nr; r++) sums[r] += mins[r];
}

static inline void b32_dot_f32_rows(int fmt, const uint8_t *wrow, int nb, const float *x, int64_t x_row, int nr,
                                    float *sums) {
    const int bb = b32_block_bytes(fmt);
    float w[QK];
    int8_t q[QK];
    for (int r = 0; r < nr; r++) sums[r] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * bb;
        b32_ints(fmt, blk, q);
        const float d = fp16_at(blk), m = fmt == Q5_1 ? fp16_at(blk + 2) : 0.0f;
        for (int j = 0; j < QK; j++) w[j] = d * (float)q[j] + m;
        for (int r = 0; r < nr; r++) {
            float s = 0.0f;
            for (int j = 0; j < QK; j++) s += w[j] * x[r * x_row + b * QK + j];
            sums[r] += s;
        }
    }
}

static inline void iq4xs_dot_q8_rows(const uint8_t *wrow, int nb, const ActBlockK *act, int64_t act_row, int nr,
                                     float *sums) {
    for (int r = 0; r < nr; r++) sums[r] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * 136, *qs = blk + 8;
        const float d = fp16_at(blk);
        for (int r = 0; r < nr; r++) {
            const int8_t *x = act[r * act_row + b].qs;
            int dot = 0;
            for (int ib = 0; ib < QK_K / 32; ib++, x += 32) {
                int sub = 0;
                for (int j = 0; j < 16; j++)
                    sub += IQ4_LEVELS[qs[16 * ib + j] & 15] * x[j] + IQ4_LEVELS[qs[16 * ib + j] >> 4] * x[j + 16];
                dot += iq4xs_scale(blk, ib) * sub;
            }
            sums[r] += d * act[r * act_row + b].d * (float)dot;
        }
    }
}

static inline void iq4xs_dot_f32_rows(const uint8_t *wrow, int nb, const float *x, int64_t x_row, int nr,
                                      float *sums) {
    for (int r = 0; r < nr; r++) sums[r] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * 136, *qs = blk + 8;
        const float d = fp16_at(blk);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const float dl = d * (float)iq4xs_scale(blk, ib);
            float w[32];
            for (int j = 0; j < 16; j++) {
                w[j] = dl * (float)IQ4_LEVELS[qs[16 * ib + j] & 15];
                w[j + 16] = dl * (float)IQ4_LEVELS[qs[16 * ib + j] >> 4];
            }
            for (int r = 0; r < nr; r++) {
                float s = 0.0f;
                for (int j = 0; j < 32; j++) s += w[j] * x[r * x_row + (int64_t)b * QK_K + 32 * ib + j];
                sums[r] += s;
            }
        }
    }
}
#endif

/* The QFormat entry points: each row count its own specialization (accumulators in registers); ready for a
 * KQ_ROWS of 8 (whose passes of 5..8 rows the pairs of rows keep in registers, AVX2's 16 included). */
_Static_assert(KQ_ROWS == 4 || KQ_ROWS == 8, "the dots specialize 1..4 or 1..8 rows");
#if KQ_ROWS > 4
#define B32_WIDE(CALL)                                                                                              \
    case 5: CALL(5); break;                                                                                         \
    case 6: CALL(6); break;                                                                                         \
    case 7: CALL(7); break;                                                                                         \
    case 4: CALL(4); break;
#else
#define B32_WIDE(CALL)
#endif
#define B32_BY_ROWS(CALL)                                                                                           \
    switch (nr) {                                                                                                   \
    case 1: CALL(1); break;                                                                                         \
    case 2: CALL(2); break;                                                                                         \
    case 3: CALL(3); break;                                                                                         \
    B32_WIDE(CALL)                                                                                                  \
    default: CALL(KQ_ROWS); break;                                                                                  \
    }
#define B32_DEFINE(NAME)                                                                                            \
    static void NAME##_dot_q8(const uint8_t *wrow, int nb, const void *act, int64_t act_row, int nr, float *sums) { \
        const ActBlock32 *a = (const ActBlock32 *)act;                                                              \
        B32_BY_ROWS(NAME##_q8_rows)                                                                                 \
    }                                                                                                               \
    static void NAME##_dot_f32(const uint8_t *wrow, int nb, const float *x, int64_t x_row, int nr, float *sums) {  \
        B32_BY_ROWS(NAME##_f32_rows)                                                                                \
    }
#define q5_0_q8_rows(N) b32_dot_q8_rows(Q5_0, wrow, nb, a, act_row, N, sums)
#define q5_0_f32_rows(N) b32_dot_f32_rows(Q5_0, wrow, nb, x, x_row, N, sums)
#define q5_1_q8_rows(N) b32_dot_q8_rows(Q5_1, wrow, nb, a, act_row, N, sums)
#define q5_1_f32_rows(N) b32_dot_f32_rows(Q5_1, wrow, nb, x, x_row, N, sums)
#define iq4_nl_q8_rows(N) b32_dot_q8_rows(IQ4_NL, wrow, nb, a, act_row, N, sums)
#define iq4_nl_f32_rows(N) b32_dot_f32_rows(IQ4_NL, wrow, nb, x, x_row, N, sums)
B32_DEFINE(q5_0)
B32_DEFINE(q5_1)
B32_DEFINE(iq4_nl)

static void iq4_xs_dot_q8(const uint8_t *wrow, int nb, const void *act, int64_t act_row, int nr, float *sums) {
    const ActBlockK *a = (const ActBlockK *)act;
#define IQ4_XS_Q8(N) iq4xs_dot_q8_rows(wrow, nb, a, act_row, N, sums)
    B32_BY_ROWS(IQ4_XS_Q8)
}
static void iq4_xs_dot_f32(const uint8_t *wrow, int nb, const float *x, int64_t x_row, int nr, float *sums) {
#define IQ4_XS_F32(N) iq4xs_dot_f32_rows(wrow, nb, x, x_row, N, sums)
    B32_BY_ROWS(IQ4_XS_F32)
}

#define Q5_0_DOT_F32 q5_0_dot_f32
#define Q5_0_DOT_Q8 q5_0_dot_q8
#define Q5_1_DOT_F32 q5_1_dot_f32
#define Q5_1_DOT_Q8 q5_1_dot_q8
#define IQ4_NL_DOT_F32 iq4_nl_dot_f32
#define IQ4_NL_DOT_Q8 iq4_nl_dot_q8
#define IQ4_XS_DOT_F32 iq4_xs_dot_f32
#define IQ4_XS_DOT_Q8 iq4_xs_dot_q8
#endif
