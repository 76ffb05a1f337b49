//! Float math for the runtime's epilogues: exp, tanh, sigmoid and GELU in branch-free f32, the same formulas,
//! constants and operation order as the `c` backend's prelude (`stages/src/backend/c/prelude.h`, whose tests
//! check the two give the same bits), so a loop over them vectorizes and a fused GELU costs what a load and a
//! store cost instead of a call into libm per element. Rust never contracts `a * b + c` into an FMA, and the C
//! prelude is compiled with `-ffp-contract=off`: both round every operation.
//!
//! The constants are written as the prelude writes them, digit for digit, so both round to the same floats.
//!
//! Accuracy against the exact functions (tested in the prelude's tests over the whole float range): exp within
//! 1 ulp, tanh 1.5, sigmoid 2.6, GELU (erf form) 7 ulps, GELU (tanh form) 32 ulps in its negative tail.

#![allow(clippy::excessive_precision)]
// Line for line the C prelude's formulas (checked bit for bit against it), so kept in its spelling: its clamp
// chain, its literal of log2(e), its `r = r - ...` steps.
#![allow(clippy::manual_clamp, clippy::approx_constant, clippy::assign_op_pattern)]

/// e^(a + b) for `a` exact and `b` small beside it (see the prelude's `tsr_expf_sum`).
#[inline(always)]
pub fn exp_sum(a: f32, b: f32) -> f32 {
    let x = a + b;
    let xc = if x < -104.0 { -104.0 } else if x > 89.0 { 89.0 } else { x };
    let n = (xc * 1.442_695_040_888_963_4_f32 + 12_582_912.0) - 12_582_912.0;
    let mut r = (a - n * 0.693_359_375) + b;
    r = r - n * -2.121_944_40e-4;
    let mut p = 1.987_569_150_0e-4_f32;
    p = p * r + 1.398_199_950_7e-3;
    p = p * r + 8.333_451_907_3e-3;
    p = p * r + 4.166_579_589_4e-2;
    p = p * r + 1.666_666_545_9e-1;
    p = p * r + 5.000_000_120_1e-1;
    p = p * r * r + r + 1.0;
    let ni = n as i32;
    let (n1, n2) = (ni >> 1, ni - (ni >> 1));
    let y = p * f32::from_bits(((n1 + 127) as u32) << 23) * f32::from_bits(((n2 + 127) as u32) << 23);
    if x.is_nan() {
        x
    } else if x > 88.722_839_4 {
        f32::INFINITY
    } else if x < -104.0 {
        0.0
    } else {
        y
    }
}

#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp_sum(x, 0.0)
}

/// 1 / (1 + e^-x) through e^-|x| (a large negative x gives e^x, not 0).
#[inline(always)]
pub fn sigmoid(a: f32) -> f32 {
    let e = exp(-a.abs());
    let r = 1.0 / (1.0 + e);
    if a >= 0.0 {
        r
    } else {
        e * r
    }
}

/// GELU, erf form: Numerical Recipes' erfc fit (fractional error below 1.2e-7), -z^2 passed in two parts.
#[inline(always)]
pub fn gelu_erf(a: f32) -> f32 {
    let z = a.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = -1.265_512_23
        + t * (1.000_023_68 + t * (0.374_091_96 + t * (0.096_784_18 + t * (-0.186_288_06 + t * (0.278_868_07 + t * (-1.135_203_98 + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let ah = f32::from_bits(a.to_bits() & 0xffff_f000);
    let (hi, lo) = (0.5 * ah * ah, 0.5 * (a - ah) * (a + ah));
    let e = 0.5 * t * exp_sum(-hi, p - lo);
    let half_erfc = if z < 10.0 { e } else { 0.0 };
    a * if a >= 0.0 { 1.0 - half_erfc } else { half_erfc }
}

/// GELU, tanh form, as x sigmoid(2u) (no cancellation where tanh(u) is near -1).
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    x * sigmoid(1.595_769_121_605_730_7 * (x + 0.044715 * x * x * x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_values() {
        assert!(exp(f32::NAN).is_nan() && exp(f32::INFINITY) == f32::INFINITY && exp(f32::NEG_INFINITY) == 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert!(sigmoid(f32::NAN).is_nan() && sigmoid(f32::INFINITY) == 1.0 && sigmoid(f32::NEG_INFINITY) == 0.0);
        assert!(gelu_erf(f32::NAN).is_nan() && gelu_erf(f32::INFINITY) == f32::INFINITY && gelu_erf(f32::NEG_INFINITY).is_nan());
        assert!(gelu_tanh(f32::NAN).is_nan() && gelu_tanh(f32::INFINITY) == f32::INFINITY);
        // e^-90 is subnormal (1.2e-39, 20 significant bits), and comes out so.
        assert!((exp(-90.0) as f64 / (-90f64).exp() - 1.0).abs() < 2e-6);
    }

    #[test]
    fn close_to_double_on_a_grid() {
        for i in -20_000..=20_000 {
            let x = i as f32 * 1e-3;
            let ex = (x as f64).exp();
            assert!(((exp(x) as f64 - ex) / ex).abs() < 2.5e-7, "exp({x})");
            let g = 0.5 * x as f64 * libm::erfc(-(x as f64) * std::f64::consts::FRAC_1_SQRT_2);
            assert!((gelu_erf(x) as f64 - g).abs() <= 1e-6 * g.abs().max(1e-3), "gelu_erf({x})");
        }
    }
}
