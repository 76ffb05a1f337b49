//! The prelude's float math (exp, tanh, sigmoid, GELU) against f64 results over its whole range, special
//! values included, and the loops over it vectorized in the instruction sets the module is built for.

use super::toolchain::{assembly, compile, toolchain};
use super::PRELUDE;
use crate::target::Target;

/// One exported function applying helper `which` to `n` floats, built like a kernel item (cloned per
/// instruction set where the toolchain clones), so the clone this machine dispatches to is the one tested.
const DRIVER: &str = r#"
TSR_KERNEL void tsr_test_math(const float* restrict x, float* restrict y, long n, int which) {
    switch (which) {
    case 0: for (long i = 0; i < n; i++) y[i] = tsr_expf(x[i]); break;
    case 1: for (long i = 0; i < n; i++) y[i] = tsr_tanhf(x[i]); break;
    case 2: for (long i = 0; i < n; i++) y[i] = tsr_sigmoid(x[i]); break;
    case 3: for (long i = 0; i < n; i++) y[i] = tsr_gelu_erf(x[i]); break;
    case 4: for (long i = 0; i < n; i++) y[i] = tsr_gelu_tanh(x[i]); break;
    }
}
"#;

fn gelu_erf(x: f64) -> f64 {
    0.5 * x * libm::erfc(-x / std::f64::consts::SQRT_2)
}

/// 0.5 x (1 + tanh(u)) written as x / (1 + e^-2u), exact where 1 + tanh(u) would cancel even in f64.
fn gelu_tanh(x: f64) -> f64 {
    x / (1.0 + (-2.0 * (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).exp())
}

/// Values across every range the helpers treat differently: a dense grid over [-110, 100], the region where
/// exp's result is subnormal, tanh's polynomial/exponential boundary, and the special values.
fn inputs() -> Vec<f32> {
    let mut v: Vec<f32> = (0..=420_000).map(|i| -110.0 + i as f32 * 0.0005).collect();
    v.extend((0..2000).map(|i| -104.0 + i as f32 * 0.0085));
    v.extend((0..2000).map(|i| 0.6 + i as f32 * 0.00005));
    v.extend([0.0, -0.0, 1e-30, -1e-30, 88.72283, 88.7229, 89.5, -87.5, -103.9, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MAX, f32::MIN]);
    v
}

#[test]
fn float_math_is_within_a_few_ulps_of_double() {
    if toolchain().is_err() {
        eprintln!("skipped: no C compiler");
        return;
    }
    let so = compile(&Target::parse("cpu").unwrap(), &format!("{}\n{DRIVER}", *PRELUDE)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("math.so");
    std::fs::write(&path, so).unwrap();
    // SAFETY: the library was just compiled from the prelude and the driver above; no initializers of its own.
    let lib = unsafe { libloading::Library::new(&path) }.unwrap();
    type MathFn = unsafe extern "C" fn(*const f32, *mut f32, std::ffi::c_long, std::ffi::c_int);
    // SAFETY: the driver's signature is MathFn.
    let f: libloading::Symbol<MathFn> = unsafe { lib.get(b"tsr_test_math") }.unwrap();
    let x = inputs();
    // (name, exact function, allowed error in ulps of the float result, the magnitude below which the error
    // is counted in ulps of that magnitude instead).
    let reference: [(&str, fn(f64) -> f64, f64, f32); 5] = [
        ("exp", f64::exp, 2.0, f32::MIN_POSITIVE),
        ("tanh", f64::tanh, 3.0, f32::MIN_POSITIVE),
        ("sigmoid", |x| 1.0 / (1.0 + (-x).exp()), 4.0, f32::MIN_POSITIVE),
        // The GELU fit's own error (1.2e-7 of erfc) is below 2 ulps; rounding in the polynomial adds a few.
        // Below 1e-30 (x < -11, the product of a subnormal erfc and x) the error is counted against 1e-30.
        ("gelu_erf", gelu_erf, 8.0, 1e-30),
        // The tanh form's argument 2u is a cubic (-11 at x = -3.6, -34 at -6.8): its float rounding costs
        // relative accuracy in the negative tail, up to 2e-6 (32 ulps) of values below 1e-4; below 1e-5 the
        // error is counted against 1e-5 (within 3e-11 absolute).
        ("gelu_tanh", gelu_tanh, 32.0, 1e-5),
    ];
    for (which, (name, exact, ulps, floor)) in reference.into_iter().enumerate() {
        let mut y = vec![0f32; x.len()];
        // SAFETY: x and y hold x.len() floats.
        unsafe { f(x.as_ptr(), y.as_mut_ptr(), x.len() as std::ffi::c_long, which as std::ffi::c_int) };
        let mut worst = (0.0f64, 0.0f32);
        for (&xi, &got) in x.iter().zip(&y) {
            let want = exact(xi as f64);
            if want.is_nan() {
                assert!(got.is_nan(), "{name}({xi:e}) = {got:e}, want NaN");
                continue;
            }
            let want32 = want as f32;
            if want32.is_infinite() || want32 == 0.0 {
                // Beyond the float range, or below its smallest subnormal: the rounded result exactly,
                // or the smallest subnormal next to 0.
                assert!(got == want32 || (want32 == 0.0 && got.abs() <= f32::from_bits(1)), "{name}({xi:e}) = {got:e}, want {want32:e}");
                continue;
            }
            // One ulp of the result, at least the floor's (a subnormal result has an absolute ulp).
            let ulp = ((want32.abs().max(floor) as f64).ln() / 2f64.ln()).floor();
            let err = (got as f64 - want).abs() / 2f64.powf(ulp - 23.0);
            if err > worst.0 {
                worst = (err, xi);
            }
        }
        assert!(worst.0 <= ulps, "{name}: {:.2} ulps at x = {:e} (allowed {ulps})", worst.0, worst.1);
        // The runtime's epilogues compute the same functions in Rust (tessera_kernels' fmath): same bits.
        use tessera_kernels::runtime::gemm::fmath;
        let rust: Option<fn(f32) -> f32> = match name {
            "exp" => Some(fmath::exp),
            "sigmoid" => Some(fmath::sigmoid),
            "gelu_erf" => Some(fmath::gelu_erf),
            "gelu_tanh" => Some(fmath::gelu_tanh),
            _ => None,
        };
        if let Some(r) = rust {
            for (&xi, &got) in x.iter().zip(&y) {
                let want = r(xi);
                assert!(want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()), "{name}({xi:e}): C {got:e}, Rust {want:e}");
            }
        }
        eprintln!("{name}: worst {:.2} ulps at x = {:e}", worst.0, worst.1);
    }
}

/// The GELU loop is vectorized 16 and 8 floats wide in the AVX-512 and AVX2 copies a generic target builds.
#[test]
fn math_loops_vectorize_in_every_clone() {
    let Ok(tc) = toolchain() else {
        eprintln!("skipped: no C compiler");
        return;
    };
    if !tc.clones {
        eprintln!("skipped: the C compiler does not build target clones (x86-64 GCC 12 and later do)");
        return;
    }
    let asm = assembly(&Target::parse("cpu").unwrap(), &format!("{}\n{DRIVER}", *PRELUDE)).unwrap();
    // Each clone is its own function: tsr_test_math.arch_x86_64_v4, .arch_x86_64_v3, .default.
    let body = |clone: &str| {
        let start = asm.find(&format!("tsr_test_math.{clone}:")).unwrap_or_else(|| panic!("no {clone} clone in:\n{asm}"));
        let rest = &asm[start..];
        rest[..rest.find(".cfi_endproc").unwrap_or(rest.len())].to_string()
    };
    assert!(body("arch_x86_64_v4").contains("%zmm"), "the AVX-512 copy uses no 512-bit registers");
    assert!(body("arch_x86_64_v3").contains("%ymm"), "the AVX2 copy uses no 256-bit registers");
    // The baseline copy vectorizes too (SSE2, four floats): mulps and no call to libm.
    let base = body("default");
    assert!(base.contains("mulps"), "the baseline copy is not vectorized");
    assert!(!base.contains("call\texp") && !base.contains("call\ttanh"), "the baseline copy calls libm");
}
