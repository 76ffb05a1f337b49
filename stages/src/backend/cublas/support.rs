//! The `cublas` backend's pattern rule: which MatMuls cuBLASLt runs, and which epilogues fuse into them.
//!
//! Anchors: `MatMul` of one float type (f32, f16 or bf16) throughout, both operands of rank 2 or more, whose batch
//! dimensions (broadcast as NumPy does) make one strided batch: each operand either the same matrix for every
//! batch or one dense matrix per batch. A's batches over one shared B fold into one tall GEMM.
//!
//! Epilogues follow the shared chain rule ([`crate::rules::epilogue`]: single-use chains
//! back to one anchor, shared by the partitioner's epilogue combiner), restricted to what cuBLASLt's epilogue
//! computes, `act(A*B + C + bias)`: one `Add` of a bias along the last axis, one `Add` of a same-shaped
//! residual, in either order, and one activation last: `Relu`, or `Gelu` in its tanh form for f16 and bf16
//! (GPT-2's MLP). The tanh form is the one cuBLASLt's GELU epilogue computes; its accuracy is not documented,
//! so fp32 keeps the GELU on a kernel of ours, where the 1e-4 bar is checked, and the half types, whose bar is
//! 1e-2 and whose storage rounds at 4e-3 (bf16) anyway, take the epilogue. A cuBLASLt call reads every operand from device memory, so the
//! backend's kernel graphs lift every constant, however small, to an argument
//! ([`crate::backend::Backend::inline_const_max`] is 0).

use crate::rules::epilogue::{self as chain, Fusion, Unary};
use crate::backend::{refuse, Refusal};
use crate::ir::{DType, GeluApprox, Graph, NodeId, Op, ValueId};

/// One epilogue of a cuBLASLt chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Epilogue {
    Bias(ValueId),
    Residual(ValueId),
    Relu,
    GeluTanh,
}

impl Epilogue {
    fn is_activation(&self) -> bool {
        matches!(self, Epilogue::Relu | Epilogue::GeluTanh)
    }
}

/// The strided-batch form of a MatMul (shared with `cutlass`: [`crate::backend::library::matmul_shape`]).
pub use crate::backend::library::matmul_shape;

/// Whether `n` is a MatMul cuBLASLt runs from device operands.
pub fn anchor(g: &Graph, n: NodeId) -> Result<(), Refusal> {
    matmul_shape(g, n)?;
    Ok(())
}

/// The chain ending at epilogue node `n` (its anchor and its epilogues in order, `n`'s last), if every step
/// is a cuBLASLt epilogue in an order it computes; `uses` counts the uses of a value.
pub fn chain_of(g: &Graph, n: NodeId, uses: &dyn Fn(ValueId) -> usize) -> Result<(NodeId, Vec<(NodeId, Epilogue)>), Refusal> {
    let mut eps = Vec::new();
    let mut at = n;
    let anchor_node = loop {
        if g.node(at).op == Op::MatMul {
            break at;
        }
        let f = chain::fusion(g, at, uses)?;
        let ep = match f {
            Fusion::Unary { op: Unary::Relu, .. } => Epilogue::Relu,
            Fusion::Unary { op: Unary::Gelu(GeluApprox::Tanh), .. } if matches!(g.ty(g.node(at).outputs[0]).dtype, DType::F16 | DType::BF16) => Epilogue::GeluTanh,
            Fusion::Unary { op, .. } => return Err(refuse!("cuBLASLt has no {op:?} epilogue")),
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
    if eps.iter().rev().skip(1).any(|(_, e)| e.is_activation()) {
        return Err("cuBLASLt applies one activation, last".into());
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
