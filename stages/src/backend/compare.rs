//! Test helper the backends' tests share: compiled output against the reference interpreter's.

use crate::ir::Tensor;

/// `got` against the fp32 reference `want`: NaN exactly where it has NaN, elsewhere within `tol` of the
/// largest finite reference magnitude (the relative error the GPU zoo test uses).
pub(crate) fn compare_to_reference(got: &Tensor, want: &Tensor, tol: f64) -> Result<f64, String> {
    if got.ty != want.ty {
        return Err(format!("type {} instead of {}", got.ty, want.ty));
    }
    let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
    let scale = b.iter().filter(|v| v.is_finite()).fold(0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
    let mut worst = 0f64;
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        if x.is_nan() || y.is_nan() {
            if !(x.is_nan() && y.is_nan()) {
                return Err(format!("element {i}: got {x}, want {y}"));
            }
            continue;
        }
        worst = worst.max((x - y).abs() / scale);
    }
    if worst > tol {
        return Err(format!("relative error {worst:.3e} above {tol:e}"));
    }
    Ok(worst)
}
