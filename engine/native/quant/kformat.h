/* The formats beyond Q4_0 / Q4_1 / Q8_0, each in quant/<format>.h, described to the generic driver (quant/generic.h)
 * by a QFormat: the block's size, how to dequantize one block, and its dot products (included by quant_linear.c).
 *
 * A format gives at least `dequant` (the reference: equal to gguf.quants.dequantize); the driver then multiplies
 * exactly by dequantizing a block at a time. `dot_f32` (exact, fp32 activations) and `dot_q8` (activations rounded
 * to int8 per block, as llama.cpp's Q8_K / Q8_0 do) are the fast paths: they read each weight block once for up to
 * KQ_ROWS activation rows. */
#ifndef QUANT_KFORMAT_H
#define QUANT_KFORMAT_H
#include "quant/common.h"

#define KQ_ROWS 8 /* activation rows one dot call takes at most; a dot splits them into the passes its registers hold */

/* Activations rounded to int8 for the formats of 256-weight super-blocks (llama.cpp's Q8_K): x ~= d * qs. */
typedef struct {
    float d;
    int16_t bsums[QK_K / 16]; /* sums of qs by 16 (the K-quants' minimum terms) */
    int8_t qs[QK_K];
} ActBlockK;

/* Activations rounded to int8 per 32 (Q5_0, Q5_1, IQ4_NL): x ~= d * qs, s = d * sum(qs) (Q5_1's minimum term). */
typedef struct {
    float d, s;
    int8_t qs[QK];
} ActBlock32;

typedef enum { ACT_32 = 0, ACT_K = 1 } ActKind;

typedef struct {
    int qtype, block_weights, block_bytes;
    ActKind act; /* the activation blocks dot_q8 takes */
    /* The block_weights weights of one block as fp32, computed as gguf.quants.dequantize does. */
    void (*dequant)(const uint8_t *blk, float *out);
    /* sums[r] = x row r . the weight row of nb blocks, for r < nr <= KQ_ROWS, x rows x_row floats apart. */
    void (*dot_f32)(const uint8_t *wrow, int nb, const float *x, int64_t x_row, int nr, float *sums);
    /* The same with int8 activations: rows of nb activation blocks (ActBlockK or ActBlock32), act_row blocks apart. */
    void (*dot_q8)(const uint8_t *wrow, int nb, const void *act, int64_t act_row, int nr, float *sums);
} QFormat;

/* The scale and minimum (6 bits each) of sub-block j < 8 of a Q4_K / Q5_K super-block, from its 12 scale bytes. */
static inline void k4_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* IQ4_NL's and IQ4_XS's 16 non-uniform levels. */
static const int8_t IQ4_LEVELS[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
#endif
