/* Paged decode attention for the CPU: one query token per sequence, K/V read in place from the paged cache.
 *
 * Built and loaded by engine/native/attention.py (cc -O3 -march=native, ctypes). Plain C with GCC/Clang
 * vector extensions. Two kernels of one algorithm: attention8.h's, 8-float vectors, runs every cache on AVX2 CPUs and
 * int8 and fp16 caches everywhere; on AVX-512 CPUs caches of the query's dtype (bf16, fp32) run this file's 16-float
 * one (simd.h; head_dim a multiple of 16). Online softmax in fp32 over chunks of up to 16 tokens; the 16 scores of a
 * chunk come out of one transpose-and-add reduction, not 16 horizontal sums. Caches [num_blocks, block_size,
 * num_kv_heads, head_dim] are addressed through element strides, so any layout with a unit head_dim stride works.
 *
 * int8 caches (kernels/reference.py's quantize_kv_ref): one fp16 scale per token and KV head, in scale tensors
 * [num_blocks, block_size, num_kv_heads]. The kernel converts int8 to fp32 and multiplies each chunk's scores by
 * the K scales, and each probability by its token's V scale: two multiplies per token, not one per element.
 *
 * fp16 caches under fp32 queries (kv_format KV_F16): half the bytes of fp32 a token, converted to fp32 as they are
 * loaded (F16C); everything else as for fp32 caches. store_kv_f16 saturates values beyond fp16's range at +-65504 (an
 * infinity would turn attention into NaN).
 *
 * Threads take whole sequences; with fewer sequences than threads (one conversation alone) each context is cut into
 * block-aligned pieces whose softmax states are merged (split_decode), as flash-decoding does on GPUs.
 */
#include <stdlib.h>

#include "simd.h"

#define MAX_C 16 /* head_dim <= 256 */

typedef _Float16 vhf __attribute__((vector_size(32)));

/* What the caches hold (paged_decode's kv_format): q's dtype, int8 with fp16 scales, or fp16 under fp32 queries. */
enum { KV_SAME = 0, KV_INT8 = 1, KV_F16 = 2 };

static inline float f16_to_f32(uint16_t x) {
    _Float16 h;
    memcpy(&h, &x, 2);
    return (float)h;
}
static inline uint16_t f32_to_f16(float f) { /* round to nearest even, as torch's .to(float16) */
    const _Float16 h = (_Float16)f;
    uint16_t x;
    memcpy(&x, &h, 2);
    return x;
}
#define MAX_G 16 /* query heads per kv head */

/* Lane t of the result is the sum of the lanes of r[t]: four rounds of pairwise shuffles and adds. */
static inline vf reduce16(const vf *r) {
    vf a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) /* lanes 0-7: halves of r[2i]; 8-15: of r[2i+1] */
        a[i] = SHUF(r[2 * i], r[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               SHUF(r[2 * i], r[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; i++) /* four lanes each of r[4i .. 4i+3] */
        b[i] = SHUF(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               SHUF(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (int i = 0; i < 2; i++) /* two lanes each of r[8i .. 8i+7] */
        c[i] = SHUF(b[2 * i], b[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
               SHUF(b[2 * i], b[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    return SHUF(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           SHUF(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

typedef struct {
    const void *q, *k, *v;
    const uint16_t *k_scale, *v_scale;    /* int8 caches: fp16 scales [num_blocks, block_size, num_kv_heads] */
    int64_t s_block, s_tok;               /* their strides (unit stride over heads) */
    void *out;
    int64_t q_row, q_head, o_row, o_head; /* element strides of q / out: [rows, heads, head_dim] */
    int64_t c_block, c_tok, c_head;       /* element strides of the caches */
    const int32_t *rows;                  /* query (and output) row of each sequence */
    const int32_t *seq_lens;              /* context length, the query token included */
    const int32_t *tables;                /* block table rows */
    int64_t t_row;
    int num_heads, num_kv_heads, head_dim, block_size;
    float scale;
    /* split decoding (fewer sequences than threads): work item i is piece i % parts of sequence i / parts, tokens
     * [piece * span, piece * span + span), and writes its unnormalized state to partial (see SPLIT_STATE) */
    int parts, span;
    float *partial;
} job_t;

/* A piece's state per query head in `partial`: its running max m, its sum l, then head_dim unnormalized outputs. */
#define SPLIT_STATE(head_dim) (2 + (head_dim))

/* Work item -> its sequence and token range [*lo, *hi); the whole sequence unless the job is split. */
static inline int item_range(const job_t *j, int item, int *lo, int *hi) {
    const int s = j->parts > 1 ? item / j->parts : item, len = j->seq_lens[s];
    *lo = j->parts > 1 ? item % j->parts * j->span : 0;
    *hi = j->parts > 1 && *lo + j->span < len ? *lo + j->span : len;
    return s;
}

/* One sequence, every head. NC (vectors per head) and NG (query heads per kv head) are compile-time constants in
 * the specialised copies, so the accumulators of a chunk stay in registers; 0 means "read them from the job". */
#define DEFINE_SEQUENCE(NAME, T, LOAD, STORE, NC, NG)                                                      \
    static void NAME(const job_t *j, int item) {                                                               \
        const int nc = (NC) ? (NC) : j->head_dim / W, ng = (NG) ? (NG) : j->num_heads / j->num_kv_heads;     \
        int lo, len; /* len: the end of this item's tokens */                                                   \
        const int s = item_range(j, item, &lo, &len), bs = j->block_size;                                       \
        vf q[j->num_heads][nc], acc[j->num_heads][nc], part[MAX_G][W];                                         \
        float m[j->num_heads], l[j->num_heads], p[MAX_G][W];                                                   \
        for (int hh = 0; hh < j->num_heads; hh++) {                                                            \
            const T *qp = (const T *)j->q + j->rows[s] * j->q_row + hh * j->q_head;                          \
            for (int c = 0; c < nc; c++) {                                                                     \
                q[hh][c] = LOAD(qp + c * W) * j->scale;                                                        \
                acc[hh][c] = (vf){0};                                                                          \
            }                                                                                                  \
            m[hh] = -INFINITY;                                                                                 \
            l[hh] = 0.f;                                                                                       \
        }                                                                                                      \
        const int32_t *table = j->tables + s * j->t_row;                                                       \
        for (int t0 = lo, n = 0; t0 < len; t0 += n) {                                                           \
            n = len - t0 < W ? len - t0 : W;                                                                    \
            if (bs - t0 % bs < n) n = bs - t0 % bs; /* a chunk never leaves its block */                        \
            const int64_t base = (int64_t)table[t0 / bs] * j->c_block + (t0 % bs) * j->c_tok;                \
            if (t0 + n < len) { /* the next chunk's rows, while this one computes */                            \
                const int t1 = t0 + n;                                                                          \
                const int64_t next = (int64_t)table[t1 / bs] * j->c_block + (t1 % bs) * j->c_tok;            \
                const char *pk = (const char *)((const T *)j->k + next);                                      \
                const char *pv = (const char *)((const T *)j->v + next);                                      \
                for (int64_t o = 0; o < (int64_t)W * j->c_tok * (int64_t)sizeof(T); o += 64) {                 \
                    __builtin_prefetch(pk + o);                                                                \
                    __builtin_prefetch(pv + o);                                                                \
                }                                                                                              \
            }                                                                                                  \
            const vf lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};                            \
            for (int h = 0; h < j->num_kv_heads; h++) {                                                        \
                const T *kb = (const T *)j->k + base + h * j->c_head;                                        \
                const T *vb = (const T *)j->v + base + h * j->c_head;                                        \
                vf(*qh)[nc] = q + h * ng, (*ah)[nc] = acc + h * ng;                                            \
                for (int t = 0; t < n; t++) { /* partial dot products, reduced 16 at a time below */          \
                    vf kt[MAX_C];                                                                              \
                    for (int c = 0; c < nc; c++) kt[c] = LOAD(kb + t * j->c_tok + c * W);                     \
                    for (int g = 0; g < ng; g++) {                                                             \
                        vf a = qh[g][0] * kt[0];                                                               \
                        for (int c = 1; c < nc; c++) a += qh[g][c] * kt[c];                                    \
                        part[g][t] = a;                                                                        \
                    }                                                                                          \
                }                                                                                              \
                for (int g = 0; g < ng; g++) {                                                                 \
                    const int hh = h * ng + g;                                                                 \
                    for (int t = n; t < W; t++) part[g][t] = (vf){0};                                          \
                    vf raw = reduce16(part[g]);                                                                \
                    const vf scores = vsel(lane < (float)n, raw, (vf){0} - INFINITY);                          \
                    const float chunk_max = hmax(scores), mx = chunk_max > m[hh] ? chunk_max : m[hh];          \
                    const float corr = expf(m[hh] - mx);                                                       \
                    const vf pe = vsel(lane < (float)n, vexp(scores - mx), (vf){0});                           \
                    l[hh] = l[hh] * corr + hsum(pe);                                                           \
                    m[hh] = mx;                                                                                \
                    memcpy(p[g], &pe, sizeof pe);                                                              \
                    for (int c = 0; c < nc; c++) ah[g][c] *= corr;                                             \
                }                                                                                              \
                vf a[MAX_G][MAX_C];                                                                            \
                for (int g = 0; g < ng; g++)                                                                   \
                    for (int c = 0; c < nc; c++) a[g][c] = ah[g][c];                                           \
                for (int t = 0; t < n; t++) {                                                                  \
                    vf vt[MAX_C];                                                                              \
                    for (int c = 0; c < nc; c++) vt[c] = LOAD(vb + t * j->c_tok + c * W);                     \
                    for (int g = 0; g < ng; g++)                                                               \
                        for (int c = 0; c < nc; c++) a[g][c] += p[g][t] * vt[c];                               \
                }                                                                                              \
                for (int g = 0; g < ng; g++)                                                                   \
                    for (int c = 0; c < nc; c++) ah[g][c] = a[g][c];                                           \
            }                                                                                                  \
        }                                                                                                      \
        for (int hh = 0; hh < j->num_heads; hh++) {                                                            \
            if (j->partial) { /* a piece: its state, merged by split_decode */                                 \
                float *pp = j->partial + ((int64_t)item * j->num_heads + hh) * SPLIT_STATE(j->head_dim);        \
                pp[0] = m[hh], pp[1] = l[hh];                                                                  \
                for (int c = 0; c < nc; c++) store_f32(pp + 2 + c * W, acc[hh][c]);                            \
                continue;                                                                                      \
            }                                                                                                  \
            T *op = (T *)j->out + j->rows[s] * j->o_row + hh * j->o_head;                                     \
            const float inv = 1.f / l[hh];                                                                     \
            for (int c = 0; c < nc; c++) STORE(op + c * W, acc[hh][c] * inv);                                  \
        }                                                                                                      \
    }

typedef void (*sequence_fn)(const job_t *, int);

#ifdef __AVX512F__ /* 16-float vectors are one register each */
DEFINE_SEQUENCE(bf16_any, bf16, load_bf16, store_bf16, 0, 0)
DEFINE_SEQUENCE(bf16_d64_g3, bf16, load_bf16, store_bf16, 4, 3)  /* SmolLM2 */
DEFINE_SEQUENCE(bf16_d64_g4, bf16, load_bf16, store_bf16, 4, 4)  /* Llama 3.2 1B */
DEFINE_SEQUENCE(bf16_d128_g4, bf16, load_bf16, store_bf16, 8, 4) /* Llama 3 8B, Mistral 7B */
DEFINE_SEQUENCE(f32_any, float, load_f32, store_f32, 0, 0)
DEFINE_SEQUENCE(f32_d64_g3, float, load_f32, store_f32, 4, 3)
/* The kernel for caches of q's dtype (KV_SAME) and these shapes (int8 and fp16 caches: attention8.h's, below). */
static sequence_fn pick(int is_bf16, int nc, int ng) {
    const int smollm = nc == 4 && ng == 3;
    if (!is_bf16) return smollm ? f32_d64_g3 : f32_any;
    if (smollm) return bf16_d64_g3;
    if (nc == 4 && ng == 4) return bf16_d64_g4;
    if (nc == 8 && ng == 4) return bf16_d128_g4;
    return bf16_any;
}
#endif
/* The same algorithm in 8-float vectors, laid out for sixteen registers: the kernel of AVX2 CPUs, and of int8 and fp16
 * caches on AVX-512 ones too. On a 2-core AMD EPYC (Zen 4, AVX-512 run as two 256-bit halves) `bench attention`
 * at 64 x 1,024 / 4,096 tokens went from the 16-float kernel to this one: int8 8.6 / 39.1 -> 3.1 / 14.3 ms a call,
 * fp16 9.6 / 39.3 -> 4.0 / 16.7 (docs/bench/attention-avx512-before.json, attention-avx512.json); bf16 and fp32,
 * measured the same way in the same hour, were mixed (bf16 5.5 / 21.8 -> 6.8 / 18.3, fp32 7.8 / 28.7 -> 8.7 / 26.2):
 * those keep the 16-float kernel. */
#include "attention8.h"

/* Every sequence's tokens are cut into pieces of PIECE_TOKENS (rounded up to whole blocks), a work item a piece, whose
 * softmax states are then merged in order exactly as the online softmax would have, up to summation order (as
 * flash-decoding does on GPUs). The pieces depend on the sequence's own length only, never on the other sequences of
 * the step, the thread count or timing: a row's result is the same bits in any batch, which speculative decoding's
 * verification rows need (several rows of one sequence in a step must each get what one decode row would). One
 * conversation alone still has every thread streaming part of its KV cache (one thread alone reads DRAM at about half
 * the rate of two) once its context is two pieces long. fp32 outputs only; 0 (nothing done) without memory for the
 * states. */
#define PIECE_TOKENS 256

/* fn over work items [0, items), handed out one at a time (their lengths differ) to at most num_threads threads. */
static void run_items(const job_t *job, sequence_fn fn, int items, int num_threads) {
    if (num_threads > items) num_threads = items;
    if (num_threads <= 1) {
        for (int i = 0; i < items; i++) fn(job, i);
        return;
    }
    int next = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(num_threads)
#endif
    for (int i = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED); i < items; i = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED))
        fn(job, i);
}

static int split_decode(const job_t *whole, sequence_fn fn, int num_seqs, int num_threads) {
    job_t piece = *whole, *job = &piece;
    if (num_seqs < 1) return 0;
    int longest = 0;
    for (int s = 0; s < num_seqs; s++) longest = job->seq_lens[s] > longest ? job->seq_lens[s] : longest;
    const int bs = job->block_size, span = (PIECE_TOKENS + bs - 1) / bs * bs;
    const int parts = (longest + span - 1) / span; /* a shorter sequence's pieces past its end are empty */
    const int hq = job->num_heads, hd = job->head_dim, items = num_seqs * parts;
    float *partial = malloc(sizeof(float) * (size_t)items * hq * SPLIT_STATE(hd));
    if (!partial) return 0;
    job->parts = parts, job->span = span, job->partial = partial;
    run_items(job, fn, items, num_threads);
    for (int s = 0; s < num_seqs; s++)
        for (int hh = 0; hh < hq; hh++) {
            const float *first = partial + ((int64_t)s * parts * hq + hh) * SPLIT_STATE(hd);
            const int64_t stride = (int64_t)hq * SPLIT_STATE(hd); /* from one piece's state to the next's */
            float mx = -INFINITY, total = 0.f;
            for (int p = 0; p < parts; p++)
                if (first[p * stride + 1] > 0.f && first[p * stride] > mx) mx = first[p * stride];
            float *op = (float *)job->out + job->rows[s] * job->o_row + hh * job->o_head;
            for (int c = 0; c < hd; c++) op[c] = 0.f;
            for (int p = 0; p < parts; p++) {
                const float *pp = first + p * stride;
                if (pp[1] <= 0.f) continue; /* a piece past the sequence's end */
                const float w = expf(pp[0] - mx);
                total += w * pp[1];
                for (int c = 0; c < hd; c++) op[c] += w * pp[2 + c];
            }
            const float inv = 1.f / total;
            for (int c = 0; c < hd; c++) op[c] *= inv;
        }
    free(partial);
    return 1;
}

/* Returns 0, or -1 when the shapes or dtypes are outside what this kernel handles (the caller then uses torch).
 * kv_format KV_INT8: the caches are int8 with fp16 scales k_scale / v_scale (strides s_block, s_tok; unit over
 * heads); KV_F16: fp16 caches (fp32 q only); KV_SAME: they have q's dtype. The scale arguments are for int8 only.
 * Threads come from OpenMP: loaded into a torch process, this library binds to torch's own libgomp (the same
 * soname), so its parallel region reuses torch's thread team instead of racing it for the cores. */
int paged_decode(int is_bf16, int kv_format, const void *q, int64_t q_row, int64_t q_head, const void *k_cache,
                 const void *v_cache, int64_t c_block, int64_t c_tok, int64_t c_head, const uint16_t *k_scale,
                 const uint16_t *v_scale, int64_t s_block, int64_t s_tok, const int32_t *rows,
                 const int32_t *seq_lens, const int32_t *tables, int64_t t_row, void *out, int64_t o_row,
                 int64_t o_head, int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size,
                 float scale, int num_threads) {
    if (num_kv_heads < 1 || num_heads % num_kv_heads || num_heads / num_kv_heads > MAX_G || head_dim % W ||
        head_dim / W > MAX_C || head_dim < W || block_size < 1)
        return -1;
    for (int s = 0; s < num_seqs; s++)
        if (seq_lens[s] < 1) return -1;
    if (kv_format == KV_INT8 && (!k_scale || !v_scale)) return -1;
#ifdef __AVX512F__
    const sequence_fn fn = kv_format == KV_SAME ? pick(is_bf16, head_dim / W, num_heads / num_kv_heads)
                                                : pick8(is_bf16, kv_format, head_dim / W8, num_heads / num_kv_heads,
                                                        block_size);
#else
    const sequence_fn fn = pick8(is_bf16, kv_format, head_dim / W8, num_heads / num_kv_heads, block_size);
#endif
    if (!fn) return -1;
    const job_t job = {.q = q, .k = k_cache, .v = v_cache, .k_scale = k_scale, .v_scale = v_scale,
                       .s_block = s_block, .s_tok = s_tok, .out = out, .q_row = q_row, .q_head = q_head,
                       .o_row = o_row, .o_head = o_head, .c_block = c_block, .c_tok = c_tok, .c_head = c_head,
                       .rows = rows, .seq_lens = seq_lens, .tables = tables, .t_row = t_row,
                       .num_heads = num_heads, .num_kv_heads = num_kv_heads, .head_dim = head_dim,
                       .block_size = block_size, .scale = scale};
    if (!is_bf16 && split_decode(&job, fn, num_seqs, num_threads)) return 0;
    run_items(&job, fn, num_seqs, num_threads); /* a sequence an item */
    return 0;
}

/* Write each token's K and V rows into the caches at its slot (block * block_size + offset); negative slots are
 * padding and skipped. Any dtype: rows are copied as bytes, elem_size per element. */
void store_kv(int elem_size, const void *k, const void *v, int64_t kv_row, int64_t kv_head, void *k_cache,
              void *v_cache, int64_t c_block, int64_t c_tok, int64_t c_head, const int64_t *slots, int num_tokens,
              int num_kv_heads, int head_dim, int block_size) {
    const size_t row_bytes = (size_t)head_dim * elem_size;
    for (int t = 0; t < num_tokens; t++) {
        const int64_t slot = slots[t];
        if (slot < 0) continue;
        const int64_t dst = (slot / block_size) * c_block + (slot % block_size) * c_tok;
        for (int h = 0; h < num_kv_heads; h++) {
            const int64_t src = t * kv_row + h * kv_head, at = dst + h * c_head;
            memcpy((char *)k_cache + at * elem_size, (const char *)k + src * elem_size, row_bytes);
            memcpy((char *)v_cache + at * elem_size, (const char *)v + src * elem_size, row_bytes);
        }
    }
}

#define F16_MAX 65504.0f

/* store_kv for fp16 caches: each token's fp32 K and V rows rounded to fp16 (to nearest even, as torch's
 * .to(float16)), saturated at +-F16_MAX, into the caches at its slot; negative slots are padding and skipped. */
void store_kv_f16(const float *k, const float *v, int64_t kv_row, int64_t kv_head, uint16_t *k_cache,
                  uint16_t *v_cache, int64_t c_block, int64_t c_tok, int64_t c_head, const int64_t *slots,
                  int num_tokens, int num_kv_heads, int head_dim, int block_size) {
    for (int t = 0; t < num_tokens; t++) {
        const int64_t slot = slots[t];
        if (slot < 0) continue;
        const int64_t dst = (slot / block_size) * c_block + (slot % block_size) * c_tok;
        for (int h = 0; h < num_kv_heads; h++) {
            const int64_t src = t * kv_row + h * kv_head, at = dst + h * c_head;
            for (int which = 0; which < 2; which++) {
                const float *x = (which ? v : k) + src;
                uint16_t *out = (which ? v_cache : k_cache) + at;
                int d = 0;
                for (; d + W <= head_dim; d += W) { /* head_dim is a multiple of 16 where the kernel runs */
                    vf f;
                    memcpy(&f, x + d, sizeof f);
                    f = vsel(f > F16_MAX, (vf){0} + F16_MAX, f);
                    f = vsel(f < -F16_MAX, (vf){0} - F16_MAX, f);
                    const vhf h16 = __builtin_convertvector(f, vhf);
                    memcpy(out + d, &h16, sizeof h16);
                }
                for (; d < head_dim; d++) out[d] = f32_to_f16(fminf(fmaxf(x[d], -F16_MAX), F16_MAX));
            }
        }
    }
}

/* One row of head_dim values quantized as kernels/reference.py's quantize_kv_ref, with the same fp32 operations. */
static inline void quantize_row(const float *x, int head_dim, int8_t *q, uint16_t *scale) {
    float amax = 0.f;
    for (int d = 0; d < head_dim; d++) amax = fmaxf(amax, fabsf(x[d]));
    float s = amax / 127.f;
    if (s > 65504.f) s = 65504.f;
    *scale = f32_to_f16(s);
    s = f16_to_f32(*scale);
    for (int d = 0; d < head_dim; d++) {
        float r = s > 0.f ? floorf(x[d] / s + 0.5f) : 0.f;
        r = r > 127.f ? 127.f : r < -127.f ? -127.f : r;
        q[d] = (int8_t)r;
    }
}

/* store_kv for int8 caches: each token's K and V rows (fp32, or bf16 when is_bf16) quantized into the caches at its
 * slot, their scales into k_scale / v_scale; negative slots are padding and skipped. */
void store_kv_int8(int is_bf16, const void *k, const void *v, int64_t kv_row, int64_t kv_head, int8_t *k_cache,
                   int8_t *v_cache, int64_t c_block, int64_t c_tok, int64_t c_head, uint16_t *k_scale,
                   uint16_t *v_scale, int64_t s_block, int64_t s_tok, const int64_t *slots, int num_tokens,
                   int num_kv_heads, int head_dim, int block_size) {
    float row[head_dim];
    for (int t = 0; t < num_tokens; t++) {
        const int64_t slot = slots[t];
        if (slot < 0) continue;
        const int64_t blk = slot / block_size, off = slot % block_size;
        for (int h = 0; h < num_kv_heads; h++) {
            const int64_t src = t * kv_row + h * kv_head, at = blk * c_block + off * c_tok + h * c_head;
            const int64_t sat = blk * s_block + off * s_tok + h;
            for (int which = 0; which < 2; which++) {
                const void *x = which ? v : k;
                for (int d = 0; d < head_dim; d++)
                    row[d] = is_bf16 ? bf16_to_f32(((const bf16 *)x)[src + d]) : ((const float *)x)[src + d];
                quantize_row(row, head_dim, (which ? v_cache : k_cache) + at, (which ? v_scale : k_scale) + sat);
            }
        }
    }
}
