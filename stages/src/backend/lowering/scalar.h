/* tessera's scalar math, shared by the c backend's prelude (c/prelude.h) and the cuda backend's
 * (cuda/prelude.cuh): one definition of what both compute alike, spliced into each prelude in place of its
 * include line (backend::c::with_scalar). Written in the C that C and CUDA C++ share; each prelude
 * defines first what it needs:
 *   TSR_FN        the qualifiers of a small helper (always inlined);
 *   TSR_FN_CALL   those of a large one (erf, the integer power: a call in C, inlined on the GPU);
 *   TSR_NAN       a quiet NaN;
 *   tsr_f64_bits(x), tsr_f64_from_bits(u)   a double's bits and back.
 * What the two compute differently on purpose stays in each prelude: exp, tanh, the sigmoid and GELU are
 * branch-free float polynomials on the CPU (so loops vectorize; the runtime's epilogues use the same
 * formulas, kernels/src/runtime/gemm/fmath.rs, checked bit for bit in c/math_tests.rs) and the device's
 * own float functions on the GPU. */

/* ---- float helpers ---------------------------------------------------------------------------------- */

/* max/min that return NaN when either side is NaN. */
TSR_FN float tsr_maxf(float a, float b) { return (a != a || b != b) ? TSR_NAN : (a > b ? a : b); }
TSR_FN float tsr_minf(float a, float b) { return (a != a || b != b) ? TSR_NAN : (a < b ? a : b); }

/* Clamp to [lo, hi], keeping NaN. */
TSR_FN float tsr_clampf(float x, float lo, float hi) {
    if (x != x) return x;
    x = x < lo ? lo : x;
    return x > hi ? hi : x;
}

/* Python-style float modulo: the result has the sign of the divisor (ONNX Mod, fmod=0). */
TSR_FN float tsr_modf_py(float a, float b) {
    float r = fmodf(a, b);
    return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}

/* Softplus log(1 + exp(x)) and Mish x tanh(softplus(x)) in double, without overflow for large x (as the
 * reference interpreter's `softplus`); NaN propagates (fmax drops it, the log1p term keeps it). */
TSR_FN double tsr_softplus(double x) { return fmax(x, 0.0) + log1p(exp(-fabs(x))); }
TSR_FN float tsr_softplusf(float a) { return (float)tsr_softplus((double)a); }
TSR_FN float tsr_mishf(float a) { return (float)((double)a * tanh(tsr_softplus((double)a))); }

TSR_FN float tsr_hardswish(float a) {
    double x = a;
    if (x != x) return a;
    double t = x / 6.0 + 0.5;
    t = t < 0.0 ? 0.0 : (t > 1.0 ? 1.0 : t);
    return (float)(x * t);
}

/* erf in double: FreeBSD's s_erf.c (as ported by musl and by Rust's libm crate, which the reference
 * interpreter uses), so results agree with the reference independently of the C library. */
TSR_FN_CALL double tsr_erfc2(uint32_t ix, double x);
TSR_FN_CALL double tsr_erf(double x) {
    uint64_t bits = tsr_f64_bits(x);
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

TSR_FN_CALL double tsr_erfc2(uint32_t ix, double x) {
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
    const double z = tsr_f64_from_bits(tsr_f64_bits(x) & 0xffffffff00000000ull); /* x with its low word cleared */
    return exp(-z * z - 0.5625) * exp((z - x) * (z + x) + r / bs) / x;
}

TSR_FN float tsr_erff(float a) { return (float)tsr_erf((double)a); }

/* ---- integer helpers (i64 domain; i32 results are narrowed by the caller) ----------------------------- */

#define TSR_WADD(a, b) ((int64_t)((uint64_t)(int64_t)(a) + (uint64_t)(int64_t)(b)))
#define TSR_WSUB(a, b) ((int64_t)((uint64_t)(int64_t)(a) - (uint64_t)(int64_t)(b)))
#define TSR_WMUL(a, b) ((int64_t)((uint64_t)(int64_t)(a) * (uint64_t)(int64_t)(b)))
#define TSR_WNEG(a) ((int64_t)(0u - (uint64_t)(int64_t)(a)))

/* Truncating division; INT64_MIN / -1 wraps. Division by zero (an error in the reference) gives 0: a
 * compiled kernel has no error channel and must not trap. */
TSR_FN int64_t tsr_idiv(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return TSR_WNEG(a);
    return a / b;
}
/* C remainder (sign of the dividend); x % -1 is 0. */
TSR_FN int64_t tsr_irem(int64_t a, int64_t b) {
    if (b == 0 || b == -1) return 0;
    return a % b;
}
/* Python modulo (sign of the divisor). */
TSR_FN int64_t tsr_imod(int64_t a, int64_t b) {
    int64_t r = tsr_irem(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
TSR_FN int64_t tsr_imin(int64_t a, int64_t b) { return a < b ? a : b; }
TSR_FN int64_t tsr_imax(int64_t a, int64_t b) { return a > b ? a : b; }
TSR_FN int64_t tsr_iabs(int64_t a) { return a < 0 ? TSR_WNEG(a) : a; }

/* Float to integer: truncation; NaN and out-of-range give the target's minimum. */
TSR_FN int64_t tsr_f2i64(double x) {
    double t = trunc(x);
    if (t != t || !(t >= -9223372036854775808.0 && t < 9223372036854775808.0)) return INT64_MIN;
    return (int64_t)t;
}
TSR_FN int64_t tsr_f2i32(double x) {
    double t = trunc(x);
    if (t != t || t < -2147483648.0 || t > 2147483647.0) return INT32_MIN;
    return (int64_t)t;
}

/* Wrapping exponentiation by squaring; a negative exponent goes through pow in double, as ONNX Runtime. */
TSR_FN_CALL int64_t tsr_ipow(int64_t a, int64_t b) {
    if (b < 0) return tsr_f2i64(pow((double)a, (double)b));
    uint64_t base = (uint64_t)a, e = (uint64_t)b, acc = 1;
    while (e > 0) {
        if (e & 1) acc *= base;
        base *= base;
        e >>= 1;
    }
    return (int64_t)acc;
}

