/*
 * A decode step's row ops on the CPU, fp32, for kernels/norm/cpu.py: RMSNorm (after
 * the residual add that precedes it) and SwiGLU. A decode step's rows are a few
 * hundred floats each, so what these save is torch's per-op cost (a norm was ~8 ops),
 * not arithmetic; they run on the calling thread. Each value is computed with the
 * reference's operations in its order (kernels/norm/naive.py, kernels/swiglu/naive.py),
 * separately rounded (-ffp-contract=off); only the sum of squares adds in another order.
 */
#include <math.h>
#include <stdint.h>

/* out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * (w + offset), rows of D */
void ckn_rms_norm(const float *x, const float *w, float offset, float eps, int64_t rows,
                  int64_t D, float *out)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D;
        float *o = out + r * D;
        float acc[8] = {0};
        int64_t d = 0;
        for (; d + 8 <= D; d += 8)
            for (int j = 0; j < 8; j++)
                acc[j] += xr[d + j] * xr[d + j];
        float ss = 0.0f;
        for (; d < D; d++)
            ss += xr[d] * xr[d];
        for (int j = 0; j < 8; j++)
            ss += acc[j];
        float inv = 1.0f / sqrtf(ss / (float)D + eps);
        if (offset != 0.0f) {
            for (d = 0; d < D; d++)
                o[d] = xr[d] * inv * (w[d] + offset);
        } else {
            for (d = 0; d < D; d++)
                o[d] = w[d] * (xr[d] * inv);
        }
    }
}

/* x += delta, then out = ckn_rms_norm(x): a residual add and the next norm */
void ckn_add_rms_norm(float *x, const float *delta, const float *w, float offset,
                      float eps, int64_t rows, int64_t D, float *out)
{
    for (int64_t i = 0; i < rows * D; i++)
        x[i] += delta[i];
    ckn_rms_norm(x, w, offset, eps, rows, D, out);
}

/* out [rows, I] = silu(gate) * up, from gu [rows, 2 I] = [gate | up] */
void ckn_silu_mul(const float *gu, int64_t rows, int64_t I, float *out)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * 2 * I, *u = g + I;
        float *o = out + r * I;
        for (int64_t j = 0; j < I; j++)
            o[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    }
}
