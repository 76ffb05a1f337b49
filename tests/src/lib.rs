//! Helpers shared by the end-to-end tests in this folder.

use tessera_stages::ir::Tensor;

/// Asserts `got` matches `want`: same type, and for floats a relative error `max|got - want| / max|want|`
/// below `tol` (relative to the output's scale, so elements near zero do not turn rounding noise into a
/// failure); integer and bool outputs must match exactly; NaN never passes.
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    assert_eq!(got.ty, want.ty, "{what}: type differs");
    let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
    if !want.dtype().is_float() {
        assert_eq!(a, b, "{what}: values differ");
        return;
    }
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
    let mut worst = (0f64, 0usize);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(!x.is_nan() && !y.is_nan(), "{what}: NaN at element {i} (got {x}, want {y})");
        let err = (x - y).abs() / scale;
        if err > worst.0 {
            worst = (err, i);
        }
    }
    assert!(
        worst.0 < tol,
        "{what}: relative error {:.3e} at element {} (got {}, want {}) is not below {tol:e}",
        worst.0,
        worst.1,
        a[worst.1],
        b[worst.1]
    );
}
