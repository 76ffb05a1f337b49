/* tessera c backend prelude: helpers shared by every generated kernel of a module.
 *
 * Included textually (once) at the top of each module's C file, so a module is one self-contained source.
 * Every helper reproduces the reference interpreter's semantics (stages/src/interp) bit for bit where the
 * interpreter is exact: transcendental functions are evaluated in double and rounded once to float; min/max
 * propagate NaN; integer arithmetic wraps (two's complement, computed through uint64_t so it is never
 * undefined behaviour); float -> integer conversions truncate and give the target's minimum for NaN and
 * out-of-range values (what x86-64's cvttsd2si returns).
 */
#include <stdint.h>
#include <string.h>
#include <math.h>

#define TSR_INLINE static inline __attribute__((always_inline))

/* ---- float helpers ---------------------------------------------------------------------------------- */

/* max/min that return NaN when either side is NaN. */
TSR_INLINE float tsr_maxf(float a, float b) { return (a != a || b != b) ? NAN : (a > b ? a : b); }
TSR_INLINE float tsr_minf(float a, float b) { return (a != a || b != b) ? NAN : (a < b ? a : b); }

/* Clamp to [lo, hi], keeping NaN. */
TSR_INLINE float tsr_clampf(float x, float lo, float hi) {
    if (x != x) return x;
    x = x < lo ? lo : x;
    return x > hi ? hi : x;
}

/* Python-style float modulo: the result has the sign of the divisor (ONNX Mod, fmod=0). */
TSR_INLINE float tsr_modf_py(float a, float b) {
    float r = fmodf(a, b);
    return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}

/* exp, tanh and log of a float through double, rounded once: the reference's own results. (The cuda
 * prelude computes them in float: a GPU's double rate is a fraction of its float rate.) */
TSR_INLINE float tsr_expf(float a) { return (float)exp((double)a); }
TSR_INLINE float tsr_tanhf(float a) { return (float)tanh((double)a); }
TSR_INLINE float tsr_logf(float a) { return (float)log((double)a); }
TSR_INLINE float tsr_sigmoid(float a) { return (float)(1.0 / (1.0 + exp(-(double)a))); }

/* Softplus log(1 + exp(x)) and Mish x tanh(softplus(x)) in double, without overflow for large x (as the
 * reference interpreter's `softplus`); NaN propagates (fmax drops it, the log1p term keeps it). */
TSR_INLINE double tsr_softplus(double x) { return fmax(x, 0.0) + log1p(exp(-fabs(x))); }
TSR_INLINE float tsr_softplusf(float a) { return (float)tsr_softplus((double)a); }
TSR_INLINE float tsr_mishf(float a) { return (float)((double)a * tanh(tsr_softplus((double)a))); }

TSR_INLINE float tsr_hardswish(float a) {
    double x = a;
    if (x != x) return a;
    double t = x / 6.0 + 0.5;
    t = t < 0.0 ? 0.0 : (t > 1.0 ? 1.0 : t);
    return (float)(x * t);
}

/* erf in double: FreeBSD's s_erf.c (as ported by musl and by Rust's libm crate, which the reference
 * interpreter uses), so results agree with the reference independently of the C library. */
static double tsr_erfc2(uint32_t ix, double x);
static double tsr_erf(double x) {
    uint64_t bits;
    memcpy(&bits, &x, 8);
    uint32_t ix = (uint32_t)(bits >> 32);
    int sign = (int)(ix >> 31);
    ix &= 0x7fffffff;
    if (ix >= 0x7ff00000) return 1.0 - 2.0 * (double)sign + 1.0 / x;
    if (ix < 0x3feb0000) {
        if (ix < 0x3e300000) return 0.125 * (8.0 * x + 1.02703333676410069053e+00 * x);
        double z = x * x;
        double r = 1.28379167095512558561e-01 + z * (-3.25042107247001499370e-01 + z * (-2.84817495755985104766e-02 + z * (-5.77027029648944159157e-03 + z * -2.37630166566501626084e-05)));
        double s = 1.0 + z * (3.97917223959155352819e-01 + z * (6.50222499887672944485e-02 + z * (5.08130628187576562776e-03 + z * (1.32494738004321644526e-04 + z * -3.96022827877536812320e-06))));
        double y = r / s;
        return x + x * y;
    }
    double y;
    if (ix < 0x40180000) {
        y = 1.0 - tsr_erfc2(ix, x);
    } else {
        y = 1.0 - 2.2250738585072014e-308; /* 1 - 0x1p-1022 */
    }
    return sign ? -y : y;
}

static double tsr_erfc2(uint32_t ix, double x) {
    if (ix < 0x3ff40000) { /* |x| < 1.25: erfc1 */
        double s = fabs(x) - 1.0;
        double p = -2.36211856075265944077e-03 + s * (4.14856118683748331666e-01 + s * (-3.72207876035701323847e-01 + s * (3.18346619901161753674e-01 + s * (-1.10894694282396677476e-01 + s * (3.54783043256182359371e-02 + s * -2.16637559486879084300e-03)))));
        double q = 1.0 + s * (1.06420880400844228286e-01 + s * (5.40397917702171048937e-01 + s * (7.18286544141962662868e-02 + s * (1.26171219808761642112e-01 + s * (1.36370839120290507362e-02 + s * 1.19844998467991074170e-02)))));
        return 1.0 - 8.45062911510467529297e-01 - p / q;
    }
    x = fabs(x);
    double s = 1.0 / (x * x), r, bs;
    if (ix < 0x4006db6d) {
        r = -9.86494403484714822705e-03 + s * (-6.93858572707181764372e-01 + s * (-1.05586262253232909814e+01 + s * (-6.23753324503260060396e+01 + s * (-1.62396669462573470355e+02 + s * (-1.84605092906711035994e+02 + s * (-8.12874355063065934246e+01 + s * -9.81432934416914548592e+00))))));
        bs = 1.0 + s * (1.96512716674392571292e+01 + s * (1.37657754143519042600e+02 + s * (4.34565877475229228821e+02 + s * (6.45387271733267880336e+02 + s * (4.29008140027567833386e+02 + s * (1.08635005541779435134e+02 + s * (6.57024977031928170135e+00 + s * -6.04244152148580987438e-02)))))));
    } else {
        r = -9.86494292470009928597e-03 + s * (-7.99283237680523006574e-01 + s * (-1.77579549177547519889e+01 + s * (-1.60636384855821916062e+02 + s * (-6.37566443368389627722e+02 + s * (-1.02509513161107724954e+03 + s * -4.83519191608651397019e+02)))));
        bs = 1.0 + s * (3.03380607434824582924e+01 + s * (3.25792512996573918826e+02 + s * (1.53672958608443695994e+03 + s * (3.19985821950859553908e+03 + s * (2.55305040643316442583e+03 + s * (4.74528541206955367215e+02 + s * -2.24409524465858183362e+01))))));
    }
    uint64_t zb;
    memcpy(&zb, &x, 8);
    zb &= 0xffffffff00000000ull; /* z = x with its low word cleared */
    double z;
    memcpy(&z, &zb, 8);
    return exp(-z * z - 0.5625) * exp((z - x) * (z + x) + r / bs) / x;
}

TSR_INLINE float tsr_erff(float a) { return (float)tsr_erf((double)a); }

/* GELU, erf form, x * Phi(x), at a cost that does not depend on x: Phi(x) = erfc(|x|/sqrt2)/2 below 0 and
 * 1 - erfc(|x|/sqrt2)/2 above, with erfc(z) = t * exp(-z^2 - 1.26551223 + t * P(t)), t = 1/(1 + z/2) (the
 * Chebyshev fit of Numerical Recipes, 6.2: fractional error below 1.2e-7 for every z >= 0), in double, one
 * exp and no branch. tsr_erf takes a rational-only path below |x| = 0.84 and two exp() above, so a GELU
 * kernel measured on uniform [-1, 1) inputs ran at half its cost on BERT's activations (350 vs 720 us) and
 * the partitioner's measurements misled it; this form costs the same on any data. */
TSR_INLINE float tsr_gelu_erf(float a) {
    double x = a;
    double z = fabs(x) * 0.70710678118654752440;
    double t = 1.0 / (1.0 + 0.5 * z);
    double p = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    double half_erfc = 0.5 * t * exp(p - z * z);
    return (float)(x * (x >= 0.0 ? 1.0 - half_erfc : half_erfc));
}

TSR_INLINE float tsr_gelu_tanh(float a) {
    double x = a;
    double k = sqrt(2.0 / 3.14159265358979323846);
    return (float)(0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x))));
}

/* ---- integer helpers (i64 domain; i32 results are narrowed by the caller) ----------------------------- */

#define TSR_WADD(a, b) ((int64_t)((uint64_t)(int64_t)(a) + (uint64_t)(int64_t)(b)))
#define TSR_WSUB(a, b) ((int64_t)((uint64_t)(int64_t)(a) - (uint64_t)(int64_t)(b)))
#define TSR_WMUL(a, b) ((int64_t)((uint64_t)(int64_t)(a) * (uint64_t)(int64_t)(b)))
#define TSR_WNEG(a) ((int64_t)(0u - (uint64_t)(int64_t)(a)))

/* Truncating division; INT64_MIN / -1 wraps. Division by zero (an error in the reference) gives 0: a
 * compiled kernel has no error channel and must not trap. */
TSR_INLINE int64_t tsr_idiv(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return TSR_WNEG(a);
    return a / b;
}
/* C remainder (sign of the dividend); x % -1 is 0. */
TSR_INLINE int64_t tsr_irem(int64_t a, int64_t b) {
    if (b == 0 || b == -1) return 0;
    return a % b;
}
/* Python modulo (sign of the divisor). */
TSR_INLINE int64_t tsr_imod(int64_t a, int64_t b) {
    int64_t r = tsr_irem(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
TSR_INLINE int64_t tsr_imin(int64_t a, int64_t b) { return a < b ? a : b; }
TSR_INLINE int64_t tsr_imax(int64_t a, int64_t b) { return a > b ? a : b; }
TSR_INLINE int64_t tsr_iabs(int64_t a) { return a < 0 ? TSR_WNEG(a) : a; }

/* Float to integer: truncation; NaN and out-of-range give the target's minimum. */
TSR_INLINE int64_t tsr_f2i64(double x) {
    double t = trunc(x);
    if (t != t || !(t >= -9223372036854775808.0 && t < 9223372036854775808.0)) return INT64_MIN;
    return (int64_t)t;
}
TSR_INLINE int64_t tsr_f2i32(double x) {
    double t = trunc(x);
    if (t != t || t < -2147483648.0 || t > 2147483647.0) return INT32_MIN;
    return (int64_t)t;
}

/* Wrapping exponentiation by squaring; a negative exponent goes through pow in double, as ONNX Runtime. */
static int64_t tsr_ipow(int64_t a, int64_t b) {
    if (b < 0) return tsr_f2i64(pow((double)a, (double)b));
    uint64_t base = (uint64_t)a, e = (uint64_t)b, acc = 1;
    while (e > 0) {
        if (e & 1) acc *= base;
        base *= base;
        e >>= 1;
    }
    return (int64_t)acc;
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
