/* y = x @ W^T (+ bias) for an fp32 weight and a few fp32 rows: a decode step of a float model on the CPU.
 *
 * Built and loaded by engine/native/dense_gemv.py. At one to a few rows a linear is a stream over its weight; torch's
 * fp32 F.linear streamed SmolLM2's ~540 MB at ~6 GB/s on two AVX2 cores (~85 ms of a ~100 ms token), this ~3x faster.
 * Each weight row is read once for all rows (up to GEMV_ROWS); output rows are handed to the threads a chunk at a
 * time (a thread preempted by the service's own threads then holds up nobody). 8-float vectors (simd.h), four
 * independent accumulators a row, a scalar tail: any width works.
 */
#include "simd.h"

#define GEMV_ROWS 4
#define ROWS_PER_GRAB 32 /* the shortest run of output rows a thread takes: see quant_linear.c */
#define PARALLEL_MIN_WEIGHTS 65536

static inline __attribute__((always_inline)) void dot_rows(const float *w, const float *x, int64_t x_row, int in,
                                                           int nr, float *out) {
    v8 acc[GEMV_ROWS][4];
    for (int r = 0; r < nr; r++)
        for (int k = 0; k < 4; k++) acc[r][k] = (v8){0};
    int i = 0;
    for (; i + 32 <= in; i += 32)
        for (int k = 0; k < 4; k++) {
            const v8 wv = load8_f32(w + i + 8 * k);
            for (int r = 0; r < nr; r++) acc[r][k] += wv * load8_f32(x + r * x_row + i + 8 * k);
        }
    for (int r = 0; r < nr; r++) {
        float s = hsum8((acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3]));
        for (int j = i; j < in; j++) s += w[j] * x[r * x_row + j];
        out[r] = s;
    }
}

/* rows <= GEMV_ROWS. Returns 0, or -1 for more rows than that. */
int gemv_f32(const float *w, int64_t w_row, int out_features, int in_features, const float *x, int64_t x_row,
             int rows, const float *bias, float *y, int64_t y_row, int num_threads) {
    if (rows < 1 || rows > GEMV_ROWS) return -1;
    const int threads = (int64_t)out_features * in_features >= PARALLEL_MIN_WEIGHTS && num_threads > 1 ? num_threads : 1;
#pragma omp parallel for schedule(guided, ROWS_PER_GRAB) num_threads(threads)
    for (int o = 0; o < out_features; o++) {
        float sums[GEMV_ROWS];
        const float *wo = w + (int64_t)o * w_row;
        switch (rows) { /* constant row counts: the accumulators stay in registers */
        case 1: dot_rows(wo, x, x_row, in_features, 1, sums); break;
        case 2: dot_rows(wo, x, x_row, in_features, 2, sums); break;
        case 3: dot_rows(wo, x, x_row, in_features, 3, sums); break;
        default: dot_rows(wo, x, x_row, in_features, 4, sums); break;
        }
        for (int r = 0; r < rows; r++) y[r * y_row + o] = sums[r] + (bias ? bias[o] : 0.0f);
    }
    return 0;
}
