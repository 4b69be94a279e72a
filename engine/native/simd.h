/* 16- and 8-float vectors (GCC/Clang vector extensions) and bf16 conversions shared by the engine's CPU C libraries:
 * attention.c and fused_ops.c. build.py compiles them with this folder on the include path
 * and hashes this header into each library's build key.
 */
#ifndef PAGEDCHAT_CPU_SIMD_H
#define PAGEDCHAT_CPU_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint16_t vh __attribute__((vector_size(32)));
typedef uint32_t vu __attribute__((vector_size(64)));
typedef uint16_t bf16;

#define W 16 /* lanes per vector */
#define SHUF __builtin_shufflevector

static inline float bf16_to_f32(bf16 x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline bf16 round_bf16(float f) { /* round to nearest even, as torch does; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}
/* bf16 <-> fp32 and exp at any vector width: defined once here, instantiated below for 16 lanes and in attention8.h
 * for 8, so every kernel rounds and exponentiates alike. VF/VI/VU: float/int32/uint32 vectors, VH: uint16 of as many
 * lanes, SEL: the width's lane select. */
#define DEFINE_BF16_LOAD_STORE(LOAD, STORE, VF, VU, VH)                                                        \
    static inline VF LOAD(const bf16 *p) {                                                                      \
        VH h;                                                                                                   \
        memcpy(&h, p, sizeof h);                                                                                \
        const VU u = __builtin_convertvector(h, VU) << 16;                                                      \
        VF f;                                                                                                   \
        memcpy(&f, &u, sizeof f);                                                                               \
        return f;                                                                                               \
    }                                                                                                           \
    static inline void STORE(bf16 *p, VF x) { /* vector form of round_bf16 */                                   \
        VU u;                                                                                                   \
        memcpy(&u, &x, sizeof u);                                                                               \
        const VU nan = (VU)((u & 0x7fffffffu) > 0x7f800000u);                                                   \
        const VU rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;                                              \
        const VH h = __builtin_convertvector((nan & ((u >> 16) | 0x40)) | (~nan & rounded), VH);                \
        memcpy(p, &h, sizeof h);                                                                                \
    }

/* exp(x), clamped to [-87, 88] (-inf gives ~0); relative error ~1e-7. */
#define DEFINE_VEXP(NAME, VF, VI, SEL)                                                                          \
    static inline VF NAME(VF x) {                                                                               \
        x = SEL(x < -87.0f, (VF){0} - 87.0f, x);                                                                \
        x = SEL(x > 88.0f, (VF){0} + 88.0f, x);                                                                 \
        const VF t = x * 1.44269504088896341f + 0.5f;                                                           \
        VF n = __builtin_convertvector(__builtin_convertvector(t, VI), VF); /* trunc, then floor */             \
        n = SEL(n > t, n - 1.0f, n);                                                                            \
        const VF f = x - n * 0.693145751953125f - n * 1.428606765330187e-06f; /* |f| <= ln2 / 2, two-part ln2 */ \
        const VF p = 1.0f + f * (1.0f + f * (0.5f + f * (1.6666667e-1f + f * (4.1666668e-2f +                   \
                                                                             f * (8.3333338e-3f + f * 1.3888889e-3f))))); \
        const VI e = (__builtin_convertvector(n, VI) + 127) << 23;                                              \
        VF s;                                                                                                   \
        memcpy(&s, &e, sizeof s);                                                                               \
        return p * s;                                                                                           \
    }

DEFINE_BF16_LOAD_STORE(load_bf16, store_bf16, vf, vu, vh)
static inline vf load_f32(const float *p) {
    vf f;
    memcpy(&f, p, sizeof f);
    return f;
}
static inline void store_f32(float *p, vf x) { memcpy(p, &x, sizeof x); }

static inline vf vsel(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }
static inline vf vmax(vf a, vf b) { return vsel(a > b, a, b); }
static inline float hmax(vf x) {
    x = vmax(x, SHUF(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
    x = vmax(x, SHUF(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
    x = vmax(x, SHUF(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
    x = vmax(x, SHUF(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
    return x[0];
}
static inline float hsum(vf x) {
    x += SHUF(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    x += SHUF(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    x += SHUF(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    x += SHUF(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    return x[0];
}

DEFINE_VEXP(vexp, vf, vi, vsel)

/* The same in 8 lanes: what an AVX2 CPU computes well. Compiled for AVX2, GCC turns the comparisons and int
 * conversions of 16-float vectors (vexp's clamps and floor, vsel's masks) into one scalar compare and branch a lane. */
typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint32_t v8u __attribute__((vector_size(32)));

#define W8 8

static inline v8 load8_f32(const float *p) {
    v8 f;
    memcpy(&f, p, sizeof f);
    return f;
}
static inline void store8_f32(float *p, v8 x) { memcpy(p, &x, sizeof x); }
DEFINE_BF16_LOAD_STORE(load8_bf16, store8_bf16, v8, v8u, v8h)

static inline v8 vsel8(v8i mask, v8 a, v8 b) { return (v8)(((v8i)a & mask) | ((v8i)b & ~mask)); }
static inline float hsum8(v8 x) {
    x += SHUF(x, x, 4, 5, 6, 7, 0, 1, 2, 3);
    x += SHUF(x, x, 2, 3, 0, 1, 6, 7, 4, 5);
    x += SHUF(x, x, 1, 0, 3, 2, 5, 4, 7, 6);
    return x[0];
}
DEFINE_VEXP(vexp8, v8, v8i, vsel8)

#endif
