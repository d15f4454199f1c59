/*
 * Attention of a few query rows over one sequence's KV pages, read in place from a
 * head-major fp32 pool (kernels/paged_attention/layout.py): every page is visited
 * where it lies, through the page table, so a step neither gathers the context nor
 * depends on how the pages fell in the pool.
 *
 * A layer's keys of kv head h are rows of one matrix [P * B, D] (row page * B + offset);
 * values likewise. The R query rows of a kv head (its query heads times the step's
 * tokens, GQA) see keys 0 .. n-1, no mask. Work items are (kv head, run of pages):
 * each keeps a running max, sum and output per row (online softmax, one page at a
 * time), and the items of a head are merged at the end through their log-sum-exp.
 * Items are spread over OpenMP threads: the process's one libgomp (torch's), as the
 * quant kernels do (kernels/quant/cpu.c).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <omp.h>

#define MAX_B 256     /* block sizes above this are not taken (cpu.py checks) */

/* One item: rows q [R, D] over pages table[p0..p1) (keys < n). Writes o [R, D] (not
 * normalised), m [R] (max score) and l [R] (sum of exp(score - m)). */
static void attend_pages(const float *q, const float *k, const float *v,
                         const int32_t *table, int64_t p0, int64_t p1, int64_t n,
                         int64_t B, int64_t D, int64_t R, float scale,
                         float *o, float *m, float *l)
{
    float s[MAX_B];
    for (int64_t r = 0; r < R; r++) {
        m[r] = -FLT_MAX;
        l[r] = 0.0f;
    }
    memset(o, 0, sizeof(float) * R * D);
    for (int64_t p = p0; p < p1; p++) {
        int64_t cnt = n - p * B < B ? n - p * B : B;
        const float *kp = k + (int64_t)table[p] * B * D;
        const float *vp = v + (int64_t)table[p] * B * D;
        for (int64_t r = 0; r < R; r++) {
            const float *qr = q + r * D;
            float mx = m[r];
            for (int64_t t = 0; t < cnt; t++) {
                const float *kt = kp + t * D;
                float acc = 0.0f;
                #pragma omp simd reduction(+:acc)
                for (int64_t d = 0; d < D; d++)
                    acc += qr[d] * kt[d];
                s[t] = acc * scale;
                mx = s[t] > mx ? s[t] : mx;
            }
            float *orow = o + r * D;
            if (mx > m[r]) {                 /* a new max: what was summed shrinks */
                float c = expf(m[r] - mx);
                l[r] *= c;
                #pragma omp simd
                for (int64_t d = 0; d < D; d++)
                    orow[d] *= c;
                m[r] = mx;
            }
            float sum = 0.0f;
            #pragma omp simd reduction(+:sum)
            for (int64_t t = 0; t < cnt; t++) {
                s[t] = expf(s[t] - mx);
                sum += s[t];
            }
            l[r] += sum;
            for (int64_t t = 0; t < cnt; t++) {
                const float *vt = vp + t * D;
                float w = s[t];
                #pragma omp simd
                for (int64_t d = 0; d < D; d++)
                    orow[d] += w * vt[d];
            }
        }
    }
}

/*
 * q [Hkv, R, D]; k, v: the layer's K and V of kv head 0, heads `hs` floats apart;
 * table: the sequence's pages; keys 0..n-1; out [Hkv, R, D]; lse [Hkv, R] (natural
 * log of the softmax's sum, scores scaled). `splits` runs of pages per kv head;
 * work: Hkv * splits * R * (D + 2) floats of scratch (the caller's, so nothing here
 * can fail to allocate).
 */
void ckpa_attend(const float *q, const float *k, const float *v, int64_t hs,
                 const int32_t *table, int64_t n, int64_t B, int64_t D, int64_t Hkv,
                 int64_t R, float scale, int64_t splits, float *out, float *lse,
                 float *work, int nthreads)
{
    int64_t pages = (n + B - 1) / B;
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
            for (int64_t r = 0; r < R; r++) {
                m[r] = -FLT_MAX;
                l[r] = 0.0f;
            }
            memset(o, 0, sizeof(float) * R * D);
            continue;
        }
        attend_pages(q + h * R * D, k + h * hs, v + h * hs, table, p0, p1, n, B, D, R,
                     scale, o, m, l);
    }
    for (int64_t h = 0; h < Hkv; h++) {
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
                float *o = work + (h * splits + sp) * R * (D + 2);
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
            lse[h * R + r] = mx + logf(sum);
        }
    }
}
