//! Elementwise ops: unary and binary arithmetic, comparisons, activations and Cast.
//!
//! Floats compute in f32 where IEEE arithmetic is already correctly rounded (+, -, *, /, sqrt, min, max)
//! and in f64 rounded once to f32 for transcendental functions (exp, log, tanh, erf, pow, sigmoid, GELU,
//! the trigonometric and hyperbolic functions and their inverses, softplus, mish),
//! so results are as close to exact as an f32 can hold. NaN propagates through Min, Max, Relu, Clip and
//! the activations, as in ONNX Runtime. Integers use wrapping two's-complement arithmetic; integer
//! division or modulo by zero is an error rather than undefined behaviour.

use super::layout::broadcast_to;
use super::view::{bools, float_to_int, floats, from_bools, from_floats, from_ints, ints};
use super::{par, OpError};
use crate::ir::{BinaryOp, DType, GeluApprox, Tensor, UnaryOp};

/// Applies `f` to the two operands broadcast to `out` (each borrowed when it already has that shape).
fn zip_broadcast<A: Copy + Send + Sync, B: Copy + Send + Sync, R: Send>(
    a: &[A],
    sa: &[usize],
    b: &[B],
    sb: &[usize],
    out: &[usize],
    f: impl Fn(A, B) -> R + Sync + Send,
) -> Vec<R> {
    let n: usize = out.iter().product();
    // A scalar operand needs no materialized copy.
    if a.len() == 1 && n != 1 {
        let x = a[0];
        return par::map(&broadcast_to(b, sb, out), |&y| f(x, y));
    }
    if b.len() == 1 && n != 1 {
        let y = b[0];
        return par::map(&broadcast_to(a, sa, out), |&x| f(x, y));
    }
    let a = broadcast_to(a, sa, out);
    let b = broadcast_to(b, sb, out);
    par::zip(&a, &b, |&x, &y| f(x, y))
}

/// max/min that return NaN when either side is NaN (`f32::max` would return the other side).
fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

fn min_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.min(b)
    }
}

/// Clamps to [lo, hi], keeping NaN.
fn clamp_nan(x: f32, lo: f32, hi: f32) -> f32 {
    if x.is_nan() {
        x
    } else {
        x.max(lo).min(hi)
    }
}

fn map_floats(x: &Tensor, f: impl Fn(f32) -> f32 + Sync + Send) -> Result<Tensor, OpError> {
    let v: Vec<f32> = par::map(&floats(x), |&a| f(a));
    from_floats(x.dtype(), x.shape(), &v)
}

fn map_f64(x: &Tensor, f: impl Fn(f64) -> f64 + Sync + Send) -> Result<Tensor, OpError> {
    map_floats(x, |a| f(a as f64) as f32)
}

fn map_ints(x: &Tensor, f: impl Fn(i64) -> i64 + Sync + Send) -> Result<Tensor, OpError> {
    let v: Vec<i64> = par::map(&ints(x), |&a| f(a));
    from_ints(x.dtype(), x.shape(), &v)
}

pub(super) fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// log(1 + exp(x)) without overflow for large x (NaN stays NaN).
pub(super) fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

pub(super) fn unary(u: UnaryOp, x: &Tensor) -> Result<Tensor, OpError> {
    if x.dtype().is_int() {
        return match u {
            UnaryOp::Relu => map_ints(x, |a| a.max(0)),
            UnaryOp::Neg => map_ints(x, |a| a.wrapping_neg()),
            UnaryOp::Abs => map_ints(x, |a| a.wrapping_abs()),
            _ => Err(OpError::new(format!("{u:?} on {}", x.dtype()))),
        };
    }
    match u {
        // `a < 0` is false for NaN, so NaN passes through.
        UnaryOp::Relu => map_floats(x, |a| if a < 0.0 { 0.0 } else { a }),
        UnaryOp::Sigmoid => map_f64(x, sigmoid),
        UnaryOp::Tanh => map_f64(x, f64::tanh),
        UnaryOp::Erf => map_f64(x, libm::erf),
        UnaryOp::Sqrt => map_floats(x, f32::sqrt),
        UnaryOp::Exp => map_f64(x, f64::exp),
        UnaryOp::Log => map_f64(x, f64::ln),
        UnaryOp::Neg => map_floats(x, |a| -a),
        UnaryOp::Reciprocal => map_floats(x, |a| 1.0 / a),
        UnaryOp::Abs => map_floats(x, f32::abs),
        UnaryOp::Floor => map_floats(x, f32::floor),
        UnaryOp::Ceil => map_floats(x, f32::ceil),
        // x * relu6(x + 3) / 6 == x * clamp(x/6 + 1/2, 0, 1)
        UnaryOp::HardSwish => map_f64(x, |a| if a.is_nan() { a } else { a * (a / 6.0 + 0.5).clamp(0.0, 1.0) }),
        UnaryOp::Not => from_bools(x.shape(), &bools(x).iter().map(|&b| !b).collect::<Vec<_>>()),
        UnaryOp::IsNaN => from_bools(x.shape(), &floats(x).iter().map(|a| a.is_nan()).collect::<Vec<_>>()),
        UnaryOp::Cos => map_f64(x, f64::cos),
        UnaryOp::Sin => map_f64(x, f64::sin),
        UnaryOp::Tan => map_f64(x, f64::tan),
        UnaryOp::Acos => map_f64(x, f64::acos),
        UnaryOp::Asin => map_f64(x, f64::asin),
        UnaryOp::Atan => map_f64(x, f64::atan),
        UnaryOp::Cosh => map_f64(x, f64::cosh),
        UnaryOp::Sinh => map_f64(x, f64::sinh),
        UnaryOp::Asinh => map_f64(x, f64::asinh),
        UnaryOp::Acosh => map_f64(x, f64::acosh),
        UnaryOp::Atanh => map_f64(x, f64::atanh),
        // Exact in f32: ties go to the even neighbour.
        UnaryOp::Round => map_floats(x, f32::round_ties_even),
        UnaryOp::Softplus => map_f64(x, softplus),
        UnaryOp::Mish => map_f64(x, |a| a * softplus(a).tanh()),
    }
}

pub(super) fn leaky_relu(x: &Tensor, alpha: f32) -> Result<Tensor, OpError> {
    map_floats(x, |a| if a < 0.0 { alpha * a } else { a })
}

pub(super) fn hard_sigmoid(x: &Tensor, alpha: f32, beta: f32) -> Result<Tensor, OpError> {
    map_floats(x, |a| clamp_nan(alpha * a + beta, 0.0, 1.0))
}

pub(super) fn clip(x: &Tensor, min: f32, max: f32) -> Result<Tensor, OpError> {
    if x.dtype().is_int() {
        // Integer bounds: the smallest integer >= min and the largest <= max (±inf leave that side open;
        // `as` saturates, which is right for bounds beyond the integer range).
        let lo = min.is_finite().then(|| (min as f64).ceil() as i64);
        let hi = max.is_finite().then(|| (max as f64).floor() as i64);
        return map_ints(x, |a| {
            let a = lo.map_or(a, |l| a.max(l));
            hi.map_or(a, |h| a.min(h))
        });
    }
    map_floats(x, |a| clamp_nan(a, min, max))
}

pub(super) fn gelu(x: &Tensor, approx: GeluApprox) -> Result<Tensor, OpError> {
    match approx {
        GeluApprox::Erf => map_f64(x, |a| 0.5 * a * (1.0 + libm::erf(a * std::f64::consts::FRAC_1_SQRT_2))),
        GeluApprox::Tanh => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            map_f64(x, |a| 0.5 * a * (1.0 + (k * (a + 0.044715 * a * a * a)).tanh()))
        }
    }
}

/// Python-style modulo: the result has the sign of the divisor.
fn float_mod(a: f32, b: f32) -> f32 {
    let r = a % b;
    if r != 0.0 && ((r < 0.0) != (b < 0.0)) {
        r + b
    } else {
        r
    }
}

fn int_pow(a: i64, b: i64) -> i64 {
    if b >= 0 {
        // Wrapping exponentiation by squaring (exact modulo 2^64, so also for i32 after narrowing).
        let (mut base, mut e, mut acc) = (a, b as u64, 1i64);
        while e > 0 {
            if e & 1 == 1 {
                acc = acc.wrapping_mul(base);
            }
            base = base.wrapping_mul(base);
            e >>= 1;
        }
        acc
    } else {
        // ONNX Runtime computes integer Pow through std::pow in double and casts back.
        float_to_int((a as f64).powf(b as f64), DType::I64)
    }
}

fn binary_float(b: BinaryOp, x: &Tensor, y: &Tensor, out: &[usize]) -> Result<Tensor, OpError> {
    let (xv, yv) = (floats(x), floats(y));
    let (sx, sy) = (x.shape(), y.shape());
    let num = |f: fn(f32, f32) -> f32| from_floats(x.dtype(), out, &zip_broadcast(&xv, sx, &yv, sy, out, f));
    let cmp = |f: fn(f32, f32) -> bool| from_bools(out, &zip_broadcast(&xv, sx, &yv, sy, out, f));
    match b {
        BinaryOp::Add => num(|a, b| a + b),
        BinaryOp::Sub => num(|a, b| a - b),
        BinaryOp::Mul => num(|a, b| a * b),
        BinaryOp::Div => num(|a, b| a / b),
        BinaryOp::Pow => num(|a, b| (a as f64).powf(b as f64) as f32),
        BinaryOp::Min => num(min_nan),
        BinaryOp::Max => num(max_nan),
        BinaryOp::Mod => num(float_mod),
        BinaryOp::FMod => num(|a, b| a % b),
        BinaryOp::Equal => cmp(|a, b| a == b),
        BinaryOp::Less => cmp(|a, b| a < b),
        BinaryOp::Greater => cmp(|a, b| a > b),
        BinaryOp::LessOrEqual => cmp(|a, b| a <= b),
        BinaryOp::GreaterOrEqual => cmp(|a, b| a >= b),
        BinaryOp::And | BinaryOp::Or => Err(OpError::new(format!("{b:?} on {}", x.dtype()))),
    }
}

fn binary_int(b: BinaryOp, x: &Tensor, y: &Tensor, out: &[usize]) -> Result<Tensor, OpError> {
    let (xv, yv) = (ints(x), ints(y));
    let (sx, sy) = (x.shape(), y.shape());
    let num = |f: fn(i64, i64) -> i64| from_ints(x.dtype(), out, &zip_broadcast(&xv, sx, &yv, sy, out, f));
    let cmp = |f: fn(i64, i64) -> bool| from_bools(out, &zip_broadcast(&xv, sx, &yv, sy, out, f));
    let needs_nonzero_divisor = matches!(b, BinaryOp::Div | BinaryOp::Mod | BinaryOp::FMod);
    if needs_nonzero_divisor && yv.contains(&0) {
        return Err(OpError::new(format!("integer {b:?} by zero")));
    }
    match b {
        BinaryOp::Add => num(i64::wrapping_add),
        BinaryOp::Sub => num(i64::wrapping_sub),
        BinaryOp::Mul => num(i64::wrapping_mul),
        // Truncating division, as C and ONNX Runtime do.
        BinaryOp::Div => num(i64::wrapping_div),
        BinaryOp::Pow => num(int_pow),
        BinaryOp::Min => num(i64::min),
        BinaryOp::Max => num(i64::max),
        BinaryOp::Mod => num(|a, b| {
            let r = a.wrapping_rem(b);
            if r != 0 && ((r < 0) != (b < 0)) {
                r + b
            } else {
                r
            }
        }),
        BinaryOp::FMod => num(i64::wrapping_rem),
        BinaryOp::Equal => cmp(|a, b| a == b),
        BinaryOp::Less => cmp(|a, b| a < b),
        BinaryOp::Greater => cmp(|a, b| a > b),
        BinaryOp::LessOrEqual => cmp(|a, b| a <= b),
        BinaryOp::GreaterOrEqual => cmp(|a, b| a >= b),
        BinaryOp::And | BinaryOp::Or => Err(OpError::new(format!("{b:?} on {}", x.dtype()))),
    }
}

fn binary_bool(b: BinaryOp, x: &Tensor, y: &Tensor, out: &[usize]) -> Result<Tensor, OpError> {
    let (xv, yv) = (bools(x), bools(y));
    let f: fn(bool, bool) -> bool = match b {
        BinaryOp::And => |a, b| a && b,
        BinaryOp::Or => |a, b| a || b,
        BinaryOp::Equal => |a, b| a == b,
        _ => return Err(OpError::new(format!("{b:?} on bool"))),
    };
    from_bools(out, &zip_broadcast(&xv, x.shape(), &yv, y.shape(), out, f))
}

pub(super) fn binary(b: BinaryOp, x: &Tensor, y: &Tensor, out: &[usize]) -> Result<Tensor, OpError> {
    match x.dtype() {
        DType::Bool => binary_bool(b, x, y, out),
        d if d.is_int() => binary_int(b, x, y, out),
        _ => binary_float(b, x, y, out),
    }
}

/// Cast as ONNX Runtime does it: float to integer truncates (NaN and out-of-range give the target's
/// minimum, see [`float_to_int`]); integer to narrower integer wraps; to float rounds to nearest even
/// (integers go through f32 first, as ORT does for f16); anything to bool is `!= 0` (NaN is true).
pub(super) fn cast(x: &Tensor, to: DType) -> Result<Tensor, OpError> {
    let from = x.dtype();
    if from == to {
        return Ok(x.clone());
    }
    let shape = x.shape();
    match to {
        DType::Bool => from_bools(shape, &bools(x)),
        DType::F32 | DType::F16 | DType::BF16 => from_floats(to, shape, &floats(x)),
        DType::I64 | DType::I32 => {
            if from.is_float() {
                let v: Vec<i64> = par::map(&floats(x), |&a| float_to_int(a as f64, to));
                from_ints(to, shape, &v)
            } else {
                from_ints(to, shape, &ints(x))
            }
        }
    }
}
