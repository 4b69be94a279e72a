/* Fused elementwise ops of the Llama family for the CPU: residual add + RMSNorm, SiLU(gate) * up, RoPE, in bf16
 * and in fp32 (the `_f32` twins); and each row's argmax of fp32 logits.
 *
 * Built and loaded by engine/native/fused_ops.py. Each op reads and writes its rows once and, in bf16, rounds once
 * (torch's bf16 ops round after every step and make several passes); at a decode batch one call also replaces
 * several torch dispatches. Math in fp32; 16- or 8-float vectors (simd.h; `ov` below) with a scalar tail, so any
 * width works. Rows are split over OpenMP threads only when there are enough elements to pay for waking them.
 */
#include "simd.h"

/* The ops' vectors: 16 floats where AVX-512 holds them in one register, else 8 (see simd.h: on AVX2 the 16-float
 * forms of vexp's comparisons become scalar code: SiLU and the norms ran ~2.7x slower at 64 rows). */
#ifdef __AVX512F__
typedef vf ov;
typedef vi ovi;
#define OW W
#define ov_sel vsel
#define ov_load_f32 load_f32
#define ov_store_f32 store_f32
#define ov_load_bf16 load_bf16
#define ov_store_bf16 store_bf16
#define ov_exp vexp
#define ov_hsum hsum
#else
typedef v8 ov;
typedef v8i ovi;
#define OW W8
#define ov_sel vsel8
#define ov_load_f32 load8_f32
#define ov_store_f32 store8_f32
#define ov_load_bf16 load8_bf16
#define ov_store_bf16 store8_bf16
#define ov_exp vexp8
#define ov_hsum hsum8
#endif

#define PARALLEL_MIN_ELEMENTS 65536

static inline int threads_for(int64_t elements, int num_threads) {
    return elements >= PARALLEL_MIN_ELEMENTS && num_threads > 1 ? num_threads : 1;
}

/* residual[r] += delta[r] (rounded to bf16, when delta is not NULL); out[r] = residual[r] / rms * weight */
void add_rms_norm(bf16 *residual, int64_t res_row, const bf16 *delta, int64_t delta_row, const bf16 *weight,
                  bf16 *out, int64_t out_row, int rows, int dim, float eps, int num_threads) {
    const int vec_end = dim - dim % OW;
#pragma omp parallel for num_threads(threads_for((int64_t)rows * dim, num_threads))
    for (int r = 0; r < rows; r++) {
        bf16 *x = residual + r * res_row;
        const bf16 *d = delta ? delta + r * delta_row : NULL;
        bf16 *o = out + r * out_row;
        ov ss_v = {0};
        float ss = 0.f;
        for (int i = 0; i < vec_end; i += OW) {
            ov v = ov_load_bf16(x + i);
            if (d) {
                ov_store_bf16(x + i, v + ov_load_bf16(d + i));
                v = ov_load_bf16(x + i); /* the rounded residual, as the next layer will read it */
            }
            ss_v += v * v;
        }
        for (int i = vec_end; i < dim; i++) {
            if (d) x[i] = round_bf16(bf16_to_f32(x[i]) + bf16_to_f32(d[i]));
            ss += bf16_to_f32(x[i]) * bf16_to_f32(x[i]);
        }
        const float inv = 1.0f / sqrtf((ov_hsum(ss_v) + ss) / dim + eps);
        for (int i = 0; i < vec_end; i += OW) ov_store_bf16(o + i, ov_load_bf16(x + i) * inv * ov_load_bf16(weight + i));
        for (int i = vec_end; i < dim; i++) o[i] = round_bf16(bf16_to_f32(x[i]) * inv * bf16_to_f32(weight[i]));
    }
}

/* out[r, i] = silu(gate_up[r, i]) * gate_up[r, width + i] */
void silu_mul(const bf16 *gate_up, int64_t in_row, bf16 *out, int64_t out_row, int rows, int width,
              int num_threads) {
    const int vec_end = width - width % OW;
#pragma omp parallel for num_threads(threads_for((int64_t)rows * width, num_threads))
    for (int r = 0; r < rows; r++) {
        const bf16 *g = gate_up + r * in_row, *u = g + width;
        bf16 *o = out + r * out_row;
        for (int i = 0; i < vec_end; i += OW) {
            const ov x = ov_load_bf16(g + i);
            ov_store_bf16(o + i, x / (1.0f + ov_exp(-x)) * ov_load_bf16(u + i));
        }
        for (int i = vec_end; i < width; i++) {
            const float x = bf16_to_f32(g[i]);
            o[i] = round_bf16(x / (1.0f + expf(-x)) * bf16_to_f32(u[i]));
        }
    }
}

/* In place on heads [0, num_heads) of each row of x: x = x * cos + rotate_half(x) * sin, where table[pos] holds
 * (cos, cos) then the sign-folded (-sin, sin) for that position (see llama.rope_cos_sin). */
void rope(bf16 *x, int64_t x_row, int64_t x_head, const int64_t *positions, const bf16 *table, int64_t t_row,
          int rows, int num_heads, int head_dim, int num_threads) {
    const int half = head_dim / 2, vec_end = half - half % OW;
#pragma omp parallel for num_threads(threads_for((int64_t)rows * num_heads * head_dim, num_threads))
    for (int r = 0; r < rows; r++) {
        const bf16 *cos = table + positions[r] * t_row, *sin = cos + head_dim;
        for (int h = 0; h < num_heads; h++) {
            bf16 *a = x + r * x_row + h * x_head, *b = a + half;
            for (int i = 0; i < vec_end; i += OW) {
                const ov av = ov_load_bf16(a + i), bv = ov_load_bf16(b + i);
                ov_store_bf16(a + i, av * ov_load_bf16(cos + i) + bv * ov_load_bf16(sin + i));
                ov_store_bf16(b + i, bv * ov_load_bf16(cos + half + i) + av * ov_load_bf16(sin + half + i));
            }
            for (int i = vec_end; i < half; i++) {
                const float av = bf16_to_f32(a[i]), bv = bf16_to_f32(b[i]);
                a[i] = round_bf16(av * bf16_to_f32(cos[i]) + bv * bf16_to_f32(sin[i]));
                b[i] = round_bf16(bv * bf16_to_f32(cos[half + i]) + av * bf16_to_f32(sin[half + i]));
            }
        }
    }
}

/* fp32 twins of the three ops above: the same math without the bf16 rounding. */
void add_rms_norm_f32(float *residual, int64_t res_row, const float *delta, int64_t delta_row, const float *weight,
                      float *out, int64_t out_row, int rows, int dim, float eps, int num_threads) {
    const int vec_end = dim - dim % OW;
#pragma omp parallel for num_threads(threads_for((int64_t)rows * dim, num_threads))
    for (int r = 0; r < rows; r++) {
        float *x = residual + r * res_row;
        const float *d = delta ? delta + r * delta_row : NULL;
        float *o = out + r * out_row;
        ov ss_v = {0};
        float ss = 0.f;
        for (int i = 0; i < vec_end; i += OW) {
            ov v = ov_load_f32(x + i);
            if (d) {
                v += ov_load_f32(d + i);
                ov_store_f32(x + i, v);
            }
            ss_v += v * v;
        }
        for (int i = vec_end; i < dim; i++) {
            if (d) x[i] += d[i];
            ss += x[i] * x[i];
        }
        const float inv = 1.0f / sqrtf((ov_hsum(ss_v) + ss) / dim + eps);
        for (int i = 0; i < vec_end; i += OW) ov_store_f32(o + i, ov_load_f32(x + i) * inv * ov_load_f32(weight + i));
        for (int i = vec_end; i < dim; i++) o[i] = x[i] * inv * weight[i];
    }
}

void silu_mul_f32(const float *gate_up, int64_t in_row, float *out, int64_t out_row, int rows, int width,
                  int num_threads) {
    const int vec_end = width - width % OW;
#pragma omp parallel for num_threads(threads_for((int64_t)rows * width, num_threads))
    for (int r = 0; r < rows; r++) {
        const float *g = gate_up + r * in_row, *u = g + width;
        float *o = out + r * out_row;
        for (int i = 0; i < vec_end; i += OW) {
            const ov x = ov_load_f32(g + i);
            ov_store_f32(o + i, x / (1.0f + ov_exp(-x)) * ov_load_f32(u + i));
        }
        for (int i = vec_end; i < width; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

void rope_f32(float *x, int64_t x_row, int64_t x_head, const int64_t *positions, const float *table, int64_t t_row,
              int rows, int num_heads, int head_dim, int num_threads) {
    const int half = head_dim / 2, vec_end = half - half % OW;
#pragma omp parallel for num_threads(threads_for((int64_t)rows * num_heads * head_dim, num_threads))
    for (int r = 0; r < rows; r++) {
        const float *cos = table + positions[r] * t_row, *sin = cos + head_dim;
        for (int h = 0; h < num_heads; h++) {
            float *a = x + r * x_row + h * x_head, *b = a + half;
            for (int i = 0; i < vec_end; i += OW) {
                const ov av = ov_load_f32(a + i), bv = ov_load_f32(b + i);
                ov_store_f32(a + i, av * ov_load_f32(cos + i) + bv * ov_load_f32(sin + i));
                ov_store_f32(b + i, bv * ov_load_f32(cos + half + i) + av * ov_load_f32(sin + half + i));
            }
            for (int i = vec_end; i < half; i++) {
                const float av = a[i], bv = b[i];
                a[i] = av * cos[i] + bv * sin[i];
                b[i] = bv * cos[half + i] + av * sin[half + i];
            }
        }
    }
}

/* The index of x[:n]'s first maximum, a NaN counting as the maximum (numpy's and torch's argmax): one pass in which
 * each vector lane keeps its first maximum and that maximum's index, then the lanes' best (ties: the lower index). */
static int argmax_row_f32(const float *x, int n) {
    const int vec_end = n - n % OW;
    int nan = 0, at = 0, i = 1;
    float m = x[0];
    if (vec_end) {
        ov best = ov_load_f32(x);
        ovi best_i, lane_i, nans = (ovi)(best != best);
        for (int l = 0; l < OW; l++) best_i[l] = lane_i[l] = l;
        for (i = OW; i < vec_end; i += OW) {
            const ov v = ov_load_f32(x + i);
            const ovi greater = (ovi)(v > best);
            lane_i += OW;
            best = ov_sel(greater, v, best);
            best_i = (greater & lane_i) | (~greater & best_i);
            nans |= (ovi)(v != v);
        }
        m = best[0], at = best_i[0];
        for (int l = 0; l < OW; l++) {
            nan |= nans[l] != 0;
            if (best[l] > m || (best[l] == m && best_i[l] < at)) m = best[l], at = best_i[l];
        }
    }
    for (; i < n; i++) {
        nan |= x[i] != x[i];
        if (x[i] > m) m = x[i], at = i;
    }
    if (nan || m != m)
        for (i = 0; i < n; i++)
            if (x[i] != x[i]) return i;
    return at;
}

/* out[r] = argmax of row r of x [rows, cols] (see argmax_row_f32): greedy sampling's pick, beside the logits. */
void argmax_rows_f32(const float *x, int64_t x_row, int rows, int cols, int32_t *out, int num_threads) {
#pragma omp parallel for num_threads(threads_for((int64_t)rows * cols, num_threads))
    for (int r = 0; r < rows; r++) out[r] = cols > 0 ? argmax_row_f32(x + r * x_row, cols) : -1;
}
