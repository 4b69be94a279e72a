/* Q4_0 / Q4_1 / Q8_0: the int8 GEMV for few rows in the GEMM's activation layout (included by quant_linear.c). */
#ifdef QL_AVX2
/* The decode GEMV with int8 activations (few rows): the GEMM's layout on the activation side only. A weight row is
 * read once, straight from its GGUF blocks: blocks 2p and 2p + 1 are loaded as one vector [2p | 2p + 1] of their 16
 * nibble bytes (Q4; Q8_0: the two halves of each block's 32 bytes), whose low and high nibbles are then exactly the
 * pair layout, and their fp16 scales [d, m] are converted together into the lanes of each block; Q4 quads come from
 * two such vectors (quad_weights). Per group of blocks that is one int->float conversion and two FMAs a row instead
 * of a scalar scale, a broadcast and a dependent scalar minimum term per block. An odd leftover pairs with zeros. */
static inline __attribute__((always_inline)) void pair_weights(int qtype, const uint8_t *blk0, const uint8_t *blk1,
                                                               __m256i *u0, __m256i *u1, __m256i *s0, __m256i *s1,
                                                               __m256 *d, __m256 *m) {
    uint32_t dm0 = 0, dm1 = 0; /* fp16 d (and Q4_1's fp16 m above it) */
    memcpy(&dm0, blk0, qtype == Q4_1 ? 4 : 2);
    if (blk1) memcpy(&dm1, blk1, qtype == Q4_1 ? 4 : 2);
    const __m256 f = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_setr_epi32((int)dm0, (int)dm1, 0, 0)));
    *d = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
    if (qtype == Q4_1) *m = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3));
    if (qtype == Q4_0) *m = _mm256_mul_ps(*d, _mm256_set1_ps(-8.0f));
    const __m128i zero = _mm_setzero_si128();
    if (qtype == Q8_0) {
        const __m128i a0 = _mm_loadu_si128((const __m128i *)(blk0 + 2)), a1 = _mm_loadu_si128((const __m128i *)(blk0 + 18));
        const __m128i b0 = blk1 ? _mm_loadu_si128((const __m128i *)(blk1 + 2)) : zero;
        const __m128i b1 = blk1 ? _mm_loadu_si128((const __m128i *)(blk1 + 18)) : zero;
        *s0 = _mm256_set_m128i(b0, a0), *s1 = _mm256_set_m128i(b1, a1);
        *u0 = _mm256_sign_epi8(*s0, *s0), *u1 = _mm256_sign_epi8(*s1, *s1);
    } else {
        const int off = qtype == Q4_1 ? 4 : 2;
        const __m128i a = _mm_loadu_si128((const __m128i *)(blk0 + off));
        const __m256i v = _mm256_set_m128i(blk1 ? _mm_loadu_si128((const __m128i *)(blk1 + off)) : zero, a);
        *u0 = _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
        *u1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f));
    }
}

/* Four Q4 blocks of a row straight from GGUF in the GEMM's quad layout: [blk0 | blk1] and [blk2 | blk3] loaded as
 * two vectors of nibble bytes; the 64-bit unpacks of their low (then high) nibbles give vectors whose slots hold
 * weights 8k..8k+7 of blocks 0, 2, 1, 3 (quad_slot's order). Their scales [d, m] land in the slots' lanes. */
static inline __attribute__((always_inline)) void quad_weights(int qtype, const uint8_t *blk, int bb, __m256i u[4],
                                                               __m256 *d, __m256 *m) {
    const int off = qtype == Q4_1 ? 4 : 2;
    int dm[4]; /* fp16 d (and Q4_1's fp16 m above it), each read as an integer and inserted into the vector in
                * registers: four 2-byte stores read back as one 16-byte load missed store forwarding, and Q4_0's
                * GEMV ran at 11 GB/s against Q4_1's 26 (Zen 4) */
    for (int k = 0; k < 4; k++) {
        if (qtype == Q4_1) {
            uint32_t v;
            memcpy(&v, blk + k * bb, 4);
            dm[k] = (int)v;
        } else {
            uint16_t v;
            memcpy(&v, blk + k * bb, 2);
            dm[k] = v;
        }
    }
    const __m256 f = _mm256_cvtph_ps(_mm_setr_epi32(dm[0], dm[1], dm[2], dm[3])); /* [d0 m0 d1 m1 d2 m2 d3 m3] */
    *d = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 0, 4, 4, 2, 2, 6, 6));
    *m = qtype == Q4_1 ? _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(1, 1, 5, 5, 3, 3, 7, 7))
                       : _mm256_mul_ps(*d, _mm256_set1_ps(-8.0f));
    const __m256i lo = _mm256_set1_epi8(0x0f);
    const __m256i a = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(blk + bb + off)),
                                       _mm_loadu_si128((const __m128i *)(blk + off)));
    const __m256i b = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(blk + 3 * bb + off)),
                                       _mm_loadu_si128((const __m128i *)(blk + 2 * bb + off)));
    const __m256i al = _mm256_and_si256(a, lo), bl = _mm256_and_si256(b, lo);
    const __m256i ah = _mm256_and_si256(_mm256_srli_epi16(a, 4), lo), bh = _mm256_and_si256(_mm256_srli_epi16(b, 4), lo);
    u[0] = _mm256_unpacklo_epi64(al, bl), u[1] = _mm256_unpackhi_epi64(al, bl);
    u[2] = _mm256_unpacklo_epi64(ah, bh), u[3] = _mm256_unpackhi_epi64(ah, bh);
}

/* acc[r] += a group's integer dots times d dx, then + m sx (Q4), for activation rows r < NR: a quad of Q4 blocks
 * (blk: the first, G = 4) or a pair (blk0, blk1 or NULL: a zero partner; G = 2); the activations' group at byte
 * offset `off` of each row, its scales at float offset g * 8. One accumulator a row, the same operations in the same
 * order for every row whatever NR is: a row's result does not depend on the call's row count (speculative decoding
 * verifies several rows of one sequence in a step), and 8 rows' accumulators fit the registers. */
static inline __attribute__((always_inline)) void group_step(int qtype, int G, const uint8_t *blk0,
                                                             const uint8_t *blk1, ActPairs a, GemmLayout L,
                                                             int64_t off, int g, int NR, __m256 *acc) {
    __m256i u[4], sk[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    __m256 d, m = _mm256_setzero_ps();
    if (G == 4)
        quad_weights(qtype, blk0, block_bytes(qtype), u, &d, &m);
    else
        pair_weights(qtype, blk0, blk1, &u[0], &u[1], &sk[0], &sk[1], &d, &m);
    for (int r = 0; r < NR; r++) {
        const __m256i dot = group_dot(qtype, G, u, sk, a.qx + r * L.cw + off);
        const __m256 scale = _mm256_mul_ps(d, _mm256_load_ps(a.dx8 + r * L.sw + g * 8));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r]);
        if (qtype != Q8_0) acc[r] = _mm256_fmadd_ps(m, _mm256_load_ps(a.sx8 + r * L.sw + g * 8), acc[r]);
    }
}

/* sums[i][r] = activation row r . weight row i (before bias) for i < NI weight rows and r < NR activation rows
 * (constants after inlining): NI x NR independent accumulators, each weight group loaded once for all rows. Q4 rows
 * go in quads of blocks, then pairs; Q8_0 rows in pairs (gemm_layout). */
static inline __attribute__((always_inline)) void dot_pairs(int qtype, const uint8_t *wrow, int64_t w_row_bytes,
                                                            int nb, ActPairs a, GemmLayout L, int NI, int NR,
                                                            float sums[][PAIR_PASS_ROWS]) {
    const int bb = block_bytes(qtype), nq = qtype == Q8_0 ? 0 : L.nq; /* Q8_0: no quads (constant after inlining) */
    __m256 acc[PAIR_ROWS][PAIR_PASS_ROWS];
    for (int i = 0; i < NI; i++)
        for (int r = 0; r < NR; r++) acc[i][r] = _mm256_setzero_ps();
    for (int q = 0; q < nq; q++)
        for (int i = 0; i < NI; i++) {
            const uint8_t *blk = wrow + i * w_row_bytes + (int64_t)(4 * q) * bb;
            { /* past the last tile this names memory it never reads: a prefetch does not fault. A lone weight row's
               * too (several activation rows): without it 4 to 8 rows ran 21-35% slower, waiting on each quad */
                const uintptr_t ahead = (uintptr_t)blk + (uintptr_t)(PAIR_PREFETCH * NI * w_row_bytes);
                _mm_prefetch((const char *)ahead, _MM_HINT_T0); /* a quad spans up to 136 bytes: two lines */
                _mm_prefetch((const char *)(ahead + 64), _MM_HINT_T0);
            }
            group_step(qtype, 4, blk, NULL, a, L, (int64_t)q * 128, q, NR, acc[i]);
        }
    for (int b = 4 * nq, p = 0; b < nb; b += 2, p++)
        for (int i = 0; i < NI; i++) {
            const uint8_t *blk = wrow + i * w_row_bytes + (int64_t)b * bb;
            _mm_prefetch((const char *)((uintptr_t)blk + (uintptr_t)(PAIR_PREFETCH * NI * w_row_bytes)), _MM_HINT_T0);
            group_step(qtype, 2, blk, b + 1 < nb ? blk + bb : NULL, a, L, (int64_t)nq * 128 + p * 64, nq + p, NR,
                       acc[i]);
        }
    for (int i = 0; i < NI; i++)
        for (int r = 0; r < NR; r++) sums[i][r] = hsum8(acc[i][r]);
}

/* dot_pairs for a runtime type and row count (NI weight rows: 4 for one activation row, 2 for two, else 1: the
 * (ni, nr) pairs linear_pairs makes, each of which needs its case below), each
 * case compiled with its constants outside the OpenMP-outlined loop (whose body GCC builds before inlining, where
 * the type is still a variable). */
static __attribute__((noinline)) void dot_pairs_any(int qtype, int ni, int nr, const uint8_t *wrow,
                                                    int64_t w_row_bytes, int nb, ActPairs a, GemmLayout L,
                                                    float sums[][PAIR_PASS_ROWS]) {
#define PAIRS_CASE(T, I, N)                                                       \
    if (ni == I && nr == N) {                                                     \
        dot_pairs(T, wrow, w_row_bytes, nb, a, L, I, N, sums);                    \
        return;                                                                   \
    }
#define PAIRS_TYPE(T)                                                                                         \
    PAIRS_CASE(T, 4, 1) PAIRS_CASE(T, 2, 2) PAIRS_CASE(T, 1, 1) PAIRS_CASE(T, 1, 2) PAIRS_CASE(T, 1, 3)      \
    PAIRS_CASE(T, 1, 4) PAIRS_CASE(T, 1, 5) PAIRS_CASE(T, 1, 6) PAIRS_CASE(T, 1, 7) PAIRS_CASE(T, 1, 8)
    switch (qtype) {
    case Q4_0: PAIRS_TYPE(Q4_0) break;
    case Q4_1: PAIRS_TYPE(Q4_1) break;
    default: PAIRS_TYPE(Q8_0) break;
    }
#undef PAIRS_TYPE
#undef PAIRS_CASE
}

/* quant_linear with act_q8 under AVX2: the activations into the GEMM's layout, then the GEMV. 0, or -2 (memory). */
static int linear_pairs(int qtype, const uint8_t *w, int64_t w_row_bytes, int out_features, int in_features,
                        const float *x, int64_t x_row, int rows, const float *bias, float *y, int64_t y_row,
                        int threads) {
    const int nb = in_features / QK;
    const GemmLayout L = gemm_layout(qtype, nb);
    const int64_t cw = L.cw, sw = L.sw;
    if (rows <= 0) return 0;
    const ActPairs a = act_alloc(rows, cw, sw);
    if (act_pairs_ok(a)) {
        for (int r = 0; r < rows; r++)
            quantize_row_gemm(L, x + r * x_row, in_features, a.qx + r * cw, a.dx8 + r * sw, a.sx8 + r * sw, NULL, 0);
        /* weight rows a tile at a time: PAIR_ROWS of them for one activation row, 2 for two, else 1 */
        const int tile = rows == 1 ? PAIR_ROWS : rows == 2 ? 2 : 1, tiles = (out_features + tile - 1) / tile;
        const int grab = ROWS_PER_GRAB / tile; /* the shortest run: 32 outputs, whole cache lines of y */
#pragma omp parallel for schedule(guided, grab) num_threads(threads)
        for (int t = 0; t < tiles; t++) {
            /* a whole tile at once; a last, short one row by row */
            const int o0 = t * tile, end = o0 + tile < out_features ? o0 + tile : out_features;
            const int ni = end - o0 == tile ? tile : 1;
            for (int o = o0; o < end; o += ni)
                for (int r0 = 0; r0 < rows; r0 += PAIR_PASS_ROWS) {
                    const int nr = rows - r0 < PAIR_PASS_ROWS ? rows - r0 : PAIR_PASS_ROWS;
                    const ActPairs ar = {a.qx + r0 * cw, a.dx8 + r0 * sw, a.sx8 + r0 * sw};
                    float sums[PAIR_ROWS][PAIR_PASS_ROWS];
                    dot_pairs_any(qtype, ni, nr, w + (int64_t)o * w_row_bytes, w_row_bytes, nb, ar, L, sums);
                    for (int i = 0; i < ni; i++)
                        for (int r = 0; r < nr; r++)
                            y[(r0 + r) * y_row + o + i] = sums[i][r] + (bias ? bias[o + i] : 0.0f);
                }
        }
    }
    const int status = act_pairs_ok(a) ? 0 : -2;
    act_pairs_free(a);
    return status;
}
#endif
