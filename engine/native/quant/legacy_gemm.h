/* Q4_0 / Q4_1 / Q8_0: the register-tiled int8 GEMM for many rows (included by quant_linear.c). */
#ifdef QL_AVX2
/* Many rows (prefill, a busy decode step) with int8 activations: a register-tiled GEMM over groups of blocks.
 *
 * Pairs of blocks (Q8_0, and a Q4 row's leftover blocks): blocks 2p and 2p + 1 of a row become two 32-byte vectors, [2p bytes 0..15 | 2p+1 bytes 0..15] and [2p bytes 16..31 | 2p+1 bytes 16..31]. After
 * maddubs/madd the 8 int32 lanes are then 4 partial dots of block 2p and 4 of block 2p + 1, so one int->float
 * conversion and one FMA with the lanes' scales [d dx of 2p x4 | d dx of 2p+1 x4] serve two blocks.
 *
 * Q4 goes further: a row's blocks go in quads (GEMM_QUAD), then the 0..3 left over in pairs as above.
 * Quad q is four vectors; vector k holds bytes 8k..8k+7 of blocks 4q, 4q+2, 4q+1, 4q+3 side by side (that order: the
 * GEMV builds it from two [block | block] loads with one 64-bit unpack each), so after maddubs and madd lanes 2s and
 * 2s+1 are partial dots of the block in slot s. The four maddubs results are added in 16 bits
 * first (nibbles <= 15, |x| <= 127: 4 * 2 * 15 * 127 < 2^15), so four blocks cost four maddubs but one madd, one
 * conversion and one FMA (a pair of blocks: two, one, one and one; on AVX2, whose integer multiplies take one port,
 * SmolLM2's Q4_1 linears at 64 rows run 1.1-1.2x the pairs' rate). Q8_0 (|q| up to 128) cannot share the 16-bit
 * sums and stays in pairs (in quads it gained nothing). The Q4 minimum (Q4_0 offset) term, sum over blocks of
 * m_b dx_b sum(qx_b), is not in the inner loop: gemm_min_term adds it per tile, 8 activation rows a vector.
 *
 * Each thread takes GEMM_RM weight rows at a time (a tile), unpacks them once into that layout (Q4 nibbles as bytes;
 * Q8_0 as |q| and q, for maddubs's unsigned x signed) and multiplies them by every activation row, GEMM_RM x GEMM_RN
 * accumulators in registers; the activations are quantized once (per 32-block, as for act_q8) into the same layout.
 * The tile stays in L1 and the activations in L2 while a thread sweeps them.
 * Integer products and their 32-bit sums are exact; what differs from dequantize-then-multiply is only the
 * activations' rounding to int8 (error <= amax / 254 a value) and the fp32 summation order. */
#define GEMM_RM 4
#define GEMM_RN 2
#define GEMM_QUAD 4 /* blocks per group */

/* The decode GEMV's activations, in the GEMM's layout (GemmLayout: cw bytes and sw scales a row). */
typedef struct {
    int8_t *qx;  /* [rows][cw] */
    float *dx8;  /* [rows][sw]: each block's dx in its lanes */
    float *sx8;  /* [rows][sw]: each block's dx * sum(qx) shared out over its lanes (the minimum term's operand) */
} ActPairs;

/* The GEMM's activations: values and scales in its layout, and each block's dx * sum(qx) by block, then row (the
 * minimum term's operand, rows padded to a multiple of 8 with zeros). */
typedef struct {
    int8_t *qx;   /* [rows][cw] */
    float *dx8;   /* [rows][sw]: each block's dx in its lanes */
    float *sums;  /* [nb][rows8] */
    int64_t rows8;
} ActGemm;

typedef struct {
    uint8_t *u; /* [GEMM_RM][cw]: maddubs's unsigned operand (Q4 nibbles, |q| for Q8_0) */
    int8_t *s;  /* [GEMM_RM][cw]: Q8_0's signed q (its sign moved onto the activations), else unused */
    float *d8;  /* [GEMM_RM][sw]: each block's d in its lanes */
    float *m;   /* [GEMM_RM][nb]: the Q4_1 minimum or the Q4_0 -8 d of each block (Q8_0: unused) */
} WTile;

/* A row of nb blocks in the GEMM's layout: nq quads, then np pairs (the last one with a zero partner when the
 * leftover is odd); cw bytes of values and sw floats of scales (8 a group). */
typedef struct {
    int nq, np;
    int64_t cw, sw;
} GemmLayout;

static GemmLayout gemm_layout(int qtype, int nb) {
    const int nq = qtype == Q8_0 ? 0 : nb / GEMM_QUAD, np = (nb - nq * GEMM_QUAD + 1) / 2;
    return (GemmLayout){nq, np, (int64_t)nq * GEMM_QUAD * 32 + (int64_t)np * 64, (int64_t)(nq + np) * 8};
}

/* Block b's 32 bytes to their places in a row of the pair layout; its value in its 4 lanes of the row's scales. */
static inline void place_block(void *row, int b, __m256i v) {
    uint8_t *dst = (uint8_t *)row + (b >> 1) * 64 + (b & 1) * 16;
    _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(v));
    _mm_storeu_si128((__m128i *)(dst + 32), _mm256_extracti128_si256(v, 1));
}
static inline void place_scale(float *row8, int b, float value) {
    _mm_storeu_ps(row8 + (b >> 1) * 8 + (b & 1) * 4, _mm_set1_ps(value));
}

/* The slot of block b in its quad: blocks 4q, 4q+1, 4q+2, 4q+3 sit in slots 0, 2, 1, 3. */
static inline int quad_slot(int b) { return (b & 1) * 2 + ((b >> 1) & 1); }

/* The same for the GEMM's layout: block b's bytes, and its lanes' scale (each of them gets `value`). */
static inline void gemm_place_block(GemmLayout L, void *row, int b, __m256i v) {
    if (b >= L.nq * GEMM_QUAD) {
        place_block((uint8_t *)row + (int64_t)L.nq * GEMM_QUAD * 32, b - L.nq * GEMM_QUAD, v);
        return;
    }
    enum { SLOT = 32 / GEMM_QUAD };
    uint8_t bytes[32], *dst = (uint8_t *)row + (int64_t)(b / GEMM_QUAD) * GEMM_QUAD * 32 + quad_slot(b) * SLOT;
    _mm256_storeu_si256((__m256i *)bytes, v);
    for (int k = 0; k < GEMM_QUAD; k++) memcpy(dst + 32 * k, bytes + SLOT * k, SLOT);
}
static inline void gemm_place_scale(GemmLayout L, float *row8, int b, float value) {
    if (b >= L.nq * GEMM_QUAD) {
        place_scale(row8 + (int64_t)L.nq * 8, b - L.nq * GEMM_QUAD, value);
        return;
    }
    const int lanes = 8 / GEMM_QUAD;
    for (int l = 0; l < lanes; l++) row8[(b / GEMM_QUAD) * 8 + quad_slot(b) * lanes + l] = value;
}

/* One 32-block of activations as int8 (rounded half to even, as nearbyintf in the default mode) with
 * dx = amax / 127, and the sum of its int8 values. */
static inline __m256i quantize_block(const float *xb, float *dx, int *sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(xb + 8 * k);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float a = _mm_cvtss_f32(m);
    const __m256 inv = _mm256_set1_ps(a > 0.0f ? 127.0f / a : 0.0f);
    __m256i q[4];
    for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], inv)); /* |q| <= 127 */
    /* int32 -> int16 -> int8; the packs interleave 128-bit lanes, the permute restores the order */
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    s = _mm_hadd_epi32(s, s);
    *sum = _mm_cvtsi128_si32(_mm_hadd_epi32(s, s));
    *dx = a / 127.0f;
    return _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* An activation row into the GEMM's layout: values qx, dx8 in each block's lanes, and each block's dx * sum(qx)
 * either shared out over its lanes of sx8 (the GEMV's minimum term) or at sums[b * rows8] (the GEMM's); NULL: not
 * wanted. */
static void quantize_row_gemm(GemmLayout L, const float *x, int cols, int8_t *qx, float *dx8, float *sx8, float *sums,
                              int64_t rows8) {
    const int nb = cols / QK;
    for (int b = 0; b < nb; b++) {
        float dx;
        int sum;
        gemm_place_block(L, qx, b, quantize_block(x + b * QK, &dx, &sum));
        gemm_place_scale(L, dx8, b, dx);
        if (sx8) gemm_place_scale(L, sx8, b, dx * (float)sum / (b < L.nq * GEMM_QUAD ? 8 / GEMM_QUAD : 4));
        if (sums) sums[b * rows8] = dx * (float)sum;
    }
    if ((nb - L.nq * GEMM_QUAD) & 1) { /* the last pair's zero partner */
        gemm_place_block(L, qx, nb, _mm256_setzero_si256());
        gemm_place_scale(L, dx8, nb, 0.0f);
        if (sx8) gemm_place_scale(L, sx8, nb, 0.0f);
    }
}

/* Room for `rows` activation rows of cw value bytes and sw scales each (members NULL where memory is short). */
static ActPairs act_alloc(int rows, int64_t cw, int64_t sw) {
    return (ActPairs){aligned_alloc(32, (size_t)rows * cw), aligned_alloc(32, sizeof(float) * rows * sw),
                      aligned_alloc(32, sizeof(float) * rows * sw)};
}
static int act_pairs_ok(ActPairs a) { return a.qx && a.dx8 && a.sx8; }
static void act_pairs_free(ActPairs a) { free(a.qx), free(a.dx8), free(a.sx8); }

static void unpack_tile(int qtype, const uint8_t *w, int64_t w_row_bytes, int nr, int nb, GemmLayout L, WTile t) {
    const int bb = block_bytes(qtype);
    for (int i = 0; i < nr; i++) {
        uint8_t *u = t.u + i * L.cw;
        int8_t *s = t.s + i * L.cw;
        float *d8 = t.d8 + i * L.sw, *m = t.m + i * nb;
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = w + (int64_t)i * w_row_bytes + (int64_t)b * bb;
            const float d = fp16_at(blk);
            gemm_place_scale(L, d8, b, d);
            if (qtype == Q8_0) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 2));
                gemm_place_block(L, s, b, q);
                gemm_place_block(L, u, b, _mm256_sign_epi8(q, q));
            } else {
                const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + (qtype == Q4_1 ? 4 : 2)));
                gemm_place_block(L, u, b, q4_nibbles(raw));
                m[b] = qtype == Q4_1 ? fp16_at(blk + 2) : -8.0f * d;
            }
        }
        if ((nb - L.nq * GEMM_QUAD) & 1) {
            gemm_place_block(L, u, nb, _mm256_setzero_si256());
            gemm_place_block(L, s, nb, _mm256_setzero_si256());
            gemm_place_scale(L, d8, nb, 0.0f);
        }
    }
}

/* The integer dots of G consecutive 32-byte vectors of weights (uk; Q8_0: |q|, its signed q in sk, registers or the
 * GEMM's aligned tile) and activations x: 8 int32 lanes (for Q4 the maddubs sums are added in 16 bits first: see
 * above). The GEMM and the GEMV both take their dots here. */
static inline __attribute__((always_inline)) __m256i group_dot(int qtype, int G, const __m256i *uk, const __m256i *sk,
                                                               const int8_t *x) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc16 = _mm256_setzero_si256(), acc32 = _mm256_setzero_si256();
    for (int k = 0; k < G; k++) {
        __m256i xk = _mm256_load_si256((const __m256i *)(x + 32 * k));
        if (qtype == Q8_0) { /* u <= 128, |x| <= 127: a pair sums to at most 2 * 128 * 127 < 2^15 */
            xk = _mm256_sign_epi8(xk, sk[k]);
            const __m256i dk = _mm256_madd_epi16(_mm256_maddubs_epi16(uk[k], xk), ones);
            acc32 = k ? _mm256_add_epi32(acc32, dk) : dk;
        } else {
            const __m256i pk = _mm256_maddubs_epi16(uk[k], xk);
            acc16 = k ? _mm256_add_epi16(acc16, pk) : pk;
        }
    }
    return qtype == Q8_0 ? acc32 : _mm256_madd_epi16(acc16, ones);
}

/* acc[i][j] += group g's dots (G blocks' vectors at byte offset `off`, scales at float offset g * 8) of weight row i
 * and activation row j, scaled (the Q4 minimum term is added afterwards: gemm_tile_of). Each weight row's vectors
 * are loaded once for all NJ activation rows. */
static inline __attribute__((always_inline)) void gemm_group(int qtype, int G, WTile t, ActGemm a, GemmLayout L,
                                                             int64_t off, int g, int NI, int NJ,
                                                             __m256 acc[GEMM_RM][GEMM_RN]) {
    for (int i = 0; i < NI; i++) {
        /* Q8_0: keeps GCC from hoisting the activation loads of every row i (16 registers do not hold them and the
         * accumulators: it spilled, and the head's GEMM ran ~12% slower than with them reloaded) */
        if (qtype == Q8_0) __asm__ volatile("" ::: "memory");
        __m256i uk[GEMM_QUAD];
        for (int k = 0; k < G; k++) uk[k] = _mm256_load_si256((const __m256i *)(t.u + i * L.cw + off + 32 * k));
        const __m256 d = _mm256_load_ps(t.d8 + i * L.sw + g * 8);
        for (int j = 0; j < NJ; j++) {
            const __m256i *sk = (const __m256i *)(t.s + i * L.cw + off);
            const __m256i dot = group_dot(qtype, G, uk, sk, a.qx + j * L.cw + off);
            const __m256 scale = _mm256_mul_ps(d, _mm256_load_ps(a.dx8 + j * L.sw + g * 8));
            acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[i][j]);
        }
    }
}

/* out[j][i] = x row j . weight row i for the tile's rows i < NI and activation rows j < NJ (constants after
 * inlining), before bias. */
static inline __attribute__((always_inline)) void gemm_micro(int qtype, WTile t, ActGemm a, GemmLayout L, int NI,
                                                             int NJ, float out[GEMM_RN][GEMM_RM]) {
    __m256 acc[GEMM_RM][GEMM_RN];
    for (int i = 0; i < NI; i++)
        for (int j = 0; j < NJ; j++) acc[i][j] = _mm256_setzero_ps();
    for (int q = 0; q < (qtype == Q8_0 ? 0 : L.nq); q++) /* Q8_0: pairs only (gemm_layout) */
        gemm_group(qtype, GEMM_QUAD, t, a, L, (int64_t)q * GEMM_QUAD * 32, q, NI, NJ, acc);
    for (int p = 0; p < L.np; p++)
        gemm_group(qtype, 2, t, a, L, (int64_t)L.nq * GEMM_QUAD * 32 + p * 64, L.nq + p, NI, NJ, acc);
    if (NI == GEMM_RM && NJ == GEMM_RN) { /* the 8 sums at once: lanes [i0j0 i1j0 i2j0 i3j0 | i0j1 .. i3j1] */
        const __m256 h0 = _mm256_hadd_ps(acc[0][0], acc[1][0]), h1 = _mm256_hadd_ps(acc[2][0], acc[3][0]);
        const __m256 h2 = _mm256_hadd_ps(acc[0][1], acc[1][1]), h3 = _mm256_hadd_ps(acc[2][1], acc[3][1]);
        const __m256 g0 = _mm256_hadd_ps(h0, h1), g1 = _mm256_hadd_ps(h2, h3);
        float v[8];
        _mm256_storeu_ps(v, _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31)));
        for (int j = 0; j < GEMM_RN; j++)
            for (int i = 0; i < GEMM_RM; i++) out[j][i] = v[j * GEMM_RM + i];
        return;
    }
    for (int i = 0; i < NI; i++)
        for (int j = 0; j < NJ; j++) out[j][i] = hsum8(acc[i][j]);
}

/* The Q4 minimum term of weight rows i < ni and activation rows r0..r0+7: corr[i][k] = sum over blocks of m_ib times
 * row r0 + k's dx * sum(qx) of block b (8 rows a vector; rows past the last are zeros). */
static void gemm_min_term(WTile t, ActGemm a, int nb, int ni, int64_t r0, float corr[GEMM_RM][8]) {
    for (int i = 0; i < ni; i++) {
        __m256 c = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++)
            c = _mm256_fmadd_ps(_mm256_set1_ps(t.m[i * nb + b]), _mm256_loadu_ps(a.sums + b * a.rows8 + r0), c);
        _mm256_storeu_ps(corr[i], c);
    }
}

static inline __attribute__((always_inline)) void gemm_tile_of(int qtype, WTile t, ActGemm a, GemmLayout L, int nb,
                                                               int ni, int rows, int o0, const float *bias, float *y,
                                                               int64_t y_row) {
    float corr[GEMM_RM][8] = {{0.0f}};
    for (int r0 = 0; r0 < rows; r0 += GEMM_RN) {
        if (qtype != Q8_0 && r0 % 8 == 0) gemm_min_term(t, a, nb, ni, r0, corr);
        const int nj = rows - r0 < GEMM_RN ? rows - r0 : GEMM_RN;
        const ActGemm ar = {a.qx + r0 * L.cw, a.dx8 + r0 * L.sw, a.sums, a.rows8};
        float out[GEMM_RN][GEMM_RM];
        if (ni == GEMM_RM && nj == GEMM_RN)
            gemm_micro(qtype, t, ar, L, GEMM_RM, GEMM_RN, out);
        else if (ni == GEMM_RM)
            gemm_micro(qtype, t, ar, L, GEMM_RM, 1, out);
        else
            for (int i = 0; i < ni; i++) {
                const WTile ti = {t.u + i * L.cw, t.s + i * L.cw, t.d8 + i * L.sw, t.m + i * nb};
                for (int j = 0; j < nj; j++) {
                    const ActGemm aj = {ar.qx + j * L.cw, ar.dx8 + j * L.sw, a.sums, a.rows8};
                    float one[GEMM_RN][GEMM_RM];
                    gemm_micro(qtype, ti, aj, L, 1, 1, one);
                    out[j][i] = one[0][0];
                }
            }
        for (int j = 0; j < nj; j++)
            for (int i = 0; i < ni; i++)
                y[(r0 + j) * y_row + o0 + i] = out[j][i] + corr[i][(r0 + j) % 8] + (bias ? bias[o0 + i] : 0.0f);
    }
}

static void gemm_tile(int qtype, WTile t, ActGemm a, GemmLayout L, int nb, int ni, int rows, int o0,
                      const float *bias, float *y, int64_t y_row) {
    switch (qtype) {
    case Q4_0: gemm_tile_of(Q4_0, t, a, L, nb, ni, rows, o0, bias, y, y_row); break;
    case Q4_1: gemm_tile_of(Q4_1, t, a, L, nb, ni, rows, o0, bias, y, y_row); break;
    default: gemm_tile_of(Q8_0, t, a, L, nb, ni, rows, o0, bias, y, y_row); break;
    }
}

/* Puts weight rows [0, ni) of a tile into the GEMM's layout; `kind` says what the blocks are (a ggml type id). */
typedef void (*unpack_fn)(int kind, const uint8_t *w, int64_t w_row_bytes, int ni, int nb, GemmLayout L, WTile t);

/* The tiled int8 GEMM: the activations quantized once into the GEMM's layout, then tiles of GEMM_RM weight rows
 * unpacked by `unpack(kind, ...)` and multiplied as the legacy type `qtype`'s by every activation row (quant_gemm_q8's
 * Q4_0 / Q4_1 / Q8_0, and the formats that unpack into them: quant/gemm_b32.h). 0, or -2 (memory). */
static int tiled_gemm(int qtype, unpack_fn unpack, int kind, const uint8_t *w, int64_t w_row_bytes, int out_features,
                      int in_features, const float *x, int64_t x_row, int rows, const float *bias, float *y,
                      int64_t y_row, int num_threads) {
    const int nb = in_features / QK;
    const GemmLayout L = gemm_layout(qtype, nb);
    const int64_t rows8 = (rows + 7) / 8 * 8;
    const ActGemm a = {aligned_alloc(32, (size_t)rows * L.cw), aligned_alloc(32, sizeof(float) * rows * L.sw),
                       calloc((size_t)nb * rows8, sizeof(float)), rows8};
    int status = 0;
    if (!a.qx || !a.dx8 || !a.sums) {
        status = -2;
        goto done;
    }
    const int threads = threads_for((int64_t)out_features * in_features * rows, num_threads);
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int r = 0; r < rows; r++)
            quantize_row_gemm(L, x + r * x_row, in_features, a.qx + r * L.cw, a.dx8 + r * L.sw, NULL, a.sums + r,
                              a.rows8);
        uint8_t *u = aligned_alloc(32, GEMM_RM * L.cw);
        int8_t *sq = aligned_alloc(32, GEMM_RM * L.cw);
        /* d8 lanes, then the minimum per block; aligned_alloc wants a multiple of the alignment */
        float *scales = aligned_alloc(32, (sizeof(float) * GEMM_RM * (L.sw + nb) + 31) / 32 * 32);
        if (!u || !sq || !scales) {
#pragma omp atomic write
            status = -2;
        }
        const int tiles = (out_features + GEMM_RM - 1) / GEMM_RM;
#pragma omp for schedule(dynamic, 1)
        for (int tile = 0; tile < tiles; tile++) {
            if (!u || !sq || !scales) continue;
            const int o0 = tile * GEMM_RM, ni = out_features - o0 < GEMM_RM ? out_features - o0 : GEMM_RM;
            const WTile t = {u, sq, scales, scales + GEMM_RM * L.sw};
            unpack(kind, w + (int64_t)o0 * w_row_bytes, w_row_bytes, ni, nb, L, t);
            gemm_tile(qtype, t, a, L, nb, ni, rows, o0, bias, y, y_row);
        }
        free(u), free(sq), free(scales);
    }
done:
    free(a.qx), free(a.dx8), free(a.sums);
    return status;
}
#endif
