/* Shared by the quantized-linear sources (included once, by quant_linear.c): types, the SIMD switch, fp16. */
#ifndef QUANT_COMMON_H
#define QUANT_COMMON_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define QL_AVX2 1
#endif

/* ggml type ids (gguf.GGMLQuantizationType) */
enum {
    Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
    Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, IQ4_NL = 20, IQ4_XS = 23,
};
#define QK 32 /* weights per block of Q4_0 / Q4_1 / Q8_0 (and Q5_0 / Q5_1 / IQ4_NL) */
#define QK_K 256 /* weights per super-block of the K-quants and IQ4_XS */
#define PASS_ROWS 4                    /* activation rows sharing one decoded weight block */
#define PAIR_ROWS 4                    /* weight rows the int8 GEMV multiplies at once by one activation row */
#define PAIR_PASS_ROWS 8               /* activation rows the legacy int8 GEMV takes in one pass over a weight row */
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

#ifdef QL_AVX2
/* Keeps an accumulator in its register at this point of a loop: without it GCC 12 reassociates a few-row dot's
 * integer sums (every product of a block first, summed afterwards), spilling them to the stack; pinned, the 5-row
 * Q4_K dot ran ~1.3x faster on a 2-core AMD EPYC (Zen 3, AVX2). */
#define K_PIN(v) __asm__("" : "+x"(v))
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif
#endif
