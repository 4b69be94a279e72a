/* The driver for the formats described by a QFormat (quant/kformat.h): the GEMV for few rows, the GEMM for many,
 * dequantizing rows (included by quant_linear.c). Each output row is computed by one thread, a weight row at a time;
 * its blocks are read once for every pass of KQ_ROWS activation rows , and stay in L1 for the next. */
#ifndef QUANT_GENERIC_H
#define QUANT_GENERIC_H
#include "quant/reference.h"
#include "quant/dots_q4k_q5k.h"
#include "quant/dots_q6k_q3k.h"
#include "quant/dots_b32_iq4.h"
#include "quant/gemm_b32.h"

#define KQ_TILE 16 /* weight rows the GEMM keeps in cache while it sweeps every activation row */

/* Each format's fast dots (NULL: not written; the driver then multiplies exactly through `dequant`). */
static const QFormat FORMAT_Q5_0 = {Q5_0, QK, 22, ACT_32, deq_q5_0, Q5_0_DOT_F32, Q5_0_DOT_Q8};
static const QFormat FORMAT_Q5_1 = {Q5_1, QK, 24, ACT_32, deq_q5_1, Q5_1_DOT_F32, Q5_1_DOT_Q8};
static const QFormat FORMAT_IQ4_NL = {IQ4_NL, QK, 18, ACT_32, deq_iq4_nl, IQ4_NL_DOT_F32, IQ4_NL_DOT_Q8};
static const QFormat FORMAT_Q3_K = {Q3_K, QK_K, 110, ACT_K, deq_q3_k, Q3_K_DOT_F32, Q3_K_DOT_Q8};
static const QFormat FORMAT_Q4_K = {Q4_K, QK_K, 144, ACT_K, deq_q4_k, Q4_K_DOT_F32, Q4_K_DOT_Q8};
static const QFormat FORMAT_Q5_K = {Q5_K, QK_K, 176, ACT_K, deq_q5_k, Q5_K_DOT_F32, Q5_K_DOT_Q8};
static const QFormat FORMAT_Q6_K = {Q6_K, QK_K, 210, ACT_K, deq_q6_k, Q6_K_DOT_F32, Q6_K_DOT_Q8};
static const QFormat FORMAT_IQ4_XS = {IQ4_XS, QK_K, 136, ACT_K, deq_iq4_xs, IQ4_XS_DOT_F32, IQ4_XS_DOT_Q8};

/* The format of a ggml type id, or NULL (Q4_0 / Q4_1 / Q8_0 have kernels of their own; others are not supported). */
static const QFormat *qformat(int qtype) {
    switch (qtype) {
    case Q5_0: return &FORMAT_Q5_0;
    case Q5_1: return &FORMAT_Q5_1;
    case IQ4_NL: return &FORMAT_IQ4_NL;
    case Q3_K: return &FORMAT_Q3_K;
    case Q4_K: return &FORMAT_Q4_K;
    case Q5_K: return &FORMAT_Q5_K;
    case Q6_K: return &FORMAT_Q6_K;
    case IQ4_XS: return &FORMAT_IQ4_XS;
    default: return NULL;
    }
}

#ifdef QL_AVX2
/* 32 activations times inv rounded to int8 (half to even, as nearbyintf) into out; the sums of its two halves. */
static inline void kq_round_32(const float *xb, __m256 inv, int8_t *out, int *sum0, int *sum1) {
    __m256i q[4];
    for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), inv));
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i *)out, _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    const __m256i s0 = _mm256_add_epi32(q[0], q[1]), s1 = _mm256_add_epi32(q[2], q[3]);
    __m128i s = _mm_hadd_epi32(_mm_add_epi32(_mm256_castsi256_si128(s0), _mm256_extracti128_si256(s0, 1)),
                               _mm_add_epi32(_mm256_castsi256_si128(s1), _mm256_extracti128_si256(s1, 1)));
    s = _mm_hadd_epi32(s, s); /* [sum0, sum1, sum0, sum1] */
    *sum0 = _mm_cvtsi128_si32(s), *sum1 = _mm_extract_epi32(s, 1);
}

/* kq_quantize_row in AVX2: the same amax, scale, rounding and sums (for finite inputs), 8 values an instruction (a
 * decode step rounds every linear's input: 1.8 ns a value scalar, on one thread while the others wait). */
static void kq_quantize_row_avx2(ActKind kind, const float *x, int cols, void *out) {
    const int bw = kind == ACT_K ? QK_K : QK, nb = cols / bw;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int b = 0; b < nb; b++) {
        const float *xb = x + (int64_t)b * bw;
        __m256 m8 = _mm256_setzero_ps();
        for (int j = 0; j < bw; j += 8) m8 = _mm256_max_ps(m8, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)));
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        const float d = amax / 127.0f;
        const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        if (kind == ACT_K) {
            ActBlockK *a = (ActBlockK *)out + b;
            a->d = d;
            for (int g = 0; g < QK_K / QK; g++) {
                int s0, s1;
                kq_round_32(xb + QK * g, inv, a->qs + QK * g, &s0, &s1);
                a->bsums[2 * g] = (int16_t)s0, a->bsums[2 * g + 1] = (int16_t)s1;
            }
        } else {
            ActBlock32 *a = (ActBlock32 *)out + b;
            int s0, s1;
            kq_round_32(xb, inv, a->qs, &s0, &s1);
            a->d = d;
            a->s = d * (float)(s0 + s1);
        }
    }
}
#endif

/* One activation row rounded to int8 a block at a time (amax / 127 scales; |q| <= 127), as the format's dot takes. */
static void kq_quantize_row(ActKind kind, const float *x, int cols, void *out) {
#ifdef QL_AVX2
    kq_quantize_row_avx2(kind, x, cols, out);
#else
    const int bw = kind == ACT_K ? QK_K : QK, nb = cols / bw;
    for (int b = 0; b < nb; b++) {
        const float *xb = x + (int64_t)b * bw;
        float amax = 0.0f;
        for (int j = 0; j < bw; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int8_t *qs = kind == ACT_K ? ((ActBlockK *)out)[b].qs : ((ActBlock32 *)out)[b].qs;
        int sum = 0;
        for (int j = 0; j < bw; j++) {
            qs[j] = (int8_t)nearbyintf(xb[j] * inv);
            sum += qs[j];
        }
        if (kind == ACT_K) {
            ActBlockK *a = (ActBlockK *)out + b;
            a->d = d;
            for (int g = 0; g < QK_K / 16; g++) {
                int s = 0;
                for (int j = 0; j < 16; j++) s += qs[16 * g + j];
                a->bsums[g] = (int16_t)s;
            }
        } else {
            ActBlock32 *a = (ActBlock32 *)out + b;
            a->d = d;
            a->s = d * (float)sum;
        }
    }
#endif
}

/* The exact dot of a format without a dot_f32 of its own: each block dequantized once for the nr rows. */
static void kq_dot_dequant(const QFormat *f, const uint8_t *wrow, int nb, const float *x, int64_t x_row, int nr,
                           float *sums) {
    float w[QK_K];
    const int bw = f->block_weights;
    for (int r = 0; r < nr; r++) sums[r] = 0.0f;
    for (int b = 0; b < nb; b++) {
        f->dequant(wrow + (int64_t)b * f->block_bytes, w);
        for (int r = 0; r < nr; r++) {
            const float *xb = x + r * x_row + (int64_t)b * bw;
            float s = 0.0f;
            for (int j = 0; j < bw; j++) s += w[j] * xb[j];
            sums[r] += s;
        }
    }
}

/* Activations for a call: NULL when the call multiplies exactly (act_q8 = 0 or no integer dot), else rows of blocks
 * (*act_row blocks a row); *failed when memory is short. */
static void *kq_activations(const QFormat *f, int act_q8, const float *x, int64_t x_row, int rows, int cols,
                            int64_t *act_row, int *failed) {
    *act_row = cols / (f->act == ACT_K ? QK_K : QK);
    *failed = 0;
    if (!act_q8 || f->dot_q8 == NULL) return NULL;
    const size_t size = f->act == ACT_K ? sizeof(ActBlockK) : sizeof(ActBlock32);
    void *act = malloc(size * (size_t)(*act_row) * (size_t)rows + 1);
    if (!act) {
        *failed = 1;
        return NULL;
    }
    for (int r = 0; r < rows; r++)
        kq_quantize_row(f->act, x + r * x_row, cols, (uint8_t *)act + size * (size_t)(*act_row) * r);
    return act;
}

/* sums for activation rows r0..r0+nr of one weight row: the integer dot (act given), the exact one, or the fallback. */
static inline void kq_dot(const QFormat *f, const uint8_t *wrow, int nb, const float *x, int64_t x_row,
                          const void *act, int64_t act_row, int r0, int nr, float *sums) {
    if (act) {
        const size_t size = f->act == ACT_K ? sizeof(ActBlockK) : sizeof(ActBlock32);
        f->dot_q8(wrow, nb, (const uint8_t *)act + size * (size_t)act_row * r0, act_row, nr, sums);
    } else if (f->dot_f32) {
        f->dot_f32(wrow, nb, x + r0 * x_row, x_row, nr, sums);
    } else {
        kq_dot_dequant(f, wrow, nb, x + r0 * x_row, x_row, nr, sums);
    }
}

/* quant_linear for a QFormat: few rows, each weight row read from memory once. 0, -1 (bad width), -2 (memory). */
static int kq_linear(const QFormat *f, int act_q8, const uint8_t *w, int64_t w_row_bytes, int out_features,
                     int in_features, const float *x, int64_t x_row, int rows, const float *bias, float *y,
                     int64_t y_row, int num_threads) {
    const int nb = in_features / f->block_weights;
    if (in_features % f->block_weights != 0 || w_row_bytes < (int64_t)nb * f->block_bytes) return -1;
    int64_t act_row;
    int failed;
    void *act = kq_activations(f, act_q8, x, x_row, rows, in_features, &act_row, &failed);
    if (failed) return -2;
    const int pass = KQ_ROWS;
#pragma omp parallel for schedule(guided, ROWS_PER_GRAB) num_threads(threads_for((int64_t)out_features * in_features, num_threads))
    for (int o = 0; o < out_features; o++) {
        const uint8_t *wrow = w + (int64_t)o * w_row_bytes;
        const float b = bias ? bias[o] : 0.0f;
        for (int r0 = 0; r0 < rows; r0 += pass) {
            const int nr = rows - r0 < pass ? rows - r0 : pass;
            float sums[KQ_ROWS];
            kq_dot(f, wrow, nb, x, x_row, act, act_row, r0, nr, sums);
            for (int r = 0; r < nr; r++) y[(r0 + r) * y_row + o] = sums[r] + b;
        }
    }
    free(act);
    return 0;
}

/* quant_gemm_q8 for a QFormat: many rows; KQ_TILE weight rows at a time stay in cache while every activation row
 * passes them. 0, -1 (bad width), -2 (memory). */
static int kq_gemm(const QFormat *f, const uint8_t *w, int64_t w_row_bytes, int out_features, int in_features,
                   const float *x, int64_t x_row, int rows, const float *bias, float *y, int64_t y_row,
                   int num_threads) {
    const int nb = in_features / f->block_weights;
    if (in_features % f->block_weights != 0 || w_row_bytes < (int64_t)nb * f->block_bytes) return -1;
#ifdef QL_AVX2 /* Q5_0, Q5_1, IQ4_NL: the legacy formats' tiled GEMM over their unpacked blocks (quant/gemm_b32.h) */
    if (f->qtype == Q5_0 || f->qtype == Q5_1 || f->qtype == IQ4_NL)
        return b32_gemm(f->qtype, w, w_row_bytes, out_features, in_features, x, x_row, rows, bias, y, y_row,
                        num_threads);
#endif
    int64_t act_row;
    int failed;
    void *act = kq_activations(f, 1, x, x_row, rows, in_features, &act_row, &failed);
    if (failed) return -2;
    const int tiles = (out_features + KQ_TILE - 1) / KQ_TILE, pass = KQ_ROWS;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_for((int64_t)out_features * in_features * rows, num_threads))
    for (int t = 0; t < tiles; t++) {
        const int o0 = t * KQ_TILE, o1 = o0 + KQ_TILE < out_features ? o0 + KQ_TILE : out_features;
        for (int r0 = 0; r0 < rows; r0 += pass) {
            const int nr = rows - r0 < pass ? rows - r0 : pass;
            for (int o = o0; o < o1; o++) {
                float sums[KQ_ROWS];
                kq_dot(f, w + (int64_t)o * w_row_bytes, nb, x, x_row, act, act_row, r0, nr, sums);
                for (int r = 0; r < nr; r++) y[(r0 + r) * y_row + o] = sums[r] + (bias ? bias[o] : 0.0f);
            }
        }
    }
    free(act);
    return 0;
}

/* dequantize for a QFormat. 0, or -1 (bad width). */
static int kq_dequantize(const QFormat *f, const uint8_t *w, int64_t w_row_bytes, int rows, int cols, float *out,
                         int64_t out_row, int num_threads) {
    const int nb = cols / f->block_weights;
    if (cols % f->block_weights != 0 || w_row_bytes < (int64_t)nb * f->block_bytes) return -1;
#pragma omp parallel for schedule(dynamic, ROWS_PER_GRAB) num_threads(threads_for((int64_t)rows * cols, num_threads))
    for (int o = 0; o < rows; o++)
        for (int b = 0; b < nb; b++)
            f->dequant(w + (int64_t)o * w_row_bytes + (int64_t)b * f->block_bytes,
                       out + o * out_row + (int64_t)b * f->block_weights);
    return 0;
}
#endif
