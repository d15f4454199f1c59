/* Kept GGUF weights on the CPU: y[M, N] = x[M, K] @ W[N, K]^T with W in a GGML block
 * format, dequantized block by block into registers-sized scratch (never into a
 * full fp32 copy), and the dequantization alone for long steps (cpu.py).
 *
 * Each block is dequantized with ggml-quants.c's dequantize_row_* formulas, in the
 * same fp32 operations: built with -ffp-contract=off, so d * q + m is never fused into
 * an fma and the values equal the gguf package's dequantize bit for bit (with AVX2, the
 * 32-value formats in intrinsics: the same operations on 8 lanes). The dot products fuse
 * their multiply-adds over four 8-lane accumulators: a 16-lane GCC vector spilled to
 * the stack every step on AVX2 (1.7 ns a Q4_1 value against 0.2 now, docs/BENCHMARKS.md).
 * Rows are split over OpenMP threads: the process's one libgomp (torch's), since it
 * is loaded first under the same soname. */
#include <stdint.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum { F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30 };

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#ifdef __F16C__
static inline float h2f(const uint8_t *p) {       /* exact: the hardware conversion */
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
#else
static inline float h2f(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) {
        if (m == 0) { u = s; }
        else {                                   /* subnormal: normalise */
            e = 113;
            while (!(m & 0x400)) { m <<= 1; e--; }
            u = s | (e << 23) | ((m & 0x3ff) << 13);
        }
    } else if (e == 31) {
        u = s | 0x7f800000u | (m << 13);
    } else {
        u = s | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#endif

static inline float bf2f(const uint8_t *p) {
    uint32_t u = (uint32_t)(p[0] | (p[1] << 8)) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline void k_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) { *d = q[j] & 63; *m = q[j + 4] & 63; }
    else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* one block -> y[block size] */
static inline __attribute__((always_inline)) void deq_block(int t, const uint8_t *restrict b, float *restrict y) {
    switch (t) {
#ifdef __AVX2__
    /* the same operations, 8 lanes at a time (an int -> float conversion, a multiply, an
     * add: each rounded as the scalar code rounds it) */
    case Q4_0: case Q4_1: {
        const __m256 d = _mm256_set1_ps(h2f(b));
        const __m256 m = _mm256_set1_ps(t == Q4_1 ? h2f(b + 2) : 0.f);
        const __m128i q = _mm_loadu_si128((const __m128i *)(b + (t == Q4_1 ? 4 : 2)));
        const __m128i nib = _mm_set1_epi8(0xF);
        const __m128i half[2] = {_mm_and_si128(q, nib),
                                 _mm_and_si128(_mm_srli_epi16(q, 4), nib)};
        for (int h = 0; h < 2; h++) {
            for (int e = 0; e < 2; e++) {
                __m256i qi = _mm256_cvtepu8_epi32(e ? _mm_srli_si128(half[h], 8) : half[h]);
                if (t == Q4_0) qi = _mm256_sub_epi32(qi, _mm256_set1_epi32(8));
                __m256 v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(qi));
                if (t == Q4_1) v = _mm256_add_ps(v, m);
                _mm256_storeu_ps(y + 16 * h + 8 * e, v);
            }
        }
        break;
    }
    case Q8_0: {
        const __m256 d = _mm256_set1_ps(h2f(b));
        for (int e = 0; e < 4; e++) {
            __m128i q = _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * e));
            _mm256_storeu_ps(y + 8 * e, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
        }
        break;
    }
#else
    case Q4_0: {
        const float d = h2f(b);
        for (int l = 0; l < 16; l++) y[l] = d * (float)((int)(b[2 + l] & 0xF) - 8);
        for (int l = 0; l < 16; l++) y[l + 16] = d * (float)((int)(b[2 + l] >> 4) - 8);
        break;
    }
    case Q4_1: {
        const float d = h2f(b), m = h2f(b + 2);
        for (int l = 0; l < 16; l++) y[l] = d * (float)(b[4 + l] & 0xF) + m;
        for (int l = 0; l < 16; l++) y[l + 16] = d * (float)(b[4 + l] >> 4) + m;
        break;
    }
    case Q8_0: {
        const float d = h2f(b);
        for (int l = 0; l < 32; l++) y[l] = (float)(int8_t)b[2 + l] * d;
        break;
    }
#endif
    case Q4_K: case Q5_K: {
        const float d = h2f(b), dmin = h2f(b + 2);
        const uint8_t *sc = b + 4, *qh = b + 16, *ql = b + (t == Q4_K ? 16 : 48);
        uint8_t s, mn;
        for (int j = 0; j < 4; j++) {
            k_scale_min(2 * j, sc, &s, &mn);
            const float d1 = d * (float)s, m1 = dmin * (float)mn;
            k_scale_min(2 * j + 1, sc, &s, &mn);
            const float d2 = d * (float)s, m2 = dmin * (float)mn;
            for (int l = 0; l < 32; l++) {
                int lo = ql[32 * j + l] & 0xF, hi = ql[32 * j + l] >> 4;
                if (t == Q5_K) {
                    lo |= ((qh[l] >> (2 * j)) & 1) << 4;
                    hi |= ((qh[l] >> (2 * j + 1)) & 1) << 4;
                }
                y[64 * j + l] = d1 * (float)lo - m1;
                y[64 * j + 32 + l] = d2 * (float)hi - m2;
            }
        }
        break;
    }
    case Q6_K: {
        const float d = h2f(b + 208);
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int n = 0; n < 2; n++) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = (d * (float)sc[is]) * (float)q1;
                y[l + 32] = (d * (float)sc[is + 2]) * (float)q2;
                y[l + 64] = (d * (float)sc[is + 4]) * (float)q3;
                y[l + 96] = (d * (float)sc[is + 6]) * (float)q4;
            }
            y += 128; ql += 64; qh += 32; sc += 8;
        }
        break;
    }
    }
}

static int block_values(int t) {
    return (t == Q4_K || t == Q5_K || t == Q6_K) ? 256 : 32;
}

static int block_bytes(int t) {
    switch (t) {
    case Q4_0: return 18; case Q4_1: return 20; case Q8_0: return 34;
    case Q4_K: return 144; case Q5_K: return 176; case Q6_K: return 210;
    default: return 64;           /* F16 / BF16: 32 values of 2 bytes */
    }
}

/* a row of K values -> y[K]; one switch per row, so each loop below is specialised
 * to its format and vectorized */
static void deq_row(int t, const uint8_t *restrict row, int64_t K, float *restrict y) {
    const int bv = block_values(t), bb = block_bytes(t);
    const int64_t nb = K / bv;
    switch (t) {
    case F16: for (int64_t k = 0; k < K; k++) y[k] = h2f(row + 2 * k); break;
    case BF16: for (int64_t k = 0; k < K; k++) y[k] = bf2f(row + 2 * k); break;
#define EACH(T) case T: for (int64_t b = 0; b < nb; b++) deq_block(T, row + b * bb, y + b * bv); break;
    EACH(Q4_0) EACH(Q4_1) EACH(Q8_0) EACH(Q4_K) EACH(Q5_K) EACH(Q6_K)
#undef EACH
    }
}

typedef float v8 __attribute__((vector_size(32)));

/* sum a[k] b[k]: four accumulators of 8 lanes (AVX2 registers; GCC splits or joins
 * them on other widths); this function alone may fuse its multiply-adds */
__attribute__((optimize("fp-contract=fast")))
static float dot(const float *restrict a, const float *restrict b, int64_t K) {
    v8 acc0 = {0}, acc1 = {0}, acc2 = {0}, acc3 = {0}, va, vb;
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        memcpy(&va, a + k, 32); memcpy(&vb, b + k, 32); acc0 += va * vb;
        memcpy(&va, a + k + 8, 32); memcpy(&vb, b + k + 8, 32); acc1 += va * vb;
        memcpy(&va, a + k + 16, 32); memcpy(&vb, b + k + 16, 32); acc2 += va * vb;
        memcpy(&va, a + k + 24, 32); memcpy(&vb, b + k + 24, 32); acc3 += va * vb;
    }
    for (; k + 8 <= K; k += 8) { memcpy(&va, a + k, 32); memcpy(&vb, b + k, 32); acc0 += va * vb; }
    acc0 = (acc0 + acc1) + (acc2 + acc3);
    float s = 0.f;
    for (; k < K; k++) s += a[k] * b[k];
    for (int l = 0; l < 8; l++) s += acc0[l];
    return s;
}

/* rows [r0, r1) of W (row_bytes apart) -> out [(r1 - r0), K] fp32 */
void ckq_dequant(int t, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1,
                 int64_t K, float *out, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r = r0; r < r1; r++) deq_row(t, w + r * row_bytes, K, out + (r - r0) * K);
}

/* y[m, n] = sum_k x[m, k] W[n, k] for n < N, m < M: each row of W is dequantized once
 * into a per-thread scratch row (L1/L2-sized), then dotted with every x[m] */
void ckq_gemv(int t, const uint8_t *w, int64_t row_bytes, int64_t N, int64_t K,
              const float *x, int64_t M, float *y, float *scratch, int nthreads) {
    #pragma omp parallel num_threads(nthreads)
    {
        float *tmp = scratch;
#ifdef _OPENMP
        tmp += (int64_t)omp_get_thread_num() * K;
#endif
        #pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            deq_row(t, w + n * row_bytes, K, tmp);
            for (int64_t m = 0; m < M; m++) y[m * N + n] = dot(tmp, x + m * K, K);
        }
    }
}

/* ---- the integer dot (--gemv-activations q8), as llama.cpp multiplies its steps:
 * the activations rounded to int8 per block of 32 (d = max|x| / 127, q = x / d rounded
 * to nearest even, clamped to +-127), each weight block's integer dot with them exact
 * in int32, then scaled in fp32. The integers are those of tests/kernels/q8_model.py's
 * numpy model, and so are the fp32 operations and their order: per block, 8 lanes each
 * summing 4 neighbouring products, acc[l] = acc[l] + (dw * dx) * lane[l], a fixed
 * tree over the lanes at the end, then Q4_1's min term (sum of mw * (dx * sum q)) added.
 * With VNNI (chosen by -march=native when this CPU has it) the lanes come from one
 * dpbusd; else from maddubs + madd, which cannot saturate here: |w| <= 128 (Q8_0's sign
 * trick), |q| <= 127, so a pair stays under 2^15. */

enum { XB = 32 };

/* x [M, K] fp32 -> q int8 [M, K] and ds [M, K / 32, 2]: (d, d * sum of the block's q) */
void ckq_quantize_q8(const float *x, int64_t M, int64_t K, int8_t *q, float *ds) {
    const int64_t nb = M * (K / XB);
    for (int64_t r = 0; r < nb; r++) {
        const float *v = x + r * XB;
        float amax = 0.f;
        for (int l = 0; l < XB; l++) amax = fmaxf(amax, fabsf(v[l]));
        const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
        int sum = 0;
        for (int l = 0; l < XB; l++) {
            float t = nearbyintf(v[l] * id);
            t = t > 127.f ? 127.f : (t < -127.f ? -127.f : t);
            q[r * XB + l] = (int8_t)t;
            sum += (int)t;
        }
        ds[2 * r] = d;
        ds[2 * r + 1] = d * (float)sum;
    }
}

#ifdef __AVX2__
static inline __m256i nibbles(const uint8_t *qs) {      /* 16 bytes -> 32 values in order */
    const __m128i b = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0xF);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

static inline __m256i lanes(__m256i u, __m256i s) {      /* u8 x s8, 4 products a lane */
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* one row of W . MC rows of x (K apart) -> y[0], y[N], ...: each weight block unpacked
 * once for all of them; each (row, x) pair's operations as for MC = 1 */
static inline __attribute__((always_inline))
void dot_q8(const int t, const int MC, const uint8_t *restrict w, const int8_t *restrict xq,
            const float *restrict ds, int64_t K, float *y, int64_t N) {
    const int64_t nb = K / XB;
    __m256 acc[4];
    float macc[4];
    for (int m = 0; m < MC; m++) { acc[m] = _mm256_setzero_ps(); macc[m] = 0.f; }
    const int bb = t == Q4_1 ? 20 : (t == Q4_0 ? 18 : 34);
    for (int64_t b = 0; b < nb; b++, w += bb) {
        __m256i u, ws = _mm256_setzero_si256();
        if (t == Q4_1) {
            u = nibbles(w + 4);
        } else {
            ws = t == Q4_0 ? _mm256_sub_epi8(nibbles(w + 2), _mm256_set1_epi8(8))
                           : _mm256_loadu_si256((const __m256i *)(w + 2));
            u = _mm256_sign_epi8(ws, ws);
        }
        const float dw = h2f(w), mw = t == Q4_1 ? h2f(w + 2) : 0.f;
        for (int m = 0; m < MC; m++) {
            const float *dm = ds + 2 * (m * nb + b);
            __m256i x = _mm256_loadu_si256((const __m256i *)(xq + m * K + XB * b));
            if (t != Q4_1) x = _mm256_sign_epi8(x, ws);
            if (t == Q4_1) macc[m] = macc[m] + mw * dm[1];
            const __m256 dd = _mm256_set1_ps(dw * dm[0]);
            acc[m] = _mm256_add_ps(acc[m], _mm256_mul_ps(dd, _mm256_cvtepi32_ps(lanes(u, x))));
        }
    }
    for (int m = 0; m < MC; m++) {
        __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc[m]), _mm256_extractf128_ps(acc[m], 1));
        v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        v = _mm_add_ss(v, _mm_movehdup_ps(v));
        y[m * N] = _mm_cvtss_f32(v) + macc[m];
    }
}
#else
static inline __attribute__((always_inline))
float dot_row(const int t, const uint8_t *restrict w, const int8_t *restrict xq,
              const float *restrict ds, int64_t nb) {
    float acc[8] = {0}, macc = 0.f;
    const int bb = t == Q4_1 ? 20 : (t == Q4_0 ? 18 : 34);
    for (int64_t b = 0; b < nb; b++, w += bb) {
        int wv[XB];
        if (t == Q8_0) {
            for (int l = 0; l < XB; l++) wv[l] = (int8_t)w[2 + l];
        } else {
            const uint8_t *qs = w + (t == Q4_1 ? 4 : 2);
            const int off = t == Q4_0 ? 8 : 0;
            for (int l = 0; l < 16; l++) {
                wv[l] = (qs[l] & 0xF) - off;
                wv[l + 16] = (qs[l] >> 4) - off;
            }
        }
        if (t == Q4_1) macc = macc + h2f(w + 2) * ds[2 * b + 1];
        const float dd = h2f(w) * ds[2 * b];
        const int8_t *x = xq + XB * b;
        for (int l = 0; l < 8; l++) {
            int s = 0;
            for (int i = 4 * l; i < 4 * l + 4; i++) s += wv[i] * x[i];
            acc[l] = acc[l] + dd * (float)s;
        }
    }
    return (((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7])))
           + macc;
}

static inline __attribute__((always_inline))
void dot_q8(const int t, const int MC, const uint8_t *restrict w, const int8_t *restrict xq,
            const float *restrict ds, int64_t K, float *y, int64_t N) {
    for (int m = 0; m < MC; m++) y[m * N] = dot_row(t, w, xq + m * K, ds + 2 * m * (K / XB), K / XB);
}
#endif

/* y[m0 .. m0 + MC, n], MC = min(4, M - m0) */
static inline __attribute__((always_inline))
void rows_of_x(const int t, const uint8_t *w, const int8_t *xq, const float *ds, int64_t K,
               int64_t M, int64_t m0, float *y, int64_t N) {
    xq += m0 * K;
    ds += 2 * m0 * (K / XB);
    y += m0 * N;
    switch (M - m0 < 4 ? M - m0 : 4) {
    case 1: dot_q8(t, 1, w, xq, ds, K, y, N); break;
    case 2: dot_q8(t, 2, w, xq, ds, K, y, N); break;
    case 3: dot_q8(t, 3, w, xq, ds, K, y, N); break;
    default: dot_q8(t, 4, w, xq, ds, K, y, N); break;
    }
}

/* y[m, n] = W[n] . x[m] for the integer formats, x as ckq_quantize_q8 left it: a row of W
 * at a time against up to 4 rows of x (the row stays in L1 over all of x); returns -1
 * for a format without an integer dot (the caller multiplies in fp32) */
int ckq_gemv_q8(int t, const uint8_t *w, int64_t row_bytes, int64_t N, int64_t K,
                const int8_t *xq, const float *ds, int64_t M, float *y, int nthreads) {
    if (t != Q4_0 && t != Q4_1 && t != Q8_0) return -1;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *row = w + n * row_bytes;
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
            switch (t) {          /* a constant format in each call: specialised loops */
            case Q4_0: rows_of_x(Q4_0, row, xq, ds, K, M, m0, y + n, N); break;
            case Q4_1: rows_of_x(Q4_1, row, xq, ds, K, M, m0, y + n, N); break;
            default: rows_of_x(Q8_0, row, xq, ds, K, M, m0, y + n, N); break;
            }
        }
    }
    return 0;
}

/* ckq_gemv_q8 with x [M, K] fp32 quantized first into q / ds (quantize != 0), or q / ds
 * as an earlier call over the same x left them: one call a matmul */
int ckq_matmul_q8(int t, const uint8_t *w, int64_t row_bytes, int64_t N, int64_t K,
                  const float *x, int64_t M, int8_t *xq, float *ds, int quantize, float *y,
                  int nthreads) {
    if (quantize) ckq_quantize_q8(x, M, K, xq, ds);
    return ckq_gemv_q8(t, w, row_bytes, N, K, xq, ds, M, y, nthreads);
}
