//! GatherND and ScatterND (without reduction). Constant index tuples are normalized at import: negative
//! entries count from the end of their dimension, and an entry out of range is an error naming the node.

use super::one;
use crate::ir::{Op, Tensor, ValueId};
use crate::onnx::error::{NResult, NodeError};
use crate::onnx::importer::{Importer, NodeCx};
use crate::onnx::ops::Converter;

pub const OPS: &[&str] = &["GatherND", "ScatterND"];

pub fn converter(op: &str) -> Option<Converter> {
    Some(match op {
        "GatherND" => gather_nd,
        "ScatterND" => scatter_nd,
        _ => return None,
    })
}

/// The index operand, with constant tuples normalized against `dims` (the data dims after the batch dims).
fn tuples(im: &mut Importer, n: &NodeCx, dims: &[usize]) -> NResult<ValueId> {
    let idx = im.input(n, 1)?;
    let Some(t) = im.constant(idx) else { return Ok(idx) };
    let k = t.shape().last().copied().unwrap_or(0);
    if !t.dtype().is_int() || t.shape().is_empty() || k == 0 || k > dims.len() {
        return Err(NodeError::invalid(format!("indices must be integer tuples of length 1..={}, got {}", dims.len(), t.ty)));
    }
    let mut vals = t.to_i64_vec();
    for (i, v) in vals.iter_mut().enumerate() {
        let d = dims[i % k] as i64;
        if *v < -d || *v >= d {
            return Err(NodeError::invalid(format!("index {v} is out of range for dimension {} of size {d}", i % k)));
        }
        if *v < 0 {
            *v += d;
        }
    }
    let fixed = Tensor::from_i64(t.shape().to_vec(), &vals);
    Ok(im.konst(n, fixed))
}

fn gather_nd(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let b = n.attrs.int_or("batch_dims", 0)?;
    let xs = im.shape(x);
    let batch_dims = usize::try_from(b).ok().filter(|&b| b < xs.len()).ok_or_else(|| NodeError::attr("batch_dims", format!("{b} is out of range for data of rank {}", xs.len())))?;
    let idx = tuples(im, n, &xs[batch_dims..])?;
    one(im.emit(n, Op::GatherND { batch_dims }, &[x, idx])?)
}

fn scatter_nd(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    if let Some(r) = n.attrs.string("reduction")?.filter(|r| r != "none") {
        return Err(NodeError::unsupported_attr("reduction", format!("ScatterND reduction {r}"), format!("reduction '{r}' (only 'none' is supported)")));
    }
    let x = im.input(n, 0)?;
    let xs = im.shape(x);
    let idx = tuples(im, n, &xs)?;
    let upd = im.input(n, 2)?;
    one(im.emit(n, Op::ScatterND, &[x, idx, upd])?)
}
