//! The work and traffic of a partition, which every backend's analytical cost builds on: flops per node
//! (GEMM flops apart from the rest; a transcendental function counts 20 flops) and the bytes a partition
//! reads from and writes to outside itself (fused intermediates are free, which is what makes fusion win in
//! the partitioner). Each backend turns them into microseconds with its own rates (`c`'s in `c/cost.rs`).

use crate::ir::{Graph, NodeId, Op, UnaryOp};
use std::collections::BTreeSet;

const TRANSCENDENTAL: f64 = 20.0;

fn numel(g: &Graph, n: NodeId) -> f64 {
    g.ty(g.node(n).outputs[0]).numel() as f64
}

/// (GEMM flops, other flops) of one node (transcendental functions weighted as above).
pub fn flops(g: &Graph, n: NodeId) -> (f64, f64) {
    let node = g.node(n);
    let out = numel(g, n);
    let in0 = g.ty(node.inputs[0]).numel() as f64;
    match &node.op {
        Op::MatMul => {
            let a = &g.ty(node.inputs[0]).shape;
            let k = *a.last().unwrap_or(&1) as f64;
            (2.0 * out * k, 0.0)
        }
        // The weight's dims after the first are one output's taps in every layout ([M, C/g, k..] channels-first,
        // [M, k.., C/g] channels-last).
        Op::Conv(_) | Op::NhwcConv(_) | Op::ConvTranspose(_) => {
            let w = &g.ty(node.inputs[1]).shape;
            let per: f64 = w[1..].iter().product::<usize>() as f64;
            let base = if matches!(node.op, Op::ConvTranspose(_)) { in0 } else { out };
            (2.0 * base * per, 0.0)
        }
        Op::Attention(a) => {
            // Two GEMMs (Q Kᵀ and P V) and a softmax over the scores; a graph that exists has valid dims.
            let types: Vec<_> = node.inputs.iter().map(|&v| g.ty(v)).collect();
            match crate::ir::attention_dims(a, &types) {
                Ok(d) => {
                    let scores = d.batch.iter().product::<usize>() as f64 * (d.sq * d.sk) as f64;
                    (2.0 * scores * (d.d + d.dv) as f64, scores * (TRANSCENDENTAL + 4.0))
                }
                Err(_) => (0.0, out),
            }
        }
        Op::MaxPool(p) | Op::NhwcMaxPool(p) | Op::AveragePool { pool: p, .. } => (0.0, out * p.kernel.iter().product::<usize>() as f64),
        Op::Softmax { .. } | Op::LogSoftmax { .. } => (0.0, in0 * (TRANSCENDENTAL + 3.0)),
        Op::LayerNorm { .. } | Op::BatchNorm { .. } => (0.0, in0 * 6.0),
        Op::Reduce { .. } | Op::GlobalAveragePool => (0.0, in0),
        Op::Unary(
            UnaryOp::Sigmoid
            | UnaryOp::Tanh
            | UnaryOp::Erf
            | UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Cos
            | UnaryOp::Sin
            | UnaryOp::Tan
            | UnaryOp::Acos
            | UnaryOp::Asin
            | UnaryOp::Atan
            | UnaryOp::Cosh
            | UnaryOp::Sinh
            | UnaryOp::Asinh
            | UnaryOp::Acosh
            | UnaryOp::Atanh
            | UnaryOp::Softplus
            | UnaryOp::Mish,
        )
        | Op::Gelu { .. } => (0.0, out * TRANSCENDENTAL),
        Op::Binary(crate::ir::BinaryOp::Pow) => (0.0, out * TRANSCENDENTAL),
        op if op.is_elementwise() => (0.0, out),
        // Data movement: its cost is the bytes it moves.
        _ => (0.0, out * 0.5),
    }
}

/// (GEMM flops, other flops) of a partition.
pub fn partition_flops(g: &Graph, nodes: &[NodeId]) -> (f64, f64) {
    let set: BTreeSet<NodeId> = nodes.iter().copied().collect();
    set.iter().map(|&n| flops(g, n)).fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y))
}

/// Bytes a partition reads from and writes to outside itself (inline constants excluded).
pub fn boundary_bytes(g: &Graph, nodes: &[NodeId]) -> usize {
    let set: BTreeSet<NodeId> = nodes.iter().copied().collect();
    let produced: BTreeSet<_> = set.iter().flat_map(|&n| g.node(n).outputs.iter().copied()).collect();
    let consumers = g.consumers();
    let mut bytes = 0usize;
    let mut seen = BTreeSet::new();
    for &n in &set {
        for &i in &g.node(n).inputs {
            let small_const = g.constant(i).is_some_and(|t| t.numel() <= crate::backend::INLINE_CONST_MAX);
            if !produced.contains(&i) && !small_const && seen.insert(i) {
                bytes += g.ty(i).size_bytes();
            }
        }
    }
    for &o in &produced {
        let escapes = g.outputs.contains(&o) || consumers[o.index()].iter().any(|c| !set.contains(c));
        if escapes {
            bytes += g.ty(o).size_bytes();
        }
    }
    bytes
}
