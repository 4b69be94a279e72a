/* The cores' arithmetic peak: the ceiling a matmul kernel is measured against (`pagedchat bench step`).
 *
 * Built and loaded by engine/native/peak.py (cc -O3 -march=native, OpenMP), like stream.c. Two register-only loops,
 * run by every thread at once:
 *   - fp32: independent FMA chains (8 floats each, enough chains to hide the FMA latency), 2 flops a lane;
 *   - int8: the widest integer dot product the quantized kernels use: on AVX-512 VNNI (with BW) the 64-byte vpdpbusd
 *     (u8 x s8, 4 products summed into each 32-bit lane; the K-quants' dots and Q4_K_R8 issue it), else AVX2's
 *     maddubs u8 x s8 -> pairs in 16 bits, madd with ones -> 32 bits, add; 2 ops per byte product. Each iteration
 *     changes its operands, so no product repeats. (On a 2-core Zen 4 the vpdpbusd loop ran ~1.7x the maddubs one.)
 * Nothing touches memory; the accumulators are returned so the loops cannot be optimised away. Without AVX2 (and
 * FMA) both return -1: no peak to report.
 */
#include <stdint.h>
#include <time.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define PEAK_AVX2 1
#endif

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define FMA_CHAINS 10
#define DOT_CHAINS 8

static int team(int num_threads) { return num_threads > 1 ? num_threads : 1; }

/* The rate of `ops_per_thread` operations done by each of `threads` threads since `start`. */
static double per_second(double ops_per_thread, int threads, double start) {
    return ops_per_thread * threads / (now_s() - start);
}

/* fp32 FMA operations a second over `iters` iterations on each of `num_threads` threads (-1 without AVX2/FMA);
 * *checksum gets the accumulators' sum. */
double peak_fp32(int64_t iters, int num_threads, double *checksum) {
#ifdef PEAK_AVX2
    double sum = 0.0;
    const double start = now_s();
#pragma omp parallel num_threads(team(num_threads)) reduction(+ : sum)
    {
        __m256 acc[FMA_CHAINS];
        const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
        for (int c = 0; c < FMA_CHAINS; c++) acc[c] = _mm256_set1_ps(1.0f + c);
        for (int64_t i = 0; i < iters; i++)
            for (int c = 0; c < FMA_CHAINS; c++) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
        for (int c = 0; c < FMA_CHAINS; c++) sum += _mm256_cvtss_f32(acc[c]);
    }
    const double rate = per_second((double)iters * FMA_CHAINS * 8 * 2, team(num_threads), start);
    *checksum = sum;
    return rate;
#else
    (void)iters, (void)num_threads, (void)checksum;
    return -1.0;
#endif
}

/* int8 dot-product operations (2 per byte product) a second, as above. */
double peak_int8(int64_t iters, int num_threads, double *checksum) {
#ifdef PEAK_AVX2
    double sum = 0.0;
    const double start = now_s();
#pragma omp parallel num_threads(team(num_threads)) reduction(+ : sum)
    {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
        __m512i acc[DOT_CHAINS], u[DOT_CHAINS];
        const __m512i step = _mm512_set1_epi8(1), x = _mm512_set1_epi8(3);
        for (int c = 0; c < DOT_CHAINS; c++) {
            acc[c] = _mm512_setzero_si512();
            u[c] = _mm512_set1_epi8((char)(5 + c));
        }
        for (int64_t i = 0; i < iters; i++)
            for (int c = 0; c < DOT_CHAINS; c++) {
                u[c] = _mm512_add_epi8(u[c], step);
                acc[c] = _mm512_dpbusd_epi32(acc[c], u[c], x);
            }
        for (int c = 0; c < DOT_CHAINS; c++) sum += _mm_cvtsi128_si32(_mm512_castsi512_si128(acc[c]));
    }
    const double rate = per_second((double)iters * DOT_CHAINS * 64 * 2, team(num_threads), start);
#else
        __m256i acc[DOT_CHAINS], u[DOT_CHAINS];
        const __m256i ones = _mm256_set1_epi16(1), step = _mm256_set1_epi8(1), x = _mm256_set1_epi8(3);
        for (int c = 0; c < DOT_CHAINS; c++) {
            acc[c] = _mm256_setzero_si256();
            u[c] = _mm256_set1_epi8((char)(5 + c));
        }
        for (int64_t i = 0; i < iters; i++)
            for (int c = 0; c < DOT_CHAINS; c++) {
                u[c] = _mm256_add_epi8(u[c], step); /* new operands every iteration: nothing to hoist */
                acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(_mm256_maddubs_epi16(u[c], x), ones));
            }
        for (int c = 0; c < DOT_CHAINS; c++) sum += _mm256_cvtsi256_si32(acc[c]);
    }
    const double rate = per_second((double)iters * DOT_CHAINS * 32 * 2, team(num_threads), start);
#endif
    *checksum = sum;
    return rate;
#else
    (void)iters, (void)num_threads, (void)checksum;
    return -1.0;
#endif
}
