/*
 * Attention of a few query rows over one sequence's KV pages, read in place from a
 * head-major fp32 or fp16 pool (kernels/paged_attention/layout.py; fp16 halves the
 * bytes a long context's step reads, converted to fp32 on load with F16C, the queries
 * and every sum staying fp32): every page is visited
 * where it lies, through the page table, so a step neither gathers the context nor
 * depends on how the pages fell in the pool.
 *
 * A layer's keys of kv head h are rows of one matrix [P * B, D] (row page * B + offset);
 * values likewise. The R query rows of a kv head (its query heads times the step's
 * tokens, GQA) see keys 0 .. n-1, no mask. Work items are (kv head, run of pages):
 * each keeps a running max, sum and output per row (online softmax, one page at a
 * time), and the items of a head are merged at the end through their log-sum-exp.
 * Items are spread over OpenMP threads: the process's one libgomp (torch's), as the
 * quant kernels do (kernels/quant/cpu.c). With AVX2, the scores of 8 keys at a time and
 * their exponentials are computed on 8 lanes, and the next page is prefetched while
 * one is read (pages lie anywhere in the pool: each is a cold 4 KB for the hardware
 * prefetcher), 1.3-1.4x the plain loops (docs/BENCHMARKS.md).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <omp.h>

#define MAX_B 256     /* block sizes above this are not taken (cpu.py checks) */

#ifdef __AVX2__
#include <immintrin.h>

/* exp(x) on 8 lanes, x <= 0 (scores less their max): Cephes' expf, 2^n times a
 * degree-6 polynomial of the remainder, within 2 ulp of expf; x below -87.3 gives
 * exp(-87.3) (~1e-38) instead of a subnormal, nothing a softmax's sum can see. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.33654f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                   _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* the sums of 8 vectors' lanes, in order */
static inline __m256 hsum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4,
                           __m256 a5, __m256 a6, __m256 a7) {
    __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20),
                         _mm256_permute2f128_ps(t0, t1, 0x31));
}
#endif

/* Keys and values are fp32 or fp16 (`half`: a constant in each copy of the loops below,
 * so each copy has one kind of load). Without F16C nothing reads fp16: ckpa_half()
 * says so, and cpu.py then leaves an fp16 pool to torch. */
#if defined(__AVX2__) && defined(__F16C__)
#define HAVE_HALF 1
#else
#define HAVE_HALF 0
#endif
#define INLINE static inline __attribute__((always_inline))
#define MAX_D 1024    /* head dims above this are not taken (cpu.py checks) */

int ckpa_half(void) { return HAVE_HALF; }

/* element i of p as fp32 */
INLINE float ld1(const void *p, int64_t i, const int half) {
#if HAVE_HALF
    if (half)
        return _cvtsh_ss(((const uint16_t *)p)[i]);
#endif
    return ((const float *)p)[i];
}

#ifdef __AVX2__
/* elements i .. i + 7 of p as fp32 */
INLINE __m256 ld8(const void *p, int64_t i, const int half) {
#if HAVE_HALF
    if (half)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
#endif
    return _mm256_loadu_ps((const float *)p + i);
}
#endif

/* x [D] fp32 into element i.. of p: fp16 rounded to nearest even, as torch's .to() */
INLINE void store_row(void *p, int64_t i, const float *x, int64_t D, const int half) {
#if HAVE_HALF
    if (half) {
        uint16_t *dst = (uint16_t *)p + i;
        for (int64_t d = 0; d < D; d++)
            dst[d] = _cvtss_sh(x[d], _MM_FROUND_TO_NEAREST_INT);
        return;
    }
#endif
    memcpy((float *)p + i, x, sizeof(float) * D);
}

/* s[t] = scale * q . k[t] for t < cnt, keys D elements apart; the max of them */
INLINE float scores(const float *q, const void *kp, int64_t cnt, int64_t D, float scale,
                    float *s, const int half) {
    int64_t t = 0;
#ifdef __AVX2__
    if (D % 8 == 0) {
        for (; t + 8 <= cnt; t += 8) {
            __m256 a[8];
            for (int j = 0; j < 8; j++)
                a[j] = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d += 8) {
                __m256 qd = _mm256_loadu_ps(q + d);
                for (int j = 0; j < 8; j++)
                    a[j] = _mm256_fmadd_ps(qd, ld8(kp, (t + j) * D + d, half), a[j]);
            }
            _mm256_storeu_ps(s + t, _mm256_mul_ps(
                hsum8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]), _mm256_set1_ps(scale)));
        }
    }
#endif
    for (; t < cnt; t++) {
        float acc = 0.0f;
        #pragma omp simd reduction(+:acc)
        for (int64_t d = 0; d < D; d++)
            acc += q[d] * ld1(kp, t * D + d, half);
        s[t] = acc * scale;
    }
    float mx = -FLT_MAX;
    for (t = 0; t < cnt; t++)
        mx = s[t] > mx ? s[t] : mx;
    return mx;
}

/* s[t] = exp(s[t] - mx) for t < cnt; their sum */
static inline float exps(float *s, int64_t cnt, float mx) {
    int64_t t = 0;
    float sum = 0.0f;
#ifdef __AVX2__
    __m256 acc = _mm256_setzero_ps(), vm = _mm256_set1_ps(mx);
    for (; t + 8 <= cnt; t += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), vm));
        _mm256_storeu_ps(s + t, e);
        acc = _mm256_add_ps(acc, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    for (int j = 0; j < 8; j++)
        sum += lanes[j];
#endif
    for (; t < cnt; t++) {
        s[t] = expf(s[t] - mx);
        sum += s[t];
    }
    return sum;
}

/* o[d] += sum over t < cnt of w[t] * v[t][d], t in order for each d; with AVX2 a row's
 * 64 (or 8) dims stay in registers across the page's keys */
INLINE void accumulate(float *o, const float *w, const void *vp, int64_t cnt, int64_t D,
                       const int half) {
    int64_t d0 = 0;
#ifdef __AVX2__
    for (; d0 + 64 <= D; d0 += 64) {
        __m256 a[8];
        for (int j = 0; j < 8; j++)
            a[j] = _mm256_loadu_ps(o + d0 + 8 * j);
        for (int64_t t = 0; t < cnt; t++) {
            __m256 wt = _mm256_set1_ps(w[t]);
            for (int j = 0; j < 8; j++)
                a[j] = _mm256_fmadd_ps(wt, ld8(vp, t * D + d0 + 8 * j, half), a[j]);
        }
        for (int j = 0; j < 8; j++)
            _mm256_storeu_ps(o + d0 + 8 * j, a[j]);
    }
    for (; d0 + 8 <= D; d0 += 8) {
        __m256 a = _mm256_loadu_ps(o + d0);
        for (int64_t t = 0; t < cnt; t++)
            a = _mm256_fmadd_ps(_mm256_set1_ps(w[t]), ld8(vp, t * D + d0, half), a);
        _mm256_storeu_ps(o + d0, a);
    }
#endif
    for (; d0 < D; d0++) {
        float a = o[d0];
        for (int64_t t = 0; t < cnt; t++)
            a += w[t] * ld1(vp, t * D + d0, half);
        o[d0] = a;
    }
}

/* One item: rows q [R, D] over pages table[p0..p1) (keys < n) of k, v (fp16 where
 * `half`). Writes o [R, D] (not normalised), m [R] (max score) and l [R] (sum of
 * exp(score - m)). */
INLINE void attend_pages_of(const float *q, const void *k, const void *v,
                            const int32_t *table, int64_t p0, int64_t p1, int64_t n,
                            int64_t B, int64_t D, int64_t R, float scale,
                            float *o, float *m, float *l, const int half)
{
    float s[MAX_B];
    const int64_t page = B * D * (half ? 2 : 4);      /* bytes */
    for (int64_t r = 0; r < R; r++) {
        m[r] = -FLT_MAX;
        l[r] = 0.0f;
    }
    memset(o, 0, sizeof(float) * R * D);
    for (int64_t p = p0; p < p1; p++) {
        int64_t cnt = n - p * B < B ? n - p * B : B;
        const char *kp = (const char *)k + (int64_t)table[p] * page;
        const char *vp = (const char *)v + (int64_t)table[p] * page;
        if (p + 1 < p1) {            /* the next page lies elsewhere: fetch it meanwhile */
            const char *kn = (const char *)k + (int64_t)table[p + 1] * page;
            const char *vn = (const char *)v + (int64_t)table[p + 1] * page;
            for (int64_t b = 0; b < page; b += 64) {
                __builtin_prefetch(kn + b);
                __builtin_prefetch(vn + b);
            }
        }
        for (int64_t r = 0; r < R; r++) {
            float mx = scores(q + r * D, kp, cnt, D, scale, s, half);
            float *orow = o + r * D;
            if (mx > m[r]) {                 /* a new max: what was summed shrinks */
                float c = expf(m[r] - mx);
                l[r] *= c;
                #pragma omp simd
                for (int64_t d = 0; d < D; d++)
                    orow[d] *= c;
                m[r] = mx;
            }
            l[r] += exps(s, cnt, m[r]);
            accumulate(orow, s, vp, cnt, D, half);
        }
    }
}

static void attend_f32(const float *q, const void *k, const void *v, const int32_t *table,
                       int64_t p0, int64_t p1, int64_t n, int64_t B, int64_t D, int64_t R,
                       float scale, float *o, float *m, float *l)
{
    attend_pages_of(q, k, v, table, p0, p1, n, B, D, R, scale, o, m, l, 0);
}

static void attend_f16(const float *q, const void *k, const void *v, const int32_t *table,
                       int64_t p0, int64_t p1, int64_t n, int64_t B, int64_t D, int64_t R,
                       float scale, float *o, float *m, float *l)
{
    attend_pages_of(q, k, v, table, p0, p1, n, B, D, R, scale, o, m, l, 1);
}

static void attend_pages(const float *q, const void *k, const void *v,
                         const int32_t *table, int64_t p0, int64_t p1, int64_t n,
                         int64_t B, int64_t D, int64_t R, float scale,
                         float *o, float *m, float *l, int half)
{
    (half ? attend_f16 : attend_f32)(q, k, v, table, p0, p1, n, B, D, R, scale, o, m, l);
}

/* Each of H heads' R rows from its `splits` items in work (o [R, D], m [R], l [R]
 * each): out [H, R, D] normalised, and lse [H, R] unless it is NULL. */
static void merge(const float *work, int64_t H, int64_t splits, int64_t R, int64_t D,
                  float *out, float *lse)
{
    for (int64_t h = 0; h < H; h++) {
        for (int64_t r = 0; r < R; r++) {
            float mx = -FLT_MAX;
            for (int64_t sp = 0; sp < splits; sp++) {
                float ms = work[(h * splits + sp) * R * (D + 2) + R * D + r];
                mx = ms > mx ? ms : mx;
            }
            float sum = 0.0f;
            float *dst = out + (h * R + r) * D;
            memset(dst, 0, sizeof(float) * D);
            for (int64_t sp = 0; sp < splits; sp++) {
                const float *o = work + (h * splits + sp) * R * (D + 2);
                float ls = o[R * D + R + r];
                if (ls == 0.0f)
                    continue;
                float c = expf(o[R * D + r] - mx);
                sum += ls * c;
                for (int64_t d = 0; d < D; d++)
                    dst[d] += c * o[r * D + d];
            }
            float inv = 1.0f / sum;
            for (int64_t d = 0; d < D; d++)
                dst[d] *= inv;
            if (lse)
                lse[h * R + r] = mx + logf(sum);
        }
    }
}

/* One item's pages: run sp of `splits` over the sequence's ceil(n / B) pages (fewer
 * runs where it has fewer pages than splits: the rest are empty, p0 >= p1). */
static void item_pages(int64_t n, int64_t B, int64_t splits, int64_t sp, int64_t *p0,
                       int64_t *p1)
{
    int64_t pages = (n + B - 1) / B;
    int64_t runs = splits < pages ? splits : pages;
    int64_t per = (pages + runs - 1) / runs;
    *p0 = sp * per;
    *p1 = *p0 + per < pages ? *p0 + per : pages;
}

/* An item of nothing: no rows, no weight (merge skips it) */
static void empty_item(float *o, int64_t R, int64_t D)
{
    float *m = o + R * D, *l = m + R;
    for (int64_t r = 0; r < R; r++) {
        m[r] = -FLT_MAX;
        l[r] = 0.0f;
    }
    memset(o, 0, sizeof(float) * R * D);
}

/*
 * q [Hkv, R, D]; k, v: the layer's K and V of kv head 0 (fp16 where `half`, else fp32),
 * heads `hs` elements apart; table: the sequence's pages; keys 0..n-1; out [Hkv, R, D];
 * lse [Hkv, R] (natural log of the softmax's sum, scores scaled). `splits` runs of pages
 * per kv head; work: Hkv * splits * R * (D + 2) floats of scratch (the caller's, so
 * nothing here can fail to allocate).
 */
void ckpa_attend(const float *q, const void *k, const void *v, int64_t hs,
                 const int32_t *table, int64_t n, int64_t B, int64_t D, int64_t Hkv,
                 int64_t R, float scale, int64_t splits, float *out, float *lse,
                 float *work, int nthreads, int half)
{
    int64_t pages = (n + B - 1) / B, es = half ? 2 : 4;
    if (splits > pages)
        splits = pages;
    if (splits < 1)
        splits = 1;
    int64_t per = (pages + splits - 1) / splits;
    int64_t items = Hkv * splits;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t it = 0; it < items; it++) {
        int64_t h = it / splits, sp = it % splits;
        int64_t p0 = sp * per, p1 = p0 + per < pages ? p0 + per : pages;
        float *o = work + it * R * (D + 2);
        float *m = o + R * D, *l = m + R;
        if (p0 >= p1) {
            empty_item(o, R, D);
            continue;
        }
        attend_pages(q + h * R * D, (const char *)k + h * hs * es,
                     (const char *)v + h * hs * es, table, p0, p1, n, B, D, R, scale, o,
                     m, l, half);
    }
    merge(work, Hkv, splits, R, D, out, lse);
}

/* Rotate-half rotary of x's first R dims (pairs j and j + R/2) by c, s [R], as
 * x * c + rotate_half(x) * s in separate roundings: torch's ops, value for value. */
__attribute__((optimize("fp-contract=off")))
static void rotate(float *x, const float *c, const float *s, int64_t R)
{
    int64_t half = R / 2;
    for (int64_t j = 0; j < half; j++) {
        float a = x[j], b = x[j + half];
        x[j] = a * c[j] + (-b) * s[j];
        x[j + half] = b * c[j + half] + a * s[j + half];
    }
}

/*
 * One attention layer of a decode step, N sequences of one new token each, after the
 * q/k/v projection: qkv [N, (Hq + 2 Hkv) * D] (q heads, k heads, v heads). Each
 * token's q and k heads are rotated by cos, sin [N, Rr] (q into q [N, Hq, D], the
 * caller's scratch), its k and v written at row kv_index[i] of the layer's K and V
 * (k, v: kv head 0's matrix, heads hs elements apart, fp16 where `half`: rotated in
 * fp32, then rounded), then its Hq / Hkv query heads per kv head attend keys
 * 0 .. lens[i] - 1 of its pages (tables + i * W): out [N, Hq, D]. splits: runs of
 * pages per (sequence, kv head); work: N * Hkv * splits * (Hq / Hkv) * (D + 2) floats.
 */
void ckpa_decode_step(const float *qkv, int64_t N, int64_t Hq, int64_t Hkv, int64_t D,
                      const float *cos, const float *sin, int64_t Rr, void *k, void *v,
                      int64_t hs, const int64_t *kv_index, const int32_t *tables,
                      int64_t W, const int32_t *lens, int64_t B, float scale,
                      int64_t splits, float *q, float *out, float *work, int nthreads,
                      int half)
{
    int64_t row = (Hq + 2 * Hkv) * D, R = Hq / Hkv;
    float kt[MAX_D];
    for (int64_t i = 0; i < N; i++) {
        const float *src = qkv + i * row, *c = cos + i * Rr, *s = sin + i * Rr;
        float *qi = q + i * Hq * D;
        memcpy(qi, src, sizeof(float) * Hq * D);
        for (int64_t h = 0; h < Hq; h++)
            rotate(qi + h * D, c, s, Rr);
        for (int64_t h = 0; h < Hkv; h++) {
            memcpy(kt, src + (Hq + h) * D, sizeof(float) * D);
            rotate(kt, c, s, Rr);
            if (half) {
                store_row(k, h * hs + kv_index[i] * D, kt, D, 1);
                store_row(v, h * hs + kv_index[i] * D, src + (Hq + Hkv + h) * D, D, 1);
            } else {
                store_row(k, h * hs + kv_index[i] * D, kt, D, 0);
                store_row(v, h * hs + kv_index[i] * D, src + (Hq + Hkv + h) * D, D, 0);
            }
        }
    }
    if (splits < 1)
        splits = 1;
    int64_t items = N * Hkv * splits, es = half ? 2 : 4;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t it = 0; it < items; it++) {
        int64_t i = it / (Hkv * splits), h = it / splits % Hkv, sp = it % splits;
        float *o = work + it * R * (D + 2);
        int64_t p0, p1;
        item_pages(lens[i], B, splits, sp, &p0, &p1);
        if (p0 >= p1) {
            empty_item(o, R, D);
            continue;
        }
        attend_pages(q + (i * Hq + h * R) * D, (const char *)k + h * hs * es,
                     (const char *)v + h * hs * es, tables + i * W, p0, p1, lens[i], B, D,
                     R, scale, o, o + R * D, o + R * D + R, half);
    }
    merge(work, N * Hkv, splits, R, D, out, NULL);
}
