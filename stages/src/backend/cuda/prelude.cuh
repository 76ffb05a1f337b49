/* tessera cuda backend prelude: device helpers shared by every generated kernel of a module.
 *
 * Compiled by NVRTC without any header: the fixed-width integer types and the few macros the scalar
 * expressions use are defined here. The helpers are the C prelude's (stages/src/backend/c/prelude.h), made
 * device functions, so the GPU computes what the reference interpreter computes: transcendental functions
 * in double rounded once to float, NaN-propagating min/max, wrapping integer arithmetic, truncating
 * float -> integer conversions that give the target's minimum for NaN and out-of-range values.
 */
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#define INT64_C(v) (v##LL)
#define INT64_MIN (-9223372036854775807LL - 1)
#define INT32_MIN (-2147483647 - 1)
#define TSR_NAN __int_as_float(0x7fc00000)
/* The spellings of the shared scalar expressions (backend/c/cexpr.rs) for NaN and infinity. */
#define __builtin_nanf(s) TSR_NAN
#define __builtin_inff() __int_as_float(0x7f800000)
#define TSR_DEV static __device__ __forceinline__

/* What the shared scalar math (scalar.h) needs from its host. */
#define TSR_FN TSR_DEV
#define TSR_FN_CALL TSR_DEV
TSR_DEV double tsr_f64_from_bits(uint64_t u) { return __longlong_as_double((long long)u); }
TSR_DEV uint64_t tsr_f64_bits(double x) { return (uint64_t)__double_as_longlong(x); }

#include "scalar.h"

/* ---- float helpers of the GPU --------------------------------------------------------------------------- */

/* exp, tanh, log and the sigmoid in float (the C backend's go through double): Hopper's double rate is a
 * fraction of its float rate, and these library functions are within 2 ulp of the rounded result, far
 * inside fp32's 1e-4 tolerance. exp(-a) overflowing to inf gives a sigmoid of 0, as it should. */
TSR_DEV float tsr_expf(float a) { return expf(a); }
TSR_DEV float tsr_tanhf(float a) { return tanhf(a); }
TSR_DEV float tsr_logf(float a) { return logf(a); }
TSR_DEV float tsr_sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

/* GELU, erf form, x * Phi(x), at a cost that does not depend on x: Phi(x) = erfc(|x|/sqrt2)/2 below 0 and
 * 1 - erfc(|x|/sqrt2)/2 above, with erfc(z) = t * exp(-z^2 - 1.26551223 + t * P(t)), t = 1/(1 + z/2) (the
 * Chebyshev fit of Numerical Recipes, 6.2: fractional error below 1.2e-7 for every z >= 0), one exp and no
 * branch. tsr_erf takes a rational-only path below |x| = 0.84 and two exp() above, so a GELU kernel measured
 * on uniform [-1, 1) inputs ran at half its cost on BERT's activations (350 vs 720 us) and the partitioner's
 * measurements misled it; this form costs the same on any data.
 *
 * In float, not double: Hopper's double-precision rate made the double form the whole cost of a GELU kernel
 * (BERT-base b8's 1024x3072 GELU took 16.9 us on an H200, ten times its memory floor; 2026-11-26). The fit's
 * error and float rounding stay near 1e-6 of the largest value, far inside fp32's 1e-4 tolerance. */
TSR_DEV float tsr_gelu_erf(float x) {
    float z = fabsf(x) * 0.70710678118654752440f;
    float t = 1.0f / (1.0f + 0.5f * z);
    float p = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f + t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f))))))));
    float half_erfc = 0.5f * t * expf(p - z * z);
    return x * (x >= 0.0f ? 1.0f - half_erfc : half_erfc);
}

/* GELU, tanh form, in float (as the erf form, for the same reason). */
TSR_DEV float tsr_gelu_tanh(float x) {
    const float k = 0.79788456080286535588f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

/* ---- reductions ---------------------------------------------------------------------------------------- */
/* Sum of v over the 32 lanes of a warp, every lane gets it. */
TSR_DEV float tsr_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* NaN-propagating max over a warp. */
TSR_DEV float tsr_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = tsr_maxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
TSR_DEV float tsr_warp_min(float v) {
    for (int o = 16; o > 0; o >>= 1) v = tsr_minf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* Block-wide reductions for blocks of whole warps: every thread gets the result. `sh` holds 32 floats. */
TSR_DEV float tsr_block_sum(float v, float* sh) {
    v = tsr_warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return tsr_warp_sum(v);
}
TSR_DEV float tsr_block_max(float v, float* sh) {
    v = tsr_warp_max(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -__int_as_float(0x7f800000);
    return tsr_warp_max(v);
}
TSR_DEV float tsr_block_min(float v, float* sh) {
    v = tsr_warp_min(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : __int_as_float(0x7f800000);
    return tsr_warp_min(v);
}
