/* Paged decode attention in 8-float vectors: the kernel attention.c runs on CPUs without AVX-512 (AVX2: sixteen
 * 256-bit registers), and for int8 and fp16 caches on AVX-512 ones too. attention.c's 16-float kernel keeps a sequence's queries, accumulators and a chunk's partial
 * sums in 16-lane vectors; compiled for AVX2 each is a pair of registers, GCC spills most of them to the stack and
 * turns its int8 loads into scalar conversions, so that kernel is bound by its own loads and stores (measured on a
 * 2-core Zen 3, 64 x 1,024 tokens: bf16 25 ms, int8 37 ms a call; this one: 7 and 5 ms). Per sequence:
 *
 * - chunks of 16 tokens (8 where the block size is no multiple of 16; shorter where a block ends): a chunk never
 *   leaves its block. Every cache line of the chunk (and its int8 scales) is touched first, as independent loads the
 *   core overlaps, and the next chunk is prefetched: reading head by head, each line was waited for in turn;
 * - scores, per KV head: each key row loaded (converted) once into registers and multiplied against the query heads
 *   that share it, into one 8-lane partial sum per head and token; 8 partial sums reduce to 8 scores in one
 *   transpose-and-add (reduce8);
 * - online softmax in fp32 for every KV head before any values, so the heads' long dependency chains overlap; one
 *   vexp8 gives the rescale factors of all query heads of a KV head;
 * - values: a column block of 8 at a time, every query head's accumulator in a register, each token's weight a
 *   broadcast probability.
 *
 * int8 caches: the chunk's key scales multiply its scores and each value scale is folded into its token's
 * probability, so dequantization costs two multiplies per token and head, not one per element.
 */
#ifndef PAGEDCHAT_ATTENTION8_H
#define PAGEDCHAT_ATTENTION8_H

#ifdef __AVX2__
#include <immintrin.h>
#endif

typedef int8_t v8b __attribute__((vector_size(8)));

#define MAX_C8 32 /* head_dim <= 256 */

static inline v8 load8_i8(const int8_t *p) {
#ifdef __AVX2__ /* GCC lowers the generic conversion to eight scalar ones */
    return (v8)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#else
    v8b b;
    memcpy(&b, p, sizeof b);
    return __builtin_convertvector(b, v8);
#endif
}

typedef _Float16 v8hf __attribute__((vector_size(16)));
static inline v8 load8_f16(const uint16_t *p) {
#ifdef __F16C__
    return (v8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    v8hf h;
    memcpy(&h, p, sizeof h);
    return __builtin_convertvector(h, v8);
#endif
}

static inline float hmax8(v8 x) {
    x = vsel8(x > SHUF(x, x, 4, 5, 6, 7, 0, 1, 2, 3), x, SHUF(x, x, 4, 5, 6, 7, 0, 1, 2, 3));
    x = vsel8(x > SHUF(x, x, 2, 3, 0, 1, 6, 7, 4, 5), x, SHUF(x, x, 2, 3, 0, 1, 6, 7, 4, 5));
    x = vsel8(x > SHUF(x, x, 1, 0, 3, 2, 5, 4, 7, 6), x, SHUF(x, x, 1, 0, 3, 2, 5, 4, 7, 6));
    return x[0];
}
/* Lane t of the result is the sum of the lanes of r[t]: three rounds of pairwise shuffles and adds. */
static inline v8 reduce8(const v8 *r) {
    v8 a[4], b[2];
    for (int i = 0; i < 4; i++) /* lanes 0-3: halves of r[2i]; 4-7: of r[2i+1] */
        a[i] = SHUF(r[2 * i], r[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
               SHUF(r[2 * i], r[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
    for (int i = 0; i < 2; i++) /* two lanes each of r[4i .. 4i+3] */
        b[i] = SHUF(a[2 * i], a[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
               SHUF(a[2 * i], a[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15);
    return SHUF(b[0], b[1], 0, 2, 4, 6, 8, 10, 12, 14) + SHUF(b[0], b[1], 1, 3, 5, 7, 9, 11, 13, 15);
}

static inline v8 broadcast8(const float *p) {
#ifdef __AVX2__
    return (v8)_mm256_broadcast_ss(p); /* one load, no shuffle */
#else
    return (v8){0} + *p;
#endif
}

/* One sequence, every head, in 8-lane vectors. T: q/out element; KT: cache element; Q8: int8 caches with scales;
 * NC: head_dim / 8 and NG: query heads per KV head, compile-time in the specialised copies (0: from the job);
 * CH: tokens per chunk, 8 or 16 (shorter where a block ends first). */
#define DEFINE_SEQUENCE8(NAME, T, LOAD, STORE, KT, KLOAD, Q8, NC, NG, CH)                                       \
    static void NAME(const job_t *j, int item) {                                                                \
        enum { NV = (CH) / W8 }; /* score vectors per chunk */                                                  \
        const int nc = (NC) ? (NC) : j->head_dim / W8, ng = (NG) ? (NG) : j->num_heads / j->num_kv_heads;       \
        int lo, len; /* len: the end of this item's tokens */                                                   \
        const int s = item_range(j, item, &lo, &len);                                                           \
        const int hq = j->num_heads, hkv = j->num_kv_heads, bs = j->block_size;                                 \
        v8 q[hq][nc], acc[hq][nc];                                                                              \
        float m[hq], l[hq];                                                                                     \
        for (int hh = 0; hh < hq; hh++) {                                                                       \
            const T *qp = (const T *)j->q + j->rows[s] * j->q_row + hh * j->q_head;                             \
            for (int c = 0; c < nc; c++) {                                                                      \
                q[hh][c] = LOAD(qp + c * W8) * j->scale;                                                        \
                acc[hh][c] = (v8){0};                                                                           \
            }                                                                                                   \
            m[hh] = -INFINITY;                                                                                  \
            l[hh] = 0.f;                                                                                        \
        }                                                                                                       \
        const int32_t *table = j->tables + s * j->t_row;                                                        \
        const v8 lane = {0, 1, 2, 3, 4, 5, 6, 7};                                                               \
        for (int t0 = lo, n = 0; t0 < len; t0 += n) {                                                           \
            n = len - t0 < (CH) ? len - t0 : (CH); /* a chunk never leaves its block (when bs is no multiple */ \
            if (bs - t0 % bs < n) n = bs - t0 % bs; /* of CH, some chunks are shorter) */                       \
            const int64_t block = table[t0 / bs], off = t0 % bs;                                                \
            const int64_t base = block * j->c_block + off * j->c_tok;                                           \
            const int64_t sbase = Q8 ? block * j->s_block + off * j->s_tok : 0;                                 \
            { /* touch every line of the chunk first: independent loads the core issues together, where the     \
               * compute below would reach each line only after the previous one's arithmetic */                \
                const char *pk = (const char *)((const KT *)j->k + base);                                       \
                const char *pv = (const char *)((const KT *)j->v + base);                                       \
                const int64_t bytes = (int64_t)n * j->c_tok * (int64_t)sizeof(KT);                              \
                uint8_t sink = 0;                                                                               \
                for (int64_t o = 0; o < bytes; o += 64) sink |= pk[o] | pv[o];                                  \
                if (Q8) /* and the chunk's scales, which sit in tensors of their own */                         \
                    for (int64_t o = 0; o < (int64_t)n * j->s_tok * 2; o += 64)                                 \
                        sink |= ((const char *)(j->k_scale + sbase))[o] | ((const char *)(j->v_scale + sbase))[o]; \
                __asm__ volatile("" : : "r"(sink));                                                             \
                if (t0 + n < len) {                                                                             \
                    const int64_t nb = (int64_t)table[(t0 + n) / bs] * j->c_block + ((t0 + n) % bs) * j->c_tok; \
                    const char *qk = (const char *)((const KT *)j->k + nb), *qv = (const char *)((const KT *)j->v + nb); \
                    for (int64_t o = 0; o < (int64_t)(CH) * j->c_tok * (int64_t)sizeof(KT); o += 64) {          \
                        __builtin_prefetch(qk + o);                                                             \
                        __builtin_prefetch(qv + o);                                                             \
                    }                                                                                           \
                }                                                                                               \
            }                                                                                                   \
            v8 pw[hq][CH]; /* every head's probabilities (times the value scales), broadcast */                 \
            /* scores and softmax for every KV head first, then the values: the softmax's long dependency       \
             * chains of the heads overlap, where head by head each waited for its own */                       \
            for (int h = 0; h < hkv; h++) {                                                                     \
                const KT *kb = (const KT *)j->k + base + h * j->c_head;                                         \
                v8 part[MAX_G][CH]; /* per head and token: 8 partial sums of the dot product */                 \
                /* each key row loaded (converted) once, in registers, against every query head */              \
                for (int t = 0; t < (CH); t++) {                                                                \
                    if (t >= n) {                                                                               \
                        for (int g = 0; g < ng; g++) part[g][t] = (v8){0};                                      \
                        continue;                                                                               \
                    }                                                                                           \
                    v8 kt[MAX_C8];                                                                              \
                    for (int c = 0; c < nc; c++) kt[c] = KLOAD(kb + t * j->c_tok + c * W8);                     \
                    for (int g = 0; g < ng; g++) {                                                              \
                        const v8 *qg = q[h * ng + g];                                                           \
                        v8 a0 = qg[0] * kt[0], a1 = (v8){0};                                                    \
                        for (int c = 1; c < nc; c++) {                                                          \
                            if (c & 1)                                                                          \
                                a1 += qg[c] * kt[c];                                                            \
                            else                                                                                \
                                a0 += qg[c] * kt[c];                                                            \
                        }                                                                                       \
                        part[g][t] = a0 + a1;                                                                   \
                    }                                                                                           \
                }                                                                                               \
                v8 ks[NV], vs[NV]; /* int8: the chunk's key and value scales */                                 \
                if (Q8) {                                                                                       \
                    float kt[CH], vt[CH];                                                                       \
                    for (int t = n; t < (CH); t++) kt[t] = vt[t] = 0.f;                                         \
                    for (int t = 0; t < n; t++) {                                                               \
                        kt[t] = f16_to_f32(j->k_scale[sbase + t * j->s_tok + h]);                               \
                        vt[t] = f16_to_f32(j->v_scale[sbase + t * j->s_tok + h]);                               \
                    }                                                                                           \
                    for (int v = 0; v < NV; v++) {                                                              \
                        ks[v] = load8_f32(kt + v * W8);                                                         \
                        vs[v] = load8_f32(vt + v * W8);                                                         \
                    }                                                                                           \
                }                                                                                               \
                /* online softmax: the chunk's scores, their max per head, one vexp8 for every head's rescale */ \
                v8 sc[MAX_G][NV];                                                                               \
                float m_old[MAX_G + W8], m_new[MAX_G + W8], corr[MAX_G + W8];                                   \
                for (int g = ng; g < (ng + W8 - 1) / W8 * W8; g++) m_old[g] = m_new[g] = 0.f; /* pad lanes */   \
                for (int g = 0; g < ng; g++) {                                                                  \
                    v8 mx = (v8){0} - INFINITY;                                                                 \
                    for (int v = 0; v < NV; v++) {                                                              \
                        v8 raw = reduce8(part[g] + v * W8);                                                     \
                        if (Q8) raw *= ks[v];                                                                   \
                        sc[g][v] = vsel8(lane + (float)(v * W8) < (float)n, raw, (v8){0} - INFINITY);           \
                        mx = vsel8(sc[g][v] > mx, sc[g][v], mx);                                                \
                    }                                                                                           \
                    const float chunk_max = hmax8(mx), old = m[h * ng + g];                                     \
                    m_old[g] = old;                                                                             \
                    m_new[g] = chunk_max > old ? chunk_max : old;                                               \
                }                                                                                               \
                for (int g = 0; g < ng; g += W8)                                                                \
                    store8_f32(corr + g, vexp8(load8_f32(m_old + g) - load8_f32(m_new + g)));                   \
                for (int g = 0; g < ng; g++) {                                                                  \
                    const int hh = h * ng + g;                                                                  \
                    v8 sum = {0};                                                                               \
                    float pf[CH];                                                                               \
                    for (int v = 0; v < NV; v++) {                                                              \
                        v8 pe = vsel8(lane + (float)(v * W8) < (float)n, vexp8(sc[g][v] - m_new[g]), (v8){0});  \
                        sum += pe;                                                                              \
                        if (Q8) pe *= vs[v];                                                                    \
                        store8_f32(pf + v * W8, pe);                                                            \
                    }                                                                                           \
                    for (int t = 0; t < (CH); t++) pw[hh][t] = broadcast8(pf + t);                              \
                    l[hh] = l[hh] * corr[g] + hsum8(sum);                                                       \
                    m[hh] = m_new[g];                                                                           \
                    if (m_new[g] != m_old[g])                                                                   \
                        for (int c = 0; c < nc; c++) acc[hh][c] *= corr[g];                                     \
                }                                                                                               \
            }                                                                                                   \
            for (int h = 0; h < hkv; h++) {                                                                     \
                const KT *vb = (const KT *)j->v + base + h * j->c_head;                                         \
                /* values: a column block of 8 at a time, every query head's accumulator in a register */       \
                for (int c = 0; c < nc; c++) {                                                                  \
                    v8 a[MAX_G];                                                                                \
                    for (int g = 0; g < ng; g++) a[g] = acc[h * ng + g][c];                                     \
                    for (int t = 0; t < n; t++) {                                                               \
                        const v8 vt = KLOAD(vb + t * j->c_tok + c * W8);                                        \
                        for (int g = 0; g < ng; g++) a[g] += pw[h * ng + g][t] * vt;                            \
                    }                                                                                           \
                    for (int g = 0; g < ng; g++) acc[h * ng + g][c] = a[g];                                     \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
        for (int hh = 0; hh < hq; hh++) {                                                                       \
            if (j->partial) { /* a piece: its state, merged by split_decode */                                  \
                float *pp = j->partial + ((int64_t)item * hq + hh) * SPLIT_STATE(j->head_dim);                  \
                pp[0] = m[hh], pp[1] = l[hh];                                                                   \
                for (int c = 0; c < nc; c++) store8_f32(pp + 2 + c * W8, acc[hh][c]);                           \
                continue;                                                                                       \
            }                                                                                                   \
            T *op = (T *)j->out + j->rows[s] * j->o_row + hh * j->o_head;                                       \
            const float inv = 1.f / l[hh];                                                                      \
            for (int c = 0; c < nc; c++) STORE(op + c * W8, acc[hh][c] * inv);                                  \
        }                                                                                                       \
    }

/* The common shapes specialised (head_dim / 8 and query heads per KV head constants, so a chunk's accumulators stay
 * in registers): SmolLM2's (head_dim 64, 3 query heads per KV head) with chunks of 16 or 8 tokens; Llama-3.2-1B's
 * (64, 4), -3B's (128, 3) and Llama-3.1-8B's (128, 4) with chunks of 16 (on Zen 4 the 1B's fp16 decode attention at
 * ~1,000 tokens took 2.3 ms a step unspecialised). Any other shape or block size: the generic copies. */
#define DEFINE_FAMILY8(PREFIX, T, LOAD, STORE, KT, KLOAD, Q8)                                                   \
    DEFINE_SEQUENCE8(PREFIX##_any_8, T, LOAD, STORE, KT, KLOAD, Q8, 0, 0, 8)                                    \
    DEFINE_SEQUENCE8(PREFIX##_any_16, T, LOAD, STORE, KT, KLOAD, Q8, 0, 0, 16)                                  \
    DEFINE_SEQUENCE8(PREFIX##_d64_g3_8, T, LOAD, STORE, KT, KLOAD, Q8, 8, 3, 8)                                 \
    DEFINE_SEQUENCE8(PREFIX##_d64_g3_16, T, LOAD, STORE, KT, KLOAD, Q8, 8, 3, 16)                               \
    DEFINE_SEQUENCE8(PREFIX##_d64_g4_16, T, LOAD, STORE, KT, KLOAD, Q8, 8, 4, 16)                               \
    DEFINE_SEQUENCE8(PREFIX##_d128_g3_16, T, LOAD, STORE, KT, KLOAD, Q8, 16, 3, 16)                             \
    DEFINE_SEQUENCE8(PREFIX##_d128_g4_16, T, LOAD, STORE, KT, KLOAD, Q8, 16, 4, 16)                             \
    static sequence_fn PREFIX##_pick(int nc8, int ng, int ch16) {                                               \
        if (nc8 == 8 && ng == 3) return ch16 ? PREFIX##_d64_g3_16 : PREFIX##_d64_g3_8;                          \
        if (ch16 && nc8 == 8 && ng == 4) return PREFIX##_d64_g4_16;                                             \
        if (ch16 && nc8 == 16 && ng == 3) return PREFIX##_d128_g3_16;                                           \
        if (ch16 && nc8 == 16 && ng == 4) return PREFIX##_d128_g4_16;                                           \
        return ch16 ? PREFIX##_any_16 : PREFIX##_any_8;                                                         \
    }

DEFINE_FAMILY8(f32, float, load8_f32, store8_f32, float, load8_f32, 0)
DEFINE_FAMILY8(bf16, bf16, load8_bf16, store8_bf16, bf16, load8_bf16, 0)
DEFINE_FAMILY8(i8f32, float, load8_f32, store8_f32, int8_t, load8_i8, 1)   /* int8 caches, fp32 q/out */
DEFINE_FAMILY8(i8bf16, bf16, load8_bf16, store8_bf16, int8_t, load8_i8, 1) /* int8 caches, bf16 q/out */
DEFINE_FAMILY8(h16f32, float, load8_f32, store8_f32, uint16_t, load8_f16, 0) /* fp16 caches, fp32 q/out */

/* The kernel for these dtypes, shape and block size; NULL for fp16 caches under bf16 queries. */
static sequence_fn pick8(int is_bf16, int kv_format, int nc8, int ng, int block_size) {
    const int ch16 = block_size % 16 == 0;
    if (kv_format == KV_F16) return is_bf16 ? NULL : h16f32_pick(nc8, ng, ch16);
    if (kv_format == KV_INT8) return is_bf16 ? i8bf16_pick(nc8, ng, ch16) : i8f32_pick(nc8, ng, ch16);
    return is_bf16 ? bf16_pick(nc8, ng, ch16) : f32_pick(nc8, ng, ch16);
}

#endif
