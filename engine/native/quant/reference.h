/* Every format's reference dequantization, one block at a time, as gguf.quants.dequantize computes it (layouts:
 * llama.cpp's ggml-common.h). The exact fallback of the generic driver and the base of each format's tests. */
#ifndef QUANT_REFERENCE_H
#define QUANT_REFERENCE_H
#include "quant/kformat.h"

/* Q5_0: fp16 d, 4 bytes of fifth bits, 16 bytes of nibbles: w = d * (q - 16). Q5_1: fp16 d, fp16 m; w = d * q + m. */
static inline void deq_q5(const uint8_t *blk, int has_min, float *out) {
    const float d = fp16_at(blk), m = has_min ? fp16_at(blk + 2) : 0.0f;
    const uint8_t *hb = blk + (has_min ? 4 : 2), *qs = hb + 4;
    uint32_t qh;
    memcpy(&qh, hb, 4);
    const int offset = has_min ? 0 : 16;
    for (int j = 0; j < QK / 2; j++) {
        const int lo = (qs[j] & 15) | (((qh >> j) & 1) << 4), hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        out[j] = d * (float)(lo - offset) + m;
        out[j + QK / 2] = d * (float)(hi - offset) + m;
    }
}
static void deq_q5_0(const uint8_t *blk, float *out) { deq_q5(blk, 0, out); }
static void deq_q5_1(const uint8_t *blk, float *out) { deq_q5(blk, 1, out); }

/* IQ4_NL: fp16 d, 16 bytes of nibbles indexing IQ4_LEVELS. */
static void deq_iq4_nl(const uint8_t *blk, float *out) {
    const float d = fp16_at(blk);
    for (int j = 0; j < QK / 2; j++) {
        out[j] = d * (float)IQ4_LEVELS[blk[2 + j] & 15];
        out[j + QK / 2] = d * (float)IQ4_LEVELS[blk[2 + j] >> 4];
    }
}

/* IQ4_XS: fp16 d, 16 bits of scales' high bits, 4 bytes of their low nibbles, 128 bytes of nibbles; sub-block ib of
 * 32 has scale d * (ls - 32), ls of 6 bits. */
static void deq_iq4_xs(const uint8_t *blk, float *out) {
    const float d = fp16_at(blk);
    uint16_t sh;
    memcpy(&sh, blk + 2, 2);
    const uint8_t *sl = blk + 4, *qs = blk + 8;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const int ls = ((sl[ib / 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
        const float dl = d * (float)(ls - 32);
        for (int j = 0; j < 16; j++) {
            out[32 * ib + j] = dl * (float)IQ4_LEVELS[qs[16 * ib + j] & 15];
            out[32 * ib + j + 16] = dl * (float)IQ4_LEVELS[qs[16 * ib + j] >> 4];
        }
    }
}

/* Q4_K: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and minimums, 128 bytes of nibbles; each 64 weights are two
 * sub-blocks of 32 (low nibbles, then high): w = d * sc * q - dmin * m. Q5_K adds 32 bytes of fifth bits. */
static inline void deq_k45(const uint8_t *blk, int five, float *out) {
    const float d = fp16_at(blk), dmin = fp16_at(blk + 2);
    const uint8_t *scales = blk + 4, *qh = blk + 16, *ql = blk + (five ? 48 : 16);
    for (int c = 0; c < 4; c++) {
        int sc1, m1, sc2, m2;
        k4_scale_min(2 * c, scales, &sc1, &m1);
        k4_scale_min(2 * c + 1, scales, &sc2, &m2);
        const float d1 = d * (float)sc1, mn1 = dmin * (float)m1, d2 = d * (float)sc2, mn2 = dmin * (float)m2;
        for (int l = 0; l < 32; l++) {
            const int hi1 = five ? ((qh[l] >> (2 * c)) & 1) << 4 : 0, hi2 = five ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0;
            out[64 * c + l] = d1 * (float)((ql[32 * c + l] & 15) | hi1) - mn1;
            out[64 * c + 32 + l] = d2 * (float)((ql[32 * c + l] >> 4) | hi2) - mn2;
        }
    }
}
static void deq_q4_k(const uint8_t *blk, float *out) { deq_k45(blk, 0, out); }
static void deq_q5_k(const uint8_t *blk, float *out) { deq_k45(blk, 1, out); }

/* Q6_K: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales (one per 16 weights), fp16 d at the end:
 * w = d * scale * (q - 32). */
static void deq_q6_k(const uint8_t *blk, float *out) {
    const uint8_t *ql = blk, *qh = blk + 128;
    const int8_t *sc = (const int8_t *)(blk + 192);
    const float d = fp16_at(blk + 208);
    for (int n = 0; n < 2; n++, ql += 64, qh += 32, sc += 8, out += 128) {
        for (int l = 0; l < 32; l++) {
            const int is = l / 16;
            const int q1 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            out[l] = d * (float)sc[is] * (float)q1;
            out[l + 32] = d * (float)sc[is + 2] * (float)q2;
            out[l + 64] = d * (float)sc[is + 4] * (float)q3;
            out[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
    }
}

/* Q3_K's 16 scales of 6 bits (each less 32) from its 12 bytes: low nibbles in bytes 0..7, high 2-bit pairs in 8..11. */
static inline void q3k_scales(const uint8_t *raw, int8_t out[16]) {
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? raw[j] & 15 : raw[j - 8] >> 4;
        const int hi = (raw[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

/* Q3_K: 32 bytes of high-bit masks, 64 of 2-bit pairs, 12 of scales, fp16 d: w = d * scale * (q - 4 * !high). */
static void deq_q3_k(const uint8_t *blk, float *out) {
    const uint8_t *hm = blk, *q = blk + 32;
    int8_t scales[16];
    q3k_scales(blk + 96, scales);
    const float d = fp16_at(blk + 108);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < 2; n++, q += 32) {
        for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
            for (int half = 0; half < 2; half++) {
                const float dl = d * (float)scales[is++];
                for (int l = 16 * half; l < 16 * half + 16; l++)
                    *out++ = dl * (float)(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
            }
        }
    }
}
#endif
