/* Q4_K / Q5_K's dots on AVX-512 (BW, VL; VNNI when there), included by quant/dots_q4k_q5k.h. The int8 dot: the
 * AVX2 dot's arithmetic at twice the width. A 64-byte load of nibbles holds sub-blocks [2k | 2k + 2] in its low
 * nibbles and [2k + 1 | 2k + 3] in its high ones, whereas 64 activations are [2k | 2k + 1]: two 128-bit-lane shuffles
 * per 128 weights put the weights in the activations' order, once for every row. Each row then costs, per 64
 * weights, one maddubs and one madd + add (AVX-512BW), or one vpdpbusd and half a vpdpwssd (VNNI: ~8-10% faster
 * at 4 to 8 rows on this Xeon, in cache). */
#if defined(__AVX512BW__) && defined(__AVX512VL__) && defined(QL_AVX2)
#define K45_ZMM 1
/* Rows a dot_q8 call may take (generic.h's kq_pass_rows), past kformat.h's KQ_ROWS: only acc stays in a register
 * per row (isum lives for one row's block), so 8 rows fit AVX-512's 32 registers beside the block's 8 vectors of
 * weights and scales; a pass of 8 unpacks a block once where two passes of 4 would unpack it twice. */
#define K45_Q8_ROWS 8

/* int16 element s of each 128-bit lane of the lower half, s + 1 in the upper (vpshufb indexes within lanes). */
static inline __m512i k45_pick(int s) {
    const long long lo = (long long)(0x0001000100010001ull * (uint64_t)((2 * s) | (2 * s + 1) << 8));
    const long long hi = (long long)(0x0001000100010001ull * (uint64_t)((2 * s + 2) | (2 * s + 3) << 8));
    return _mm512_set_epi64(hi, hi, hi, hi, lo, lo, lo, lo);
}

#ifdef __AVX512VNNI__
/* int16 elements [e x4, e + 2 x4] in each 128-bit lane of the lower half, [e + 1 x4, e + 3 x4] in the upper. */
static inline __m512i k45_pick_packed(int e) {
#define K45_Q(e) (long long)(0x0001000100010001ull * (uint64_t)((2 * (e)) | (2 * (e) + 1) << 8))
    return _mm512_set_epi64(K45_Q(e + 3), K45_Q(e + 1), K45_Q(e + 3), K45_Q(e + 1), K45_Q(e + 2), K45_Q(e),
                             K45_Q(e + 2), K45_Q(e));
#undef K45_Q
}
#endif

static inline __attribute__((always_inline)) void k45_dot_q8_zmm(int five, const uint8_t *wrow, int nb,
                                                                 const ActBlockK *act, int64_t act_row, int NR,
                                                                 float *sums) {
    const __m512i nib = _mm512_set1_epi8(0x0f), bit4 = _mm512_set1_epi8(0x10);
    __m256 acc[K45_Q8_ROWS];
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * K45_BYTES(five), *ql = blk + K45_QL(five);
        k45_prefetch(blk);
        uint64_t sc8, mn8;
        k45_scales(blk + 4, &sc8, &mn8);
        const __m512i scales = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
        __m512i w[4]; /* w[k]: sub-blocks [2k | 2k + 1] as bytes */
        for (int half = 0; half < 2; half++) {
            const __m512i v = _mm512_loadu_si512((const void *)(ql + 64 * half));
            const __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
            w[2 * half] = _mm512_shuffle_i64x2(lo, hi, 0x44);     /* lanes lo0 lo1 hi0 hi1 */
            w[2 * half + 1] = _mm512_shuffle_i64x2(lo, hi, 0xee); /* lanes lo2 lo3 hi2 hi3 */
        }
        if (five) { /* sub-block s's fifth bits: bit s of the 32 qh bytes, repeated in both halves */
            const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)));
            for (int k = 0; k < 4; k++) {
                const __m512i bits = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * k))),
                                                        _mm256_set1_epi8((char)(1 << (2 * k + 1))), 1);
                w[k] = _mm512_mask_add_epi8(w[k], _mm512_test_epi8_mask(h, bits), w[k], bit4);
            }
        }
#ifdef __AVX512VNNI__
        /* vpdpbusd sums 4 products a lane (<= 4 * 31 * 127: exact in 16 bits), so two sub-blocks' lanes pack into one
         * vector of int16 and one vpdpwssd applies the scales of both: 6 multiplies a row per block, not 8. Packed
         * [2k | 2k+1] and [2k+2 | 2k+3] hold, in each 128-bit lane, 4 sums of 2k then 4 of 2k+2 (lower half; upper:
         * 2k+1, 2k+3), whose scales k45_pick_packed lays out. */
        const __m512i s01 = _mm512_shuffle_epi8(scales, k45_pick_packed(0));
        const __m512i s23 = _mm512_shuffle_epi8(scales, k45_pick_packed(4));
#else
        __m512i s[4];
        for (int k = 0; k < 4; k++) s[k] = _mm512_shuffle_epi8(scales, k45_pick(2 * k));
#endif
        const __m256i mins = k45_pair_mins(mn8);
        const __m256 d = _mm256_set1_ps(fp16_at(blk)), dmin = _mm256_set1_ps(fp16_at(blk + 2));
        for (int r = 0; r < NR; r++) {
            const ActBlockK *a = act + r * act_row + b;
#ifdef __AVX512VNNI__
            const __m512i zero = _mm512_setzero_si512();
            __m512i dots[4];
            for (int k = 0; k < 4; k++)
                dots[k] = _mm512_dpbusd_epi32(zero, w[k], _mm512_loadu_si512((const void *)(a->qs + 64 * k)));
            __m512i isum = _mm512_dpwssd_epi32(zero, _mm512_packs_epi32(dots[0], dots[1]), s01);
            isum = _mm512_dpwssd_epi32(isum, _mm512_packs_epi32(dots[2], dots[3]), s23);
#else
            __m512i isum = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++) {
                const __m512i p = _mm512_maddubs_epi16(w[k], _mm512_loadu_si512((const void *)(a->qs + 64 * k)));
                isum = _mm512_add_epi32(isum, _mm512_madd_epi16(p, s[k]));
            }
#endif
            const __m256i isum8 = _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1));
            acc[r] = k45_block_end(acc[r], isum8, a, mins, d, dmin);
        }
    }
    for (int r = 0; r < NR; r++) sums[r] = hsum8(acc[r]);
}
/* The exact dot on AVX-512: a sub-block's 16 (Q5_K: 32) possible weights, d sc q - dmin m for every q, computed once
 * as the reference computes each weight, then 16 weights at a time are a vpermps (vpermt2ps) lookup by their quants:
 * 3 to 6 instructions per 16 weights for every row, then one FMA per row. */
static inline __attribute__((always_inline)) void k45_dot_f32_zmm(int five, const uint8_t *wrow, int nb,
                                                                  const float *x, int64_t x_row, int NR,
                                                                  float *sums) {
    const __m512 levels = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 levels16 = _mm512_add_ps(levels, _mm512_set1_ps(16.0f));
    const __m512i nib = _mm512_set1_epi32(15), one = _mm512_set1_epi32(1);
    __m512 acc[KQ_ROWS];
    for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (int64_t)b * K45_BYTES(five), *qh = blk + 16, *ql = blk + K45_QL(five);
        k45_prefetch(blk);
        uint8_t sc[8], mn[8];
        k45_scale_bytes(blk, sc, mn);
        const float d = fp16_at(blk), dmin = fp16_at(blk + 2);
        const float *xb = x + (int64_t)b * QK_K;
        __m512i h[2];
        for (int g = 0; g < 2 && five; g++) h[g] = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qh + 16 * g)));
        for (int s = 0; s < 8; s++) { /* sub-block s: the low (s even) or high nibbles of 32 bytes */
            const __m512 d1 = _mm512_set1_ps(d * (float)sc[s]), m1 = _mm512_set1_ps(dmin * (float)mn[s]);
            const __m512 table = _mm512_sub_ps(_mm512_mul_ps(d1, levels), m1);
            const __m512 table16 = five ? _mm512_sub_ps(_mm512_mul_ps(d1, levels16), m1) : table;
            for (int g = 0; g < 2; g++) {
                const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(ql + 32 * (s / 2) + 16 * g)));
                __m512i q = s % 2 ? _mm512_srli_epi32(v, 4) : v; /* vpermps reads the low 4 bits only */
                __m512 w;
                if (five) {
                    q = _mm512_and_si512(q, nib);
                    q = _mm512_or_si512(q, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h[g], s), one), 4));
                    w = _mm512_permutex2var_ps(table, q, table16);
                } else {
                    w = _mm512_permutexvar_ps(q, table);
                }
                for (int r = 0; r < NR; r++)
                    acc[r] = _mm512_fmadd_ps(w, _mm512_loadu_ps(xb + r * x_row + 32 * s + 16 * g), acc[r]);
            }
        }
    }
    for (int r = 0; r < NR; r++) sums[r] = _mm512_reduce_add_ps(acc[r]);
}
#endif
