//! C spellings: element types, exact literals, and the scalar expression of every elementwise op.
//!
//! Each expression reproduces the reference interpreter's arithmetic for that op (see
//! `stages/src/interp/elementwise.rs`): f32 IEEE operations in float, transcendental functions in double
//! rounded once, integers in the wrapping i64 domain narrowed to i32 afterwards, bools as 0/1 bytes.

use crate::ir::{BinaryOp, DType, GeluApprox, Op, UnaryOp};

/// The C type of an element in memory.
pub fn mem_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::I64 => "int64_t",
        DType::I32 => "int32_t",
        DType::Bool => "uint8_t",
        // Rejected by `supports`/`lower` before any code is generated.
        DType::F16 | DType::BF16 => "uint16_t",
    }
}

/// The unsigned type of the element's size, for data movement that must be bit-exact.
pub fn bits_type(d: DType) -> &'static str {
    match d.size() {
        1 => "uint8_t",
        2 => "uint16_t",
        4 => "uint32_t",
        _ => "uint64_t",
    }
}

/// An exact C literal of an f32 (hexadecimal float, so no decimal round trip is involved).
pub fn f32_lit(v: f32) -> String {
    if v.is_nan() {
        // Payloads of NaN constants are not preserved through arithmetic anyway; the sign is kept.
        return if v.is_sign_negative() { "(-__builtin_nanf(\"\"))".into() } else { "__builtin_nanf(\"\")".into() };
    }
    if v.is_infinite() {
        return if v > 0.0 { "__builtin_inff()".into() } else { "(-__builtin_inff())".into() };
    }
    let bits = v.to_bits();
    let sign = if bits >> 31 == 1 { "-" } else { "" };
    let exp = ((bits >> 23) & 0xff) as i32;
    let mant = bits & 0x7f_ffff;
    if exp == 0 {
        // Zero or subnormal: 0x0.mp-126.
        format!("{sign}0x0.{:06x}p-126f", mant << 1)
    } else {
        format!("{sign}0x1.{:06x}p{:+}f", mant << 1, exp - 127)
    }
}

/// A C literal of an integer of type `d` (i64, i32 or bool).
pub fn int_lit(v: i64, d: DType) -> String {
    match d {
        DType::I64 if v == i64::MIN => "INT64_MIN".into(),
        DType::I64 => format!("INT64_C({v})"),
        DType::I32 if v == i32::MIN as i64 => "INT32_MIN".into(),
        DType::Bool => format!("{}", (v != 0) as u8),
        _ => format!("{v}"),
    }
}

/// Reads a stored element as the value an expression computes with (bools normalized to 0/1).
pub fn load(d: DType, ptr: &str, index: &str) -> String {
    match d {
        DType::Bool => format!("(uint8_t)({ptr}[{index}] != 0)"),
        _ => format!("{ptr}[{index}]"),
    }
}

/// Narrows an i64-domain integer expression to the dtype.
fn narrow(d: DType, e: String) -> String {
    match d {
        DType::I32 => format!("(int32_t)({e})"),
        _ => e,
    }
}

/// The C expression of an elementwise op applied to operand expressions `a` (already loaded locals) of
/// dtypes `dts`, producing `out` dtype. `Err` names what is not supported.
pub fn elementwise(op: &Op, a: &[String], dts: &[DType], _out: DType) -> Result<String, String> {
    let x = a.first().cloned().unwrap_or_default();
    let d = dts.first().copied().unwrap_or(DType::F32);
    let float = d == DType::F32;
    let int = d.is_int();
    Ok(match op {
        Op::Identity => x,
        Op::Unary(u) => match (u, float, int) {
            (UnaryOp::Relu, true, _) => format!("({x} < 0.0f ? 0.0f : {x})"),
            (UnaryOp::Relu, _, true) => narrow(d, format!("({x} < 0 ? 0 : (int64_t){x})")),
            (UnaryOp::Sigmoid, true, _) => format!("tsr_sigmoid({x})"),
            (UnaryOp::Tanh, true, _) => format!("tsr_tanhf({x})"),
            (UnaryOp::Erf, true, _) => format!("tsr_erff({x})"),
            (UnaryOp::Sqrt, true, _) => format!("sqrtf({x})"),
            (UnaryOp::Exp, true, _) => format!("tsr_expf({x})"),
            (UnaryOp::Log, true, _) => format!("tsr_logf({x})"),
            (UnaryOp::Neg, true, _) => format!("(-{x})"),
            (UnaryOp::Neg, _, true) => narrow(d, format!("TSR_WNEG({x})")),
            (UnaryOp::Reciprocal, true, _) => format!("(1.0f / {x})"),
            (UnaryOp::Abs, true, _) => format!("fabsf({x})"),
            (UnaryOp::Abs, _, true) => narrow(d, format!("tsr_iabs({x})")),
            (UnaryOp::Floor, true, _) => format!("floorf({x})"),
            (UnaryOp::Ceil, true, _) => format!("ceilf({x})"),
            (UnaryOp::HardSwish, true, _) => format!("tsr_hardswish({x})"),
            (UnaryOp::Not, _, _) if d == DType::Bool => format!("(uint8_t)!{x}"),
            (UnaryOp::IsNaN, true, _) => format!("(uint8_t)({x} != {x})"),
            (UnaryOp::Cos, true, _) => format!("(float)cos((double){x})"),
            (UnaryOp::Sin, true, _) => format!("(float)sin((double){x})"),
            (UnaryOp::Tan, true, _) => format!("(float)tan((double){x})"),
            (UnaryOp::Acos, true, _) => format!("(float)acos((double){x})"),
            (UnaryOp::Asin, true, _) => format!("(float)asin((double){x})"),
            (UnaryOp::Atan, true, _) => format!("(float)atan((double){x})"),
            (UnaryOp::Cosh, true, _) => format!("(float)cosh((double){x})"),
            (UnaryOp::Sinh, true, _) => format!("(float)sinh((double){x})"),
            (UnaryOp::Asinh, true, _) => format!("(float)asinh((double){x})"),
            (UnaryOp::Acosh, true, _) => format!("(float)acosh((double){x})"),
            (UnaryOp::Atanh, true, _) => format!("(float)atanh((double){x})"),
            // The default rounding mode (to nearest, ties to even) on the host and the device alike.
            (UnaryOp::Round, true, _) => format!("rintf({x})"),
            (UnaryOp::Softplus, true, _) => format!("tsr_softplusf({x})"),
            (UnaryOp::Mish, true, _) => format!("tsr_mishf({x})"),
            _ => return Err(format!("{} on {d}", op.name())),
        },
        Op::LeakyRelu { alpha } if float => format!("({x} < 0.0f ? {} * {x} : {x})", f32_lit(*alpha)),
        Op::HardSigmoid { alpha, beta } if float => {
            format!("tsr_clampf({} * {x} + {}, 0.0f, 1.0f)", f32_lit(*alpha), f32_lit(*beta))
        }
        Op::Clip { min, max } if float => format!("tsr_clampf({x}, {}, {})", f32_lit(*min), f32_lit(*max)),
        Op::Clip { min, max } if int => {
            // Integer bounds: the smallest integer >= min and the largest <= max (saturating, as the
            // reference's `as` conversion).
            let mut e = format!("(int64_t){x}");
            if min.is_finite() {
                e = format!("tsr_imax({e}, {})", int_lit((*min as f64).ceil() as i64, DType::I64));
            }
            if max.is_finite() {
                e = format!("tsr_imin({e}, {})", int_lit((*max as f64).floor() as i64, DType::I64));
            }
            narrow(d, e)
        }
        Op::Gelu { approximate } if float => match approximate {
            GeluApprox::Erf => format!("tsr_gelu_erf({x})"),
            GeluApprox::Tanh => format!("tsr_gelu_tanh({x})"),
        },
        Op::Binary(b) => binary(*b, &x, &a[1], d)?,
        Op::Where => format!("({x} ? {} : {})", a[1], a[2]),
        Op::Cast { to } => cast(&x, d, *to),
        _ => return Err(format!("{} on {d} is not elementwise here", op.name())),
    })
}

fn binary(b: BinaryOp, x: &str, y: &str, d: DType) -> Result<String, String> {
    use BinaryOp::*;
    let cmp = |o: &str| format!("(uint8_t)({x} {o} {y})");
    Ok(match d {
        DType::F32 => match b {
            Add => format!("({x} + {y})"),
            Sub => format!("({x} - {y})"),
            Mul => format!("({x} * {y})"),
            Div => format!("({x} / {y})"),
            Pow => format!("(float)pow((double){x}, (double){y})"),
            Min => format!("tsr_minf({x}, {y})"),
            Max => format!("tsr_maxf({x}, {y})"),
            Mod => format!("tsr_modf_py({x}, {y})"),
            FMod => format!("fmodf({x}, {y})"),
            Equal => cmp("=="),
            Less => cmp("<"),
            Greater => cmp(">"),
            LessOrEqual => cmp("<="),
            GreaterOrEqual => cmp(">="),
            And | Or => return Err(format!("{b:?} on f32")),
        },
        DType::I64 | DType::I32 => {
            let e = match b {
                Add => format!("TSR_WADD({x}, {y})"),
                Sub => format!("TSR_WSUB({x}, {y})"),
                Mul => format!("TSR_WMUL({x}, {y})"),
                Div => format!("tsr_idiv({x}, {y})"),
                Pow => format!("tsr_ipow({x}, {y})"),
                Min => format!("tsr_imin({x}, {y})"),
                Max => format!("tsr_imax({x}, {y})"),
                Mod => format!("tsr_imod({x}, {y})"),
                FMod => format!("tsr_irem({x}, {y})"),
                Equal => return Ok(cmp("==")),
                Less => return Ok(cmp("<")),
                Greater => return Ok(cmp(">")),
                LessOrEqual => return Ok(cmp("<=")),
                GreaterOrEqual => return Ok(cmp(">=")),
                And | Or => return Err(format!("{b:?} on {d}")),
            };
            narrow(d, e)
        }
        DType::Bool => match b {
            And => format!("(uint8_t)({x} & {y})"),
            Or => format!("(uint8_t)({x} | {y})"),
            Equal => cmp("=="),
            _ => return Err(format!("{b:?} on bool")),
        },
        _ => return Err(format!("{b:?} on {d}")),
    })
}

/// Cast as the reference does it (see `interp::elementwise::cast`).
fn cast(x: &str, from: DType, to: DType) -> String {
    if from == to {
        return x.to_string();
    }
    match (from, to) {
        (DType::F32, DType::Bool) => format!("(uint8_t)({x} != 0.0f)"),
        (_, DType::Bool) => format!("(uint8_t)({x} != 0)"),
        (_, DType::F32) => format!("(float){x}"),
        (DType::F32, DType::I64) => format!("tsr_f2i64((double){x})"),
        (DType::F32, DType::I32) => format!("(int32_t)tsr_f2i32((double){x})"),
        (_, DType::I64) => format!("(int64_t){x}"),
        (_, DType::I32) => format!("(int32_t)(int64_t){x}"),
        _ => format!("/* unsupported cast */ {x}"),
    }
}

#[cfg(test)]
#[path = "cexpr_tests.rs"]
mod tests;
