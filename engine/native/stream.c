/* A streaming read of one buffer: the machine's read bandwidth, the ceiling of a kernel that reads the KV cache once.
 *
 * Built and loaded by engine/native/stream.py (cc -O3 -march=native, OpenMP), like attention.c. The buffer is split
 * into chunks handed out statically, so each thread streams one contiguous range (what the hardware prefetchers
 * like best). Each chunk is summed into eight independent 8-float accumulators: the adds never wait on one another,
 * so the loop is bound by loads, not by add latency. The sum is returned so the reads cannot be optimised away.
 */
#include <stdint.h>
#include <string.h>

#define CHUNK_FLOATS ((int64_t)1 << 16) /* 256 KiB a work item */
#define L 8                             /* lanes of one 32-byte vector: one AVX register */
#define ACC 8                           /* independent accumulators */

/* 32-byte vectors, not simd.h's 64-byte ones: with AVX2, GCC keeps 64-byte accumulators on the stack, and the loop
 * then waits on store-to-load forwarding instead of on memory. Eight accumulators in registers hide the add latency. */
typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p) {
    v8 x;
    memcpy(&x, p, sizeof x);
    return x;
}

static double sum_chunk(const float *p, int64_t n) {
    v8 acc[ACC] = {{0}};
    int64_t i = 0;
    for (; i + ACC * L <= n; i += ACC * L)
        for (int a = 0; a < ACC; a++) acc[a] += load8(p + i + a * L);
    for (int a = 1; a < ACC; a++) acc[0] += acc[a];
    double total = 0.0;
    for (int l = 0; l < L; l++) total += acc[0][l];
    for (; i < n; i++) total += p[i];
    return total;
}

/* The sum of data[0..n) (fp32 lanes, fp64 across chunks), read by num_threads OpenMP threads. */
double stream_read(const float *data, int64_t n, int num_threads) {
    const int64_t num_chunks = (n + CHUNK_FLOATS - 1) / CHUNK_FLOATS;
    double total = 0.0;
#pragma omp parallel for num_threads(num_threads > 1 ? num_threads : 1) schedule(static) reduction(+ : total)
    for (int64_t c = 0; c < num_chunks; c++) {
        const int64_t start = c * CHUNK_FLOATS;
        const int64_t len = n - start < CHUNK_FLOATS ? n - start : CHUNK_FLOATS;
        total += sum_chunk(data + start, len);
    }
    return total;
}
