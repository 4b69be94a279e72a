/* Q4_0 / Q4_1 / Q8_0: dequantizing, the exact and int8 dot products, the single-row kernel (from quant_linear.c). */

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
