/* A decode step's decoder layers in one call: the fp32 CPU path for sequences of one new token each (a few, or with
 * batch_gemm int8 any number: many rows take the int8 batch GEMM, as QuantLinear.forward does).
 *
 * Built and loaded by engine/models/fused_decode.py. At one token a step, a Llama layer is ~10 small operations; run
 * from Python each costs a module call, argument checks and a ctypes crossing (~15-30 us), which for SmolLM2's 30
 * layers is several milliseconds a token, as much as the matmuls. Here the layer loop runs in C and calls the very
 * kernels the Python path calls (quant_linear.c, fused_ops.c, attention.c), through function pointers taken from
 * those loaded libraries, with the same arguments in the same order: the result is bit for bit the Python path's.
 * Nothing here computes; it only sequences the kernels over scratch buffers.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*linear_fn)(int qtype, int act_q8, const uint8_t *w, int64_t w_row_bytes, int out_features,
                         int in_features, const float *x, int64_t x_row, int rows, const float *bias, float *y,
                         int64_t y_row, int num_threads);
typedef int (*gemm_fn)(int qtype, const uint8_t *w, int64_t w_row_bytes, int out_features, int in_features,
                       const float *x, int64_t x_row, int rows, const float *bias, float *y, int64_t y_row,
                       int num_threads);
typedef void (*norm_fn)(float *residual, int64_t res_row, const float *delta, int64_t delta_row,
                        const float *weight, float *out, int64_t out_row, int rows, int dim, float eps,
                        int num_threads);
typedef void (*silu_fn)(const float *gate_up, int64_t in_row, float *out, int64_t out_row, int rows, int width,
                        int num_threads);
typedef void (*rope_fn)(float *x, int64_t x_row, int64_t x_head, const int64_t *positions, const float *table,
                        int64_t t_row, int rows, int num_heads, int head_dim, int num_threads);
typedef void (*store_fn)(int elem_size, const void *k, const void *v, int64_t kv_row, int64_t kv_head,
                         void *k_cache, void *v_cache, int64_t c_block, int64_t c_tok, int64_t c_head,
                         const int64_t *slots, int num_tokens, int num_kv_heads, int head_dim, int block_size);
typedef void (*store_q8_fn)(int is_bf16, const void *k, const void *v, int64_t kv_row, int64_t kv_head,
                            int8_t *k_cache, int8_t *v_cache, int64_t c_block, int64_t c_tok, int64_t c_head,
                            uint16_t *k_scale, uint16_t *v_scale, int64_t s_block, int64_t s_tok,
                            const int64_t *slots, int num_tokens, int num_kv_heads, int head_dim, int block_size);
typedef void (*store_f16_fn)(const float *k, const float *v, int64_t kv_row, int64_t kv_head, uint16_t *k_cache,
                             uint16_t *v_cache, int64_t c_block, int64_t c_tok, int64_t c_head,
                             const int64_t *slots, int num_tokens, int num_kv_heads, int head_dim, int block_size);
typedef void (*argmax_fn)(const float *x, int64_t x_row, int rows, int cols, int32_t *out, int num_threads);
typedef int (*attend_fn)(int is_bf16, int kv_format, const void *q, int64_t q_row, int64_t q_head, const void *k_cache,
                         const void *v_cache, int64_t c_block, int64_t c_tok, int64_t c_head,
                         const uint16_t *k_scale, const uint16_t *v_scale, int64_t s_block, int64_t s_tok,
                         const int32_t *rows,
                         const int32_t *seq_lens, const int32_t *tables, int64_t t_row, void *out, int64_t o_row,
                         int64_t o_head, int num_seqs, int num_heads, int num_kv_heads, int head_dim,
                         int block_size, float scale, int num_threads);

typedef int (*gather_fn)(int qtype, const uint8_t *w, int64_t w_row_bytes, int64_t num_rows, const int64_t *index,
                         int n, int cols, float *out, int64_t out_row, int num_threads);

#define MAX_SEGMENTS 3 /* q, k, v each in its own format at most */

/* Rows of a quantized linear in one GGUF format: blocks [out_features, row_bytes]. */
typedef struct {
    const uint8_t *blocks;
    int64_t row_bytes;
    int qtype, out_features;
} QSegment;

/* One quantized linear: segments stacked by output rows (one unless its fused parts differ in format, as
 * llama-quantize's Q4_K_M mixes Q4_K q/k with a Q6_K v), and an optional fp32 bias [out_features]. */
typedef struct {
    QSegment segments[MAX_SEGMENTS];
    int num_segments, out_features, in_features;
    const float *bias;
} QLinear;

typedef struct {
    const float *input_norm, *post_norm; /* RMSNorm weights [hidden] */
    QLinear qkv, o, gate_up, down;
    void *k_cache, *v_cache; /* [num_blocks, block_size, num_kv_heads, head_dim] fp32, fp16 or int8 */
    uint16_t *k_scale, *v_scale; /* int8 caches: fp16 scales [num_blocks, block_size, num_kv_heads]; else NULL */
} Layer;

typedef struct {
    linear_fn linear;
    gemm_fn gemm;      /* quant_gemm_q8 (batch_gemm int8) for steps of gemm_min_rows or more sequences, or NULL */
    int gemm_min_rows; /* the rows from which QuantLinear.forward takes the same GEMM */
    norm_fn norm;
    silu_fn silu;
    rope_fn rope;
    store_fn store;
    store_q8_fn store_q8;
    store_f16_fn store_f16;
    attend_fn attend;
    /* kv_format: attention.c's KV_SAME (fp32 caches), KV_INT8 or KV_F16 */
    int num_layers, hidden, intermediate, num_heads, num_kv_heads, head_dim, block_size, act_q8, kv_format;
    float eps, scale;
    int64_t c_block, c_tok, c_head; /* cache strides in elements, the same for every layer */
    int64_t s_block, s_tok;         /* int8 caches: their scales' strides (unit over heads) */
    const float *rope_table;        /* [max_pos, 2, head_dim] */
    int64_t rope_row;
    const float *final_norm;
    const Layer *layers;
    QLinear head;      /* the LM head as the module path runs it (the same linear or GEMM), or no segments: none */
    argmax_fn argmax;  /* fused_ops.c's argmax_rows_f32 */
    const float *embed; /* the token embeddings [vocab, hidden] fp32, or NULL: in blocks (embed_blocks) */
    int64_t vocab;
    const uint8_t *embed_blocks; /* the embedding's GGUF blocks [vocab, embed_row_bytes] (a tied head's too) */
    int64_t embed_row_bytes;
    int embed_qtype;
    gather_fn gather; /* quant_linear.c's dequantize_gather: the rows a step needs, as QuantEmbedding gathers them */
} Model;

static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* y [n, L.out_features] = x [n, L.in_features] @ W^T (+ bias), as QuantLinear.forward runs it: each segment by the
 * GEMV (or, from gemm_min_rows rows, the int8 GEMM) into its columns of y, with its slice of the bias. The status
 * of the calls, or-ed. */
static int run_linear(const Model *m, const QLinear *L, const float *x, float *y, int n, int num_threads) {
    int status = 0, column = 0;
    for (int s = 0; s < L->num_segments; s++) {
        const QSegment *g = &L->segments[s];
        const float *bias = L->bias ? L->bias + column : NULL;
        if (m->gemm != NULL && n >= m->gemm_min_rows)
            status |= m->gemm(g->qtype, g->blocks, g->row_bytes, g->out_features, L->in_features, x, L->in_features,
                              n, bias, y + column, L->out_features, num_threads);
        else
            status |= m->linear(g->qtype, m->act_q8, g->blocks, g->row_bytes, g->out_features, L->in_features, x,
                                L->in_features, n, bias, y + column, L->out_features, num_threads);
        column += g->out_features;
    }
    return status;
}

/* residual [n, hidden] gets the embeddings of token `ids` [n] and is updated in place (the gather is here, not a numpy
 * call before, so a step gives the GIL up once, for all of it); out [n, hidden] gets the final-normed
 * hidden states; with `logits` (and the model's head) the head's logits [n, vocab] and in `argmax` [n] each row's
 * first maximum (greedy sampling's token). seconds[0] and [1] accumulate the time spent in the linears (the head
 * included) and in attention (KV store included).
 * Returns 0, -1 when a kernel rejects its inputs or a token id is outside the vocabulary, -2 when scratch memory
 * cannot be had. */
int decode_layers(const Model *m, const int64_t *ids, float *residual, float *out, int n, const int64_t *positions,
                  const int64_t *slots, const int32_t *rows, const int32_t *seq_lens, const int32_t *tables,
                  int64_t t_row, int num_threads, double *seconds, float *logits, int32_t *argmax) {
    const int hd = m->head_dim, hq = m->num_heads, hkv = m->num_kv_heads, hidden = m->hidden;
    const int qkv_width = (hq + 2 * hkv) * hd, inter = m->intermediate;
    if (m->embed_blocks != NULL) {
        if (m->gather(m->embed_qtype, m->embed_blocks, m->embed_row_bytes, m->vocab, ids, n, hidden, residual, hidden,
                      num_threads) != 0)
            return -1;
    } else {
        for (int r = 0; r < n; r++) {
            if (ids[r] < 0 || ids[r] >= m->vocab) return -1;
            memcpy(residual + (size_t)r * hidden, m->embed + ids[r] * hidden, sizeof(float) * hidden);
        }
    }
    float *scratch = malloc(sizeof(float) * (size_t)n * (hidden + qkv_width + hq * hd + hidden + 3 * inter));
    if (!scratch) return -2;
    float *h = scratch, *qkv = h + (size_t)n * hidden, *attn = qkv + (size_t)n * qkv_width;
    float *delta = attn + (size_t)n * hq * hd, *gate_up = delta + (size_t)n * hidden;
    float *act = gate_up + (size_t)n * 2 * inter;
    int status = 0;
    double t0;
#define LINEAR(L, x, y)                                                                                          \
    t0 = now_s();                                                                                                \
    status |= run_linear(m, &(L), x, y, n, num_threads);                                                         \
    seconds[0] += now_s() - t0
    m->norm(residual, hidden, NULL, 0, m->layers[0].input_norm, h, hidden, n, hidden, m->eps, num_threads);
    for (int l = 0; l < m->num_layers && status == 0; l++) {
        const Layer *layer = &m->layers[l];
        LINEAR(layer->qkv, h, qkv);
        m->rope(qkv, qkv_width, hd, positions, m->rope_table, m->rope_row, n, hq + hkv, hd, num_threads);
        t0 = now_s();
        if (m->kv_format == 1) /* KV_INT8 */
            m->store_q8(0, qkv + hq * hd, qkv + (hq + hkv) * hd, qkv_width, hd, layer->k_cache, layer->v_cache,
                        m->c_block, m->c_tok, m->c_head, layer->k_scale, layer->v_scale, m->s_block, m->s_tok, slots,
                        n, hkv, hd, m->block_size);
        else if (m->kv_format == 2) /* KV_F16 */
            m->store_f16(qkv + hq * hd, qkv + (hq + hkv) * hd, qkv_width, hd, layer->k_cache, layer->v_cache,
                         m->c_block, m->c_tok, m->c_head, slots, n, hkv, hd, m->block_size);
        else
            m->store(4, qkv + hq * hd, qkv + (hq + hkv) * hd, qkv_width, hd, layer->k_cache, layer->v_cache,
                     m->c_block, m->c_tok, m->c_head, slots, n, hkv, hd, m->block_size);
        status |= m->attend(0, m->kv_format, qkv, qkv_width, hd, layer->k_cache, layer->v_cache, m->c_block, m->c_tok,
                            m->c_head, layer->k_scale, layer->v_scale, m->s_block, m->s_tok, rows, seq_lens, tables,
                            t_row, attn, hq * hd, hd, n, hq, hkv, hd, m->block_size, m->scale, num_threads);
        seconds[1] += now_s() - t0;
        LINEAR(layer->o, attn, delta);
        m->norm(residual, hidden, delta, hidden, layer->post_norm, h, hidden, n, hidden, m->eps, num_threads);
        LINEAR(layer->gate_up, h, gate_up);
        m->silu(gate_up, 2 * inter, act, inter, n, inter, num_threads);
        LINEAR(layer->down, act, delta);
        const float *next = l + 1 < m->num_layers ? m->layers[l + 1].input_norm : m->final_norm;
        m->norm(residual, hidden, delta, hidden, next, l + 1 < m->num_layers ? h : out, hidden, n, hidden, m->eps,
                num_threads);
    }
    if (status == 0 && logits != NULL && m->head.num_segments > 0) {
        LINEAR(m->head, out, logits);
        if (status == 0) m->argmax(logits, m->head.out_features, n, m->head.out_features, argmax, num_threads);
    }
#undef LINEAR
    free(scratch);
    return status == 0 ? 0 : -1;
}
