/* A measurement of a layout the engine does not use yet (issue #36's few-row target): Q4_K weights repacked into
 * groups of 8 interleaved rows, multiplied by int8 activations with AVX-512 VNNI, against the engine's own Q4_K GEMV
 * (quant_linear.c, included whole) on the same random weights and activations; built and run by
 * `python -m bench.tools.q4k_interleaved`.
 *
 * The layout (R8Block, per 8 weight rows and 256-weight super-block): the 8 rows' fp16 d and dmin, their 6-bit
 * scales and minimums unpacked to bytes [sub-block][row], and the nibbles of sub-blocks 2p and 2p + 1 as one byte per
 * weight pair, in groups of 4 weights of each row in turn: one 32-byte vector holds 4 weights of each of the 8 rows,
 * so one vpdpbusd with 4 broadcast activation bytes adds 32 products into the 8 rows' lanes. The nibbles' unpacking
 * and the scales are shared by every activation row, and no per-row horizontal sum is left: each lane is an output.
 * The integer sums are the engine's (exact); the fp32 steps differ in order, so results agree to rounding. */
#include "quant_linear.c"
#include <omp.h>
#include <stdio.h>
#include <time.h>

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)

typedef struct {
    uint16_t d[8], dmin[8];
    uint8_t sc[8][8], mn[8][8]; /* [sub-block][row] */
    uint8_t qs[4][8][32];       /* [pair p][group j][row*4+k]: low nibble sub-block 2p, high 2p+1 */
} R8Block;                      /* 1184 bytes for 8 rows x 256 weights */

static void repack_r8(const uint8_t *w, int64_t w_row_bytes, int nb, R8Block *out) {
    for (int b = 0; b < nb; b++) {
        R8Block *o = out + b;
        for (int r = 0; r < 8; r++) {
            const uint8_t *blk = w + r * w_row_bytes + (int64_t)b * 144;
            memcpy(&o->d[r], blk, 2), memcpy(&o->dmin[r], blk + 2, 2);
            uint8_t sc[8], mn[8], q[256];
            k45_scale_bytes(blk, sc, mn);
            k45_quants(0, blk, q);
            for (int s = 0; s < 8; s++) o->sc[s][r] = sc[s], o->mn[s][r] = mn[s];
            for (int p = 0; p < 4; p++)
                for (int j = 0; j < 8; j++)
                    for (int k = 0; k < 4; k++)
                        o->qs[p][j][4 * r + k] = (uint8_t)(q[64 * p + 4 * j + k] | (q[64 * p + 32 + 4 * j + k] << 4));
        }
    }
}

static inline __attribute__((always_inline)) void dot_r8(const R8Block *g, int nb, const ActBlockK *act,
                                                         int64_t act_row, int NR, float out[][8]) {
    __m256 acc[8];
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    const __m256i nib = _mm256_set1_epi8(0x0f);
    for (int b = 0; b < nb; b++) {
        const R8Block *o = g + b;
        _mm_prefetch((const char *)(o + 2), _MM_HINT_T0);
        for (int l = 64; l < 1184; l += 64) _mm_prefetch((const char *)(o + 2) + l, _MM_HINT_T0);
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)o->d));
        const __m256 m8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)o->dmin));
        __m256i isum[8], msum[8];
        for (int r = 0; r < NR; r++) isum[r] = msum[r] = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            __m256i lo[8], hi[8];
            for (int j = 0; j < 8; j++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)o->qs[p][j]);
                lo[j] = _mm256_and_si256(v, nib), hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
            }
            const __m256i sl = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)o->sc[2 * p]));
            const __m256i sh = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)o->sc[2 * p + 1]));
            for (int r = 0; r < NR; r++) {
                const int8_t *x = act[r * act_row + b].qs + 64 * p;
                __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
                for (int j = 0; j < 8; j += 2) {
                    int32_t x0, x1, x2, x3;
                    memcpy(&x0, x + 4 * j, 4), memcpy(&x1, x + 4 * j + 4, 4);
                    memcpy(&x2, x + 32 + 4 * j, 4), memcpy(&x3, x + 32 + 4 * j + 4, 4);
                    a0 = _mm256_dpbusd_epi32(a0, lo[j], _mm256_set1_epi32(x0));
                    a1 = _mm256_dpbusd_epi32(a1, lo[j + 1], _mm256_set1_epi32(x1));
                    a2 = _mm256_dpbusd_epi32(a2, hi[j], _mm256_set1_epi32(x2));
                    a3 = _mm256_dpbusd_epi32(a3, hi[j + 1], _mm256_set1_epi32(x3));
                }
                isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(_mm256_mullo_epi32(_mm256_add_epi32(a0, a1), sl),
                                                                     _mm256_mullo_epi32(_mm256_add_epi32(a2, a3), sh)));
            }
        }
        for (int s = 0; s < 8; s++) {
            const __m256i mv = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)o->mn[s]));
            for (int r = 0; r < NR; r++) {
                const ActBlockK *a = act + r * act_row + b;
                msum[r] = _mm256_add_epi32(msum[r], _mm256_mullo_epi32(mv, _mm256_set1_epi32(a->bsums[2 * s] + a->bsums[2 * s + 1])));
            }
        }
        for (int r = 0; r < NR; r++) {
            const __m256 t = _mm256_fmsub_ps(_mm256_cvtepi32_ps(isum[r]), d8, _mm256_mul_ps(_mm256_cvtepi32_ps(msum[r]), m8));
            acc[r] = _mm256_fmadd_ps(t, _mm256_set1_ps(act[r * act_row + b].d), acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) _mm256_storeu_ps(out[r], acc[r]);
}

static void linear_r8(const R8Block *w, int out_features, int nb, const ActBlockK *act, int64_t act_row, int rows,
                      float *y) {
    const int groups = out_features / 8;
#pragma omp parallel for schedule(guided, 4)
    for (int g = 0; g < groups; g++) {
        float out[8][8];
        switch (rows) {
        case 1: dot_r8(w + (int64_t)g * nb, nb, act, act_row, 1, out); break;
        case 2: dot_r8(w + (int64_t)g * nb, nb, act, act_row, 2, out); break;
        case 4: dot_r8(w + (int64_t)g * nb, nb, act, act_row, 4, out); break;
        case 5: dot_r8(w + (int64_t)g * nb, nb, act, act_row, 5, out); break;
        default: dot_r8(w + (int64_t)g * nb, nb, act, act_row, 8, out); break;
        }
        for (int r = 0; r < rows; r++)
            for (int i = 0; i < 8; i++) y[(int64_t)r * out_features + 8 * g + i] = out[r][i];
    }
}

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

int main(void) {
    const int OUT = 2048, IN = 8192, NB = IN / 256, M = 24;
    const int64_t rb = (int64_t)NB * 144;
    uint8_t **w = malloc(sizeof(void *) * M);
    R8Block **p = malloc(sizeof(void *) * M);
    srand(1);
    for (int m = 0; m < M; m++) {
        w[m] = malloc(rb * OUT);
        for (int64_t i = 0; i < rb * OUT; i++) w[m][i] = (uint8_t)rand();
        for (int o = 0; o < OUT; o++)
            for (int b = 0; b < NB; b++) {
                const uint16_t h = 0x2000; /* small fp16 d, dmin */
                memcpy(w[m] + o * rb + b * 144, &h, 2), memcpy(w[m] + o * rb + b * 144 + 2, &h, 2);
            }
        p[m] = aligned_alloc(64, sizeof(R8Block) * (OUT / 8) * NB);
        for (int g = 0; g < OUT / 8; g++) repack_r8(w[m] + (int64_t)8 * g * rb, rb, NB, p[m] + (int64_t)g * NB);
    }
    float *x = malloc(sizeof(float) * 8 * IN), *y0 = malloc(sizeof(float) * 8 * OUT), *y1 = malloc(sizeof(float) * 8 * OUT);
    for (int i = 0; i < 8 * IN; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    const int rows_list[] = {1, 2, 4, 5, 8};
    for (int ri = 0; ri < 5; ri++) {
        const int rows = rows_list[ri];
        ActBlockK *act = malloc(sizeof(ActBlockK) * NB * rows);
        for (int r = 0; r < rows; r++) kq_quantize_row(ACT_K, x + r * IN, IN, act + r * NB);
        double told = 1e9, tnew = 1e9, err = 0, mag = 0;
        for (int rep = 0; rep < 7; rep++) {
            double t = now();
            for (int m = 0; m < M; m++) quant_linear(Q4_K, 1, w[m], rb, OUT, IN, x, IN, rows, NULL, y0, OUT, omp_get_max_threads());
            double a = now() - t;
            t = now();
            for (int m = 0; m < M; m++) {
                ActBlockK *aa = malloc(sizeof(ActBlockK) * NB * rows); /* as a call would: round the activations */
                for (int r = 0; r < rows; r++) kq_quantize_row(ACT_K, x + r * IN, IN, aa + r * NB);
                linear_r8(p[m], OUT, NB, aa, NB, rows, y1);
                free(aa);
            }
            double bnew = now() - t;
            told = a < told ? a : told, tnew = bnew < tnew ? bnew : tnew;
        }
        for (int i = 0; i < rows * OUT; i++) err = fmax(err, fabs(y0[i] - y1[i])), mag = fmax(mag, fabs(y0[i]));
        const double bytes = (double)M * rb * OUT;
        printf("rows %d: current %.1f GB/s (%.2f ms)  r8 %.1f GB/s (%.2f ms)  r8/current %.2f  max|diff| %.2g of %.2g\n", rows,
               bytes / told / 1e9, told * 1e3 / M, bytes / tnew / 1e9, tnew * 1e3 / M, told / tnew, err, mag);
        free(act);
    }
    return 0;
}
#else
int main(void) {
    fprintf(stderr, "needs AVX-512 VNNI (with VL): this CPU's build has no vpdpbusd\n");
    return 2;
}
#endif
