/* Weight-only quantized linears for the CPU: y = x @ W^T (+ bias), W kept in GGUF's Q4_0 / Q4_1 / Q8_0 blocks.
 *
 * Built and loaded by engine/native/quant_linear.py. Each weight row is its GGUF blocks of 32 weights:
 *   Q4_0: fp16 d, 16 bytes of nibbles          w = d * (q - 8)
 *   Q4_1: fp16 d, fp16 m, 16 bytes of nibbles  w = d * q + m
 *   Q8_0: fp16 d, 32 int8                      w = d * q
 * where byte j of a block holds weight j in its low nibble and weight j + 16 in its high nibble.
 *
 * Decode multiplies 1..few activation rows by every weight once, so it is a stream over the weights; the kernels
 * read each weight block once per call and use it for up to PASS_ROWS activation rows while it is in registers.
 * Two dot products:
 *   - exact (act_q8 = 0): dequantize the block to fp32 and FMA with the fp32 activations;
 *   - q8 (act_q8 = 1): the activations are first quantized per 32-block to int8 (scale dx = amax / 127, kept in
 *     fp32), then each block's dot is integer math (AVX2 maddubs/madd) scaled once, as llama.cpp does; under AVX2
 *     four Q4 blocks (two Q8_0) at a time (linear_pairs, below, in the batch GEMM's activation layout).
 * AVX2 + FMA + F16C intrinsics when the compiler targets them, a scalar fallback otherwise; OpenMP over output rows.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define QL_AVX2 1
#endif

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 }; /* ggml type ids */
#define QK 32                          /* weights per block */
#define PASS_ROWS 4                    /* activation rows sharing one decoded weight block */
#define PAIR_ROWS 4                    /* weight rows the int8 GEMV multiplies at once by one activation row */
#define PAIR_PREFETCH 1 /* the int8 GEMV prefetches this many tiles of weight rows ahead */
#define PARALLEL_MIN_WEIGHTS 65536
/* Output rows (GEMM: tiles of GEMM_RM rows) are handed to threads a chunk at a time, not split evenly up front: on a
 * machine whose cores the service's own threads (the event loop streaming every token) also need, a thread that is
 * preempted mid-call would otherwise hold up the whole call at its end while the other sits idle. The GEMVs, which
 * stream their weights, hand them out `guided`: long contiguous runs first (one stream per thread that the hardware
 * prefetcher follows; fixed grabs of 32 rows taken in turn cut both threads' streams every few KB and ran the
 * model's batch-1 linears at 11-14 ms instead of 8-9), then shorter ones down to ROWS_PER_GRAB outputs. Each output
 * is still computed by one thread the same way, so results do not depend on the schedule. */
#define ROWS_PER_GRAB 32

static int block_bytes(int qtype) { return qtype == Q4_0 ? 18 : qtype == Q4_1 ? 20 : qtype == Q8_0 ? 34 : 0; }
static int threads_for(int64_t weights, int num_threads) {
    return weights >= PARALLEL_MIN_WEIGHTS && num_threads > 1 ? num_threads : 1;
}

static inline float fp16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef QL_AVX2
    return _cvtsh_ss(h);
#else
    const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float f;
    if (exp == 0) {
        f = (float)mant * 5.9604644775390625e-08f; /* subnormal (or zero): mant * 2^-24, exact */
    } else {
        const uint32_t bits = exp == 31 ? 0x7f800000u | (mant << 13) : ((exp + 112) << 23) | (mant << 13);
        memcpy(&f, &bits, 4);
    }
    return (h & 0x8000) ? -f : f;
#endif
}

/* The 32 weights of one block as fp32, computed as gguf.quants.dequantize does. */
static inline void dequant_block(int qtype, const uint8_t *blk, float *out) {
    const float d = fp16_at(blk);
    if (qtype == Q8_0) {
        for (int j = 0; j < QK; j++) out[j] = d * (float)((const int8_t *)(blk + 2))[j];
        return;
    }
    const float m = qtype == Q4_1 ? fp16_at(blk + 2) : 0.0f;
    const uint8_t *qs = blk + (qtype == Q4_1 ? 4 : 2);
    const int offset = qtype == Q4_0 ? 8 : 0;
    for (int j = 0; j < QK / 2; j++) {
        out[j] = d * (float)((qs[j] & 15) - offset) + m;
        out[j + QK / 2] = d * (float)((qs[j] >> 4) - offset) + m;
    }
}

#ifdef QL_AVX2
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
/* The 32 nibbles of a Q4 block's 16 bytes as bytes 0..15, in weight order (low nibbles, then high). */
static inline __m256i q4_nibbles(__m128i raw) {
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0f));
}
static inline void dequant_block_avx2(int qtype, const uint8_t *blk, __m256 w[4]) {
    const __m256 d = _mm256_set1_ps(fp16_at(blk));
    if (qtype == Q8_0) {
        for (int k = 0; k < 4; k++) {
            const __m128i q = _mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * k));
            w[k] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
        }
        return;
    }
    const __m256 m = _mm256_set1_ps(qtype == Q4_1 ? fp16_at(blk + 2) : 0.0f);
    const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + (qtype == Q4_1 ? 4 : 2)));
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(raw, mask), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    const __m256i offset = _mm256_set1_epi32(qtype == Q4_0 ? 8 : 0);
    for (int k = 0; k < 4; k++) {
        const __m256 q = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[k]), offset));
        w[k] = _mm256_add_ps(_mm256_mul_ps(d, q), m);
    }
}
#endif

/* sums[r] = dot(x row r, dequantized weight row) for r < nr (nr <= PASS_ROWS, a constant after inlining). */
static inline __attribute__((always_inline)) void dot_f32(int qtype, const uint8_t *wrow, int nb, int bb,
                                                          const float *x, int64_t x_row, int nr, float *sums) {
#ifdef QL_AVX2
    __m256 acc[PASS_ROWS];
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256 w[4];
        dequant_block_avx2(qtype, wrow + (int64_t)b * bb, w);
        for (int r = 0; r < nr; r++) {
            const float *xb = x + r * x_row + b * QK;
            __m256 t = _mm256_mul_ps(w[0], _mm256_loadu_ps(xb));
            t = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xb + 8), t);
            t = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xb + 16), t);
            t = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xb + 24), t);
            acc[r] = _mm256_add_ps(acc[r], t);
        }
    }
    for (int r = 0; r < nr; r++) sums[r] = hsum8(acc[r]);
#else
    float w[QK];
    for (int r = 0; r < nr; r++) sums[r] = 0.0f;
    for (int b = 0; b < nb; b++) {
        dequant_block(qtype, wrow + (int64_t)b * bb, w);
        for (int r = 0; r < nr; r++)
            for (int j = 0; j < QK; j++) sums[r] += w[j] * x[r * x_row + b * QK + j];
    }
#endif
}

/* Activations quantized per 32-block: qx int8 [rows, cols], dx = amax / 127 and sx = dx * sum(qx) per block. */
typedef struct {
    int8_t *qx;
    float *dx, *sx;
} ActQ8;

static void quantize_act(const float *x, int64_t x_row, int rows, int cols, ActQ8 a) {
    const int nb = cols / QK;
    for (int r = 0; r < rows; r++) {
        for (int b = 0; b < nb; b++) {
            const float *xb = x + r * x_row + b * QK;
            int8_t *q = a.qx + (int64_t)r * cols + b * QK;
            float amax = 0.0f;
            for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
            const float dx = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            int sum = 0;
            for (int j = 0; j < QK; j++) {
                q[j] = (int8_t)nearbyintf(xb[j] * inv); /* |xb * inv| <= 127 (+ rounding), never 128 */
                sum += q[j];
            }
            a.dx[r * nb + b] = dx;
            a.sx[r * nb + b] = dx * (float)sum;
        }
    }
}

/* sums[r] = sum over blocks of d * dx * dot(q, qx) (+ the Q4_1 min or Q4_0 offset term), for r < nr. */
static inline __attribute__((always_inline)) void dot_q8(int qtype, const uint8_t *wrow, int nb, int bb,
                                                         ActQ8 a, int cols, int nr, float *sums) {
    float corr[PASS_ROWS] = {0};
    for (int r = 0; r < nr; r++) sums[r] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * bb;
        const float d = fp16_at(blk);
        const float m = qtype == Q4_1 ? fp16_at(blk + 2) : qtype == Q4_0 ? -8.0f * d : 0.0f;
        const uint8_t *qs = blk + (qtype == Q4_1 ? 4 : 2);
        for (int r = 0; r < nr; r++) {
            const int8_t *xq = a.qx + (int64_t)r * cols + b * QK;
            int dot = 0;
            for (int j = 0; j < QK / 2; j++) {
                if (qtype == Q8_0)
                    dot += ((const int8_t *)qs)[j] * xq[j] + ((const int8_t *)qs)[j + 16] * xq[j + 16];
                else
                    dot += (qs[j] & 15) * xq[j] + (qs[j] >> 4) * xq[j + 16];
            }
            sums[r] += d * a.dx[r * nb + b] * (float)dot;
            corr[r] += m * a.sx[r * nb + b];
        }
    }
    for (int r = 0; r < nr; r++) sums[r] += corr[r];
}

/* dot_q8 or dot_f32 for nr rows, specialized on a constant qtype and nr so that accumulators stay in registers. */
static inline __attribute__((always_inline)) void dot_rows_of(int qtype, int act_q8, const uint8_t *wrow, int nb,
                                                              int bb, const float *x, int64_t x_row, ActQ8 a,
                                                              int cols, int nr, float *sums) {
#define DOT_CASE(N)                                                         \
    case N:                                                                 \
        if (act_q8)                                                         \
            dot_q8(qtype, wrow, nb, bb, a, cols, N, sums);                  \
        else                                                                \
            dot_f32(qtype, wrow, nb, bb, x, x_row, N, sums);                \
        break;
    switch (nr) { DOT_CASE(1) DOT_CASE(2) DOT_CASE(3) DOT_CASE(4) }
#undef DOT_CASE
}

static void dot_rows(int qtype, int act_q8, const uint8_t *wrow, int nb, int bb, const float *x, int64_t x_row,
                     ActQ8 a, int cols, int nr, float *sums) {
    switch (qtype) {
    case Q4_0: dot_rows_of(Q4_0, act_q8, wrow, nb, bb, x, x_row, a, cols, nr, sums); break;
    case Q4_1: dot_rows_of(Q4_1, act_q8, wrow, nb, bb, x, x_row, a, cols, nr, sums); break;
    default: dot_rows_of(Q8_0, act_q8, wrow, nb, bb, x, x_row, a, cols, nr, sums); break;
    }
}

#ifdef QL_AVX2
/* Single-row decode (the common case of a chat): the block's scale and minimum are applied to the block's dot
 * product rather than to each weight, so the inner loop is integer unpacking plus 4 FMAs (exact) or one
 * maddubs/madd pair (q8). For a row x with per-block sums sx:
 *   Q4_1: sum_b d_b * dot(q_b, x_b) + m_b * sx_b      Q4_0: sum_b d_b * (dot(q_b, x_b) - 8 sx_b)
 *   Q8_0: sum_b d_b * dot(q_b, x_b)
 * Exact mode equals the dequantize-then-multiply result up to fp32 rounding order. */
static inline __attribute__((always_inline)) float row1_exact(int qtype, const uint8_t *wrow, int nb, int bb,
                                                              const float *x, const float *sx) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float corr = 0.0f;
    const __m128i mask = _mm_set1_epi8(0x0f);
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * bb;
        const float *xb = x + b * QK;
        __m256 q[4];
        if (qtype == Q8_0) {
            for (int k = 0; k < 4; k++)
                q[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * k))));
        } else {
            const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + (qtype == Q4_1 ? 4 : 2)));
            const __m128i lo = _mm_and_si128(raw, mask), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
            q[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
            q[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
            q[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
            q[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
        }
        __m256 t = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb)), u = _mm256_mul_ps(q[1], _mm256_loadu_ps(xb + 8));
        t = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xb + 16), t);
        u = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), u);
        const float d = fp16_at(blk);
        if (b & 1)
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_add_ps(t, u), acc1);
        else
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_add_ps(t, u), acc0);
        if (qtype == Q4_1) corr += fp16_at(blk + 2) * sx[b];
        if (qtype == Q4_0) corr -= 8.0f * d * sx[b];
    }
    return hsum8(_mm256_add_ps(acc0, acc1)) + corr;
}

/* y[o] = x . W[o] (+ bias[o]) for one fp32 activation row (exact); sx: the per-block sums of x. */
static inline __attribute__((always_inline)) void linear_row1_of(int qtype, const uint8_t *w, int64_t w_row_bytes,
                                                                 int out_features, int nb, const float *x,
                                                                 const float *sx, const float *bias, float *y,
                                                                 int threads) {
    const int bb = block_bytes(qtype);
#pragma omp parallel for schedule(guided, ROWS_PER_GRAB) num_threads(threads)
    for (int o = 0; o < out_features; o++) {
        const uint8_t *wrow = w + (int64_t)o * w_row_bytes;
        y[o] = row1_exact(qtype, wrow, nb, bb, x, sx) + (bias ? bias[o] : 0.0f);
    }
}

static void linear_row1(int qtype, const uint8_t *w, int64_t w_row_bytes, int out_features, int nb, const float *x,
                        const float *sx, const float *bias, float *y, int threads) {
    switch (qtype) {
    case Q4_0: linear_row1_of(Q4_0, w, w_row_bytes, out_features, nb, x, sx, bias, y, threads); break;
    case Q4_1: linear_row1_of(Q4_1, w, w_row_bytes, out_features, nb, x, sx, bias, y, threads); break;
    default: linear_row1_of(Q8_0, w, w_row_bytes, out_features, nb, x, sx, bias, y, threads); break;
    }
}
#endif

#ifdef QL_AVX2
static int linear_pairs(int qtype, const uint8_t *w, int64_t w_row_bytes, int out_features, int in_features,
                        const float *x, int64_t x_row, int rows, const float *bias, float *y, int64_t y_row,
                        int threads);
#endif

/* y[r, o] = x[r] . W[o] (+ bias[o]) for every row r < rows and output o. 0 on success; -1: a bad type or width;
 * -2: out of memory. Meant for few rows (decode): each weight row is read once for all of them. */
int quant_linear(int qtype, int act_q8, const uint8_t *w, int64_t w_row_bytes, int out_features, int in_features,
                 const float *x, int64_t x_row, int rows, const float *bias, float *y, int64_t y_row,
                 int num_threads) {
    const int bb = block_bytes(qtype), nb = in_features / QK;
    if (bb == 0 || in_features % QK != 0 || w_row_bytes < (int64_t)nb * bb) return -1;
#ifdef QL_AVX2 /* int8 activations: the pair GEMV; exact single rows: the row kernel */
    if (act_q8)
        return linear_pairs(qtype, w, w_row_bytes, out_features, in_features, x, x_row, rows, bias, y, y_row,
                            threads_for((int64_t)out_features * in_features, num_threads));
    if (rows == 1) {
        float sx_stack[256], *sx = nb <= 256 ? sx_stack : malloc(sizeof(float) * (size_t)nb);
        if (!sx) return -2;
        for (int b = 0; b < nb; b++) {
            __m256 s = _mm256_loadu_ps(x + b * QK);
            for (int k = 1; k < 4; k++) s = _mm256_add_ps(s, _mm256_loadu_ps(x + b * QK + 8 * k));
            sx[b] = hsum8(s);
        }
        linear_row1(qtype, w, w_row_bytes, out_features, nb, x, sx, bias, y,
                    threads_for((int64_t)out_features * in_features, num_threads));
        if (sx != sx_stack) free(sx);
        return 0;
    }
#endif
    ActQ8 a = {0};
    if (act_q8) {
        a.qx = malloc((size_t)rows * in_features + 1);
        a.dx = malloc(sizeof(float) * ((size_t)rows * nb + 1));
        a.sx = malloc(sizeof(float) * ((size_t)rows * nb + 1));
        if (!a.qx || !a.dx || !a.sx) {
            free(a.qx), free(a.dx), free(a.sx);
            return -2;
        }
        quantize_act(x, x_row, rows, in_features, a);
    }
#pragma omp parallel for schedule(guided, ROWS_PER_GRAB) num_threads(threads_for((int64_t)out_features * in_features, num_threads))
    for (int o = 0; o < out_features; o++) {
        const uint8_t *wrow = w + (int64_t)o * w_row_bytes;
        const float b = bias ? bias[o] : 0.0f;
        for (int r0 = 0; r0 < rows; r0 += PASS_ROWS) {
            const int nr = rows - r0 < PASS_ROWS ? rows - r0 : PASS_ROWS;
            const ActQ8 ar = {a.qx ? a.qx + (int64_t)r0 * in_features : NULL, a.dx ? a.dx + r0 * nb : NULL,
                              a.sx ? a.sx + r0 * nb : NULL};
            float sums[PASS_ROWS];
            dot_rows(qtype, act_q8, wrow, nb, bb, x + r0 * x_row, x_row, ar, in_features, nr, sums);
            for (int r = 0; r < nr; r++) y[(r0 + r) * y_row + o] = sums[r] + b;
        }
    }
    free(a.qx), free(a.dx), free(a.sx);
    return 0;
}

#ifdef QL_AVX2
/* Many rows (prefill, a busy decode step) with int8 activations: a register-tiled GEMM over groups of blocks.
 *
 * Pairs of blocks (Q8_0, and a Q4 row's leftover blocks): blocks 2p and 2p + 1 of a row become two 32-byte vectors, [2p bytes 0..15 | 2p+1 bytes 0..15] and [2p bytes 16..31 | 2p+1 bytes 16..31]. After
 * maddubs/madd the 8 int32 lanes are then 4 partial dots of block 2p and 4 of block 2p + 1, so one int->float
 * conversion and one FMA with the lanes' scales [d dx of 2p x4 | d dx of 2p+1 x4] serve two blocks.
 *
 * Q4 goes further: a row's blocks go in quads (GEMM_QUAD), then the 0..3 left over in pairs as above.
 * Quad q is four vectors; vector k holds bytes 8k..8k+7 of blocks 4q, 4q+2, 4q+1, 4q+3 side by side (that order: the
 * GEMV builds it from two [block | block] loads with one 64-bit unpack each), so after maddubs and madd lanes 2s and
 * 2s+1 are partial dots of the block in slot s. The four maddubs results are added in 16 bits
 * first (nibbles <= 15, |x| <= 127: 4 * 2 * 15 * 127 < 2^15), so four blocks cost four maddubs but one madd, one
 * conversion and one FMA (a pair of blocks: two, one, one and one; on AVX2, whose integer multiplies take one port,
 * SmolLM2's Q4_1 linears at 64 rows run 1.1-1.2x the pairs' rate). Q8_0 (|q| up to 128) cannot share the 16-bit
 * sums and stays in pairs (in quads it gained nothing). The Q4 minimum (Q4_0 offset) term, sum over blocks of
 * m_b dx_b sum(qx_b), is not in the inner loop: gemm_min_term adds it per tile, 8 activation rows a vector.
 *
 * Each thread takes GEMM_RM weight rows at a time (a tile), unpacks them once into that layout (Q4 nibbles as bytes;
 * Q8_0 as |q| and q, for maddubs's unsigned x signed) and multiplies them by every activation row, GEMM_RM x GEMM_RN
 * accumulators in registers; the activations are quantized once (per 32-block, as for act_q8) into the same layout.
 * The tile stays in L1 and the activations in L2 while a thread sweeps them.
 * Integer products and their 32-bit sums are exact; what differs from dequantize-then-multiply is only the
 * activations' rounding to int8 (error <= amax / 254 a value) and the fp32 summation order. */
#define GEMM_RM 4
#define GEMM_RN 2
#define GEMM_QUAD 4 /* blocks per group */

/* The decode GEMV's activations, in the GEMM's layout (GemmLayout: cw bytes and sw scales a row). */
typedef struct {
    int8_t *qx;  /* [rows][cw] */
    float *dx8;  /* [rows][sw]: each block's dx in its lanes */
    float *sx8;  /* [rows][sw]: each block's dx * sum(qx) shared out over its lanes (the minimum term's operand) */
} ActPairs;

/* The GEMM's activations: values and scales in its layout, and each block's dx * sum(qx) by block, then row (the
 * minimum term's operand, rows padded to a multiple of 8 with zeros). */
typedef struct {
    int8_t *qx;   /* [rows][cw] */
    float *dx8;   /* [rows][sw]: each block's dx in its lanes */
    float *sums;  /* [nb][rows8] */
    int64_t rows8;
} ActGemm;

typedef struct {
    uint8_t *u; /* [GEMM_RM][cw]: maddubs's unsigned operand (Q4 nibbles, |q| for Q8_0) */
    int8_t *s;  /* [GEMM_RM][cw]: Q8_0's signed q (its sign moved onto the activations), else unused */
    float *d8;  /* [GEMM_RM][sw]: each block's d in its lanes */
    float *m;   /* [GEMM_RM][nb]: the Q4_1 minimum or the Q4_0 -8 d of each block (Q8_0: unused) */
} WTile;

/* A row of nb blocks in the GEMM's layout: nq quads, then np pairs (the last one with a zero partner when the
 * leftover is odd); cw bytes of values and sw floats of scales (8 a group). */
typedef struct {
    int nq, np;
    int64_t cw, sw;
} GemmLayout;

static GemmLayout gemm_layout(int qtype, int nb) {
    const int nq = qtype == Q8_0 ? 0 : nb / GEMM_QUAD, np = (nb - nq * GEMM_QUAD + 1) / 2;
    return (GemmLayout){nq, np, (int64_t)nq * GEMM_QUAD * 32 + (int64_t)np * 64, (int64_t)(nq + np) * 8};
}

/* Block b's 32 bytes to their places in a row of the pair layout; its value in its 4 lanes of the row's scales. */
static inline void place_block(void *row, int b, __m256i v) {
    uint8_t *dst = (uint8_t *)row + (b >> 1) * 64 + (b & 1) * 16;
    _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(v));
    _mm_storeu_si128((__m128i *)(dst + 32), _mm256_extracti128_si256(v, 1));
}
static inline void place_scale(float *row8, int b, float value) {
    _mm_storeu_ps(row8 + (b >> 1) * 8 + (b & 1) * 4, _mm_set1_ps(value));
}

/* The slot of block b in its quad: blocks 4q, 4q+1, 4q+2, 4q+3 sit in slots 0, 2, 1, 3. */
static inline int quad_slot(int b) { return (b & 1) * 2 + ((b >> 1) & 1); }

/* The same for the GEMM's layout: block b's bytes, and its lanes' scale (each of them gets `value`). */
static inline void gemm_place_block(GemmLayout L, void *row, int b, __m256i v) {
    if (b >= L.nq * GEMM_QUAD) {
        place_block((uint8_t *)row + (int64_t)L.nq * GEMM_QUAD * 32, b - L.nq * GEMM_QUAD, v);
        return;
    }
    enum { SLOT = 32 / GEMM_QUAD };
    uint8_t bytes[32], *dst = (uint8_t *)row + (int64_t)(b / GEMM_QUAD) * GEMM_QUAD * 32 + quad_slot(b) * SLOT;
    _mm256_storeu_si256((__m256i *)bytes, v);
    for (int k = 0; k < GEMM_QUAD; k++) memcpy(dst + 32 * k, bytes + SLOT * k, SLOT);
}
static inline void gemm_place_scale(GemmLayout L, float *row8, int b, float value) {
    if (b >= L.nq * GEMM_QUAD) {
        place_scale(row8 + (int64_t)L.nq * 8, b - L.nq * GEMM_QUAD, value);
        return;
    }
    const int lanes = 8 / GEMM_QUAD;
    for (int l = 0; l < lanes; l++) row8[(b / GEMM_QUAD) * 8 + quad_slot(b) * lanes + l] = value;
}

/* One 32-block of activations as int8 (rounded half to even, as nearbyintf in the default mode) with
 * dx = amax / 127, and the sum of its int8 values. */
static inline __m256i quantize_block(const float *xb, float *dx, int *sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(xb + 8 * k);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float a = _mm_cvtss_f32(m);
    const __m256 inv = _mm256_set1_ps(a > 0.0f ? 127.0f / a : 0.0f);
    __m256i q[4];
    for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], inv)); /* |q| <= 127 */
    /* int32 -> int16 -> int8; the packs interleave 128-bit lanes, the permute restores the order */
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    s = _mm_hadd_epi32(s, s);
    *sum = _mm_cvtsi128_si32(_mm_hadd_epi32(s, s));
    *dx = a / 127.0f;
    return _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* An activation row into the GEMM's layout: values qx, dx8 in each block's lanes, and each block's dx * sum(qx)
 * either shared out over its lanes of sx8 (the GEMV's minimum term) or at sums[b * rows8] (the GEMM's); NULL: not
 * wanted. */
static void quantize_row_gemm(GemmLayout L, const float *x, int cols, int8_t *qx, float *dx8, float *sx8, float *sums,
                              int64_t rows8) {
    const int nb = cols / QK;
    for (int b = 0; b < nb; b++) {
        float dx;
        int sum;
        gemm_place_block(L, qx, b, quantize_block(x + b * QK, &dx, &sum));
        gemm_place_scale(L, dx8, b, dx);
        if (sx8) gemm_place_scale(L, sx8, b, dx * (float)sum / (b < L.nq * GEMM_QUAD ? 8 / GEMM_QUAD : 4));
        if (sums) sums[b * rows8] = dx * (float)sum;
    }
    if ((nb - L.nq * GEMM_QUAD) & 1) { /* the last pair's zero partner */
        gemm_place_block(L, qx, nb, _mm256_setzero_si256());
        gemm_place_scale(L, dx8, nb, 0.0f);
        if (sx8) gemm_place_scale(L, sx8, nb, 0.0f);
    }
}

/* Room for `rows` activation rows of cw value bytes and sw scales each (members NULL where memory is short). */
static ActPairs act_alloc(int rows, int64_t cw, int64_t sw) {
    return (ActPairs){aligned_alloc(32, (size_t)rows * cw), aligned_alloc(32, sizeof(float) * rows * sw),
                      aligned_alloc(32, sizeof(float) * rows * sw)};
}
static int act_pairs_ok(ActPairs a) { return a.qx && a.dx8 && a.sx8; }
static void act_pairs_free(ActPairs a) { free(a.qx), free(a.dx8), free(a.sx8); }

static void unpack_tile(int qtype, const uint8_t *w, int64_t w_row_bytes, int nr, int nb, GemmLayout L, WTile t) {
    const int bb = block_bytes(qtype);
    for (int i = 0; i < nr; i++) {
        uint8_t *u = t.u + i * L.cw;
        int8_t *s = t.s + i * L.cw;
        float *d8 = t.d8 + i * L.sw, *m = t.m + i * nb;
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = w + (int64_t)i * w_row_bytes + (int64_t)b * bb;
            const float d = fp16_at(blk);
            gemm_place_scale(L, d8, b, d);
            if (qtype == Q8_0) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 2));
                gemm_place_block(L, s, b, q);
                gemm_place_block(L, u, b, _mm256_sign_epi8(q, q));
            } else {
                const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + (qtype == Q4_1 ? 4 : 2)));
                gemm_place_block(L, u, b, q4_nibbles(raw));
                m[b] = qtype == Q4_1 ? fp16_at(blk + 2) : -8.0f * d;
            }
        }
        if ((nb - L.nq * GEMM_QUAD) & 1) {
            gemm_place_block(L, u, nb, _mm256_setzero_si256());
            gemm_place_block(L, s, nb, _mm256_setzero_si256());
            gemm_place_scale(L, d8, nb, 0.0f);
        }
    }
}

/* The integer dots of G consecutive 32-byte vectors of weights (uk; Q8_0: |q|, its signed q in sk, registers or the
 * GEMM's aligned tile) and activations x: 8 int32 lanes (for Q4 the maddubs sums are added in 16 bits first: see
 * above). The GEMM and the GEMV both take their dots here. */
static inline __attribute__((always_inline)) __m256i group_dot(int qtype, int G, const __m256i *uk, const __m256i *sk,
                                                               const int8_t *x) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc16 = _mm256_setzero_si256(), acc32 = _mm256_setzero_si256();
    for (int k = 0; k < G; k++) {
        __m256i xk = _mm256_load_si256((const __m256i *)(x + 32 * k));
        if (qtype == Q8_0) { /* u <= 128, |x| <= 127: a pair sums to at most 2 * 128 * 127 < 2^15 */
            xk = _mm256_sign_epi8(xk, sk[k]);
            const __m256i dk = _mm256_madd_epi16(_mm256_maddubs_epi16(uk[k], xk), ones);
            acc32 = k ? _mm256_add_epi32(acc32, dk) : dk;
        } else {
            const __m256i pk = _mm256_maddubs_epi16(uk[k], xk);
            acc16 = k ? _mm256_add_epi16(acc16, pk) : pk;
        }
    }
    return qtype == Q8_0 ? acc32 : _mm256_madd_epi16(acc16, ones);
}

/* acc[i][j] += group g's dots (G blocks' vectors at byte offset `off`, scales at float offset g * 8) of weight row i
 * and activation row j, scaled (the Q4 minimum term is added afterwards: gemm_tile_of). Each weight row's vectors
 * are loaded once for all NJ activation rows. */
static inline __attribute__((always_inline)) void gemm_group(int qtype, int G, WTile t, ActGemm a, GemmLayout L,
                                                             int64_t off, int g, int NI, int NJ,
                                                             __m256 acc[GEMM_RM][GEMM_RN]) {
    for (int i = 0; i < NI; i++) {
        /* Q8_0: keeps GCC from hoisting the activation loads of every row i (16 registers do not hold them and the
         * accumulators: it spilled, and the head's GEMM ran ~12% slower than with them reloaded) */
        if (qtype == Q8_0) __asm__ volatile("" ::: "memory");
        __m256i uk[GEMM_QUAD];
        for (int k = 0; k < G; k++) uk[k] = _mm256_load_si256((const __m256i *)(t.u + i * L.cw + off + 32 * k));
        const __m256 d = _mm256_load_ps(t.d8 + i * L.sw + g * 8);
        for (int j = 0; j < NJ; j++) {
            const __m256i *sk = (const __m256i *)(t.s + i * L.cw + off);
            const __m256i dot = group_dot(qtype, G, uk, sk, a.qx + j * L.cw + off);
            const __m256 scale = _mm256_mul_ps(d, _mm256_load_ps(a.dx8 + j * L.sw + g * 8));
            acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[i][j]);
        }
    }
}

/* out[j][i] = x row j . weight row i for the tile's rows i < NI and activation rows j < NJ (constants after
 * inlining), before bias. */
static inline __attribute__((always_inline)) void gemm_micro(int qtype, WTile t, ActGemm a, GemmLayout L, int NI,
                                                             int NJ, float out[GEMM_RN][GEMM_RM]) {
    __m256 acc[GEMM_RM][GEMM_RN];
    for (int i = 0; i < NI; i++)
        for (int j = 0; j < NJ; j++) acc[i][j] = _mm256_setzero_ps();
    for (int q = 0; q < (qtype == Q8_0 ? 0 : L.nq); q++) /* Q8_0: pairs only (gemm_layout) */
        gemm_group(qtype, GEMM_QUAD, t, a, L, (int64_t)q * GEMM_QUAD * 32, q, NI, NJ, acc);
    for (int p = 0; p < L.np; p++)
        gemm_group(qtype, 2, t, a, L, (int64_t)L.nq * GEMM_QUAD * 32 + p * 64, L.nq + p, NI, NJ, acc);
    if (NI == GEMM_RM && NJ == GEMM_RN) { /* the 8 sums at once: lanes [i0j0 i1j0 i2j0 i3j0 | i0j1 .. i3j1] */
        const __m256 h0 = _mm256_hadd_ps(acc[0][0], acc[1][0]), h1 = _mm256_hadd_ps(acc[2][0], acc[3][0]);
        const __m256 h2 = _mm256_hadd_ps(acc[0][1], acc[1][1]), h3 = _mm256_hadd_ps(acc[2][1], acc[3][1]);
        const __m256 g0 = _mm256_hadd_ps(h0, h1), g1 = _mm256_hadd_ps(h2, h3);
        float v[8];
        _mm256_storeu_ps(v, _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31)));
        for (int j = 0; j < GEMM_RN; j++)
            for (int i = 0; i < GEMM_RM; i++) out[j][i] = v[j * GEMM_RM + i];
        return;
    }
    for (int i = 0; i < NI; i++)
        for (int j = 0; j < NJ; j++) out[j][i] = hsum8(acc[i][j]);
}

/* The Q4 minimum term of weight rows i < ni and activation rows r0..r0+7: corr[i][k] = sum over blocks of m_ib times
 * row r0 + k's dx * sum(qx) of block b (8 rows a vector; rows past the last are zeros). */
static void gemm_min_term(WTile t, ActGemm a, int nb, int ni, int64_t r0, float corr[GEMM_RM][8]) {
    for (int i = 0; i < ni; i++) {
        __m256 c = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++)
            c = _mm256_fmadd_ps(_mm256_set1_ps(t.m[i * nb + b]), _mm256_loadu_ps(a.sums + b * a.rows8 + r0), c);
        _mm256_storeu_ps(corr[i], c);
    }
}

static inline __attribute__((always_inline)) void gemm_tile_of(int qtype, WTile t, ActGemm a, GemmLayout L, int nb,
                                                               int ni, int rows, int o0, const float *bias, float *y,
                                                               int64_t y_row) {
    float corr[GEMM_RM][8] = {{0.0f}};
    for (int r0 = 0; r0 < rows; r0 += GEMM_RN) {
        if (qtype != Q8_0 && r0 % 8 == 0) gemm_min_term(t, a, nb, ni, r0, corr);
        const int nj = rows - r0 < GEMM_RN ? rows - r0 : GEMM_RN;
        const ActGemm ar = {a.qx + r0 * L.cw, a.dx8 + r0 * L.sw, a.sums, a.rows8};
        float out[GEMM_RN][GEMM_RM];
        if (ni == GEMM_RM && nj == GEMM_RN)
            gemm_micro(qtype, t, ar, L, GEMM_RM, GEMM_RN, out);
        else if (ni == GEMM_RM)
            gemm_micro(qtype, t, ar, L, GEMM_RM, 1, out);
        else
            for (int i = 0; i < ni; i++) {
                const WTile ti = {t.u + i * L.cw, t.s + i * L.cw, t.d8 + i * L.sw, t.m + i * nb};
                for (int j = 0; j < nj; j++) {
                    const ActGemm aj = {ar.qx + j * L.cw, ar.dx8 + j * L.sw, a.sums, a.rows8};
                    float one[GEMM_RN][GEMM_RM];
                    gemm_micro(qtype, ti, aj, L, 1, 1, one);
                    out[j][i] = one[0][0];
                }
            }
        for (int j = 0; j < nj; j++)
            for (int i = 0; i < ni; i++)
                y[(r0 + j) * y_row + o0 + i] = out[j][i] + corr[i][(r0 + j) % 8] + (bias ? bias[o0 + i] : 0.0f);
    }
}

static void gemm_tile(int qtype, WTile t, ActGemm a, GemmLayout L, int nb, int ni, int rows, int o0,
                      const float *bias, float *y, int64_t y_row) {
    switch (qtype) {
    case Q4_0: gemm_tile_of(Q4_0, t, a, L, nb, ni, rows, o0, bias, y, y_row); break;
    case Q4_1: gemm_tile_of(Q4_1, t, a, L, nb, ni, rows, o0, bias, y, y_row); break;
    default: gemm_tile_of(Q8_0, t, a, L, nb, ni, rows, o0, bias, y, y_row); break;
    }
}
#endif

#ifdef QL_AVX2
/* The decode GEMV with int8 activations (few rows): the GEMM's layout on the activation side only. A weight row is
 * read once, straight from its GGUF blocks: blocks 2p and 2p + 1 are loaded as one vector [2p | 2p + 1] of their 16
 * nibble bytes (Q4; Q8_0: the two halves of each block's 32 bytes), whose low and high nibbles are then exactly the
 * pair layout, and their fp16 scales [d, m] are converted together into the lanes of each block; Q4 quads come from
 * two such vectors (quad_weights). Per group of blocks that is one int->float conversion and two FMAs a row instead
 * of a scalar scale, a broadcast and a dependent scalar minimum term per block. An odd leftover pairs with zeros. */
static inline __attribute__((always_inline)) void pair_weights(int qtype, const uint8_t *blk0, const uint8_t *blk1,
                                                               __m256i *u0, __m256i *u1, __m256i *s0, __m256i *s1,
                                                               __m256 *d, __m256 *m) {
    uint32_t dm0 = 0, dm1 = 0; /* fp16 d (and Q4_1's fp16 m above it) */
    memcpy(&dm0, blk0, qtype == Q4_1 ? 4 : 2);
    if (blk1) memcpy(&dm1, blk1, qtype == Q4_1 ? 4 : 2);
    const __m256 f = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_setr_epi32((int)dm0, (int)dm1, 0, 0)));
    *d = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
    if (qtype == Q4_1) *m = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3));
    if (qtype == Q4_0) *m = _mm256_mul_ps(*d, _mm256_set1_ps(-8.0f));
    const __m128i zero = _mm_setzero_si128();
    if (qtype == Q8_0) {
        const __m128i a0 = _mm_loadu_si128((const __m128i *)(blk0 + 2)), a1 = _mm_loadu_si128((const __m128i *)(blk0 + 18));
        const __m128i b0 = blk1 ? _mm_loadu_si128((const __m128i *)(blk1 + 2)) : zero;
        const __m128i b1 = blk1 ? _mm_loadu_si128((const __m128i *)(blk1 + 18)) : zero;
        *s0 = _mm256_set_m128i(b0, a0), *s1 = _mm256_set_m128i(b1, a1);
        *u0 = _mm256_sign_epi8(*s0, *s0), *u1 = _mm256_sign_epi8(*s1, *s1);
    } else {
        const int off = qtype == Q4_1 ? 4 : 2;
        const __m128i a = _mm_loadu_si128((const __m128i *)(blk0 + off));
        const __m256i v = _mm256_set_m128i(blk1 ? _mm_loadu_si128((const __m128i *)(blk1 + off)) : zero, a);
        *u0 = _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
        *u1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f));
    }
}

/* Four Q4 blocks of a row straight from GGUF in the GEMM's quad layout: [blk0 | blk1] and [blk2 | blk3] loaded as
 * two vectors of nibble bytes; the 64-bit unpacks of their low (then high) nibbles give vectors whose slots hold
 * weights 8k..8k+7 of blocks 0, 2, 1, 3 (quad_slot's order). Their scales [d, m] land in the slots' lanes. */
static inline __attribute__((always_inline)) void quad_weights(int qtype, const uint8_t *blk, int bb, __m256i u[4],
                                                               __m256 *d, __m256 *m) {
    const int off = qtype == Q4_1 ? 4 : 2;
    uint32_t dm[4] = {0, 0, 0, 0}; /* fp16 d (and Q4_1's fp16 m above it) */
    for (int k = 0; k < 4; k++) memcpy(&dm[k], blk + k * bb, qtype == Q4_1 ? 4 : 2);
    const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dm)); /* [d0 m0 d1 m1 d2 m2 d3 m3] */
    *d = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 0, 4, 4, 2, 2, 6, 6));
    *m = qtype == Q4_1 ? _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(1, 1, 5, 5, 3, 3, 7, 7))
                       : _mm256_mul_ps(*d, _mm256_set1_ps(-8.0f));
    const __m256i lo = _mm256_set1_epi8(0x0f);
    const __m256i a = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(blk + bb + off)),
                                       _mm_loadu_si128((const __m128i *)(blk + off)));
    const __m256i b = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(blk + 3 * bb + off)),
                                       _mm_loadu_si128((const __m128i *)(blk + 2 * bb + off)));
    const __m256i al = _mm256_and_si256(a, lo), bl = _mm256_and_si256(b, lo);
    const __m256i ah = _mm256_and_si256(_mm256_srli_epi16(a, 4), lo), bh = _mm256_and_si256(_mm256_srli_epi16(b, 4), lo);
    u[0] = _mm256_unpacklo_epi64(al, bl), u[1] = _mm256_unpackhi_epi64(al, bl);
    u[2] = _mm256_unpacklo_epi64(ah, bh), u[3] = _mm256_unpackhi_epi64(ah, bh);
}

/* accd[r] += a group's integer dots times d dx, accm[r] += m sx (Q4), for activation rows r < NR: a quad of Q4
 * blocks (blk: the first, G = 4) or a pair (blk0, blk1 or NULL: a zero partner; G = 2); the activations' group at
 * byte offset `off` of each row, its scales at float offset g * 8. */
static inline __attribute__((always_inline)) void group_step(int qtype, int G, const uint8_t *blk0,
                                                             const uint8_t *blk1, ActPairs a, GemmLayout L,
                                                             int64_t off, int g, int NR, __m256 *accd,
                                                             __m256 *accm) {
    __m256i u[4], sk[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    __m256 d, m = _mm256_setzero_ps();
    if (G == 4)
        quad_weights(qtype, blk0, block_bytes(qtype), u, &d, &m);
    else
        pair_weights(qtype, blk0, blk1, &u[0], &u[1], &sk[0], &sk[1], &d, &m);
    for (int r = 0; r < NR; r++) {
        const __m256i dot = group_dot(qtype, G, u, sk, a.qx + r * L.cw + off);
        const __m256 scale = _mm256_mul_ps(d, _mm256_load_ps(a.dx8 + r * L.sw + g * 8));
        accd[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, accd[r]);
        if (qtype != Q8_0) accm[r] = _mm256_fmadd_ps(m, _mm256_load_ps(a.sx8 + r * L.sw + g * 8), accm[r]);
    }
}

/* sums[i][r] = activation row r . weight row i (before bias) for i < NI weight rows and r < NR activation rows
 * (constants after inlining): NI x NR independent accumulators, each weight group loaded once for all rows. Q4 rows
 * go in quads of blocks, then pairs; Q8_0 rows in pairs (gemm_layout). */
static inline __attribute__((always_inline)) void dot_pairs(int qtype, const uint8_t *wrow, int64_t w_row_bytes,
                                                            int nb, ActPairs a, GemmLayout L, int NI, int NR,
                                                            float sums[][PASS_ROWS]) {
    const int bb = block_bytes(qtype), nq = qtype == Q8_0 ? 0 : L.nq; /* Q8_0: no quads (constant after inlining) */
    __m256 accd[PAIR_ROWS][PASS_ROWS], accm[PAIR_ROWS][PASS_ROWS];
    for (int i = 0; i < NI; i++)
        for (int r = 0; r < NR; r++) accd[i][r] = accm[i][r] = _mm256_setzero_ps();
    for (int q = 0; q < nq; q++)
        for (int i = 0; i < NI; i++) {
            const uint8_t *blk = wrow + i * w_row_bytes + (int64_t)(4 * q) * bb;
            if (NI > 1) { /* past the last tile this names memory it never reads: a prefetch does not fault */
                const uintptr_t ahead = (uintptr_t)blk + (uintptr_t)(PAIR_PREFETCH * NI * w_row_bytes);
                _mm_prefetch((const char *)ahead, _MM_HINT_T0); /* a quad spans up to 136 bytes: two lines */
                _mm_prefetch((const char *)(ahead + 64), _MM_HINT_T0);
            }
            group_step(qtype, 4, blk, NULL, a, L, (int64_t)q * 128, q, NR, accd[i], accm[i]);
        }
    for (int b = 4 * nq, p = 0; b < nb; b += 2, p++)
        for (int i = 0; i < NI; i++) {
            const uint8_t *blk = wrow + i * w_row_bytes + (int64_t)b * bb;
            if (NI > 1)
                _mm_prefetch((const char *)((uintptr_t)blk + (uintptr_t)(PAIR_PREFETCH * NI * w_row_bytes)), _MM_HINT_T0);
            group_step(qtype, 2, blk, b + 1 < nb ? blk + bb : NULL, a, L, (int64_t)nq * 128 + p * 64, nq + p, NR,
                       accd[i], accm[i]);
        }
    for (int i = 0; i < NI; i++)
        for (int r = 0; r < NR; r++) sums[i][r] = hsum8(_mm256_add_ps(accd[i][r], accm[i][r]));
}

/* dot_pairs for a runtime type and row count (NI weight rows: 4 for one activation row, 2 for two, else 1: the
 * (ni, nr) pairs linear_pairs makes, each of which needs its case below), each
 * case compiled with its constants outside the OpenMP-outlined loop (whose body GCC builds before inlining, where
 * the type is still a variable). */
static __attribute__((noinline)) void dot_pairs_any(int qtype, int ni, int nr, const uint8_t *wrow,
                                                    int64_t w_row_bytes, int nb, ActPairs a, GemmLayout L,
                                                    float sums[][PASS_ROWS]) {
#define PAIRS_CASE(T, I, N)                                                       \
    if (ni == I && nr == N) {                                                     \
        dot_pairs(T, wrow, w_row_bytes, nb, a, L, I, N, sums);                    \
        return;                                                                   \
    }
#define PAIRS_TYPE(T)                                                                                         \
    PAIRS_CASE(T, 4, 1) PAIRS_CASE(T, 2, 2) PAIRS_CASE(T, 1, 1) PAIRS_CASE(T, 1, 2) PAIRS_CASE(T, 1, 3)      \
    PAIRS_CASE(T, 1, 4)
    switch (qtype) {
    case Q4_0: PAIRS_TYPE(Q4_0) break;
    case Q4_1: PAIRS_TYPE(Q4_1) break;
    default: PAIRS_TYPE(Q8_0) break;
    }
#undef PAIRS_TYPE
#undef PAIRS_CASE
}

/* quant_linear with act_q8 under AVX2: the activations into the GEMM's layout, then the GEMV. 0, or -2 (memory). */
static int linear_pairs(int qtype, const uint8_t *w, int64_t w_row_bytes, int out_features, int in_features,
                        const float *x, int64_t x_row, int rows, const float *bias, float *y, int64_t y_row,
                        int threads) {
    const int nb = in_features / QK;
    const GemmLayout L = gemm_layout(qtype, nb);
    const int64_t cw = L.cw, sw = L.sw;
    if (rows <= 0) return 0;
    const ActPairs a = act_alloc(rows, cw, sw);
    if (act_pairs_ok(a)) {
        for (int r = 0; r < rows; r++)
            quantize_row_gemm(L, x + r * x_row, in_features, a.qx + r * cw, a.dx8 + r * sw, a.sx8 + r * sw, NULL, 0);
        /* weight rows a tile at a time: PAIR_ROWS of them for one activation row, 2 for two, else 1 */
        const int tile = rows == 1 ? PAIR_ROWS : rows == 2 ? 2 : 1, tiles = (out_features + tile - 1) / tile;
        const int grab = ROWS_PER_GRAB / tile; /* the shortest run: 32 outputs, whole cache lines of y */
#pragma omp parallel for schedule(guided, grab) num_threads(threads)
        for (int t = 0; t < tiles; t++) {
            /* a whole tile at once; a last, short one row by row */
            const int o0 = t * tile, end = o0 + tile < out_features ? o0 + tile : out_features;
            const int ni = end - o0 == tile ? tile : 1;
            for (int o = o0; o < end; o += ni)
                for (int r0 = 0; r0 < rows; r0 += PASS_ROWS) {
                    const int nr = rows - r0 < PASS_ROWS ? rows - r0 : PASS_ROWS;
                    const ActPairs ar = {a.qx + r0 * cw, a.dx8 + r0 * sw, a.sx8 + r0 * sw};
                    float sums[PAIR_ROWS][PASS_ROWS];
                    dot_pairs_any(qtype, ni, nr, w + (int64_t)o * w_row_bytes, w_row_bytes, nb, ar, L, sums);
                    for (int i = 0; i < ni; i++)
                        for (int r = 0; r < nr; r++)
                            y[(r0 + r) * y_row + o + i] = sums[i][r] + (bias ? bias[o + i] : 0.0f);
                }
        }
    }
    const int status = act_pairs_ok(a) ? 0 : -2;
    act_pairs_free(a);
    return status;
}
#endif

/* y[r, o] = x[r] . W[o] (+ bias[o]) for many rows, activations rounded to int8 per 32-block (see above). 0 on
 * success; -1: a bad type or width; -2: out of memory. Without AVX2: quant_linear's scalar q8 path, the same
 * rounding and integer products. */
int quant_gemm_q8(int qtype, const uint8_t *w, int64_t w_row_bytes, int out_features, int in_features,
                  const float *x, int64_t x_row, int rows, const float *bias, float *y, int64_t y_row,
                  int num_threads) {
#ifdef QL_AVX2
    const int bb = block_bytes(qtype), nb = in_features / QK;
    if (bb == 0 || in_features % QK != 0 || w_row_bytes < (int64_t)nb * bb) return -1;
    const GemmLayout L = gemm_layout(qtype, nb);
    const int64_t rows8 = (rows + 7) / 8 * 8;
    const ActGemm a = {aligned_alloc(32, (size_t)rows * L.cw), aligned_alloc(32, sizeof(float) * rows * L.sw),
                       calloc((size_t)nb * rows8, sizeof(float)), rows8};
    int status = 0;
    if (!a.qx || !a.dx8 || !a.sums) {
        status = -2;
        goto done;
    }
    const int threads = threads_for((int64_t)out_features * in_features * rows, num_threads);
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int r = 0; r < rows; r++)
            quantize_row_gemm(L, x + r * x_row, in_features, a.qx + r * L.cw, a.dx8 + r * L.sw, NULL, a.sums + r,
                              a.rows8);
        uint8_t *u = aligned_alloc(32, GEMM_RM * L.cw);
        int8_t *sq = aligned_alloc(32, GEMM_RM * L.cw);
        /* d8 lanes, then the minimum per block; aligned_alloc wants a multiple of the alignment */
        float *scales = aligned_alloc(32, (sizeof(float) * GEMM_RM * (L.sw + nb) + 31) / 32 * 32);
        if (!u || !sq || !scales) {
#pragma omp atomic write
            status = -2;
        }
        const int tiles = (out_features + GEMM_RM - 1) / GEMM_RM;
#pragma omp for schedule(dynamic, 1)
        for (int tile = 0; tile < tiles; tile++) {
            if (!u || !sq || !scales) continue;
            const int o0 = tile * GEMM_RM, ni = out_features - o0 < GEMM_RM ? out_features - o0 : GEMM_RM;
            const WTile t = {u, sq, scales, scales + GEMM_RM * L.sw};
            unpack_tile(qtype, w + (int64_t)o0 * w_row_bytes, w_row_bytes, ni, nb, L, t);
            gemm_tile(qtype, t, a, L, nb, ni, rows, o0, bias, y, y_row);
        }
        free(u), free(sq), free(scales);
    }
done:
    free(a.qx), free(a.dx8), free(a.sums);
    return status;
#else
    return quant_linear(qtype, 1, w, w_row_bytes, out_features, in_features, x, x_row, rows, bias, y, y_row,
                        num_threads);
#endif
}

/* out[o, :] = the dequantized weight row o, for rows [0, rows). 0 on success, -1 for a bad type or width. */
int dequantize(int qtype, const uint8_t *w, int64_t w_row_bytes, int rows, int cols, float *out, int64_t out_row,
               int num_threads) {
    const int bb = block_bytes(qtype), nb = cols / QK;
    if (bb == 0 || cols % QK != 0 || w_row_bytes < (int64_t)nb * bb) return -1;
#pragma omp parallel for schedule(dynamic, ROWS_PER_GRAB) num_threads(threads_for((int64_t)rows * cols, num_threads))
    for (int o = 0; o < rows; o++) {
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = w + (int64_t)o * w_row_bytes + (int64_t)b * bb;
            float *dst = out + o * out_row + b * QK;
#ifdef QL_AVX2
            __m256 v[4];
            dequant_block_avx2(qtype, blk, v);
            for (int k = 0; k < 4; k++) _mm256_storeu_ps(dst + 8 * k, v[k]);
#else
            dequant_block(qtype, blk, dst);
#endif
        }
    }
    return 0;
}
