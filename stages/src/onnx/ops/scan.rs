//! CumSum: the axis operand (a scalar or one-element integer tensor) must be constant once folded and
//! becomes the IR op's attribute; `exclusive` and `reverse` carry over.

use super::one;
use crate::ir::{Op, ValueId};
use crate::onnx::attrs::norm_axis;
use crate::onnx::error::{NResult, NodeError};
use crate::onnx::importer::{Importer, NodeCx};
use crate::onnx::ops::Converter;

pub const OPS: &[&str] = &["CumSum"];

pub fn converter(op: &str) -> Option<Converter> {
    Some(match op {
        "CumSum" => cumsum,
        _ => return None,
    })
}

fn flag(n: &NodeCx, name: &str) -> NResult<bool> {
    match n.attrs.int_or(name, 0)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(NodeError::attr(name, format!("must be 0 or 1, got {v}"))),
    }
}

fn cumsum(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let axis_t = im.const_input(n, 1, "axis")?;
    if !axis_t.dtype().is_int() || axis_t.numel() != 1 || axis_t.shape().len() > 1 {
        return Err(NodeError::invalid(format!("the axis must be an integer scalar, got {}", axis_t.ty)));
    }
    let axis = norm_axis(axis_t.to_i64_vec()[0], im.rank(x), "axis")?;
    let (exclusive, reverse) = (flag(n, "exclusive")?, flag(n, "reverse")?);
    one(im.emit(n, Op::CumSum { axis, exclusive, reverse }, &[x])?)
}
