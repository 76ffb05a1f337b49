//! Elementwise ops: unary, binary (with the pre-opset-7 `broadcast`/`axis` form), variadic, Clip, Cast, Where,
//! and decompositions of the activations the IR has no variant for.

use super::one;
use crate::ir::{BinaryOp, GeluApprox, Op, UnaryOp, ValueId};
use crate::onnx::error::{NResult, NodeError};
use crate::onnx::importer::{Importer, NodeCx};
use crate::onnx::ops::Converter;
use crate::onnx::tensor::dtype_from_onnx;

pub const OPS: &[&str] = &[
    "Relu", "Sigmoid", "Tanh", "Erf", "Sqrt", "Exp", "Log", "Neg", "Reciprocal", "Abs", "Floor", "Ceil", "HardSwish",
    "Not", "IsNaN", "LeakyRelu", "HardSigmoid", "Gelu", "Clip", "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal",
    "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Min", "Max", "Sum", "Mean", "Where", "Cast",
    "CastLike", "Elu", "Selu", "PRelu", "Softplus", "Softsign", "Sign", "Shrink", "ThresholdedRelu",
    "Xor", "IsInf", "Cos", "Sin", "Tan", "Acos", "Asin", "Atan", "Cosh", "Sinh", "Asinh", "Acosh", "Atanh", "Round",
    "Mish", "Celu",
];

pub fn converter(op: &str) -> Option<Converter> {
    Some(match op {
        "Relu" | "Sigmoid" | "Tanh" | "Erf" | "Sqrt" | "Exp" | "Log" | "Neg" | "Reciprocal" | "Abs" | "Floor" | "Ceil"
        | "HardSwish" | "Not" | "IsNaN" | "Cos" | "Sin" | "Tan" | "Acos" | "Asin" | "Atan" | "Cosh" | "Sinh" | "Asinh"
        | "Acosh" | "Atanh" | "Round" | "Softplus" | "Mish" => unary,
        "LeakyRelu" => leaky_relu,
        "HardSigmoid" => hard_sigmoid,
        "Gelu" => gelu,
        "Clip" => clip,
        "Add" | "Sub" | "Mul" | "Div" | "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And"
        | "Or" => binary,
        "Pow" => pow,
        "Mod" => modulo,
        "Min" | "Max" | "Sum" | "Mean" => variadic,
        "Where" => where_,
        "Cast" => cast,
        "CastLike" => cast_like,
        "Elu" => elu,
        "Selu" => selu,
        "PRelu" => prelu,
        "Celu" => celu,
        "Softsign" => softsign,
        "Sign" => sign,
        "Shrink" => shrink,
        "ThresholdedRelu" => thresholded_relu,
        "Xor" => xor,
        "IsInf" => is_inf,
        _ => return None,
    })
}

fn unary_op(op: &str) -> UnaryOp {
    match op {
        "Relu" => UnaryOp::Relu,
        "Sigmoid" => UnaryOp::Sigmoid,
        "Tanh" => UnaryOp::Tanh,
        "Erf" => UnaryOp::Erf,
        "Sqrt" => UnaryOp::Sqrt,
        "Exp" => UnaryOp::Exp,
        "Log" => UnaryOp::Log,
        "Neg" => UnaryOp::Neg,
        "Reciprocal" => UnaryOp::Reciprocal,
        "Abs" => UnaryOp::Abs,
        "Floor" => UnaryOp::Floor,
        "Ceil" => UnaryOp::Ceil,
        "HardSwish" => UnaryOp::HardSwish,
        "Not" => UnaryOp::Not,
        "IsNaN" => UnaryOp::IsNaN,
        "Cos" => UnaryOp::Cos,
        "Sin" => UnaryOp::Sin,
        "Tan" => UnaryOp::Tan,
        "Acos" => UnaryOp::Acos,
        "Asin" => UnaryOp::Asin,
        "Atan" => UnaryOp::Atan,
        "Cosh" => UnaryOp::Cosh,
        "Sinh" => UnaryOp::Sinh,
        "Asinh" => UnaryOp::Asinh,
        "Acosh" => UnaryOp::Acosh,
        "Atanh" => UnaryOp::Atanh,
        "Round" => UnaryOp::Round,
        "Softplus" => UnaryOp::Softplus,
        "Mish" => UnaryOp::Mish,
        _ => unreachable!("unary_op called for {op}"),
    }
}

fn binary_op(op: &str) -> BinaryOp {
    match op {
        "Add" | "Sum" | "Mean" => BinaryOp::Add,
        "Sub" => BinaryOp::Sub,
        "Mul" => BinaryOp::Mul,
        "Div" => BinaryOp::Div,
        "Equal" => BinaryOp::Equal,
        "Less" => BinaryOp::Less,
        "Greater" => BinaryOp::Greater,
        "LessOrEqual" => BinaryOp::LessOrEqual,
        "GreaterOrEqual" => BinaryOp::GreaterOrEqual,
        "And" => BinaryOp::And,
        "Or" => BinaryOp::Or,
        "Min" => BinaryOp::Min,
        "Max" => BinaryOp::Max,
        _ => unreachable!("binary_op called for {op}"),
    }
}

fn unary(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    one(im.emit(n, Op::Unary(unary_op(n.op_type)), &[x])?)
}

fn leaky_relu(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let alpha = n.attrs.float_or("alpha", 0.01)?;
    one(im.emit(n, Op::LeakyRelu { alpha }, &[x])?)
}

fn hard_sigmoid(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let alpha = n.attrs.float_or("alpha", 0.2)?;
    let beta = n.attrs.float_or("beta", 0.5)?;
    one(im.emit(n, Op::HardSigmoid { alpha, beta }, &[x])?)
}

fn gelu(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let approximate = match n.attrs.string("approximate")?.as_deref() {
        None | Some("none") => GeluApprox::Erf,
        Some("tanh") => GeluApprox::Tanh,
        Some(other) => return Err(NodeError::attr("approximate", format!("expected 'none' or 'tanh', got '{other}'"))),
    };
    one(im.emit(n, Op::Gelu { approximate }, &[x])?)
}

/// A scalar bound given as a constant input (opset 11+).
fn scalar_input(im: &Importer, n: &NodeCx, i: usize, what: &str) -> NResult<Option<f32>> {
    match im.opt_const_input(n, i, what)? {
        None => Ok(None),
        Some(t) if t.numel() == 1 => Ok(Some(t.to_f64_vec()[0] as f32)),
        Some(t) => Err(NodeError::invalid(format!("the {what} (input {i}) must be a scalar, got {}", t.ty))),
    }
}

fn clip(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let (min, max) = if im.opset < 11 {
        (n.attrs.float_or("min", f32::NEG_INFINITY)?, n.attrs.float_or("max", f32::INFINITY)?)
    } else {
        (
            scalar_input(im, n, 1, "minimum")?.unwrap_or(f32::NEG_INFINITY),
            scalar_input(im, n, 2, "maximum")?.unwrap_or(f32::INFINITY),
        )
    };
    if min > max {
        // ONNX defines this case as all outputs equal to max (min is applied first, max last).
        let m = im.scalar(n, im.dtype(x), max as f64);
        let shape = im.shape(x);
        return one(im.emit(n, Op::Expand { shape }, &[m])?);
    }
    one(im.emit(n, Op::Clip { min, max }, &[x])?)
}

/// Before opset 7 arithmetic ops broadcast only with `broadcast=1`, aligning B's dimensions to A's starting at
/// `axis` (default: the trailing ones, which is NumPy's rule). Returns B reshaped so NumPy broadcasting means the same.
fn legacy_broadcast(im: &mut Importer, n: &NodeCx, a: ValueId, b: ValueId) -> NResult<ValueId> {
    if im.opset >= 7 || n.attrs.int_or("broadcast", 0)? == 0 {
        return Ok(b);
    }
    let Some(axis) = n.attrs.int("axis")? else { return Ok(b) };
    let (ra, sb) = (im.rank(a), im.shape(b));
    let axis = crate::onnx::attrs::norm_axis(axis, ra, "axis")?;
    if axis + sb.len() > ra {
        return Err(NodeError::attr("axis", format!("B of shape {sb:?} does not fit in rank {ra} at axis {axis}")));
    }
    let mut shape = vec![1; axis];
    shape.extend(&sb);
    shape.resize(ra, 1);
    im.reshape(n, b, shape)
}

fn binary(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let a = im.input(n, 0)?;
    let b = im.input(n, 1)?;
    let b = legacy_broadcast(im, n, a, b)?;
    one(im.emit(n, Op::Binary(binary_op(n.op_type)), &[a, b])?)
}

/// Pow allows an exponent of another type than the base (opset 12+); the IR does not, so the exponent is cast
/// to the base's type where that is exact (an integer exponent below 2^24 for a float base).
fn pow(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let a = im.input(n, 0)?;
    let b = im.input(n, 1)?;
    let b = legacy_broadcast(im, n, a, b)?;
    let (da, db) = (im.dtype(a), im.dtype(b));
    let b = if da == db {
        b
    } else if da.is_float() && (db.is_float() || db.is_int()) {
        im.cast(n, b, da)?
    } else {
        return Err(NodeError::unsupported(
            "Pow with mixed types",
            format!("base of type {da} with an exponent of type {db}"),
        ));
    };
    one(im.emit(n, Op::Binary(BinaryOp::Pow), &[a, b])?)
}

fn modulo(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let a = im.input(n, 0)?;
    let b = im.input(n, 1)?;
    let op = match n.attrs.int_or("fmod", 0)? {
        0 if im.dtype(a).is_float() => {
            return Err(NodeError::attr("fmod", "fmod=0 on floating-point inputs is not defined by ONNX (use fmod=1)"))
        }
        0 => BinaryOp::Mod,
        1 => BinaryOp::FMod,
        v => return Err(NodeError::attr("fmod", format!("expected 0 or 1, got {v}"))),
    };
    one(im.emit(n, Op::Binary(op), &[a, b])?)
}

/// Min, Max, Sum and Mean of any number of inputs, as a chain of binary ops (Mean divides by the count).
fn variadic(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let xs = im.inputs(n)?;
    let Some((&first, rest)) = xs.split_first() else {
        return Err(NodeError::missing(format!("{} needs at least one input", n.op_type)));
    };
    let op = binary_op(n.op_type);
    let mut acc = first;
    for &x in rest {
        acc = im.emit(n, Op::Binary(op), &[acc, x])?;
    }
    if n.op_type == "Mean" && xs.len() > 1 {
        let count = im.scalar(n, im.dtype(acc), xs.len() as f64);
        acc = im.emit(n, Op::Binary(BinaryOp::Div), &[acc, count])?;
    }
    if acc == first {
        acc = im.emit(n, Op::Identity, &[first])?;
    }
    one(acc)
}

fn where_(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let c = im.input(n, 0)?;
    let x = im.input(n, 1)?;
    let y = im.input(n, 2)?;
    one(im.emit(n, Op::Where, &[c, x, y])?)
}

fn cast(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let Some(to) = n.attrs.int("to")? else {
        return Err(NodeError::attr("to", "required attribute is absent"));
    };
    let out = n.proto.output.first().cloned().unwrap_or_default();
    let to = dtype_from_onnx(to as i32, &format!("output '{out}' (the target type)"))
        .map_err(|kind| NodeError { attribute: Some("to".into()), kind })?;
    one(im.emit(n, Op::Cast { to }, &[x])?)
}

fn cast_like(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let like = im.input(n, 1)?;
    let to = im.dtype(like);
    one(im.emit(n, Op::Cast { to }, &[x])?)
}

/// `x > 0 ? x : alpha * (exp(x) - 1)`, times `gamma` for Selu.
fn elu_like(im: &mut Importer, n: &NodeCx, alpha: f32, gamma: Option<f32>) -> NResult<ValueId> {
    let x = im.input(n, 0)?;
    let dt = im.dtype(x);
    let zero = im.scalar(n, dt, 0.0);
    let onev = im.scalar(n, dt, 1.0);
    let a = im.scalar(n, dt, alpha as f64);
    let pos = im.emit(n, Op::Binary(BinaryOp::Greater), &[x, zero])?;
    let e = im.emit(n, Op::Unary(UnaryOp::Exp), &[x])?;
    let em1 = im.emit(n, Op::Binary(BinaryOp::Sub), &[e, onev])?;
    let neg = im.emit(n, Op::Binary(BinaryOp::Mul), &[em1, a])?;
    let y = im.emit(n, Op::Where, &[pos, x, neg])?;
    match gamma {
        None => Ok(y),
        Some(g) => {
            let g = im.scalar(n, dt, g as f64);
            im.emit(n, Op::Binary(BinaryOp::Mul), &[y, g])
        }
    }
}

fn elu(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let alpha = n.attrs.float_or("alpha", 1.0)?;
    one(elu_like(im, n, alpha, None)?)
}

fn selu(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let alpha = n.attrs.float_or("alpha", 1.673_263_2)?;
    let gamma = n.attrs.float_or("gamma", 1.050_701)?;
    one(elu_like(im, n, alpha, Some(gamma))?)
}

/// `x < 0 ? slope * x : x`. Before opset 7 a 1-D slope of C values applies per channel (axis 1).
fn prelu(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let mut slope = im.input(n, 1)?;
    let (xs, ss) = (im.shape(x), im.shape(slope));
    if im.opset < 7 && ss.len() == 1 && xs.len() > 2 && ss[0] == xs[1] && ss[0] != 1 {
        let mut shape = vec![ss[0]];
        shape.resize(xs.len() - 1, 1);
        slope = im.reshape(n, slope, shape)?;
    }
    let zero = im.scalar(n, im.dtype(x), 0.0);
    let neg = im.emit(n, Op::Binary(BinaryOp::Less), &[x, zero])?;
    let scaled = im.emit(n, Op::Binary(BinaryOp::Mul), &[x, slope])?;
    let y = im.emit(n, Op::Where, &[neg, scaled, x])?;
    if im.shape(y) != xs {
        return Err(NodeError::invalid(format!("slope of shape {ss:?} does not broadcast to the input {xs:?}")));
    }
    one(y)
}

/// `max(0, x) + min(0, alpha * (exp(x / alpha) - 1))`, as ONNX defines Celu (alpha must not be 0).
fn celu(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let alpha = n.attrs.float_or("alpha", 1.0)?;
    if alpha == 0.0 || !alpha.is_finite() {
        return Err(NodeError::attr("alpha", format!("must be finite and non-zero, got {alpha}")));
    }
    let dt = im.dtype(x);
    if !dt.is_float() {
        return Err(NodeError::invalid(format!("Celu needs a float input, got {dt}")));
    }
    let (zero, onev, a) = (im.scalar(n, dt, 0.0), im.scalar(n, dt, 1.0), im.scalar(n, dt, alpha as f64));
    let pos = im.emit(n, Op::Binary(BinaryOp::Max), &[x, zero])?;
    let xa = im.emit(n, Op::Binary(BinaryOp::Div), &[x, a])?;
    let e = im.emit(n, Op::Unary(UnaryOp::Exp), &[xa])?;
    let em1 = im.emit(n, Op::Binary(BinaryOp::Sub), &[e, onev])?;
    let scaled = im.emit(n, Op::Binary(BinaryOp::Mul), &[em1, a])?;
    let neg = im.emit(n, Op::Binary(BinaryOp::Min), &[scaled, zero])?;
    one(im.emit(n, Op::Binary(BinaryOp::Add), &[pos, neg])?)
}

/// `x / (1 + |x|)`.
fn softsign(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let onev = im.scalar(n, im.dtype(x), 1.0);
    let a = im.emit(n, Op::Unary(UnaryOp::Abs), &[x])?;
    let d = im.emit(n, Op::Binary(BinaryOp::Add), &[a, onev])?;
    one(im.emit(n, Op::Binary(BinaryOp::Div), &[x, d])?)
}

/// `(x > 0) - (x < 0)` in x's type (NaN maps to 0, where ONNX's reference gives NaN).
fn sign(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let dt = im.dtype(x);
    let zero = im.scalar(n, dt, 0.0);
    let p = im.emit(n, Op::Binary(BinaryOp::Greater), &[x, zero])?;
    let q = im.emit(n, Op::Binary(BinaryOp::Less), &[x, zero])?;
    let p = im.cast(n, p, dt)?;
    let q = im.cast(n, q, dt)?;
    one(im.emit(n, Op::Binary(BinaryOp::Sub), &[p, q])?)
}

/// `x < -lambd ? x + bias : (x > lambd ? x - bias : 0)`.
fn shrink(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let lambd = n.attrs.float_or("lambd", 0.5)? as f64;
    let bias = n.attrs.float_or("bias", 0.0)? as f64;
    let dt = im.dtype(x);
    let (lo, hi, b, zero) = (im.scalar(n, dt, -lambd), im.scalar(n, dt, lambd), im.scalar(n, dt, bias), im.scalar(n, dt, 0.0));
    let below = im.emit(n, Op::Binary(BinaryOp::Less), &[x, lo])?;
    let above = im.emit(n, Op::Binary(BinaryOp::Greater), &[x, hi])?;
    let plus = im.emit(n, Op::Binary(BinaryOp::Add), &[x, b])?;
    let minus = im.emit(n, Op::Binary(BinaryOp::Sub), &[x, b])?;
    let upper = im.emit(n, Op::Where, &[above, minus, zero])?;
    let shape = im.shape(x);
    let upper = if im.shape(upper) != shape { im.emit(n, Op::Expand { shape }, &[upper])? } else { upper };
    one(im.emit(n, Op::Where, &[below, plus, upper])?)
}

/// `x > alpha ? x : 0`.
fn thresholded_relu(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let alpha = n.attrs.float_or("alpha", 1.0)? as f64;
    let dt = im.dtype(x);
    let (a, zero) = (im.scalar(n, dt, alpha), im.scalar(n, dt, 0.0));
    let keep = im.emit(n, Op::Binary(BinaryOp::Greater), &[x, a])?;
    one(im.emit(n, Op::Where, &[keep, x, zero])?)
}

/// `(a or b) and not (a and b)`.
fn xor(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let a = im.input(n, 0)?;
    let b = im.input(n, 1)?;
    let either = im.emit(n, Op::Binary(BinaryOp::Or), &[a, b])?;
    let both = im.emit(n, Op::Binary(BinaryOp::And), &[a, b])?;
    let not_both = im.emit(n, Op::Unary(UnaryOp::Not), &[both])?;
    one(im.emit(n, Op::Binary(BinaryOp::And), &[either, not_both])?)
}

/// `x == +inf` and/or `x == -inf`, as `detect_positive` / `detect_negative` ask.
fn is_inf(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let dt = im.dtype(x);
    if !dt.is_float() {
        return Err(NodeError::invalid(format!("IsInf needs a float input, got {dt}")));
    }
    let pos = n.attrs.int_or("detect_positive", 1)? != 0;
    let neg = n.attrs.int_or("detect_negative", 1)? != 0;
    let mut tests = Vec::new();
    for (on, v) in [(pos, f64::INFINITY), (neg, f64::NEG_INFINITY)] {
        if on {
            let c = im.scalar(n, dt, v);
            tests.push(im.emit(n, Op::Binary(BinaryOp::Equal), &[x, c])?);
        }
    }
    match tests[..] {
        [] => {
            let f = im.konst(n, crate::ir::Tensor::from_bool(im.shape(x), &vec![false; im.ty(x).numel()]));
            one(f)
        }
        [t] => one(t),
        [p, q] => one(im.emit(n, Op::Binary(BinaryOp::Or), &[p, q])?),
        _ => unreachable!("at most two tests"),
    }
}
