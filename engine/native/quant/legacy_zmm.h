/* Q4_0 / Q4_1 / Q8_0: the int8 GEMV on AVX-512 VNNI (included by quant_linear.c, which takes it instead of
 * legacy_pairs.h's AVX2 GEMV where the CPU has it and zq_takes says it is the faster). Few rows: decode, and
 * speculative decoding's verification of a sequence's proposed tokens as extra rows of a step.
 *
 * Every 32-weight block has its own fp16 scale, so beside its products a row pays the scaling of each block's sum.
 * A Q4 row's blocks go 16 at a time (a group): their nibble words transposed (zq_weights16) so that lane 4L + g of
 * each of 8 vectors holds 4 weights of block 4g + L, 8 vpdpbusd give each lane one block's whole sum, and one
 * conversion and 2-3 float operations scale 16 blocks. The rest of the row (and every Q8_0 row) goes in quads: 4
 * blocks as two 64-byte vectors lo = [b0 w0..15 | b1 w0..15 | b2 | b3] and hi (w16..31), the row's last quad
 * padded with zero blocks; 2 vpdpbusd and the scaling of 4 blocks. A Q4 block's 16 bytes hold w0..15 in their low
 * nibbles and w16..31 in their high ones; a Q8_0 block's 32 signed bytes are made unsigned by adding 128. The
 * activations are quantized once per call into the same orders (ZQ_GSLOT bytes a row and group, ZQ_SLOT a row
 * and quad, rows side by side), with p a block's integer dot of unsigned weights and int8 activations a:
 *   Q4_1: acc += (d * dx) * float(p) + m * (dx * sum(a))          w = d q + m
 *   Q4_0: acc += (d * dx) * float(p - 8 * sum(a))                 w = d (q - 8)
 *   Q8_0: acc += (d * dx) * float(p - 128 * sum(a))               w = d q, q + 128 unsigned
 * where the activation sums sit in their blocks' lanes (zeros in the others); Q4_0's and Q8_0's are stored as
 * -8 sum(a) and -128 sum(a), the dots' starting value, so their corrections are exact integer arithmetic. The same operations in the same order for each (weight row, activation row) pair
 * whatever the call's row count: a row's result does not depend on the rows beside it (issue #40). The AVX2 GEMV
 * scales every 4 blocks (a conversion and 3 float operations a row per 128 weights): 8 rows of the default model's
 * 3,072 x 576 Q4_1 ran at ~160 GOP/s on a 2-core Zen 4 whose int8 peak reads 580-900. */
#if defined(QL_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define ZQ 1
#define ZQ_SLOT 256       /* bytes of one activation row's quad: lo, hi, dx x4 a block, sums */
#define ZQ_GSLOT 640      /* bytes of one activation row's group of 16 blocks: 8 x 64 values, dx, sums */
#define ZQ_AHEAD 2048     /* bytes the weight prefetches run ahead of the rows being multiplied, at least */
#define ZQ_PASS_ROWS 16   /* activation rows a pass over a weight row takes: the GEMV bound, in registers */

/* Q4 rows go in groups of 16 blocks first (the rest in quads); Q8_0 rows in quads only. */
static inline int zq_groups(int qtype, int nb) { return qtype == Q8_0 ? 0 : nb / 16; }

/* One activation row into its slots: groups at act + g * group_stride, quads at quads + q * quad_stride (its
 * first slot of each kind). A group's 16 blocks sit in lanes 4 (b % 4) + b / 4 (the order the
 * weights' transposition, zq_weights16, leaves them in): vector k (k < 8) holds activations 4k..4k+3 of each block
 * (int8), then dx and the sums in the blocks' lanes (Q4_1: dx * sum, float; Q4_0: -8 * sum, int32, the dots' start). */
static void zq_quantize_row(int qtype, const float *x, int nb, uint8_t *act, uint8_t *quads, int64_t group_stride,
                            int64_t quad_stride) {
    const int b0 = 16 * zq_groups(qtype, nb);
    for (int q = 0; q < (nb - b0 + 3) / 4; q++) memset(quads + q * quad_stride, 0, ZQ_SLOT);
    for (int b = 0; b < nb; b++) {
        float dx;
        int sum;
        const __m256i v = quantize_block(x + b * QK, &dx, &sum);
        if (b < b0) {
            uint8_t *s = act + (b / 16) * group_stride;
            const int lane = 4 * (b % 4) + (b % 16) / 4;
            int32_t words[8];
            _mm256_storeu_si256((__m256i *)words, v);
            for (int k = 0; k < 8; k++) ((int32_t *)(s + 64 * k))[lane] = words[k];
            ((float *)(s + 512))[lane] = dx;
            if (qtype == Q4_1)
                ((float *)(s + 576))[lane] = dx * (float)sum;
            else
                ((int32_t *)(s + 576))[lane] = -8 * sum;
            continue;
        }
        uint8_t *s = quads + ((b - b0) / 4) * quad_stride;
        const int i = (b - b0) % 4;
        _mm_store_si128((__m128i *)(s + 16 * i), _mm256_castsi256_si128(v));
        _mm_store_si128((__m128i *)(s + 64 + 16 * i), _mm256_extracti128_si256(v, 1));
        _mm_store_ps((float *)(s + 128) + 4 * i, _mm_set1_ps(dx));
        if (qtype == Q4_1)
            ((float *)(s + 192))[4 * i] = dx * (float)sum;
        else
            ((int32_t *)(s + 192))[4 * i] = -(qtype == Q4_0 ? 8 : 128) * sum;
    }
}

/* A group of 16 Q4 blocks at blk, transposed: W[k] (k < 4) the low nibbles of each block's bytes 4k..4k+3 (its
 * weights 4k..4k+3), W[4 + k] their high nibbles (weights 16 + 4k..), block b in lane 4 (b % 4) + b / 4: four
 * vectors of 4 blocks' 16 nibble bytes each and a 4 x 4 transposition of their 32-bit words. d16 (and Q4_1's m16):
 * the blocks' scales in the same lanes. (A gather of the scales read ~5% slower than 16 scalar reads on a Zen 4.) */
static inline __attribute__((always_inline)) void zq_weights16(int qtype, const uint8_t *blk, __m512i W[8],
                                                               __m512 *d16, __m512 *m16) {
    const int bb = block_bytes(qtype), off = qtype == Q4_1 ? 4 : 2;
    __m512i z[4];
#ifdef __AVX512VBMI__
    /* 4 blocks (80 or 72 bytes) from two loads, the second masked to the blocks' end: vpermt2b picks their nibble
     * bytes, and their first 4 bytes (d, m) into quarter g of dmz; 12 instructions where 16 loads and 12 inserts
     * (and 16 scalar reads for the scales) made a 576-wide row's single-row GEMV 0.8x the AVX2 kernel's */
    /* vpermt2b's byte indexes, as 32-bit words of 4 consecutive bytes x..x + 3: word j of the nibbles is bytes 4 (j % 4)
     * on of block j / 4's nibbles; of the scales, quarter g gets the first 4 bytes of blocks 0..3 (word j: block j % 4) */
#define ZQ_BYTES(x) _mm512_add_epi32(_mm512_mullo_epi32(x, _mm512_set1_epi32(0x01010101)), _mm512_set1_epi32(0x03020100))
    const __m512i quad = _mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
    const __m512i block = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i nib_index = ZQ_BYTES(_mm512_add_epi32(_mm512_mullo_epi32(block, _mm512_set1_epi32(bb)),
                                                        _mm512_add_epi32(_mm512_slli_epi32(quad, 2), _mm512_set1_epi32(off))));
    const __m512i dm_index = ZQ_BYTES(_mm512_mullo_epi32(quad, _mm512_set1_epi32(bb)));
#undef ZQ_BYTES
    __m512i dmz = _mm512_setzero_si512();
    for (int g = 0; g < 4; g++) {
        const uint8_t *b = blk + 4 * g * bb;
        const __m512i lo = _mm512_loadu_si512((const void *)b);
        const __m512i hi = _mm512_maskz_loadu_epi8((__mmask64)((1ull << (4 * bb - 64)) - 1), (const void *)(b + 64));
        z[g] = _mm512_permutex2var_epi8(lo, nib_index, hi);
        dmz = _mm512_mask_blend_epi8((__mmask64)(0xffffull << (16 * g)), dmz, _mm512_permutex2var_epi8(lo, dm_index, hi));
    }
    /* lane 4L + g: block 4g + L's */
    const __m512i dm =
        _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), dmz);
#else
    for (int g = 0; g < 4; g++) {
        const uint8_t *b = blk + 4 * g * bb + off;
        z[g] = _mm512_inserti32x4(
            _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)b)),
                                                  _mm_loadu_si128((const __m128i *)(b + bb)), 1),
                               _mm_loadu_si128((const __m128i *)(b + 2 * bb)), 2),
            _mm_loadu_si128((const __m128i *)(b + 3 * bb)), 3);
    }
#endif
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    const __m512i n[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2), _mm512_unpacklo_epi64(t1, t3),
                          _mm512_unpackhi_epi64(t1, t3)};
    const __m512i nib = _mm512_set1_epi8(0x0f);
    for (int k = 0; k < 4; k++) {
        W[k] = _mm512_and_si512(n[k], nib);
        W[4 + k] = _mm512_and_si512(_mm512_srli_epi16(n[k], 4), nib);
    }
#ifndef __AVX512VBMI__
    /* lane 4L + g: block 4g + L's first 4 bytes (d, and Q4_1's m), read as integers into the vector in registers */
    __m128i q[4];
    for (int L = 0; L < 4; L++) {
        int v[4];
        for (int g = 0; g < 4; g++) memcpy(&v[g], blk + (4 * g + L) * bb, 4);
        q[L] = _mm_setr_epi32(v[0], v[1], v[2], v[3]);
    }
    const __m512i dm = _mm512_inserti32x4(
        _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(q[0]), q[1], 1), q[2], 2), q[3], 3);
#endif
    *d16 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
    if (qtype == Q4_1) *m16 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
}

/* acc[r] += a group's dots of a weight row (its 16 blocks at blk) and activation rows r < NR (a: the group's slot
 * of the pass's first row). */
static inline __attribute__((always_inline)) void zq_group(int qtype, const uint8_t *blk, int64_t ahead,
                                                           const uint8_t *a, int NR, __m512 acc[ZQ_PASS_ROWS]) {
    /* the same group `ahead` bytes on (past the last row: memory never read; a prefetch does not fault) */
    for (int l = 0; l < 16 * block_bytes(qtype); l += 64)
        _mm_prefetch((const char *)((uintptr_t)blk + (uintptr_t)(ahead + l)), _MM_HINT_T0);
    __m512i W[8];
    __m512 d16, m16 = _mm512_setzero_ps();
    zq_weights16(qtype, blk, W, &d16, &m16);
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++) {
        const uint8_t *ar = a + r * ZQ_GSLOT;
        /* the 8 products in `chains` independent sums where few rows would leave vpdpbusd's latency exposed (1 row:
         * a chain of 8 ran a 576-wide row at 0.8x the AVX2 kernel); integer sums, so the same whatever the split */
        const int chains = NR <= 2 ? 4 : NR <= 4 ? 2 : 1;
        __m512i p[4];
        for (int c = 0; c < chains; c++)
            p[c] = c == 0 && qtype != Q4_1 ? _mm512_load_si512((const void *)(ar + 576)) : _mm512_setzero_si512();
        for (int k = 0; k < 8; k++)
            p[k % chains] = _mm512_dpbusd_epi32(p[k % chains], W[k], _mm512_load_si512((const void *)(ar + 64 * k)));
        for (int c = 1; c < chains; c++) p[0] = _mm512_add_epi32(p[0], p[c]);
        const __m512 scale = _mm512_mul_ps(d16, _mm512_load_ps((const float *)(ar + 512)));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[0]), scale, acc[r]);
        if (qtype == Q4_1) acc[r] = _mm512_fmadd_ps(m16, _mm512_load_ps((const float *)(ar + 576)), acc[r]);
    }
}

/* The quad of n blocks (n <= 4; the rest zero) at blk: lo, hi and the lanes' d (and Q4_1's m). */
static inline __attribute__((always_inline)) void zq_weights(int qtype, const uint8_t *blk, int n, __m512i *lo,
                                                             __m512i *hi, __m512 *d4, __m512 *m4) {
    const int bb = block_bytes(qtype), off = qtype == Q4_1 ? 4 : 2;
    int dm[4] = {0, 0, 0, 0}; /* fp16 d (Q4_1: and m above it), read as integers (see quad_weights) */
    __m128i l[4], h[4];
    for (int i = 0; i < 4; i++) {
        l[i] = h[i] = _mm_setzero_si128();
        if (i >= n) continue;
        const uint8_t *b = blk + i * bb;
        if (qtype == Q4_1) {
            uint32_t v;
            memcpy(&v, b, 4);
            dm[i] = (int)v;
        } else {
            uint16_t v;
            memcpy(&v, b, 2);
            dm[i] = v;
        }
        l[i] = _mm_loadu_si128((const __m128i *)(b + off));
        if (qtype == Q8_0) h[i] = _mm_loadu_si128((const __m128i *)(b + off + 16));
    }
#define ZQ_JOIN(v) \
    _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(v[0]), v[1], 1), v[2], 2), v[3], 3)
    const __m512i a = ZQ_JOIN(l);
    if (qtype == Q8_0) { /* q + 128 (the padding's 0 becomes 128: its activations are 0) */
        *lo = _mm512_xor_si512(a, _mm512_set1_epi8((char)0x80));
        *hi = _mm512_xor_si512(ZQ_JOIN(h), _mm512_set1_epi8((char)0x80));
    } else {
        *lo = _mm512_and_si512(a, _mm512_set1_epi8(0x0f));
        *hi = _mm512_and_si512(_mm512_srli_epi16(a, 4), _mm512_set1_epi8(0x0f));
    }
#undef ZQ_JOIN
    const __m512 f = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_setr_epi32(dm[0], dm[1], dm[2], dm[3])));
    *d4 = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6), f);
    if (qtype == Q4_1) *m4 = _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7), f);
}

/* acc[r] += a quad's dots of a weight row (its n blocks at blk) and activation rows r < NR (a: the quad's slot of
 * the pass's first row). */
static inline __attribute__((always_inline)) void zq_quad(int qtype, const uint8_t *blk, int64_t ahead, int n,
                                                          const uint8_t *a, int NR, __m512 acc[ZQ_PASS_ROWS]) {
    /* the same quad `ahead` bytes on */
    const uintptr_t next = (uintptr_t)blk + (uintptr_t)ahead;
    _mm_prefetch((const char *)next, _MM_HINT_T0);
    _mm_prefetch((const char *)(next + 64), _MM_HINT_T0);
    if (qtype == Q8_0) _mm_prefetch((const char *)(next + 128), _MM_HINT_T0);
    __m512i lo, hi;
    __m512 d4, m4 = _mm512_setzero_ps();
    zq_weights(qtype, blk, n, &lo, &hi, &d4, &m4);
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++) {
        const uint8_t *ar = a + r * ZQ_SLOT;
        __m512i p = qtype == Q4_1 ? _mm512_setzero_si512() : _mm512_load_si512((const void *)(ar + 192));
        p = _mm512_dpbusd_epi32(p, lo, _mm512_load_si512((const void *)ar));
        p = _mm512_dpbusd_epi32(p, hi, _mm512_load_si512((const void *)(ar + 64)));
        const __m512 scale = _mm512_mul_ps(d4, _mm512_load_ps((const float *)(ar + 128)));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc[r]);
        if (qtype == Q4_1) acc[r] = _mm512_fmadd_ps(m4, _mm512_load_ps((const float *)(ar + 192)), acc[r]);
    }
}

/* out[j] = the sum of v[j]'s 16 lanes, j < n <= 16 (a constant after inlining), four vectors' sums at once: each
 * vector's lanes are added in the same order whichever vectors share its registers (lane l with l + 8, then with
 * l + 4, then the four partial sums as (0 + 2) + (1 + 3)), so a row's result does not depend on the rows beside it.
 * One _mm512_reduce_add_ps per accumulator cost a 576-wide row (one group and a quad) about as much as its dots. */
static inline __attribute__((always_inline)) void zq_sums(const __m512 *v, int n, float *out) {
    const __m512 z = _mm512_setzero_ps();
    __m512 s[ZQ_PASS_ROWS / 2], u[ZQ_PASS_ROWS / 4];
    const int ns = (n + 1) / 2, nu = (ns + 1) / 2;
    for (int j = 0; j < ns; j++) { /* v[2j], v[2j + 1]: their lanes l + (l + 8), quarters [a0 a1 b0 b1] */
        const __m512 a = v[2 * j], b = 2 * j + 1 < n ? v[2 * j + 1] : z;
        s[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
    }
    for (int j = 0; j < nu; j++) { /* then + (l + 4): quarter k of u[m] is vector 4m + k's four partial sums */
        const __m512 a = s[2 * j], b = 2 * j + 1 < ns ? s[2 * j + 1] : z;
        u[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xdd));
    }
    for (int m = 0; m < nu; m += 4) { /* four u at a time: lane 4k + j of t is vector 4 (m + j) + k's sum */
        const __m512 u0 = u[m], u1 = m + 1 < nu ? u[m + 1] : z, u2 = m + 2 < nu ? u[m + 2] : z,
                     u3 = m + 3 < nu ? u[m + 3] : z;
        const __m512 p0 = _mm512_add_ps(_mm512_unpacklo_ps(u0, u1), _mm512_unpackhi_ps(u0, u1));
        const __m512 p1 = _mm512_add_ps(_mm512_unpacklo_ps(u2, u3), _mm512_unpackhi_ps(u2, u3));
        const __m512d a = _mm512_castps_pd(p0), b = _mm512_castps_pd(p1);
        float t[16];
        _mm512_storeu_ps(t, _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                                          _mm512_castpd_ps(_mm512_unpackhi_pd(a, b))));
        for (int j = 0; j < 4 && m + j < nu; j++)
            for (int k = 0; k < 4 && 4 * (m + j) + k < n; k++) out[4 * (m + j) + k] = t[4 * k + j];
    }
}

/* sums[r] = activation row r . the weight row (before bias), r < NR (a constant after inlining). */
static inline __attribute__((always_inline)) void zq_dots(int qtype, const uint8_t *wrow, int64_t ahead, int nb,
                                                          const uint8_t *act, const uint8_t *quads,
                                                          int64_t group_stride, int64_t quad_stride, int NR,
                                                          float *sums) {
    const int bb = block_bytes(qtype), groups = zq_groups(qtype, nb), b0 = 16 * groups, full = (nb - b0) / 4;
    const uint8_t *wq = wrow + (int64_t)b0 * bb;
    __m512 acc[ZQ_PASS_ROWS];
    for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++)
        zq_group(qtype, wrow + (int64_t)(16 * g) * bb, ahead, act + g * group_stride, NR, acc);
    for (int q = 0; q < full; q++)
        zq_quad(qtype, wq + (int64_t)(4 * q) * bb, ahead, 4, quads + q * quad_stride, NR, acc);
    if ((nb - b0) % 4)
        zq_quad(qtype, wq + (int64_t)(4 * full) * bb, ahead, (nb - b0) % 4, quads + full * quad_stride, NR,
                acc);
    zq_sums(acc, NR, sums);
}

/* zq_dots for a runtime type and row count, compiled outside the OpenMP loop (see dot_pairs_any). */
static __attribute__((noinline)) void zq_dots_any(int qtype, int nr, const uint8_t *wrow, int64_t ahead, int nb,
                                                  const uint8_t *act, const uint8_t *quads, int64_t group_stride,
                                                  int64_t quad_stride, float *sums) {
#define ZQ_CASE(T, N)                                                                  \
    case N: zq_dots(T, wrow, ahead, nb, act, quads, group_stride, quad_stride, N, sums); return;
#define ZQ_TYPE(T)                                                                                                 \
    switch (nr) {                                                                                                  \
        ZQ_CASE(T, 1) ZQ_CASE(T, 2) ZQ_CASE(T, 3) ZQ_CASE(T, 4) ZQ_CASE(T, 5) ZQ_CASE(T, 6) ZQ_CASE(T, 7)          \
        ZQ_CASE(T, 8) ZQ_CASE(T, 9) ZQ_CASE(T, 10) ZQ_CASE(T, 11) ZQ_CASE(T, 12) ZQ_CASE(T, 13) ZQ_CASE(T, 14)    \
        ZQ_CASE(T, 15) ZQ_CASE(T, 16)                                                                              \
    }
    switch (qtype) {
    case Q4_0: ZQ_TYPE(Q4_0) break;
    case Q4_1: ZQ_TYPE(Q4_1) break;
    default: ZQ_TYPE(Q8_0) break;
    }
#undef ZQ_TYPE
#undef ZQ_CASE
}

/* Whether linear_zmm takes a weight of nb blocks a row: Q8_0 always; Q4 rows of 32 blocks and more. SmolLM2's
 * 576-wide Q4_1 rows (one group and half a quad) read 0.8x the AVX2 GEMV at one activation row and 0.95x at two
 * (its tiles of 4 and 2 weight rows amortize a row's fixed costs better) though 1.1-1.3x faster at 3 to 9; at 2,048
 * and up this GEMV is 1.05-1.4x faster at one row and 1.2-1.9x at 2 to 16 (Zen 4). A choice by shape alone, so a
 * row's result still does not depend on the row count. */
static int zq_takes(int qtype, int nb) { return qtype == Q8_0 || nb >= 32; }

/* quant_linear with act_q8 on AVX-512 VNNI: the activations into their slots, then the GEMV. 0, or -2 (memory). */
static int linear_zmm(int qtype, const uint8_t *w, int64_t w_row_bytes, int out_features, int in_features,
                      const float *x, int64_t x_row, int rows, const float *bias, float *y, int64_t y_row,
                      int threads) {
    const int nb = in_features / QK, groups = zq_groups(qtype, nb), nq = (nb - 16 * groups + 3) / 4;
    if (rows <= 0) return 0;
    const int64_t group_stride = (int64_t)rows * ZQ_GSLOT, quad_stride = (int64_t)rows * ZQ_SLOT;
    uint8_t *act = aligned_alloc(64, (size_t)(groups * group_stride + nq * quad_stride));
    if (!act) return -2;
    uint8_t *quads = act + groups * group_stride;
    for (int r = 0; r < rows; r++)
        zq_quantize_row(qtype, x + r * x_row, nb, act + r * ZQ_GSLOT, quads + r * ZQ_SLOT, group_stride, quad_stride);
    /* prefetches reach the weight row at least ZQ_AHEAD bytes on: one row ahead left a 576-wide row's single-row
     * GEMV 0.8x the AVX2 kernel's, whose 4-row tiles prefetched 4 rows on */
    const int64_t ahead = (ZQ_AHEAD + w_row_bytes - 1) / w_row_bytes * w_row_bytes;
    /* one weight row at a time for every row count: 4 rows side by side (the AVX2 GEMV's tile for one activation
     * row) read 1 and 2 rows 1.2-1.4x slower on a Zen 4 */
#pragma omp parallel for schedule(guided, ROWS_PER_GRAB) num_threads(threads)
    for (int o = 0; o < out_features; o++)
        for (int r0 = 0; r0 < rows; r0 += ZQ_PASS_ROWS) {
            const int nr = rows - r0 < ZQ_PASS_ROWS ? rows - r0 : ZQ_PASS_ROWS;
            float sums[ZQ_PASS_ROWS];
            zq_dots_any(qtype, nr, w + (int64_t)o * w_row_bytes, ahead, nb, act + r0 * ZQ_GSLOT,
                        quads + r0 * ZQ_SLOT, group_stride, quad_stride, sums);
            for (int r = 0; r < nr; r++) y[(r0 + r) * y_row + o] = sums[r] + (bias ? bias[o] : 0.0f);
        }
    free(act);
    return 0;
}
#endif
