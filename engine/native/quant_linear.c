/* Weight-only quantized linears for the CPU: y = x @ W^T (+ bias), W kept in GGUF's blocks. The entry points are
 * here; Q4_0 / Q4_1 / Q8_0 have their own kernels (quant/legacy_*.h), every other format (Q5_0, Q5_1, IQ4_NL, the
 * K-quants Q3_K..Q6_K, IQ4_XS) is a QFormat run by one generic driver (quant/kformat.h, quant/generic.h).
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
 *     four Q4 blocks (two Q8_0) at a time (linear_pairs, in the batch GEMM's activation layout), on AVX-512 VNNI
 *     sixteen (linear_zmm, quant/legacy_zmm.h).
 * AVX2 + FMA + F16C intrinsics when the compiler targets them, a scalar fallback otherwise; OpenMP over output rows.
 */
#include "quant/common.h"
#include "quant/legacy_rows.h"
#include "quant/legacy_gemm.h"
#include "quant/legacy_pairs.h"
#include "quant/legacy_zmm.h"
#include "quant/generic.h"
#include "quant/q4k_r8.h"

/* y[r, o] = x[r] . W[o] (+ bias[o]) for every row r < rows and output o. 0 on success; -1: a bad type or width;
 * -2: out of memory. Meant for few rows (decode): each weight row is read once for all of them. */
int quant_linear(int qtype, int act_q8, const uint8_t *w, int64_t w_row_bytes, int out_features, int in_features,
                 const float *x, int64_t x_row, int rows, const float *bias, float *y, int64_t y_row,
                 int num_threads) {
    if (qtype == Q4_K_R8)
        return r8_linear(act_q8, 0, w, w_row_bytes, out_features, in_features, x, x_row, rows, bias, y, y_row,
                         num_threads);
    const QFormat *format = qformat(qtype);
    if (format)
        return kq_linear(format, act_q8, w, w_row_bytes, out_features, in_features, x, x_row, rows, bias, y, y_row,
                         num_threads);
    const int bb = block_bytes(qtype), nb = in_features / QK;
    if (bb == 0 || in_features % QK != 0 || w_row_bytes < (int64_t)nb * bb) return -1;
#ifdef QL_AVX2 /* int8 activations: the pair GEMV; exact single rows: the row kernel */
#ifdef ZQ /* on AVX-512 VNNI, the zmm GEMV where it is the faster one (zq_takes) */
    if (act_q8 && zq_takes(qtype, nb))
        return linear_zmm(qtype, w, w_row_bytes, out_features, in_features, x, x_row, rows, bias, y, y_row,
                          threads_for((int64_t)out_features * in_features, num_threads));
#endif
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

/* y[r, o] = x[r] . W[o] (+ bias[o]) for many rows, activations rounded to int8 per 32-block (see above). 0 on
 * success; -1: a bad type or width; -2: out of memory. Without AVX2: quant_linear's scalar q8 path, the same
 * rounding and integer products. */
int quant_gemm_q8(int qtype, const uint8_t *w, int64_t w_row_bytes, int out_features, int in_features,
                  const float *x, int64_t x_row, int rows, const float *bias, float *y, int64_t y_row,
                  int num_threads) {
    if (qtype == Q4_K_R8)
        return r8_linear(1, 1, w, w_row_bytes, out_features, in_features, x, x_row, rows, bias, y, y_row, num_threads);
    const QFormat *format = qformat(qtype);
    if (format)
        return kq_gemm(format, w, w_row_bytes, out_features, in_features, x, x_row, rows, bias, y, y_row, num_threads);
#ifdef QL_AVX2
    const int bb = block_bytes(qtype), nb = in_features / QK;
    if (bb == 0 || in_features % QK != 0 || w_row_bytes < (int64_t)nb * bb) return -1;
    return tiled_gemm(qtype, unpack_tile, qtype, w, w_row_bytes, out_features, in_features, x, x_row, rows, bias, y,
                      y_row, num_threads);
#else
    return quant_linear(qtype, 1, w, w_row_bytes, out_features, in_features, x, x_row, rows, bias, y, y_row,
                        num_threads);
#endif
}

/* out[o, :] = the dequantized weight row o, for rows [0, rows). 0 on success, -1 for a bad type or width. */
int dequantize(int qtype, const uint8_t *w, int64_t w_row_bytes, int rows, int cols, float *out, int64_t out_row,
               int num_threads) {
    if (qtype == Q4_K_R8) return r8_dequantize(w, w_row_bytes, NULL, rows, cols, out, out_row, num_threads);
    const QFormat *format = qformat(qtype);
    if (format) return kq_dequantize(format, w, w_row_bytes, rows, cols, out, out_row, num_threads);
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

/* out[r, :] = the dequantized weight row index[r], for r < n (the embedding's rows a step needs, gathered from its
 * blocks: each row is `dequantize` of one row, so the values are bit for bit those of dequantizing the whole matrix).
 * 0 on success; -1: a bad type or width, or an index outside [0, num_rows). */
int dequantize_gather(int qtype, const uint8_t *w, int64_t w_row_bytes, int64_t num_rows, const int64_t *index, int n,
                      int cols, float *out, int64_t out_row, int num_threads) {
    for (int r = 0; r < n; r++)
        if (index[r] < 0 || index[r] >= num_rows) return -1;
    if (qtype == Q4_K_R8) /* a row is a lane of its group */
        return num_rows % 8 ? -1 : r8_dequantize(w, w_row_bytes, index, n, cols, out, out_row, num_threads);
    int status = 0;
#pragma omp parallel for schedule(static) reduction(| : status) num_threads(threads_for((int64_t)n * cols, num_threads))
    for (int r = 0; r < n; r++)
        status |= dequantize(qtype, w + index[r] * w_row_bytes, w_row_bytes, 1, cols, out + r * out_row, out_row, 1);
    return status;
}

/* Q4_K rows [0, rows) (w_row_bytes apart, cols weights each; rows % 8 == 0) repacked into Q4_K_R8's groups at out
 * ([rows, cols / 256 * 148] bytes; see quant/q4k_r8.h). 0, or -1 for a bad shape. */
int repack_q4k_r8(const uint8_t *w, int64_t w_row_bytes, int rows, int cols, uint8_t *out, int num_threads) {
    const int nb = cols / QK_K;
    if (cols % QK_K != 0 || rows % 8 != 0 || w_row_bytes < (int64_t)nb * 144) return -1;
#pragma omp parallel for schedule(static) num_threads(threads_for((int64_t)rows * cols, num_threads))
    for (int g = 0; g < rows / 8; g++)
        r8_repack_group(w + (int64_t)8 * g * w_row_bytes, w_row_bytes, nb, (R8Block *)out + (int64_t)g * nb);
    return 0;
}
