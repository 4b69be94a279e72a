/* Q4_K_R8: Q4_K weights repacked at load into groups of 8 interleaved rows (a layout of ours, not a file's), for the
 * few-row GEMV: every activation row's dot reads the group's unpacked nibbles and scales while they are in
 * registers, and each 32-bit lane of a vector is one output row, so no per-row horizontal sum is left (issue #36's
 * few-row path; speculative decoding verifies several tokens of a sequence on it). Included by quant_linear.c.
 *
 * The layout (R8Block, per group of 8 rows and super-block of 256 weights): the 8 rows' fp16 d and dmin, their 6-bit
 * scales and minimums as bytes [sub-block][row], and their nibbles as Q4_K keeps them (byte 32p + i: weight 64p + i
 * low, 64p + 32 + i high) regrouped 8 bytes of each row in turn: qs[p][j] holds bytes 32p + 8j .. + 7 of rows 0..7.
 * With 8 broadcast activation bytes, one int8 dot adds 4 products into each of 16 lanes, two a row (AVX-512: one
 * 64-byte vector; AVX2: two of 32), whose pairs are summed once a block. 1,184 bytes for 8 x 144 of Q4_K (+2.8%).
 * A weight [out, in] of out % 8 == 0 keeps its shape [out, in / 256 * 148]: the bytes of rows 8g .. 8g + 7 are
 * group g's R8Blocks in order, so a slice of whole groups is still a weight.
 *
 * The integer sums are Q4_K's own; the fp32 steps run per lane in one order whatever the number of activation rows
 * (row-exact). The exact mode (fp32 activations) unpacks a group back to its 8 Q4_K rows and runs Q4_K's exact dot:
 * bit for bit the unrepacked weight's result, as dequantizing is. */
#ifndef QUANT_Q4K_R8_H
#define QUANT_Q4K_R8_H
#include "quant/generic.h"

#define Q4_K_R8 112     /* ours: no ggml type has this id (engine/native/quant_format.py: QuantType.Q4_K_R8) */
#define R8_ROW_BYTES 148 /* bytes per row and super-block: sizeof(R8Block) / 8 */
#define R8_PASS 8        /* activation rows one pass of the int8 dot takes at most (their sums stay in registers) */
#define R8_GEMM_GROUPS 4 /* groups the GEMM keeps in cache while a pass of rows sweeps them */

typedef struct {
    uint16_t d[8], dmin[8];
    uint8_t sc[8][8], mn[8][8]; /* [sub-block][row] */
    uint8_t qs[4][4][64];       /* [p][j][8 * row + k] = the row's Q4_K byte 32p + 8j + k */
} R8Block;
_Static_assert(sizeof(R8Block) == 8 * R8_ROW_BYTES, "R8Block is 8 rows of 148 bytes");

/* Group of 8 Q4_K rows (w_row_bytes apart, nb super-blocks each) -> nb R8Blocks. */
static void r8_repack_group(const uint8_t *w, int64_t w_row_bytes, int nb, R8Block *out) {
    for (int b = 0; b < nb; b++) {
        R8Block *o = out + b;
        for (int r = 0; r < 8; r++) {
            const uint8_t *blk = w + r * w_row_bytes + (int64_t)b * 144;
            uint8_t sc[8], mn[8];
            memcpy(&o->d[r], blk, 2), memcpy(&o->dmin[r], blk + 2, 2);
            k45_scale_bytes(blk, sc, mn);
            for (int s = 0; s < 8; s++) o->sc[s][r] = sc[s], o->mn[s][r] = mn[s];
            for (int p = 0; p < 4; p++)
                for (int j = 0; j < 4; j++) memcpy(&o->qs[p][j][8 * r], blk + 16 + 32 * p + 8 * j, 8);
        }
    }
}

/* Row `lane` of a group back to its nb Q4_K blocks (144 bytes each), byte for byte the row that was repacked. */
static void r8_unpack_lane(const R8Block *g, int nb, int lane, uint8_t *row) {
    for (int b = 0; b < nb; b++) {
        const R8Block *o = g + b;
        uint8_t *blk = row + (int64_t)b * 144;
        memcpy(blk, &o->d[lane], 2), memcpy(blk + 2, &o->dmin[lane], 2);
        for (int j = 0; j < 4; j++) { /* k4_scale_min's packing, inverted */
            const int sl = o->sc[j][lane], sh = o->sc[j + 4][lane], ml = o->mn[j][lane], mh = o->mn[j + 4][lane];
            blk[4 + j] = (uint8_t)(sl | (sh >> 4) << 6);
            blk[8 + j] = (uint8_t)(ml | (mh >> 4) << 6);
            blk[12 + j] = (uint8_t)((sh & 0x0f) | (mh & 0x0f) << 4);
        }
        for (int p = 0; p < 4; p++)
            for (int j = 0; j < 4; j++) memcpy(blk + 16 + 32 * p + 8 * j, &o->qs[p][j][8 * lane], 8);
    }
}

/* The sums of an activation block's 8 sub-blocks of 32 (the minimums' terms), paired as int16 [s, s + 1] in each
 * int32: what the int8 dot multiplies each row's minimums by. */
typedef struct {
    int32_t pair[4];
} R8Sums;

static inline R8Sums r8_sums(const ActBlockK *a) {
    R8Sums s;
    for (int q = 0; q < 4; q++) {
        const int lo = a->bsums[4 * q] + a->bsums[4 * q + 1], hi = a->bsums[4 * q + 2] + a->bsums[4 * q + 3];
        s.pair[q] = (int32_t)((uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16);
    }
    return s;
}

#ifdef QL_AVX2
/* The minimums' and scales' fp32 step of a block for NR rows: acc[r] += dx * (d * isum - dmin * msum), lane = row;
 * msum's lanes: [mn[2q], mn[2q + 1]] as int16 pairs times the sub-block sums [2q, 2q + 1]. */
static inline __attribute__((always_inline)) void r8_block_sums(const R8Block *o, const ActBlockK *act,
                                                                const R8Sums *sums, int64_t act_row, int b, int NR,
                                                                const __m256i *isum, __m256 *acc) {
    __m256i mn[4];
    for (int q = 0; q < 4; q++)
        mn[q] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)o->mn[2 * q]),
                                                       _mm_loadl_epi64((const __m128i *)o->mn[2 * q + 1])));
    const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)o->d));
    const __m256 m8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)o->dmin));
    for (int r = 0; r < NR; r++) {
        const R8Sums *s = sums + r * act_row + b;
        const __m256i m01 = _mm256_add_epi32(_mm256_madd_epi16(mn[0], _mm256_set1_epi32(s->pair[0])),
                                             _mm256_madd_epi16(mn[1], _mm256_set1_epi32(s->pair[1])));
        const __m256i m23 = _mm256_add_epi32(_mm256_madd_epi16(mn[2], _mm256_set1_epi32(s->pair[2])),
                                             _mm256_madd_epi16(mn[3], _mm256_set1_epi32(s->pair[3])));
        const __m256 msum = _mm256_cvtepi32_ps(_mm256_add_epi32(m01, m23));
        const __m256 t = _mm256_fmsub_ps(_mm256_cvtepi32_ps(isum[r]), d8, _mm256_mul_ps(msum, m8));
        acc[r] = _mm256_fmadd_ps(t, _mm256_set1_ps(act[r * act_row + b].d), acc[r]);
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* out[r][lane] = activation row r . weight row 8g + lane over the group's nb blocks, for r < NR <= R8_PASS: 64-byte
 * vpdpbusd (on Zen 4 1.6x the products a second of the 32-byte one), lanes 2 lane + e: the row's bytes 4e .. 4e + 3
 * of each 8; the pairs summed once a block (vpmovqd of lane + next lane). */
static inline __attribute__((always_inline)) void r8_dot_q8_simd(const R8Block *g, int nb, const ActBlockK *act,
                                                                 const R8Sums *sums, int64_t act_row, int NR,
                                                                 float out[][8]) {
    __m256 acc[R8_PASS];
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    const __m512i nib = _mm512_set1_epi8(0x0f);
    for (int b = 0; b < nb; b++) {
        const R8Block *o = g + b;
        __m512i isum16[R8_PASS];
        for (int r = 0; r < NR; r++) isum16[r] = _mm512_setzero_si512();
        for (int p = 0; p < 4; p++) { /* each lane's scale in both lanes of its row */
            const __m128i s0 = _mm_loadl_epi64((const __m128i *)o->sc[2 * p]);
            const __m128i s1 = _mm_loadl_epi64((const __m128i *)o->sc[2 * p + 1]);
            const __m512i sl = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(s0, s0));
            const __m512i sh = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(s1, s1));
            __m512i alo[R8_PASS], ahi[R8_PASS];
            for (int r = 0; r < NR; r++) alo[r] = ahi[r] = _mm512_setzero_si512();
            for (int j = 0; j < 4; j++) {
                const __m512i v = _mm512_loadu_si512((const void *)o->qs[p][j]);
                const __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                for (int r = 0; r < NR; r++) {
                    const int8_t *x = act[r * act_row + b].qs + 64 * p + 8 * j;
                    long long xl, xh;
                    memcpy(&xl, x, 8), memcpy(&xh, x + 32, 8);
                    alo[r] = _mm512_dpbusd_epi32(alo[r], lo, _mm512_set1_epi64(xl));
                    ahi[r] = _mm512_dpbusd_epi32(ahi[r], hi, _mm512_set1_epi64(xh));
                }
            }
            for (int r = 0; r < NR; r++)
                isum16[r] = _mm512_add_epi32(isum16[r], _mm512_add_epi32(_mm512_mullo_epi32(alo[r], sl),
                                                                         _mm512_mullo_epi32(ahi[r], sh)));
        }
        __m256i isum[R8_PASS];
        for (int r = 0; r < NR; r++)
            isum[r] = _mm512_cvtepi64_epi32(_mm512_add_epi32(isum16[r], _mm512_srli_epi64(isum16[r], 32)));
        r8_block_sums(o, act, sums, act_row, b, NR, isum, acc);
    }
    for (int r = 0; r < NR; r++) _mm256_storeu_ps(out[r], acc[r]);
}
#else
/* The same in AVX2, a group's rows 0-3 and 4-7 in turn (32 bytes each): vpmaddubsw into 16 bits (4 of a sub-block's
 * byte pairs sum to at most 4 * 2 * 15 * 127 < 2^15), one vpmaddwd by the lane's scale; pairs summed by vphaddd. */
static inline __attribute__((always_inline)) void r8_dot_q8_simd(const R8Block *g, int nb, const ActBlockK *act,
                                                                 const R8Sums *sums, int64_t act_row, int NR,
                                                                 float out[][8]) {
    __m256 acc[R8_PASS];
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    const __m256i nib = _mm256_set1_epi8(0x0f), both = _mm256_set1_epi32(0x10001);
    for (int b = 0; b < nb; b++) {
        const R8Block *o = g + b;
        __m256i half_sum[2][R8_PASS];
        for (int h = 0; h < 2; h++) {
            for (int r = 0; r < NR; r++) half_sum[h][r] = _mm256_setzero_si256();
            for (int p = 0; p < 4; p++) { /* rows 4h.. 4h + 3's scales, each in both 16-bit halves of its 2 lanes */
                int32_t b0, b1;
                memcpy(&b0, o->sc[2 * p] + 4 * h, 4), memcpy(&b1, o->sc[2 * p + 1] + 4 * h, 4);
                const __m128i s0 = _mm_cvtsi32_si128(b0), s1 = _mm_cvtsi32_si128(b1);
                const __m256i sl = _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_unpacklo_epi8(s0, s0)), both);
                const __m256i sh = _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_unpacklo_epi8(s1, s1)), both);
                __m256i alo[R8_PASS], ahi[R8_PASS];
                for (int r = 0; r < NR; r++) alo[r] = ahi[r] = _mm256_setzero_si256();
                for (int j = 0; j < 4; j++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(o->qs[p][j] + 32 * h));
                    const __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                    for (int r = 0; r < NR; r++) {
                        const int8_t *x = act[r * act_row + b].qs + 64 * p + 8 * j;
                        long long xl, xh;
                        memcpy(&xl, x, 8), memcpy(&xh, x + 32, 8);
                        alo[r] = _mm256_add_epi16(alo[r], _mm256_maddubs_epi16(lo, _mm256_set1_epi64x(xl)));
                        ahi[r] = _mm256_add_epi16(ahi[r], _mm256_maddubs_epi16(hi, _mm256_set1_epi64x(xh)));
                    }
                }
                for (int r = 0; r < NR; r++)
                    half_sum[h][r] = _mm256_add_epi32(half_sum[h][r], _mm256_add_epi32(_mm256_madd_epi16(alo[r], sl),
                                                                                       _mm256_madd_epi16(ahi[r], sh)));
            }
        }
        __m256i isum[R8_PASS]; /* hadd: [r0 r1 r4 r5 | r2 r3 r6 r7]; 0xd8 puts the rows in order */
        for (int r = 0; r < NR; r++)
            isum[r] = _mm256_permute4x64_epi64(_mm256_hadd_epi32(half_sum[0][r], half_sum[1][r]), 0xd8);
        r8_block_sums(o, act, sums, act_row, b, NR, isum, acc);
    }
    for (int r = 0; r < NR; r++) _mm256_storeu_ps(out[r], acc[r]);
}
#endif
#endif

#ifndef QL_AVX2
/* The int8 dot without SIMD: the same integer sums, the same fp32 steps per lane (fmaf where the SIMD one fuses). */
static void r8_dot_q8_scalar(const R8Block *g, int nb, const ActBlockK *act, const R8Sums *sums, int64_t act_row,
                             int NR, float out[][8]) {
    for (int r = 0; r < NR; r++)
        for (int l = 0; l < 8; l++) out[r][l] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const R8Block *o = g + b;
        for (int r = 0; r < NR; r++) {
            const ActBlockK *a = act + r * act_row + b;
            const R8Sums *s = sums + r * act_row + b;
            for (int l = 0; l < 8; l++) {
                int32_t isum = 0, msum = 0;
                for (int p = 0; p < 4; p++) {
                    int32_t lo = 0, hi = 0;
                    for (int j = 0; j < 4; j++)
                        for (int k = 0; k < 8; k++) {
                            const int q = o->qs[p][j][8 * l + k];
                            lo += (q & 0x0f) * a->qs[64 * p + 8 * j + k];
                            hi += (q >> 4) * a->qs[64 * p + 32 + 8 * j + k];
                        }
                    isum += lo * o->sc[2 * p][l] + hi * o->sc[2 * p + 1][l];
                }
                for (int q = 0; q < 4; q++)
                    msum += o->mn[2 * q][l] * (int16_t)(s->pair[q] & 0xffff) +
                            o->mn[2 * q + 1][l] * (int16_t)((uint32_t)s->pair[q] >> 16);
                const float t = fmaf((float)isum, fp16_at((const uint8_t *)&o->d[l]),
                                     -((float)msum * fp16_at((const uint8_t *)&o->dmin[l])));
                out[r][l] = fmaf(t, a->d, out[r][l]);
            }
        }
    }
}
#endif

/* One pass of nr <= R8_PASS activation rows over group g (the register count of each is a constant). */
static void r8_pass(const R8Block *g, int nb, const ActBlockK *act, const R8Sums *sums, int64_t act_row, int nr,
                    float out[][8]) {
#ifdef QL_AVX2
    switch (nr) {
    case 1: r8_dot_q8_simd(g, nb, act, sums, act_row, 1, out); return;
    case 2: r8_dot_q8_simd(g, nb, act, sums, act_row, 2, out); return;
    case 3: r8_dot_q8_simd(g, nb, act, sums, act_row, 3, out); return;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    case 4: r8_dot_q8_simd(g, nb, act, sums, act_row, 4, out); return;
    case 5: r8_dot_q8_simd(g, nb, act, sums, act_row, 5, out); return;
    case 6: r8_dot_q8_simd(g, nb, act, sums, act_row, 6, out); return;
    case 7: r8_dot_q8_simd(g, nb, act, sums, act_row, 7, out); return;
    default: r8_dot_q8_simd(g, nb, act, sums, act_row, 8, out); return;
#else /* passes of at most 4 rows (r8_pass_rows) */
    default: r8_dot_q8_simd(g, nb, act, sums, act_row, 4, out); return;
#endif
    }
#else
    r8_dot_q8_scalar(g, nb, act, sums, act_row, nr, out);
#endif
}

/* Passes for `rows` activation rows, as even as the pass bound allows (5 rows in passes of 4: 3 + 2, not 4 + 1: a
 * second pass unpacks the group's nibbles again, from cache, and a pass of one row pays that for one row). The bound:
 * 8 rows on AVX-512 (32 registers) for rows of at most 8 blocks (2,048 weights), where one pass of 5 measured faster
 * than 3 + 2; 4 for wider rows (there a pass of 5 ran 0.84x the speed of 3 + 2, in-process A/B) and on AVX2 (16
 * registers). A 1B step on a 2-core Zen 4, three alternating pairs: 5 rows 48.1/50.1/47.5 ms with 4 at most,
 * 46.2/40.0/42.5 with this bound; 6 rows 53.6/55.2/55.1 against 48.1/48.3/53.7. */
static inline int r8_pass_rows(int rows, int r0, int nb) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    const int most = nb <= 8 ? 8 : 4;
#else
    const int most = 4;
#endif
    (void)nb;
    const int left = rows - r0, passes = (left + most - 1) / most;
    return (left + passes - 1) / passes;
}

/* y[r, 8g + lane] (+ bias) for groups [g0, g1) and every activation row, in passes. */
static void r8_groups(const R8Block *w, int nb, int g0, int g1, const ActBlockK *act, const R8Sums *sums,
                      int64_t act_row, int rows, const float *bias, float *y, int64_t y_row) {
    for (int r0 = 0; r0 < rows;) {
        const int nr = r8_pass_rows(rows, r0, nb);
        for (int g = g0; g < g1; g++) {
            float out[R8_PASS][8];
            r8_pass(w + (int64_t)g * nb, nb, act + r0 * act_row, sums + r0 * act_row, act_row, nr, out);
            for (int r = 0; r < nr; r++)
                for (int l = 0; l < 8; l++)
                    y[(int64_t)(r0 + r) * y_row + 8 * g + l] = out[r][l] + (bias ? bias[8 * g + l] : 0.0f);
        }
        r0 += nr;
    }
}

/* The activation rows rounded to int8 (kq_quantize_row: Q4_K's own rounding) and their R8Sums; NULL: no memory. */
static ActBlockK *r8_activations(const float *x, int64_t x_row, int rows, int nb, R8Sums **sums) {
    ActBlockK *act = malloc(sizeof(ActBlockK) * (size_t)nb * (size_t)rows + 1);
    *sums = malloc(sizeof(R8Sums) * (size_t)nb * (size_t)rows + 1);
    if (!act || !*sums) {
        free(act), free(*sums);
        return NULL;
    }
    for (int r = 0; r < rows; r++) {
        kq_quantize_row(ACT_K, x + r * x_row, nb * QK_K, act + (int64_t)r * nb);
        for (int b = 0; b < nb; b++) (*sums)[(int64_t)r * nb + b] = r8_sums(act + (int64_t)r * nb + b);
    }
    return act;
}

/* quant_linear / quant_gemm_q8 for Q4_K_R8 (gemm: groups handed out a few at a time, each kept in cache while every
 * pass of rows sweeps it; linear: each group streamed once for every row). 0, -1 (bad width), -2 (memory). */
static int r8_linear(int act_q8, int gemm, const uint8_t *w, int64_t w_row_bytes, int out_features, int in_features,
                     const float *x, int64_t x_row, int rows, const float *bias, float *y, int64_t y_row,
                     int num_threads) {
    const int nb = in_features / QK_K, groups = out_features / 8;
    if (in_features % QK_K != 0 || out_features % 8 != 0 || w_row_bytes != (int64_t)nb * R8_ROW_BYTES) return -1;
    const R8Block *g = (const R8Block *)w;
    const int threads = threads_for((int64_t)out_features * in_features * (gemm ? rows : 1), num_threads);
    if (!act_q8) { /* exact: each group unpacked to its Q4_K rows, Q4_K's exact dot (bit for bit the unrepacked) */
        int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
        {
            uint8_t *rows8 = malloc((size_t)8 * nb * 144);
            failed = rows8 == NULL;
#pragma omp for schedule(guided, ROWS_PER_GRAB / 8)
            for (int t = 0; t < groups; t++) {
                if (!rows8) continue;
                for (int l = 0; l < 8; l++) r8_unpack_lane(g + (int64_t)t * nb, nb, l, rows8 + (int64_t)l * nb * 144);
                kq_linear(&FORMAT_Q4_K, 0, rows8, (int64_t)nb * 144, 8, in_features, x, x_row, rows,
                          bias ? bias + 8 * t : NULL, y + 8 * t, y_row, 1);
            }
            free(rows8);
        }
        return failed ? -2 : 0;
    }
    R8Sums *sums;
    ActBlockK *act = r8_activations(x, x_row, rows, nb, &sums);
    if (!act) return -2;
    if (gemm) {
        const int tiles = (groups + R8_GEMM_GROUPS - 1) / R8_GEMM_GROUPS;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (int t = 0; t < tiles; t++) {
            const int g1 = (t + 1) * R8_GEMM_GROUPS < groups ? (t + 1) * R8_GEMM_GROUPS : groups;
            r8_groups(g, nb, t * R8_GEMM_GROUPS, g1, act, sums, nb, rows, bias, y, y_row);
        }
    } else {
#pragma omp parallel for schedule(guided, ROWS_PER_GRAB / 8) num_threads(threads)
        for (int t = 0; t < groups; t++) r8_groups(g, nb, t, t + 1, act, sums, nb, rows, bias, y, y_row);
    }
    free(act), free(sums);
    return 0;
}

/* dequantize and dequantize_gather for Q4_K_R8: out row r = weight row index[r] (r < n; row r itself when index is
 * NULL, n % 8 == 0) of the groups at w, unpacked to its Q4_K blocks and dequantized as Q4_K. 0, -1 (bad width), -2
 * (memory). */
static int r8_dequantize(const uint8_t *w, int64_t w_row_bytes, const int64_t *index, int n, int cols, float *out,
                         int64_t out_row, int num_threads) {
    const int nb = cols / QK_K;
    if (cols % QK_K != 0 || (!index && n % 8 != 0) || w_row_bytes != (int64_t)nb * R8_ROW_BYTES) return -1;
    int failed = 0;
#pragma omp parallel num_threads(threads_for((int64_t)n * cols, num_threads)) reduction(| : failed)
    {
        uint8_t *row = malloc((size_t)nb * 144);
        failed = row == NULL;
#pragma omp for schedule(dynamic, ROWS_PER_GRAB)
        for (int r = 0; r < n; r++) {
            if (!row) continue;
            const int64_t o = index ? index[r] : r;
            r8_unpack_lane((const R8Block *)w + o / 8 * nb, nb, (int)(o % 8), row);
            for (int b = 0; b < nb; b++) deq_q4_k(row + (int64_t)b * 144, out + r * out_row + (int64_t)b * QK_K);
        }
        free(row);
    }
    return failed ? -2 : 0;
}
#endif
