//! Converters, one per ONNX op, grouped by family. A converter reads its node through
//! [`Importer`](super::import::Importer) helpers (which fold constants and name what they emit) and returns the
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
use super::import::{Importer, NodeCx};
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
mod tests {
    use super::*;

    #[test]
    fn every_listed_op_has_a_converter_and_the_required_ones_are_listed() {
        for op in supported_ops() {
            assert!(converter(op).is_some(), "{op} listed without converter");
        }
        let required = "Conv ConvTranspose BatchNormalization Relu Clip LeakyRelu Sigmoid Tanh Erf Gelu HardSigmoid \
            HardSwish MaxPool AveragePool GlobalAveragePool Flatten Gemm MatMul Add Sub Mul Div Pow Sqrt Exp Log Neg \
            Reciprocal Min Max Where Equal Less Greater LessOrEqual GreaterOrEqual Not IsNaN Mod Cast ReduceMean \
            ReduceSum ReduceMax Softmax LogSoftmax LayerNormalization Reshape Transpose Concat Split Slice Squeeze \
            Unsqueeze Gather GatherElements Expand Pad Shape ConstantOfShape Constant Identity Range Tile CumSum GatherND \
            ScatterND";
        for op in required.split_whitespace() {
            assert!(supported_ops().contains(&op), "{op} is required but not supported");
        }
        assert!(converter("NoSuchOp").is_none());
    }
}
