/* The CPU runtime's native bf16 kernels (built by native.py): the linears of a few input rows,
   the residual add with RMS norm, the rotary embedding, SiLU-and-mul, attention over the KV
   pool's slots, and the head's greedy rollout positions (fp32), each one pass over its data.

   Linears. A decode step or a short verify multiplies a handful of rows by every weight of the
   model once, so its linears are bound by how fast the weights stream from memory. The weight is
   packed once into blocks of BLOCK output features laid out as [K/2][BLOCK][2] (the pairs
   VDPBF16PS reads), so each block is one contiguous run of memory read once per call; every
   output is a bf16 dot product accumulated in fp32 over k in one fixed order, so an input row
   gets the same bits whatever other rows share the call (a verify row equals the plain step's).

   Norm and rotary. SGLang's RMSNorm.forward_native and apply_rotary_emb as formulas, computed
   per row in the same fp32 steps with the same bf16 roundings; the rotary's bits are theirs, the
   norm's differ only where the order of the sum of squares moves an output's last bit. */

#include <immintrin.h>
#include <omp.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 32 /* output features per packed block: two 16-lane fp32 accumulators */
#define ROWS 8   /* input rows per tile: 2 x ROWS accumulators stay in registers */

int domino_native_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
}

/* w [n, k] row-major (k even) -> out [ceil(n / BLOCK)][k / 2][BLOCK][2], rows past n zero */
void domino_gemv_pack(const uint16_t *w, int64_t n, int64_t k, uint16_t *out) {
    int64_t blocks = (n + BLOCK - 1) / BLOCK, pairs = k / 2;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t p = 0; p < pairs; p++)
            for (int64_t j = 0; j < BLOCK; j++) {
                int64_t row = b * BLOCK + j;
                uint16_t *dst = out + ((b * pairs + p) * BLOCK + j) * 2;
                dst[0] = row < n ? w[row * k + 2 * p] : 0;
                dst[1] = row < n ? w[row * k + 2 * p + 1] : 0;
            }
}

/* acc_lo/acc_hi (fp32) -> `count` bf16 outputs at dst, rounded to nearest even */
static inline void store(__m512 lo, __m512 hi, uint16_t *dst, int64_t count) {
    __m512i out = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    if (count == BLOCK)
        _mm512_storeu_si512((void *)dst, out);
    else
        _mm512_mask_storeu_epi16(dst, (__mmask32)((1ull << count) - 1), out);
}

/* R input rows (pairs of bf16 read as one uint32, `x_pairs` apart) times one packed block */
#define DEFINE_TILE(R)                                                                       \
    static void tile##R(const uint32_t *x, int64_t x_pairs, const uint16_t *block,           \
                        int64_t pairs, __m512 init_lo, __m512 init_hi, uint16_t *y,          \
                        int64_t y_stride, int64_t count) {                                   \
        __m512 lo[R], hi[R];                                                                 \
        for (int r = 0; r < R; r++) {                                                        \
            lo[r] = init_lo;                                                                 \
            hi[r] = init_hi;                                                                 \
        }                                                                                    \
        for (int64_t p = 0; p < pairs; p++) {                                                \
            __m512bh w_lo = (__m512bh)_mm512_loadu_si512((const void *)(block + p * 64));    \
            __m512bh w_hi = (__m512bh)_mm512_loadu_si512((const void *)(block + p * 64 + 32)); \
            for (int r = 0; r < R; r++) {                                                    \
                __m512bh xr = (__m512bh)_mm512_set1_epi32((int)x[r * x_pairs + p]);          \
                lo[r] = _mm512_dpbf16_ps(lo[r], w_lo, xr);                                   \
                hi[r] = _mm512_dpbf16_ps(hi[r], w_hi, xr);                                   \
            }                                                                                \
        }                                                                                    \
        for (int r = 0; r < R; r++) store(lo[r], hi[r], y + r * y_stride, count);           \
    }
DEFINE_TILE(1)
DEFINE_TILE(2)
DEFINE_TILE(3)
DEFINE_TILE(4)
DEFINE_TILE(5)
DEFINE_TILE(6)
DEFINE_TILE(7)
DEFINE_TILE(8)

typedef void (*tile_fn)(const uint32_t *, int64_t, const uint16_t *, int64_t, __m512, __m512,
                        uint16_t *, int64_t, int64_t);
static const tile_fn TILES[ROWS + 1] = {0, tile1, tile2, tile3, tile4,
                                        tile5, tile6, tile7, tile8};

/* y [m, n] = x [m, k] @ w^T (+ bias [n]), all bf16; x's rows `x_stride` elements apart (even),
   w packed by domino_gemv_pack, bias NULL or contiguous */
void domino_gemv(const uint16_t *x, int64_t x_stride, const uint16_t *packed,
                 const uint16_t *bias, uint16_t *y, int64_t m, int64_t n, int64_t k) {
    int64_t blocks = (n + BLOCK - 1) / BLOCK, pairs = k / 2;
#pragma omp parallel for schedule(static) if (blocks >= 16)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t count = n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK;
        __m512 init_lo = _mm512_setzero_ps(), init_hi = _mm512_setzero_ps();
        if (bias) {
            uint16_t padded[BLOCK] = {0};
            for (int64_t j = 0; j < count; j++) padded[j] = bias[b * BLOCK + j];
            __m512i lanes = _mm512_loadu_si512((const void *)padded);
            init_lo = _mm512_castsi512_ps(
                _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(lanes)), 16));
            init_hi = _mm512_castsi512_ps(
                _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(lanes, 1)), 16));
        }
        const uint16_t *block = packed + b * pairs * BLOCK * 2;
        for (int64_t r0 = 0; r0 < m; r0 += ROWS) {
            int64_t rows = m - r0 < ROWS ? m - r0 : ROWS;
            TILES[rows]((const uint32_t *)(x + r0 * x_stride), x_stride / 2, block, pairs,
                        init_lo, init_hi, y + r0 * n + b * BLOCK, n, count);
        }
    }
}

static inline float widen(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* fp32 -> bf16, round to nearest even (NaN stays NaN), as torch's casts */
static inline uint16_t narrow(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* out = RMSNorm(x (+ residual)) * weight over rows of `hidden` bf16 values (rows contiguous):
   s = x + residual in fp32, residual_out = bf16(s) (when residual is given), then
   out = bf16((s * 1 / sqrt(mean(s^2) + eps)) * weight) */
void domino_add_rmsnorm(const uint16_t *x, const uint16_t *residual, const uint16_t *weight,
                        float eps, uint16_t *out, uint16_t *residual_out, int64_t rows,
                        int64_t hidden) {
#pragma omp parallel for schedule(static) if (rows >= 64)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + r * hidden;
        float s[hidden];
        for (int64_t j = 0; j < hidden; j++) s[j] = widen(xr[j]);
        if (residual) {
            const uint16_t *rr = residual + r * hidden;
            uint16_t *ro = residual_out + r * hidden;
            for (int64_t j = 0; j < hidden; j++) {
                s[j] += widen(rr[j]);
                ro[j] = narrow(s[j]);
            }
        }
        __m512 sum = _mm512_setzero_ps();
        int64_t j = 0;
        for (; j + 16 <= hidden; j += 16) {
            __m512 v = _mm512_loadu_ps(s + j);
            sum = _mm512_fmadd_ps(v, v, sum);
        }
        float total = _mm512_reduce_add_ps(sum);
        for (; j < hidden; j++) total += s[j] * s[j];
        float scale = 1.0f / sqrtf(total / (float)hidden + eps);
        uint16_t *o = out + r * hidden;
        for (j = 0; j < hidden; j++) o[j] = narrow((s[j] * scale) * widen(weight[j]));
    }
}

/* Neox-style rotary embedding of the first `heads` heads of each token's row (`stride` apart) of
   x, written contiguously to out [tokens, heads * dim]: with x1, x2 the halves of a head and
   cos, sin [tokens, dim / 2] (bf16), o1 = x1 * cos - x2 * sin, o2 = x2 * cos + x1 * sin, each
   product and sum rounded to bf16 as torch's bf16 ops round them */
void domino_rope(const uint16_t *x, int64_t stride, const uint16_t *cos, const uint16_t *sin,
                 uint16_t *out, int64_t tokens, int64_t heads, int64_t dim) {
    int64_t half = dim / 2;
    for (int64_t t = 0; t < tokens; t++) {
        const uint16_t *c = cos + t * half, *s = sin + t * half;
        for (int64_t h = 0; h < heads; h++) {
            const uint16_t *x1 = x + t * stride + h * dim, *x2 = x1 + half;
            uint16_t *o1 = out + (t * heads + h) * dim, *o2 = o1 + half;
            for (int64_t i = 0; i < half; i++) {
                float a = widen(x1[i]), b = widen(x2[i]), ci = widen(c[i]), si = widen(s[i]);
                o1[i] = narrow(widen(narrow(a * ci)) - widen(narrow(b * si)));
                o2[i] = narrow(widen(narrow(b * ci)) + widen(narrow(a * si)));
            }
        }
    }
}

/* e^x (16 lanes): x = n ln2 + r, |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial
   (relative error under 2e-7), scaled by 2^n; 0 below -87 (and for -inf), inf above 88.7 */
static inline __m512 exp_ps(__m512 x) {
    const __m512 floor = _mm512_set1_ps(-87.0f), ceiling = _mm512_set1_ps(88.7f);
    __mmask16 tiny = _mm512_cmp_ps_mask(x, floor, _CMP_LT_OQ);
    __mmask16 huge = _mm512_cmp_ps_mask(x, ceiling, _CMP_GT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, floor), ceiling);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512 e = _mm512_maskz_mov_ps((__mmask16)~tiny, _mm512_scalef_ps(p, n));
    return _mm512_mask_mov_ps(e, huge, _mm512_set1_ps(INFINITY));
}

/* 16 bf16 -> 16 fp32 */
static inline __m512 widen16(const uint16_t *src) {
    __m256i h = _mm256_loadu_si256((const __m256i *)src);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 fp32 rounded to bf16 (nearest even) and back */
static inline __m512 round16(__m512 v) {
    __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* SGLang's SiluAndMul.forward_native over rows of x [rows, 2d] (bf16, `stride` apart):
   out [rows, d] = bf16(bf16(silu(gate)) * up), silu(g) = g / (1 + e^-g) in fp32 */
void domino_silu_mul(const uint16_t *x, int64_t stride, uint16_t *out, int64_t rows,
                     int64_t d) {
#pragma omp parallel for schedule(static) if (rows >= 64)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *gate = x + r * stride, *up = gate + d;
        uint16_t *o = out + r * d;
        int64_t j = 0;
        for (; j + 16 <= d; j += 16) {
            __m512 g = widen16(gate + j);
            __m512 one = _mm512_set1_ps(1.0f);
            __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(
                                                                 _mm512_setzero_ps(), g))));
            __m512 prod = _mm512_mul_ps(round16(silu), widen16(up + j));
            _mm256_storeu_si256((__m256i *)(o + j), (__m256i)_mm512_cvtneps_pbh(prod));
        }
        for (; j < d; j++) {
            float g = widen(gate[j]);
            o[j] = narrow(widen(narrow(g / (1.0f + expf(-g)))) * widen(up[j]));
        }
    }
}

/* r[k] = the sum of v[k]'s 16 lanes, for 16 vectors at once: a tree of interleaves (32-bit,
   64-bit, then 128-bit lanes), the same order for every k */
static inline __m512 sum16(const __m512 v[16]) {
    __m512 a[8], b[4], c[2];
    for (int k = 0; k < 8; k++)
        a[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]),
                             _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    for (int k = 0; k < 4; k++) {
        __m512d x = _mm512_castps_pd(a[2 * k]), y = _mm512_castps_pd(a[2 * k + 1]);
        b[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    for (int k = 0; k < 2; k++)
        c[k] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88),
                         _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
}

#define MAX_CHUNKS 16 /* head dims up to 256, in 16-lane chunks */
#define MAX_GROUP 16  /* query heads per KV head */

/* Attention of n queries q [n, hq, d] over the keys and values at the KV-pool slots locs[keys]
   (caches [slots, hkv, d] / [slots, hkv, dv], d a multiple of 32 and dv of 16, up to 256; the
   q.k dot products by VDPBF16PS, 16 keys at a time), query head h
   reading KV head h / (hq / hkv): out [n, hq, dv] = softmax(scaling * q k^T) v in fp32, rounded
   once to bf16. Which keys query i sees: mask [n, keys] (nonzero = may attend) where given,
   else the causal rule (key j for j <= keys - n + i) where `causal`, else all. A query that sees
   no key gets zeros. Each (query, KV head) is computed on its own, in one order. */
void domino_attend(const uint16_t *q, int64_t n, int64_t hq, int64_t d, const uint16_t *k_cache,
                   const uint16_t *v_cache, int64_t hkv, int64_t dv, const int64_t *locs,
                   int64_t keys, const uint8_t *mask, int causal, float scaling, uint16_t *out) {
    int64_t group = hq / hkv, pairs = d / 32, vchunks = dv / 16;
#pragma omp parallel for collapse(2) schedule(static) if (n * hkv >= 8)
    for (int64_t i = 0; i < n; i++)
        for (int64_t kh = 0; kh < hkv; kh++) {
            int64_t visible = causal ? keys - n + i + 1 : keys;
            if (visible < 0) visible = 0;
            const uint8_t *allowed = mask ? mask + i * keys : NULL;
            __m512bh qh[MAX_GROUP][MAX_CHUNKS / 2];
            __m512 acc[MAX_GROUP][MAX_CHUNKS];
            float top[MAX_GROUP], total[MAX_GROUP];
            /* scores[g][j], padded to 16 lanes with -inf */
            int64_t padded = (visible + 15) / 16 * 16;
            float *scores = aligned_alloc(64, sizeof(float) * (size_t)(group * padded + 16));
            for (int64_t g = 0; g < group; g++) {
                const uint16_t *qr = q + (i * hq + kh * group + g) * d;
                for (int64_t c = 0; c < pairs; c++)
                    qh[g][c] = (__m512bh)_mm512_loadu_si512((const void *)(qr + 32 * c));
                for (int64_t c = 0; c < vchunks; c++) acc[g][c] = _mm512_setzero_ps();
                top[g] = -INFINITY;
                for (int64_t j = visible; j < padded; j++) scores[g * padded + j] = -INFINITY;
            }
            for (int64_t j0 = 0; j0 < visible; j0 += 16) {
                int64_t count = visible - j0 < 16 ? visible - j0 : 16;
                const uint16_t *rows[16];
                for (int u = 0; u < 16; u++)  /* past the last key: key j0 again, dropped */
                    rows[u] = k_cache + (locs[j0 + (u < count ? u : 0)] * hkv + kh) * d;
                for (int64_t g = 0; g < group; g++) {
                    __m512 lanes[16];
                    for (int u = 0; u < 16; u++) {
                        __m512 dot = _mm512_setzero_ps();
                        for (int64_t c = 0; c < pairs; c++)
                            dot = _mm512_dpbf16_ps(
                                dot, (__m512bh)_mm512_loadu_si512((const void *)(rows[u] + 32 * c)),
                                qh[g][c]);
                        lanes[u] = dot;
                    }
                    float dots[16];
                    _mm512_storeu_ps(dots, _mm512_mul_ps(sum16(lanes), _mm512_set1_ps(scaling)));
                    for (int64_t u = 0; u < count; u++) {
                        float sc = (allowed && !allowed[j0 + u]) ? -INFINITY : dots[u];
                        scores[g * padded + j0 + u] = sc;
                        if (sc > top[g]) top[g] = sc;
                    }
                }
            }
            for (int64_t g = 0; g < group; g++) {
                float *sg = scores + g * padded;
                __m512 sum = _mm512_setzero_ps(), m = _mm512_set1_ps(top[g]);
                if (top[g] == -INFINITY) m = _mm512_setzero_ps();
                for (int64_t j = 0; j < padded; j += 16) {
                    __m512 e = exp_ps(_mm512_sub_ps(_mm512_load_ps(sg + j), m));
                    _mm512_store_ps(sg + j, e);
                    sum = _mm512_add_ps(sum, e);
                }
                total[g] = _mm512_reduce_add_ps(sum);
            }
            for (int64_t j = 0; j < visible; j++) {
                const uint16_t *vr = v_cache + (locs[j] * hkv + kh) * dv;
                __m512 vf[MAX_CHUNKS];
                for (int64_t c = 0; c < vchunks; c++) vf[c] = widen16(vr + 16 * c);
                for (int64_t g = 0; g < group; g++) {
                    __m512 e = _mm512_set1_ps(scores[g * padded + j]);
                    for (int64_t c = 0; c < vchunks; c++)
                        acc[g][c] = _mm512_fmadd_ps(e, vf[c], acc[g][c]);
                }
            }
            for (int64_t g = 0; g < group; g++) {
                uint16_t *o = out + (i * hq + kh * group + g) * dv;
                __m512 inv = _mm512_set1_ps(total[g] > 0.0f ? 1.0f / total[g] : 0.0f);
                for (int64_t c = 0; c < vchunks; c++) {
                    __m256i packed = (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(acc[g][c], inv));
                    _mm256_storeu_si256((__m256i *)(o + 16 * c), packed);
                }
            }
            free(scores);
        }
}

/* Rotate-half rotary embedding with fp32 tables, as the drafter's apply_rope computes it:
   x [tokens, heads * dim] (bf16, rows `stride` apart), cos / sin [tokens, dim] (fp32, the two
   halves' angles), out = bf16(x * cos + rotate_half(x) * sin), each product and the sum
   rounded to fp32 (no fused multiply-add: built with -ffp-contract=off) */
void domino_rope_f32(const uint16_t *x, int64_t stride, const float *cos, const float *sin,
                     uint16_t *out, int64_t tokens, int64_t heads, int64_t dim) {
    int64_t half = dim / 2;
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos + t * dim, *s = sin + t * dim;
        for (int64_t h = 0; h < heads; h++) {
            const uint16_t *x1 = x + t * stride + h * dim, *x2 = x1 + half;
            uint16_t *o1 = out + (t * heads + h) * dim, *o2 = o1 + half;
            for (int64_t i = 0; i < half; i++) {
                float a = widen(x1[i]), b = widen(x2[i]);
                float p = a * c[i], r = -b * s[i];
                o1[i] = narrow(p + r);
                float p2 = b * c[half + i], r2 = a * s[half + i];
                o2[i] = narrow(p2 + r2);
            }
        }
    }
}

/* ---- the Domino head's greedy rollout (rollout.py greedy_rollout), fp32, one position a call */

/* sum of a[i] * b[i] over n floats (16 lanes, then the lanes) */
static inline float dot_f32(const float *a, const float *b, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    float out = _mm512_reduce_add_ps(acc);
    for (; i < n; i++) out += a[i] * b[i];
    return out;
}

static inline float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

/* log(sigmoid(x)), stable on both sides */
static inline float log_sigmoid_f(float x) {
    return x >= 0.0f ? -log1pf(expf(-x)) : x - log1pf(expf(x));
}

static inline float logaddexp_f(float a, float b) {
    if (a == -INFINITY) return b;
    if (b == -INFINITY) return a;
    float m = a > b ? a : b;
    return m + log1pf(expf(-fabsf(a - b)));
}

/* One draft position for each of bs rows: logits = base (+ W2 silu(W1 [z ; s]) with the head),
   next = the token of the first maximal column (vocab[column], or the column itself without a
   draft vocabulary); where a copy candidate cand >= 0 wins the greedy pick of
   q = (1 - g) softmax(logits) + g onehot(cand) (pointer.py copy_wins, g = sigmoid(gate_z +
   match_logit[min(match, max_match)])), next = cand and won = 1. W1's rows and W2's column
   tiles are loaded once for all rows (then from cache). Shapes: z [bs, H] and base [bs, C] (rows `z_stride` / `base_stride` apart),
   s [bs, G], w1 [E, H + G], w2t [E, C] (W2 transposed), vocab [C] or NULL, column [vocab_size]
   (a token's column, -1 outside; NULL: the identity); with a candidate pool (rollout.py
   Candidates) pool_w2 [bs, C, E] and pool_ids [bs, C] (each row's columns' W2 rows and token
   ids) instead of w2t and vocab; cand / match [bs] or NULL (no copy), gate_z [bs],
   match_logit [max_match + 1]; scratch: bs * (C + E) floats. */
void domino_head_pick(int64_t bs, int64_t H, int64_t G, int64_t E, int64_t C, int head,
                      const float *z, int64_t z_stride, const float *s, const float *base,
                      int64_t base_stride, const float *w1, const float *w2t,
                      const float *pool_w2, const int64_t *pool_ids,
                      const int64_t *vocab, const int32_t *column, int64_t vocab_size,
                      const int64_t *cand, const int64_t *match, const float *gate_z,
                      const float *match_logit, int64_t max_match, int64_t *next, uint8_t *won,
                      float *scratch) {
    float *logits = scratch, *hidden = scratch + bs * C;
    if (head) {
        for (int64_t e = 0; e < E; e++) {
            const float *row = w1 + e * (H + G);
            for (int64_t b = 0; b < bs; b++) {
                float h = dot_f32(row, z + b * z_stride, H) + dot_f32(row + H, s + b * G, G);
                hidden[b * E + e] = h * sigmoid_f(h); /* SiLU */
            }
        }
        if (pool_w2) { /* a candidate pool: each row's own columns, W2's rows [bs, C, E] */
            for (int64_t b = 0; b < bs; b++)
                for (int64_t c = 0; c < C; c++)
                    logits[b * C + c] = base[b * base_stride + c] +
                                        dot_f32(pool_w2 + (b * C + c) * E, hidden + b * E, E);
        } else {
            for (int64_t c0 = 0; c0 < C; c0 += 64) { /* 64 columns at a time, w2t [E, C] */
                __mmask16 lanes[4];
                for (int q = 0; q < 4; q++) {
                    int64_t left = C - c0 - 16 * q;
                    lanes[q] = left >= 16 ? (__mmask16)0xffff
                               : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
                }
                for (int64_t b = 0; b < bs; b++) {
                    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                                     _mm512_setzero_ps()};
                    for (int64_t e = 0; e < E; e++) {
                        __m512 h = _mm512_set1_ps(hidden[b * E + e]);
                        const float *w = w2t + e * C + c0;
                        for (int q = 0; q < 4; q++)
                            acc[q] = _mm512_fmadd_ps(h, _mm512_maskz_loadu_ps(lanes[q], w + 16 * q),
                                                     acc[q]);
                    }
                    for (int q = 0; q < 4; q++) {
                        const float *bb = base + b * base_stride + c0 + 16 * q;
                        __m512 sum = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes[q], bb), acc[q]);
                        _mm512_mask_storeu_ps(logits + b * C + c0 + 16 * q, lanes[q], sum);
                    }
                }
            }
        }
    } else {
        for (int64_t b = 0; b < bs; b++)
            memcpy(logits + b * C, base + b * base_stride, sizeof(float) * (size_t)C);
    }
    for (int64_t b = 0; b < bs; b++) {
        const float *lb = logits + b * C;
        __m512 peak = _mm512_set1_ps(-INFINITY);
        int64_t c = 0;
        for (; c + 16 <= C; c += 16) peak = _mm512_max_ps(peak, _mm512_loadu_ps(lb + c));
        float top = _mm512_reduce_max_ps(peak);
        for (; c < C; c++) top = lb[c] > top ? lb[c] : top;
        int64_t pick = 0; /* the first maximal column (torch.argmax's); 0 if all are NaN */
        while (pick < C && !(lb[pick] == top)) pick++;
        if (pick == C) pick = 0;
        const int64_t *ids = pool_ids ? pool_ids + b * C : NULL;
        int64_t token = ids ? ids[pick] : vocab ? vocab[pick] : pick;
        won[b] = 0;
        if (cand && cand[b] >= 0) {
            int64_t cb = cand[b], col = -1;
            if (ids) { /* the candidate's first column in the row's pool */
                for (int64_t c = 0; c < C && col < 0; c++)
                    if (ids[c] == cb) col = c;
            } else {
                col = column ? (cb < vocab_size ? column[cb] : -1) : (cb < C ? cb : -1);
            }
            __m512 sum = _mm512_setzero_ps(), shift = _mm512_set1_ps(top);
            int64_t c = 0;
            for (; c + 16 <= C; c += 16)
                sum = _mm512_add_ps(sum, exp_ps(_mm512_sub_ps(_mm512_loadu_ps(lb + c), shift)));
            float total = _mm512_reduce_add_ps(sum);
            for (; c < C; c++) total += expf(lb[c] - top);
            float lse = top + logf(total);
            float lp_pick = top - lse, lp_c = col >= 0 ? lb[col] - lse : -INFINITY;
            int64_t m = match[b] < 0 ? 0 : (match[b] > max_match ? max_match : match[b]);
            float x = gate_z[b] + match_logit[m];
            float log_g = log_sigmoid_f(x), log_1mg = log_sigmoid_f(-x);
            if (logaddexp_f(log_1mg + lp_c, log_g) > log_1mg + lp_pick) {
                token = cb;
                won[b] = 1;
            }
        }
        next[b] = token;
    }
}

/* The head's GRU over one token per row (rollout.py gru_step, bias-free, gates r, z, n):
   x = embed[tokens[b]] (bf16 table [V, H], widened), s [bs, G] updated in place;
   w_ih [3G, H], w_hh [3G, G], each row read once for all rows; scratch: bs * (H + 6G) floats. */
void domino_gru_step(int64_t bs, int64_t H, int64_t G, const uint16_t *embed,
                     const int64_t *tokens, const float *w_ih, const float *w_hh, float *s,
                     float *scratch) {
    float *x = scratch, *gi = scratch + bs * H, *gh = gi + bs * 3 * G;
    for (int64_t b = 0; b < bs; b++) {
        const uint16_t *row = embed + tokens[b] * H;
        for (int64_t j = 0; j < H; j++) x[b * H + j] = widen(row[j]);
    }
    for (int64_t j = 0; j < 3 * G; j++)
        for (int64_t b = 0; b < bs; b++) {
            gi[b * 3 * G + j] = dot_f32(w_ih + j * H, x + b * H, H);
            gh[b * 3 * G + j] = dot_f32(w_hh + j * G, s + b * G, G);
        }
    for (int64_t b = 0; b < bs; b++) {
        const float *ib = gi + b * 3 * G, *hb = gh + b * 3 * G;
        float *sb = s + b * G;
        for (int64_t j = 0; j < G; j++) {
            float r = sigmoid_f(ib[j] + hb[j]);
            float u = sigmoid_f(ib[G + j] + hb[G + j]);
            float n = tanhf(ib[2 * G + j] + r * hb[2 * G + j]);
            sb[j] = (1.0f - u) * n + u * sb[j];
        }
    }
}

/* One depth of a draft tree's growth (tree.py grow_tree) over a candidate pool: row r = b * K + k
   (request b, frontier node k) has GRU state s [r, G]; its logits over request b's C pool
   columns are base [b, C] (rows base_stride apart) + pool_w2 [b, C, E] . silu(W1 [z_b ; s_r])
   (z rows z_stride apart, w1 [E, H + G]); out [r, W] gets its W largest log-softmax values,
   largest first (equal ones: the lower column first), and col [r, W] their columns.
   scratch: C + E floats. */
void domino_tree_expand(int64_t bs, int64_t K, int64_t H, int64_t G, int64_t E, int64_t C,
                        int64_t W, const float *z, int64_t z_stride, const float *s,
                        const float *base, int64_t base_stride, const float *w1,
                        const float *pool_w2, float *out, int64_t *col, float *scratch) {
    float *logits = scratch, *hidden = scratch + C;
    for (int64_t r = 0; r < bs * K; r++) {
        int64_t b = r / K;
        const float *zb = z + b * z_stride, *sr = s + r * G;
        for (int64_t e = 0; e < E; e++) {
            const float *row = w1 + e * (H + G);
            float h = dot_f32(row, zb, H) + dot_f32(row + H, sr, G);
            hidden[e] = h * sigmoid_f(h); /* SiLU */
        }
        const float *w2 = pool_w2 + b * C * E, *bb = base + b * base_stride;
        float top = -INFINITY;
        for (int64_t c = 0; c < C; c++) {
            logits[c] = bb[c] + dot_f32(w2 + c * E, hidden, E);
            top = logits[c] > top ? logits[c] : top;
        }
        __m512 sum = _mm512_setzero_ps(), shift = _mm512_set1_ps(top);
        int64_t c = 0;
        for (; c + 16 <= C; c += 16)
            sum = _mm512_add_ps(sum, exp_ps(_mm512_sub_ps(_mm512_loadu_ps(logits + c), shift)));
        float total = _mm512_reduce_add_ps(sum);
        for (; c < C; c++) total += expf(logits[c] - top);
        float lse = top + logf(total);
        for (int64_t j = 0; j < W; j++) { /* the first maximal column not taken (taken: NaN) */
            int64_t best = -1;
            for (int64_t c2 = 0; c2 < C; c2++)
                if (logits[c2] == logits[c2] && (best < 0 || logits[c2] > logits[best])) best = c2;
            if (best < 0) best = 0;
            out[r * W + j] = logits[best] - lse;
            col[r * W + j] = best;
            logits[best] = NAN;
        }
    }
}
