/* Fused bf16 elementwise ops of the Llama family for the CPU: residual add + RMSNorm, SiLU(gate) * up, RoPE.
 *
 * Built and loaded by engine/models/cpu_ops.py. Each op reads and writes its rows once and rounds to bf16 once
 * (torch's bf16 ops round after every step and make several passes). Math in fp32; 16-float vectors (GCC/Clang
 * vector extensions) with a scalar tail, so any width works. Rows are split over OpenMP threads only when there
 * are enough elements to pay for waking them.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint16_t vh __attribute__((vector_size(32)));
typedef uint32_t vu __attribute__((vector_size(64)));
typedef uint16_t bf16;

#define W 16
#define PARALLEL_MIN_ELEMENTS 65536
#define SHUF __builtin_shufflevector

static inline float f32(bf16 x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline bf16 round_bf16(float f) { /* round to nearest even, as torch does */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}
static inline vf load(const bf16 *p) {
    vh h;
    memcpy(&h, p, sizeof h);
    vu u = __builtin_convertvector(h, vu) << 16;
    vf f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline void store(bf16 *p, vf x) { /* vector form of round_bf16 */
    vu u;
    memcpy(&u, &x, sizeof u);
    const vu nan = (vu)((u & 0x7fffffffu) > 0x7f800000u);
    const vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const vh h = __builtin_convertvector((nan & ((u >> 16) | 0x40)) | (~nan & rounded), vh);
    memcpy(p, &h, sizeof h);
}
static inline float hsum(vf x) {
    x += SHUF(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    x += SHUF(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    x += SHUF(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    x += SHUF(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    return x[0];
}
static inline vf vsel(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }

/* exp(x), clamped to [-87, 88]; relative error ~1e-7 */
static inline vf vexp(vf x) {
    x = vsel(x < -87.0f, (vf){0} - 87.0f, x);
    x = vsel(x > 88.0f, (vf){0} + 88.0f, x);
    const vf t = x * 1.44269504088896341f + 0.5f;
    vf n = __builtin_convertvector(__builtin_convertvector(t, vi), vf);
    n = vsel(n > t, n - 1.0f, n); /* floor */
    const vf f = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    const vf p =
        1.0f +
        f * (1.0f + f * (0.5f + f * (1.6666667e-1f + f * (4.1666668e-2f + f * (8.3333338e-3f + f * 1.3888889e-3f)))));
    const vi e = (__builtin_convertvector(n, vi) + 127) << 23;
    vf s;
    memcpy(&s, &e, sizeof s);
    return p * s;
}

static inline int threads_for(int64_t elements, int num_threads) {
    return elements >= PARALLEL_MIN_ELEMENTS && num_threads > 1 ? num_threads : 1;
}

/* residual[r] += delta[r] (rounded to bf16, when delta is not NULL); out[r] = residual[r] / rms * weight */
void add_rms_norm(bf16 *residual, int64_t res_row, const bf16 *delta, int64_t delta_row, const bf16 *weight,
                  bf16 *out, int64_t out_row, int rows, int dim, float eps, int num_threads) {
    const int vec_end = dim - dim % W;
#pragma omp parallel for num_threads(threads_for((int64_t)rows * dim, num_threads))
    for (int r = 0; r < rows; r++) {
        bf16 *x = residual + r * res_row;
        const bf16 *d = delta ? delta + r * delta_row : NULL;
        bf16 *o = out + r * out_row;
        vf ss_v = {0};
        float ss = 0.f;
        for (int i = 0; i < vec_end; i += W) {
            vf v = load(x + i);
            if (d) {
                store(x + i, v + load(d + i));
                v = load(x + i); /* the rounded residual, as the next layer will read it */
            }
            ss_v += v * v;
        }
        for (int i = vec_end; i < dim; i++) {
            if (d) x[i] = round_bf16(f32(x[i]) + f32(d[i]));
            ss += f32(x[i]) * f32(x[i]);
        }
        const float inv = 1.0f / sqrtf((hsum(ss_v) + ss) / dim + eps);
        for (int i = 0; i < vec_end; i += W) store(o + i, load(x + i) * inv * load(weight + i));
        for (int i = vec_end; i < dim; i++) o[i] = round_bf16(f32(x[i]) * inv * f32(weight[i]));
    }
}

/* out[r, i] = silu(gate_up[r, i]) * gate_up[r, width + i] */
void silu_mul(const bf16 *gate_up, int64_t in_row, bf16 *out, int64_t out_row, int rows, int width,
              int num_threads) {
    const int vec_end = width - width % W;
#pragma omp parallel for num_threads(threads_for((int64_t)rows * width, num_threads))
    for (int r = 0; r < rows; r++) {
        const bf16 *g = gate_up + r * in_row, *u = g + width;
        bf16 *o = out + r * out_row;
        for (int i = 0; i < vec_end; i += W) {
            const vf x = load(g + i);
            store(o + i, x / (1.0f + vexp(-x)) * load(u + i));
        }
        for (int i = vec_end; i < width; i++) {
            const float x = f32(g[i]);
            o[i] = round_bf16(x / (1.0f + expf(-x)) * f32(u[i]));
        }
    }
}

/* In place on heads [0, num_heads) of each row of x: x = x * cos + rotate_half(x) * sin, where table[pos] holds
 * (cos, cos) then the sign-folded (-sin, sin) for that position (see llama.rope_cos_sin). */
void rope(bf16 *x, int64_t x_row, int64_t x_head, const int64_t *positions, const bf16 *table, int64_t t_row,
          int rows, int num_heads, int head_dim, int num_threads) {
    const int half = head_dim / 2, vec_end = half - half % W;
#pragma omp parallel for num_threads(threads_for((int64_t)rows * num_heads * head_dim, num_threads))
    for (int r = 0; r < rows; r++) {
        const bf16 *cos = table + positions[r] * t_row, *sin = cos + head_dim;
        for (int h = 0; h < num_heads; h++) {
            bf16 *a = x + r * x_row + h * x_head, *b = a + half;
            for (int i = 0; i < vec_end; i += W) {
                const vf av = load(a + i), bv = load(b + i);
                store(a + i, av * load(cos + i) + bv * load(sin + i));
                store(b + i, bv * load(cos + half + i) + av * load(sin + half + i));
            }
            for (int i = vec_end; i < half; i++) {
                const float av = f32(a[i]), bv = f32(b[i]);
                a[i] = round_bf16(av * f32(cos[i]) + bv * f32(sin[i]));
                b[i] = round_bf16(bv * f32(cos[half + i]) + av * f32(sin[half + i]));
            }
        }
    }
}
