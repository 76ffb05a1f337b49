//! The `cublas` backend's pattern rule: which MatMuls cuBLASLt runs, and which epilogues fuse into them.
//!
//! Anchors: `MatMul` of one float type (f32 or f16) throughout, both operands of rank 2 or more, whose batch
//! dimensions (broadcast as NumPy does) make one strided batch: each operand either the same matrix for every
//! batch or one dense matrix per batch. A's batches over one shared B fold into one tall GEMM.
//!
//! Epilogues follow the chain rule of the `gemm` backend ([`crate::backend::gemm::support`]: single-use chains
//! back to one anchor, shared by the partitioner's epilogue combiner), restricted to what cuBLASLt's epilogue
//! computes, `relu?(A*B + C + bias)`: one `Add` of a bias along the last axis, one `Add` of a same-shaped
//! residual, in either order, and `Relu` last. A cuBLASLt call reads every operand from device memory, so the
//! backend's kernel graphs lift every constant, however small, to an argument
//! ([`crate::backend::Backend::inline_const_max`] is 0).

use crate::backend::gemm::support::{self as chain, Fusion, Unary};
use crate::ir::{broadcast_shapes, Graph, NodeId, Op, ValueId};

/// One epilogue of a cuBLASLt chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Epilogue {
    Bias(ValueId),
    Residual(ValueId),
    Relu,
}

/// The strided-batch form of a MatMul: `(batch, m, n, k, a_stride, b_stride)` in elements (a stride of 0: the
/// same matrix for every batch), or why cuBLASLt cannot take it.
pub fn matmul_shape(g: &Graph, n: NodeId) -> Result<(u64, u64, u64, u64, u64, u64), String> {
    let node = g.node(n);
    if node.op != Op::MatMul {
        return Err(format!("cublas runs MatMul, not {}", node.op.name()));
    }
    let dt = g.ty(node.outputs[0]).dtype;
    if let Some(&v) = node.inputs.iter().find(|&&v| g.ty(v).dtype != dt) {
        return Err(format!("MatMul of mixed types ({} and {})", g.ty(v), g.ty(node.outputs[0])));
    }
    if !matches!(dt, crate::ir::DType::F32 | crate::ir::DType::F16) {
        return Err(format!("cublas runs f32 and f16 MatMuls, got {dt:?}"));
    }
    let (sa, sb) = (&g.ty(node.inputs[0]).shape, &g.ty(node.inputs[1]).shape);
    if sa.len() < 2 || sb.len() < 2 {
        return Err("cublas takes MatMul operands of rank 2 or more".into());
    }
    let u = |x: usize| x as u64;
    let (m, k, nn) = (u(sa[sa.len() - 2]), u(sa[sa.len() - 1]), u(sb[sb.len() - 1]));
    let (ba, bb) = (&sa[..sa.len() - 2], &sb[..sb.len() - 2]);
    let batch = broadcast_shapes(ba, bb).map_err(|e| e.to_string())?;
    let count: u64 = batch.iter().map(|&d| u(d)).product();
    // An operand is shared (all its batch dims 1) or dense over the whole batch (its batch dims equal it, after
    // right-aligning): anything in between needs more than one stride.
    let stride = |x: &[usize], mat: u64| -> Result<u64, String> {
        let numel: u64 = x.iter().map(|&d| u(d)).product();
        if numel == 1 {
            Ok(0)
        } else if numel == count {
            Ok(mat)
        } else {
            Err(format!("MatMul batch {x:?} broadcast to {batch:?} is not one strided batch"))
        }
    };
    let (sa_b, sb_b) = (stride(ba, m * k)?, stride(bb, k * nn)?);
    if [m, k, nn].iter().any(|&d| d == 0 || d > i32::MAX as u64) || count == 0 {
        return Err(format!("MatMul of {m}x{k} by {k}x{nn}: empty or too large for cuBLASLt"));
    }
    if sb_b == 0 && count > 1 {
        // A's batches stacked into one tall GEMM (C is dense in the same order).
        return Ok((1, m * count, nn, k, 0, 0));
    }
    Ok((count.max(1), m, nn, k, sa_b, sb_b))
}

/// Whether `n` is a MatMul cuBLASLt runs from device operands.
pub fn anchor(g: &Graph, n: NodeId) -> Result<(), String> {
    matmul_shape(g, n)?;
    Ok(())
}

/// The chain ending at epilogue node `n` (its anchor and its epilogues in order, `n`'s last), if every step
/// is a cuBLASLt epilogue in an order it computes; `uses` counts the uses of a value.
pub fn chain_of(g: &Graph, n: NodeId, uses: &dyn Fn(ValueId) -> usize) -> Result<(NodeId, Vec<(NodeId, Epilogue)>), String> {
    let mut eps = Vec::new();
    let mut at = n;
    let anchor_node = loop {
        if g.node(at).op == Op::MatMul {
            break at;
        }
        let f = chain::fusion(g, at, uses)?;
        let ep = match f {
            Fusion::Unary { op: Unary::Relu, .. } => Epilogue::Relu,
            Fusion::Unary { op, .. } => return Err(format!("cuBLASLt has no {op:?} epilogue")),
            Fusion::Add { input, other, inner, count } => {
                let s = &g.ty(input).shape;
                if g.ty(other).shape == *s {
                    Epilogue::Residual(other)
                } else if inner == 1 && count == *s.last().unwrap_or(&1) as u64 {
                    Epilogue::Bias(other)
                } else {
                    return Err("only a bias along the last axis or a same-shaped residual is added".into());
                }
            }
        };
        eps.push((at, ep));
        at = g.producer(f.input()).ok_or("a fused value has a producer")?;
    };
    anchor(g, anchor_node)?;
    eps.reverse();
    let count = |want: fn(&Epilogue) -> bool| eps.iter().filter(|(_, e)| want(e)).count();
    if count(|e| matches!(e, Epilogue::Bias(_))) > 1 || count(|e| matches!(e, Epilogue::Residual(_))) > 1 {
        return Err("cuBLASLt adds one bias and one residual".into());
    }
    if eps.iter().rev().skip(1).any(|(_, e)| *e == Epilogue::Relu) {
        return Err("cuBLASLt applies ReLU last".into());
    }
    Ok((anchor_node, eps))
}

/// The pattern rule on a model graph.
pub fn supports(g: &Graph, n: NodeId) -> bool {
    let uses = g.use_counts();
    let count = |v: ValueId| uses[v.index()];
    match g.node(n).op {
        Op::MatMul => anchor(g, n).is_ok(),
        _ => chain_of(g, n, &count).is_ok(),
    }
}
