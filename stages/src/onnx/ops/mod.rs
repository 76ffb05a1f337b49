//! Converters, one per ONNX op, grouped by family. A converter reads its node through
//! [`Importer`](super::importer::Importer) helpers (which fold constants and name what they emit) and returns the
//! IR values of the node's outputs in order (fewer when trailing optional outputs are not produced).
//!
//! Ops the IR has no variant for are decomposed into ones it has, each decomposition exact in real arithmetic
//! (documented at its converter): Elu, Selu, Celu, PRelu, Softsign, Sign, Shrink, LRN (through an
//! AveragePool over channels), InstanceNormalization, Mean, Sum, GlobalMaxPool, Einsum (Transpose, Reshape,
//! Slice for diagonals, MatMul, ReduceSum and Mul; see `einsum.rs`).

mod einsum;
mod elementwise;
mod nd;
mod nn;
mod scan;
mod shape;

use super::error::NResult;
use super::importer::{Importer, NodeCx};
use crate::ir::ValueId;

/// Converts one node; returns its outputs.
pub type Converter = fn(&mut Importer, &NodeCx) -> NResult<Vec<ValueId>>;

/// The converter of a default-domain op, if supported.
pub fn converter(op_type: &str) -> Option<Converter> {
    elementwise::converter(op_type)
        .or_else(|| nn::converter(op_type))
        .or_else(|| shape::converter(op_type))
        .or_else(|| scan::converter(op_type))
        .or_else(|| nd::converter(op_type))
        .or_else(|| einsum::converter(op_type))
}

/// Every supported default-domain op type, sorted (for reports and docs).
pub fn supported_ops() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = elementwise::OPS.iter().chain(nn::OPS).chain(shape::OPS).chain(scan::OPS).chain(nd::OPS).chain(einsum::OPS).copied().collect();
    v.sort_unstable();
    v
}

fn one(v: ValueId) -> NResult<Vec<ValueId>> {
    Ok(vec![v])
}

#[cfg(test)]
#[path = "mod_tests.rs"]
mod tests;
