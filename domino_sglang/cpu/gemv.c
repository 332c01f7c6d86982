/* bf16 linear layers for few input rows on x86 CPUs with AVX512-BF16 (built by gemv.py).

   A decode step or a short verify multiplies a handful of rows by every weight of the model once,
   so its linears are bound by how fast the weights stream from memory. The weight is packed once
   into blocks of BLOCK output features laid out as [K/2][BLOCK][2] (the pairs VDPBF16PS reads),
   so each block is one contiguous run of memory read once per call; every output is a bf16 dot
   product accumulated in fp32 over k in one fixed order, so an input row gets the same bits
   whatever other rows share the call (a verify row equals the plain step's row). */

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#define BLOCK 32 /* output features per packed block: two 16-lane fp32 accumulators */
#define ROWS 8   /* input rows per tile: 2 x ROWS accumulators stay in registers */

int domino_gemv_supported(void) {
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
