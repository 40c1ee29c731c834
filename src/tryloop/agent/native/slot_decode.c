/* One decode step's attention over the engine's KV buffers, on a CPU.
 *
 * Each row of the batch has one new query token per head and attends to its own
 * live columns [first[row], end) of the buffers keys/values [slots, kv_heads,
 * capacity, dim] (the engine's slot cache: rows right-aligned at `end`). Per row
 * and key/value head it reads those columns of the keys once and of the values
 * once, for the `group` query heads that share them, with float32 scores, softmax
 * and accumulation: no mask, no margins read, no copy of a strided view.
 *
 * Built by tryloop.agent.native_attention with the host's C compiler (-O3
 * -march=native, loops written to vectorize) and called through ctypes, which
 * releases the GIL for the call.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIM 512       /* the head sizes the row buffer holds (native_attention.MAX_DIM) */

static inline float load_bf16(const uint16_t *p) {
    uint32_t bits = (uint32_t)(*p) << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t store_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u)          /* NaN stays NaN */
        return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);            /* round to nearest even, as torch does */
    return (uint16_t)(bits >> 16);
}

static inline float load_f32(const float *p) { return *p; }
static inline float store_f32(float f) { return f; }

/* exp for x <= 0 (scores minus their maximum), vectorizable: 2^n * p(r) with a degree-6
 * polynomial on r in [-ln2/2, ln2/2]; relative error ~2e-7, below float32's rounding of the sum. */
static inline float exp_nonpositive(float x) {
    if (x < -87.0f) return 0.0f;
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    float n = floorf(x * log2e + 0.5f);
    float r = x - n * ln2_hi - n * ln2_lo;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t e = (int32_t)n + 127;
    uint32_t bits = (uint32_t)e << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#define SLOT_DECODE(NAME, T, LOAD, STORE)                                                          \
static inline __attribute__((always_inline))                                                      \
int NAME##_dim(const T *query, int64_t q_row_stride, int64_t q_head_stride,                        \
               const T *keys, const T *values, int64_t kv_heads, int64_t capacity, int64_t dim,     \
               int64_t group, const int64_t *first, int64_t end, float scale,                       \
               T *out, int64_t row_begin, int64_t row_end)                                          \
{                                                                                                  \
    if (dim > MAX_DIM || group < 1 || end > capacity) return 1;                           \
    float *scores = malloc(sizeof(float) * (size_t)(group * capacity));                            \
    float *q = malloc(sizeof(float) * (size_t)(group * dim));                                      \
    float *acc = malloc(sizeof(float) * (size_t)(group * dim));                                    \
    if (!scores || !q || !acc) { free(scores); free(q); free(acc); return 2; }                    \
    float row_buf[MAX_DIM];                                                                        \
    for (int64_t r = row_begin; r < row_end; r++) {                                                \
        int64_t lo = first[r], n = end - lo;                                                       \
        if (lo < 0 || n <= 0) { free(scores); free(q); free(acc); return 3; }                     \
        for (int64_t h = 0; h < kv_heads; h++) {                                                   \
            const T *K = keys + ((r * kv_heads + h) * capacity + lo) * dim;                        \
            const T *V = values + ((r * kv_heads + h) * capacity + lo) * dim;                      \
            for (int64_t g = 0; g < group; g++) {                                                  \
                const T *src = query + r * q_row_stride + (h * group + g) * q_head_stride;         \
                for (int64_t d = 0; d < dim; d++) q[g * dim + d] = LOAD(src + d) * scale;          \
            }                                                                                      \
            for (int64_t c = 0; c < n; c++) {                                                      \
                for (int64_t d = 0; d < dim; d++) row_buf[d] = LOAD(K + c * dim + d);              \
                for (int64_t g = 0; g < group; g++) {                                              \
                    float s = 0.0f;                                                                \
                    _Pragma("omp simd reduction(+:s)")                                             \
                    for (int64_t d = 0; d < dim; d++) s += q[g * dim + d] * row_buf[d];            \
                    scores[g * n + c] = s;                                                         \
                }                                                                                  \
            }                                                                                      \
            for (int64_t g = 0; g < group; g++) {                                                  \
                float *sg = scores + g * n, m = sg[0], sum = 0.0f;                                 \
                for (int64_t c = 1; c < n; c++) m = sg[c] > m ? sg[c] : m;                         \
                _Pragma("omp simd reduction(+:sum)")                                               \
                for (int64_t c = 0; c < n; c++) { sg[c] = exp_nonpositive(sg[c] - m); sum += sg[c]; } \
                float inv = 1.0f / sum;                                                            \
                for (int64_t c = 0; c < n; c++) sg[c] *= inv;                                      \
                for (int64_t d = 0; d < dim; d++) acc[g * dim + d] = 0.0f;                         \
            }                                                                                      \
            for (int64_t c = 0; c < n; c++) {                                                      \
                for (int64_t d = 0; d < dim; d++) row_buf[d] = LOAD(V + c * dim + d);              \
                for (int64_t g = 0; g < group; g++) {                                              \
                    float p = scores[g * n + c];                                                   \
                    for (int64_t d = 0; d < dim; d++) acc[g * dim + d] += p * row_buf[d];          \
                }                                                                                  \
            }                                                                                      \
            T *dst = out + (r * kv_heads * group + h * group) * dim;                               \
            for (int64_t i = 0; i < group * dim; i++) dst[i] = STORE(acc[i]);                      \
        }                                                                                          \
    }                                                                                              \
    free(scores); free(q); free(acc);                                                              \
    return 0;                                                                                      \
}                                                                                                  \
                                                                                                   \
/* The common head sizes get their own copy with the size a constant, which the compiler unrolls. */\
int NAME(const T *query, int64_t q_row_stride, int64_t q_head_stride,                              \
         const T *keys, const T *values, int64_t kv_heads, int64_t capacity, int64_t dim,           \
         int64_t group, const int64_t *first, int64_t end, float scale,                             \
         T *out, int64_t row_begin, int64_t row_end)                                                \
{                                                                                                  \
    if (dim == 64)                                                                                 \
        return NAME##_dim(query, q_row_stride, q_head_stride, keys, values, kv_heads, capacity,    \
                          64, group, first, end, scale, out, row_begin, row_end);                  \
    if (dim == 128)                                                                                \
        return NAME##_dim(query, q_row_stride, q_head_stride, keys, values, kv_heads, capacity,    \
                          128, group, first, end, scale, out, row_begin, row_end);                 \
    return NAME##_dim(query, q_row_stride, q_head_stride, keys, values, kv_heads, capacity,        \
                      dim, group, first, end, scale, out, row_begin, row_end);                     \
}

SLOT_DECODE(slot_decode_bf16, uint16_t, load_bf16, store_bf16)
SLOT_DECODE(slot_decode_f32, float, load_f32, store_f32)
