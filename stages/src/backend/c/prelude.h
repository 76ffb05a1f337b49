/* tessera c backend prelude: helpers shared by every generated kernel of a module.
 *
 * Included textually (once) at the top of each module's C file, so a module is one self-contained source.
 * Every helper reproduces the reference interpreter's semantics (stages/src/interp): the exponential family
 * that dominates models' time (exp, tanh, sigmoid, GELU, softmax) is computed in float by branch-free
 * polynomials within a few ulps of the reference (so loops over them vectorize: libm's double functions are
 * calls the compiler cannot vectorize, 10x slower on a GELU); the rarer functions go through libm in double and
 * are rounded once; min/max propagate NaN; integer arithmetic wraps (two's complement, computed through uint64_t so it is never
 * undefined behaviour); float -> integer conversions truncate and give the target's minimum for NaN and
 * out-of-range values (what x86-64's cvttsd2si returns).
 */
#include <stdint.h>
#include <string.h>
#include <math.h>

#define TSR_INLINE static inline __attribute__((always_inline))

/* Every kernel item is built for three instruction sets when the target is `-march=generic` on x86-64 and the
 * compiler can (TSR_CLONES, set by the toolchain): AVX-512 (x86-64-v4), AVX2 with FMA (x86-64-v3) and the
 * baseline, chosen by the dynamic loader from the CPU it runs on (an IFUNC), so one artifact copies to any
 * x86-64 machine and still runs 8 or 16 floats wide where the machine can. Helpers are always inlined, so
 * each copy of an item has its own copy of them, compiled for its instruction set. */
#ifdef TSR_CLONES
#define TSR_KERNEL __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TSR_KERNEL
#endif

/* Parallel loops. An item whose rows are independent (attention's query rows, LayerNorm's and Softmax's rows)
 * runs them as a range function `f(ctx, lo, hi)`; the runtime that loads the module hands it, through
 * tsr_set_parallel, a function that splits [0, n) into ranges of at least `grain` rows and runs them on its
 * thread pool. Each row is computed whole by one thread, in the same order, so the result is the same bytes
 * on any number of threads. Without a runtime hook (an older runtime, or none set) the rows run in order. */
typedef void (*tsr_range_fn)(void* ctx, long lo, long hi);
typedef void (*tsr_parallel_fn)(void* pool, long n, long grain, tsr_range_fn f, void* ctx);
static tsr_parallel_fn tsr_parallel = 0;
static void* tsr_parallel_pool = 0;
void tsr_set_parallel(tsr_parallel_fn f, void* pool) { tsr_parallel = f; tsr_parallel_pool = pool; }
TSR_INLINE void tsr_parallel_for(long n, long grain, tsr_range_fn f, void* ctx) {
    if (tsr_parallel && n >= 2 * grain) tsr_parallel(tsr_parallel_pool, n, grain, f, ctx);
    else f(ctx, 0, n);
}

/* What the shared scalar math (scalar.h) needs from its host. */
#define TSR_FN TSR_INLINE
#define TSR_FN_CALL static
#define TSR_NAN NAN
TSR_INLINE double tsr_f64_from_bits(uint64_t u) { double f; memcpy(&f, &u, 8); return f; }
TSR_INLINE uint64_t tsr_f64_bits(double f) { uint64_t u; memcpy(&u, &f, 8); return u; }

#include "scalar.h"

/* ---- float helpers of the CPU --------------------------------------------------------------------------- */

TSR_INLINE float tsr_f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
TSR_INLINE uint32_t tsr_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* e^(a + b) in float (Cephes' expf scheme), for a exact and b small beside it: x = a + b = n ln2 + r with
 * |r| <= ln2/2, r formed as (a - n ln2_hi) + b - n ln2_lo (ln2 in two parts: the first subtraction is exact),
 * so b keeps digits that rounding a + b to float would lose (GELU passes -z^2 that way); e^r by a degree-7
 * polynomial; then 2^n applied in two halves so that results down into the subnormals come out right. n is
 * rounded with the 1.5 * 2^23 trick (SSE2 has no vector round). No branch: the range cases are selects, so
 * loops over it vectorize. Within 1 ulp of the correctly rounded result (math_tests.rs). */
TSR_INLINE float tsr_expf_sum(float a, float b) {
    const float x = a + b;
    const float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = (a - n * 0.693359375f) + b;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t ni = (int32_t)n, n1 = ni >> 1, n2 = ni - n1;
    const float y = p * tsr_f32_from_bits((uint32_t)(n1 + 127) << 23) * tsr_f32_from_bits((uint32_t)(n2 + 127) << 23);
    return x != x ? x : (x > 88.7228394f ? __builtin_inff() : (x < -104.0f ? 0.0f : y));
}

TSR_INLINE float tsr_expf(float x) { return tsr_expf_sum(x, 0.0f); }

/* tanh in float: Cephes' odd polynomial below |x| = 0.625 (where 1 - 2/(e^2x + 1) would cancel), the
 * exponential form above, the sign restored; branch-free like tsr_expf. */
TSR_INLINE float tsr_tanhf(float x) {
    const float a = __builtin_fabsf(x);
    const float e = tsr_expf(-2.0f * a);
    const float big = __builtin_copysignf((1.0f - e) / (1.0f + e), x);
    const float z = x * x;
    const float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z + 1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
    return x != x ? x : (a < 0.625f ? small : big);
}

/* 1 / (1 + e^-x), through e^-|x| so that a large negative x gives e^x (down into the subnormals) rather than
 * 1 / (1 + inf) = 0. */
TSR_INLINE float tsr_sigmoid(float a) {
    const float e = tsr_expf(-__builtin_fabsf(a));
    const float r = 1.0f / (1.0f + e);
    return a >= 0.0f ? r : e * r;
}

/* log of a float through double, rounded once: the reference's own result. */
TSR_INLINE float tsr_logf(float a) { return (float)log((double)a); }

/* Sum and NaN-propagating max of a row, with 16 independent partial results: a loop the compiler vectorizes
 * without reassociating anything it was not told to (the order is fixed: lanes, then the tail, then the
 * lanes in order), where one running sum is a chain of dependent adds. */
TSR_INLINE float tsr_row_sum(const float* x, long n) {
    float acc[16] = {0};
    long i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += x[i + l];
    float s = 0.0f;
    for (; i < n; i++) s += x[i];
    for (int l = 0; l < 16; l++) s += acc[l];
    return s;
}

TSR_INLINE float tsr_row_max(const float* x, long n) {
    float m[16];
    int nan[16];
    for (int l = 0; l < 16; l++) { m[l] = -__builtin_inff(); nan[l] = 0; }
    long i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) {
            const float v = x[i + l];
            nan[l] |= v != v;
            m[l] = v > m[l] ? v : m[l];
        }
    float r = -__builtin_inff();
    int any = 0;
    for (; i < n; i++) { any |= x[i] != x[i]; r = x[i] > r ? x[i] : r; }
    for (int l = 0; l < 16; l++) { any |= nan[l]; r = m[l] > r ? m[l] : r; }
    return any ? __builtin_nanf("") : r;
}

/* GELU, erf form, x * Phi(x), at a cost that does not depend on x: Phi(x) = erfc(|x|/sqrt2)/2 below 0 and
 * 1 - erfc(|x|/sqrt2)/2 above, with erfc(z) = t * exp(-z^2 - 1.26551223 + t * P(t)), t = 1/(1 + z/2) (the
 * Chebyshev fit of Numerical Recipes, 6.2: fractional error below 1.2e-7 for every z >= 0), in float, one
 * exp and no branch, so GELU loops vectorize. tsr_erf takes a rational-only path below |x| = 0.84 and two exp() above, so a GELU
 * kernel measured on uniform [-1, 1) inputs ran at half its cost on BERT's activations (350 vs 720 us) and
 * the partitioner's measurements misled it; this form costs the same on any data. */
TSR_INLINE float tsr_gelu_erf(float a) {
    const float z = __builtin_fabsf(a) * 0.70710678118654752440f;
    const float t = 1.0f / (1.0f + 0.5f * z);
    const float p = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f + t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f))))))));
    /* z^2 = a^2 / 2 in two parts: ah (a with 12 mantissa bits) squares exactly, the rest is small. Rounding
     * z^2 whole to float would cost up to 5e-6 of the result in the tail (an error of 1e-6 in -z^2 ~ -25). */
    const float ah = tsr_f32_from_bits(tsr_f32_bits(a) & 0xfffff000u);
    const float hi = 0.5f * ah * ah, lo = 0.5f * (a - ah) * (a + ah);
    const float e = 0.5f * t * tsr_expf_sum(-hi, p - lo);
    const float half_erfc = z < 10.0f ? e : 0.0f; /* erfc(10)/2 is below float's range; inf - inf is not */
    return a * (a >= 0.0f ? 1.0f - half_erfc : half_erfc);
}

/* GELU, tanh form: 0.5 x (1 + tanh(u)) = x sigmoid(2u), which does not cancel where tanh(u) is near -1. */
TSR_INLINE float tsr_gelu_tanh(float x) {
    return x * tsr_sigmoid(1.59576912160573071176f * (x + 0.044715f * x * x * x));
}

/* ---- GEMM: C = A (m x k, row-major, lda) . B (k x n, row stride ldb) ---------------------------------------
 * Blocked as in BLIS/GotoBLAS: B is packed per (KC x NC) block into NR-wide column panels (zero padded);
 * a TSR_MR x NR register-tile micro-kernel multiplies a row block of A (read in place) by one panel. The
 * generated code owns the loop nest and the write-back, so bias/activation epilogues are applied while the
 * tile is still in registers. */
#ifdef __AVX__
#define TSR_MR 6
#define TSR_NV 2
#else
#define TSR_MR 4
#define TSR_NV 1
#endif
#define TSR_NR (8 * TSR_NV)
#define TSR_KC 256
#define TSR_NC 512

typedef float tsr_v8f __attribute__((vector_size(32)));

/* Packs rows [0, kc) and columns [0, nc) of B into NR-wide panels: panel p holds kc rows of NR floats. */
static void tsr_pack_b(long kc, long nc, const float* b, long ldb, float* restrict pack) {
    for (long jr = 0; jr < nc; jr += TSR_NR) {
        long nr = nc - jr < TSR_NR ? nc - jr : TSR_NR;
        float* restrict dst = pack + jr * kc;
        for (long k = 0; k < kc; k++) {
            const float* src = b + k * ldb + jr;
            long c = 0;
            for (; c < nr; c++) dst[k * TSR_NR + c] = src[c];
            for (; c < TSR_NR; c++) dst[k * TSR_NR + c] = 0.0f;
        }
    }
}

/* acc[MR][NR] = A[0..mr, 0..kc] . panel; rows past mr repeat row mr-1 (their results are discarded).
 * Accumulators are named variables (not arrays), so the compiler keeps all of them in registers:
 * MR x NV vectors of 8 floats (12 with AVX: 12 ymm accumulators + 2 panel vectors + 1 broadcast). */
#define TSR_ROW(i) const float* r##i = a + (mr > i ? i : mr - 1) * lda
#if TSR_NV == 2 && defined(__FMA__)
#include <immintrin.h>
#define TSR_ACC(i) __m256 c##i##0 = _mm256_setzero_ps(), c##i##1 = _mm256_setzero_ps()
#define TSR_FMA(i) { const __m256 ai = _mm256_set1_ps(r##i[k]); c##i##0 = _mm256_fmadd_ps(b0, ai, c##i##0); c##i##1 = _mm256_fmadd_ps(b1, ai, c##i##1); }
#define TSR_OUT(i) memcpy(acc + i * TSR_NR, &c##i##0, 32); memcpy(acc + i * TSR_NR + 8, &c##i##1, 32)
#elif TSR_NV == 2
#define TSR_ACC(i) tsr_v8f c##i##0 = {0}, c##i##1 = {0}
#define TSR_FMA(i) { const float ai = r##i[k]; c##i##0 += b0 * ai; c##i##1 += b1 * ai; }
#define TSR_OUT(i) memcpy(acc + i * TSR_NR, &c##i##0, 32); memcpy(acc + i * TSR_NR + 8, &c##i##1, 32)
#else
#define TSR_ACC(i) tsr_v8f c##i##0 = {0}
#define TSR_FMA(i) { const float ai = r##i[k]; c##i##0 += b0 * ai; }
#define TSR_OUT(i) memcpy(acc + i * TSR_NR, &c##i##0, 32)
#endif
static void tsr_micro(long kc, const float* a, long lda, long mr, const float* restrict panel, float* restrict acc) {
    TSR_ROW(0); TSR_ROW(1); TSR_ROW(2); TSR_ROW(3);
    TSR_ACC(0); TSR_ACC(1); TSR_ACC(2); TSR_ACC(3);
#if TSR_MR == 6
    TSR_ROW(4); TSR_ROW(5);
    TSR_ACC(4); TSR_ACC(5);
#endif
    for (long k = 0; k < kc; k++) {
        tsr_v8f b0;
        memcpy(&b0, panel + k * TSR_NR, 32);
#if TSR_NV == 2
        tsr_v8f b1;
        memcpy(&b1, panel + k * TSR_NR + 8, 32);
#endif
        TSR_FMA(0); TSR_FMA(1); TSR_FMA(2); TSR_FMA(3);
#if TSR_MR == 6
        TSR_FMA(4); TSR_FMA(5);
#endif
    }
    TSR_OUT(0); TSR_OUT(1); TSR_OUT(2); TSR_OUT(3);
#if TSR_MR == 6
    TSR_OUT(4); TSR_OUT(5);
#endif
}
