/* The CPU runtime's native bf16 kernels (built by native.py): the linears of a few input rows,
   the residual add with RMS norm, the rotary embedding, SiLU-and-mul, attention over the KV
   pool's slots, the head's greedy rollout positions and a draft tree's growth (fp32), each one
   pass over its data.

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
   no key gets zeros. Each (query, KV head) is computed on its own, in one order, over the keys
   it sees as one list: a tree node's query (mask) sums over the prefix and its ancestors in the
   lanes a plain step's query over the same keys uses, so it gets the plain step's bits. */
void domino_attend(const uint16_t *q, int64_t n, int64_t hq, int64_t d, const uint16_t *k_cache,
                   const uint16_t *v_cache, int64_t hkv, int64_t dv, const int64_t *locs,
                   int64_t keys, const uint8_t *mask, int causal, float scaling, uint16_t *out) {
    int64_t group = hq / hkv, pairs = d / 32, vchunks = dv / 16;
    int64_t *compact = NULL, *seen_count = NULL; /* with a mask: each query's keys, in order */
    if (mask) {
        compact = malloc(sizeof(int64_t) * (size_t)(n * keys > 0 ? n * keys : 1));
        seen_count = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
        for (int64_t i = 0; i < n; i++) {
            seen_count[i] = 0;
            for (int64_t j = 0; j < keys; j++)
                if (mask[i * keys + j]) compact[i * keys + seen_count[i]++] = locs[j];
        }
    }
#pragma omp parallel for collapse(2) schedule(static) if (n * hkv >= 8)
    for (int64_t i = 0; i < n; i++)
        for (int64_t kh = 0; kh < hkv; kh++) {
            int64_t visible = mask ? seen_count[i] : causal ? keys - n + i + 1 : keys;
            if (visible < 0) visible = 0;
            /* the slots of the keys query i sees, in order */
            const int64_t *seen = mask ? compact + i * keys : locs;
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
                    rows[u] = k_cache + (seen[j0 + (u < count ? u : 0)] * hkv + kh) * d;
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
                        scores[g * padded + j0 + u] = dots[u];
                        if (dots[u] > top[g]) top[g] = dots[u];
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
                const uint16_t *vr = v_cache + (seen[j] * hkv + kh) * dv;
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
    free(compact);
    free(seen_count);
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

/* out[r * so] = dot_f32(a + r * sa, b + r * sb, n) for r < count (a stride of 0: one vector
   for all), four at a time: independent accumulators keep the FMA pipeline full where one dot
   waits on its own sum, each summed in dot_f32's order, so each gets dot_f32's bits */
static void dots_f32(const float *a, int64_t sa, const float *b, int64_t sb, int64_t n,
                     int64_t count, float *out, int64_t so) {
    int64_t r = 0;
    for (; r + 4 <= count; r += 4) {
        const float *a0 = a + r * sa, *a1 = a0 + sa, *a2 = a1 + sa, *a3 = a2 + sa;
        const float *b0 = b + r * sb, *b1 = b0 + sb, *b2 = b1 + sb, *b3 = b2 + sb;
        __m512 c0 = _mm512_setzero_ps(), c1 = _mm512_setzero_ps(), c2 = _mm512_setzero_ps(),
               c3 = _mm512_setzero_ps();
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            c0 = _mm512_fmadd_ps(_mm512_loadu_ps(a0 + i), _mm512_loadu_ps(b0 + i), c0);
            c1 = _mm512_fmadd_ps(_mm512_loadu_ps(a1 + i), _mm512_loadu_ps(b1 + i), c1);
            c2 = _mm512_fmadd_ps(_mm512_loadu_ps(a2 + i), _mm512_loadu_ps(b2 + i), c2);
            c3 = _mm512_fmadd_ps(_mm512_loadu_ps(a3 + i), _mm512_loadu_ps(b3 + i), c3);
        }
        float d0 = _mm512_reduce_add_ps(c0), d1 = _mm512_reduce_add_ps(c1),
              d2 = _mm512_reduce_add_ps(c2), d3 = _mm512_reduce_add_ps(c3);
        for (; i < n; i++) {
            d0 += a0[i] * b0[i];
            d1 += a1[i] * b1[i];
            d2 += a2[i] * b2[i];
            d3 += a3[i] * b3[i];
        }
        out[r * so] = d0;
        out[(r + 1) * so] = d1;
        out[(r + 2) * so] = d2;
        out[(r + 3) * so] = d3;
    }
    for (; r < count; r++) out[r * so] = dot_f32(a + r * sa, b + r * sb, n);
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
            for (int64_t b = 0; b < bs; b++) {
                float *lb = logits + b * C;
                dots_f32(pool_w2 + b * C * E, E, hidden + b * E, 0, E, C, lb, 1);
                for (int64_t c = 0; c < C; c++) lb[c] = base[b * base_stride + c] + lb[c];
            }
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
   w_ih [3G, H], w_hh [3G, G]; scratch: bs * (H + 6G) floats. */
void domino_gru_step(int64_t bs, int64_t H, int64_t G, const uint16_t *embed,
                     const int64_t *tokens, const float *w_ih, const float *w_hh, float *s,
                     float *scratch) {
    float *x = scratch, *gi = scratch + bs * H, *gh = gi + bs * 3 * G;
    for (int64_t b = 0; b < bs; b++) {
        const uint16_t *row = embed + tokens[b] * H;
        for (int64_t j = 0; j < H; j++) x[b * H + j] = widen(row[j]);
    }
    if (bs >= 4) { /* four rows at a time, each weight row read once for all */
        for (int64_t j = 0; j < 3 * G; j++) {
            dots_f32(w_ih + j * H, 0, x, H, H, bs, gi + j, 3 * G);
            dots_f32(w_hh + j * G, 0, s, G, G, bs, gh + j, 3 * G);
        }
    } else { /* a few rows: four weight rows at a time */
        for (int64_t b = 0; b < bs; b++) {
            dots_f32(w_ih, H, x + b * H, 0, H, 3 * G, gi + b * 3 * G, 1);
            dots_f32(w_hh, G, s + b * G, 0, G, 3 * G, gh + b * 3 * G, 1);
        }
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

/* The k largest of v [n] into out [k], largest first (equal ones: the lower index first; NaN
   never; index 0 where none is left); taken: n bytes of scratch */
static void top_k_first(const float *v, int64_t n, int64_t k, int64_t *out, uint8_t *taken) {
    memset(taken, 0, (size_t)n);
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t c = 0; c < n; c++)
            if (!taken[c] && v[c] == v[c] && (best < 0 || v[c] > v[best])) best = c;
        if (best < 0) best = 0;
        taken[best] = 1;
        out[j] = best;
    }
}

/* One frontier row's expansion in a draft tree's growth: logits over its request's C pool columns, base bb [C] +
   w2 [C, E] . silu(W1 [zb ; sr]), and their W largest log-softmax values into out [W], largest
   first (equal ones: the lower column first), their columns into col [W].
   scratch: C + 2E floats; taken: C bytes. */
static void expand_row(int64_t H, int64_t G, int64_t E, int64_t C, int64_t W, const float *zb,
                       const float *sr, const float *bb, const float *w1, const float *w2,
                       float *out, int64_t *col, float *scratch, uint8_t *taken) {
    float *logits = scratch, *hidden = scratch + C, *from_s = hidden + E;
    dots_f32(w1, H + G, zb, 0, H, E, hidden, 1);
    dots_f32(w1 + H, H + G, sr, 0, G, E, from_s, 1);
    for (int64_t e = 0; e < E; e++) {
        float h = hidden[e] + from_s[e];
        hidden[e] = h * sigmoid_f(h); /* SiLU */
    }
    dots_f32(w2, E, hidden, 0, E, C, logits, 1);
    float top = -INFINITY;
    for (int64_t c = 0; c < C; c++) {
        logits[c] = bb[c] + logits[c];
        top = logits[c] > top ? logits[c] : top;
    }
    __m512 sum = _mm512_setzero_ps(), shift = _mm512_set1_ps(top);
    int64_t c = 0;
    for (; c + 16 <= C; c += 16)
        sum = _mm512_add_ps(sum, exp_ps(_mm512_sub_ps(_mm512_loadu_ps(logits + c), shift)));
    float total = _mm512_reduce_add_ps(sum);
    for (; c < C; c++) total += expf(logits[c] - top);
    float lse = top + logf(total);
    top_k_first(logits, C, W, col, taken);
    for (int64_t j = 0; j < W; j++) out[j] = logits[col[j]] - lse;
}

/* A draft tree's whole growth below depth 1 and its cut, as tree.py grow_tree's torch steps
   compute them (the same float32 sums in the same order, the same path hashes and constants
   as tree.py's _ROOT_HASH, _HASH_MUL, _KEPT, _DEPTH_TIE), per request b:

   depth 1 is given: its K tokens tok1 [bs, K] and log-probabilities score1 [bs, K]; the GRU
   runs from zero over bonus [bs], then over each depth-1 token. Each depth i = 1 .. D - 1
   expands the K frontier nodes (expand_row over the pool of position i: pool_base [bs, n, C],
   pool_w2 [bs, C, E], pool_ids [bs, C]; z [bs, n, H]) into K children each, offered with the
   path's summed log-probability; the K best of those K * K (the lower index on ties) are the
   next frontier, their GRU states stepped over their tokens. Then each of nb given branches
   [nb, bs, m] (-1: the row's branch ended) offers its first `kept` tokens with the kept
   scores. Offered scores lose DEPTH_TIE per depth. The cut: a path offered twice keeps its
   best-scored copy (the earlier one on ties); the N - 1 best nodes (the earlier on ties),
   ordered by depth then offer, follow the root (bonus); a node's parent is the first node
   whose path hash is its parent's; branch[j] the first given branch whose path (its first
   tokens up to any depth) is node j's, -1 none and for the root.
   Out: tokens, parents, depths, branch [bs, N] int64. Returns 0, or -1 where memory ran out. */
#define TREE_ROOT_HASH 0x5DEECE66DULL
#define TREE_HASH_MUL 0x100000001B3ULL
#define TREE_KEPT 1e5
#define TREE_DEPTH_TIE 1e-4

static inline uint64_t extend_hash(uint64_t h, int64_t token) {
    return h * TREE_HASH_MUL + (uint64_t)token + 1ULL;
}

int domino_tree_grow(int64_t bs, int64_t K, int64_t D, int64_t N, int64_t n, int64_t H,
                     int64_t G, int64_t E, int64_t C, const float *z, const float *pool_base,
                     const float *pool_w2, const int64_t *pool_ids, const float *w1,
                     const uint16_t *embed, const float *w_ih, const float *w_hh,
                     const int64_t *bonus, const float *score1, const int64_t *tok1,
                     int64_t nb, int64_t m, const int64_t *branches, int64_t kept,
                     int64_t *tokens, int64_t *parents, int64_t *depths, int64_t *branch) {
    int64_t offered_kept = kept < m ? kept : m;
    int64_t M = K + (D - 1) * K * K + nb * offered_kept; /* offers per request */
    int64_t KK = K * K, rows = bs * K;
    size_t floats = (size_t)(bs * M + 2 * rows * G + rows * (H + 6 * G) + KK * 2 + C + 2 * E + rows);
    size_t words = (size_t)(4 * bs * M + rows + KK + rows + K + N + nb * m + N);
    int64_t flag_count = C > M ? C : M;
    float *fbuf = malloc(sizeof(float) * floats);
    uint64_t *wbuf = malloc(sizeof(uint64_t) * words);
    uint8_t *flags = malloc((size_t)(flag_count > KK ? flag_count : KK)); /* scratch flags */
    if (!fbuf || !wbuf || !flags) {
        free(fbuf);
        free(wbuf);
        free(flags);
        return -1;
    }
    float *score = fbuf;                      /* [bs, M] offered scores */
    float *state = score + bs * M;            /* [rows, G] the frontier's GRU states */
    float *next_state = state + rows * G;     /* [rows, G] */
    float *gru_scratch = next_state + rows * G;
    float *child_score = gru_scratch + rows * (H + 6 * G); /* [K * K] one request's */
    float *total = child_score + KK;          /* [K * K] */
    float *row_scratch = total + KK;          /* C + 2E */
    float *front = row_scratch + C + 2 * E;   /* [rows] the frontier's path scores */
    int64_t *token = (int64_t *)wbuf;         /* [bs, M] */
    uint64_t *hash = wbuf + bs * M;           /* [bs, M] */
    uint64_t *parent_hash = hash + bs * M;    /* [bs, M] */
    int64_t *depth_of = (int64_t *)(parent_hash + bs * M); /* [bs, M] */
    uint64_t *front_hash = (uint64_t *)(depth_of + bs * M); /* [rows] */
    int64_t *child_col = (int64_t *)(front_hash + rows);    /* [K * K] */
    int64_t *front_tok = child_col + KK;                    /* [rows] */
    int64_t *best = front_tok + rows;                       /* [K] the next frontier */
    uint64_t *node_hash = (uint64_t *)(best + K);           /* [N] */
    uint64_t *path = node_hash + N;                         /* [nb, m] one request's */
    int64_t *picked = (int64_t *)(path + nb * m);           /* [N - 1] the cut */

    /* depth 1: offers, and the GRU from zero over bonus, then over each depth-1 token */
    for (int64_t b = 0; b < bs; b++) {
        for (int64_t k = 0; k < K; k++) {
            int64_t j = b * M + k, t = tok1[b * K + k];
            score[j] = score1[b * K + k] - (float)(TREE_DEPTH_TIE * 1);
            token[j] = t;
            hash[j] = extend_hash(TREE_ROOT_HASH, t);
            parent_hash[j] = TREE_ROOT_HASH;
            depth_of[j] = 1;
            front[b * K + k] = score1[b * K + k];
            front_hash[b * K + k] = hash[j];
            front_tok[b * K + k] = t;
        }
    }
    for (int64_t r = 0; r < bs; r++) memset(state + r * G, 0, sizeof(float) * (size_t)G);
    domino_gru_step(bs, H, G, embed, bonus, w_ih, w_hh, state, gru_scratch);
    for (int64_t r = rows - 1; r >= 0; r--) /* each request's root state, K times */
        memmove(state + r * G, state + (r / K) * G, sizeof(float) * (size_t)G);
    domino_gru_step(rows, H, G, embed, front_tok, w_ih, w_hh, state, gru_scratch);

    for (int64_t i = 1; i < D; i++) { /* expand the frontier of depth i into depth i + 1 */
        for (int64_t b = 0; b < bs; b++) {
            const int64_t *ids = pool_ids + b * C;
            for (int64_t k = 0; k < K; k++) {
                int64_t r = b * K + k;
                expand_row(H, G, E, C, K, z + (b * n + i) * H, state + r * G,
                           pool_base + (b * n + i) * C, w1, pool_w2 + b * C * E,
                           child_score + k * K, child_col + k * K, row_scratch, flags);
            }
            int64_t base_j = b * M + K + (i - 1) * KK;
            for (int64_t c = 0; c < KK; c++) {
                int64_t k = c / K, t = ids[child_col[c]], j = base_j + c;
                total[c] = front[b * K + k] + child_score[c];
                score[j] = total[c] - (float)(TREE_DEPTH_TIE * (double)(i + 1));
                token[j] = t;
                hash[j] = extend_hash(front_hash[b * K + k], t);
                parent_hash[j] = front_hash[b * K + k];
                depth_of[j] = i + 1;
            }
            if (i + 1 >= D) continue;
            top_k_first(total, KK, K, best, flags); /* the K best children */
            for (int64_t k = 0; k < K; k++) {
                int64_t r = b * K + k, j = base_j + best[k];
                front[r] = total[best[k]];
                front_hash[r] = hash[j];
                front_tok[r] = token[j];
                memcpy(next_state + r * G, state + (b * K + best[k] / K) * G,
                       sizeof(float) * (size_t)G);
            }
        }
        if (i + 1 < D) {
            float *swap = state;
            state = next_state;
            next_state = swap;
            domino_gru_step(rows, H, G, embed, front_tok, w_ih, w_hh, state, gru_scratch);
        }
    }

    for (int64_t b = 0; b < bs; b++) {
        float *sc = score + b * M;
        int64_t *tk = token + b * M, *dp = depth_of + b * M;
        uint64_t *hs = hash + b * M, *ph = parent_hash + b * M;
        int64_t j = K + (D - 1) * KK;
        for (int64_t g = 0; g < nb; g++) { /* the given branches' kept nodes, then paths */
            const int64_t *br = branches + (g * bs + b) * m;
            uint64_t h = TREE_ROOT_HASH;
            for (int64_t k = 0; k < m; k++) {
                int64_t t = br[k] < 0 ? 0 : br[k];
                uint64_t nxt = extend_hash(h, t);
                if (k < kept) {
                    sc[j] = br[k] >= 0 ? (float)(TREE_KEPT - 16.0 * (double)(k + 1) - (double)g)
                                       : -INFINITY;
                    sc[j] -= (float)(TREE_DEPTH_TIE * (double)(k + 1));
                    tk[j] = t;
                    hs[j] = nxt;
                    ph[j] = h;
                    dp[j] = k + 1;
                    j++;
                }
                path[g * m + k] = br[k] >= 0 ? nxt : TREE_ROOT_HASH;
                h = nxt;
            }
        }
        uint8_t *drop = flags;
        for (int64_t a = 0; a < M; a++) { /* a path offered twice: its best copy stays */
            drop[a] = 0;
            for (int64_t c = 0; c < M && !drop[a]; c++)
                if (c != a && hs[c] == hs[a] && (sc[c] > sc[a] || (sc[c] == sc[a] && c < a)))
                    drop[a] = 1;
        }
        for (int64_t a = 0; a < M; a++)
            if (drop[a]) sc[a] = -INFINITY;
        int64_t *out_tok = tokens + b * N, *out_par = parents + b * N, *out_dep = depths + b * N;
        int64_t *out_br = branch + b * N;
        top_k_first(sc, M, N - 1, picked, flags); /* the N - 1 best */
        for (int64_t c = 1; c < N - 1; c++) { /* by depth, then offer: insertion sort */
            int64_t v = picked[c], d = c - 1;
            while (d >= 0 && (dp[picked[d]] > dp[v] || (dp[picked[d]] == dp[v] && picked[d] > v))) {
                picked[d + 1] = picked[d];
                d--;
            }
            picked[d + 1] = v;
        }
        out_tok[0] = bonus[b];
        out_dep[0] = 0;
        out_par[0] = 0;
        out_br[0] = -1;
        node_hash[0] = TREE_ROOT_HASH;
        for (int64_t c = 0; c < N - 1; c++) {
            out_tok[c + 1] = tk[picked[c]];
            out_dep[c + 1] = dp[picked[c]];
            node_hash[c + 1] = hs[picked[c]];
        }
        for (int64_t c = 0; c < N - 1; c++) {
            int64_t p = 0;
            for (int64_t q = 0; q < N; q++)
                if (node_hash[q] == ph[picked[c]]) {
                    p = q;
                    break;
                }
            out_par[c + 1] = p;
            int64_t on = -1;
            for (int64_t g = 0; g < nb && on < 0; g++)
                for (int64_t k = 0; k < m; k++)
                    if (path[g * m + k] == node_hash[c + 1]) {
                        on = g;
                        break;
                    }
            out_br[c + 1] = on;
        }
    }
    free(fbuf);
    free(wbuf);
    free(flags);
    return 0;
}
