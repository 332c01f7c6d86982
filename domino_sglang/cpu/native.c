/* The CPU runtime's native bf16 kernels (built by native.py): the linears of a few input rows,
   the residual add with RMS norm, and the rotary embedding, each one pass over its data.

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
