//! The `cutlass` backend's pattern rule: which MatMuls its GEMM template runs, and which epilogues fuse.
//!
//! Anchors: MatMuls of the strided-batch form the GEMM libraries share
//! ([`crate::backend::library::matmul_shape`]), f32, f16 or bf16, whose extents the sm80 mainloop can read:
//! fp16 and bf16 need K and N even (cp.async copies at least 4 bytes), and every extent must fit the template's
//! `int`s; and channels-last convolutions the conv2d template runs ([`super::conv::problem`]), whose own bias
//! input is their epilogue's addend.
//!
//! Epilogues follow the shared chain rule ([`crate::rules::epilogue`]), restricted to
//! what the template's epilogue computes, `act(A*B + C)`: at most one `Add` (a bias along the last axis, or a
//! residual of the result's shape), then at most one activation (ReLU, GELU erf or tanh, Sigmoid,
//! HardSwish), last.

use crate::backend::{refuse, Refusal};
use super::instance::{alignment, Activation, Element};
use crate::rules::epilogue::{self as chain, Fusion, Unary};
use crate::backend::library::matmul_shape;
use crate::ir::{GeluApprox, Graph, NodeId, Op, ValueId};

/// What the epilogue adds before its activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addend {
    /// A vector along the last axis, the same for every row.
    Bias(ValueId),
    /// A tensor of the result's shape.
    Residual(ValueId),
}

/// One chain: the anchor, what its epilogue adds and applies, and the chain's last node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chain {
    pub anchor: NodeId,
    pub addend: Option<Addend>,
    pub activation: Activation,
    pub last: NodeId,
}

/// Whether an op starts a chain: MatMul or a channels-last convolution.
pub fn is_anchor_op(op: &Op) -> bool {
    matches!(op, Op::MatMul | Op::NhwcConv(_))
}

/// Whether `n` is a MatMul the template runs: its strided-batch form, an element type, and extents the
/// mainloop can read.
pub fn anchor(g: &Graph, n: NodeId) -> Result<(), Refusal> {
    if matches!(g.node(n).op, Op::NhwcConv(_)) {
        return super::conv::problem(g, n).map(|_| ());
    }
    let (batch, m, nn, k, _, _) = matmul_shape(g, n)?;
    let e = Element::of(g.ty(g.node(n).outputs[0]).dtype).ok_or("cutlass runs f32, f16 and bf16 GEMMs")?;
    if alignment(e, k).is_none() || alignment(e, nn).is_none() {
        return Err(refuse!("a {m}x{k} by {k}x{nn} {} GEMM with odd K or N: the sm80 mainloop copies at least two 16-bit elements", g.ty(g.node(n).outputs[0]).dtype));
    }
    if [batch, m, nn, k, m * k * batch, k * nn * batch, m * nn * batch].iter().any(|&d| d > i32::MAX as u64) {
        return Err(refuse!("a GEMM of {batch}x{m}x{nn}x{k} does not fit 32-bit extents"));
    }
    Ok(())
}

fn activation(op: Unary) -> Result<Activation, Refusal> {
    Ok(match op {
        Unary::Relu => Activation::Relu,
        Unary::Gelu(GeluApprox::Erf) => Activation::Gelu,
        Unary::Gelu(GeluApprox::Tanh) => Activation::GeluTanh,
        Unary::Sigmoid => Activation::Sigmoid,
        Unary::HardSwish => Activation::HardSwish,
        Unary::Clip { .. } => return Err("the cutlass epilogue has no Clip".into()),
    })
}

/// The chain ending at node `n` (a MatMul alone, or an epilogue node), if the template's epilogue computes
/// it; `uses` counts the uses of a value.
pub fn chain_of(g: &Graph, n: NodeId, uses: &dyn Fn(ValueId) -> usize) -> Result<Chain, Refusal> {
    let mut steps = Vec::new();
    let mut at = n;
    let anchor_node = loop {
        if is_anchor_op(&g.node(at).op) {
            break at;
        }
        let f = chain::fusion(g, at, uses)?;
        steps.push(f);
        at = g.producer(f.input()).ok_or("a fused value has a producer")?;
    };
    anchor(g, anchor_node)?;
    steps.reverse();
    // A convolution's bias input is its epilogue's first addend.
    let own_bias = g.node(anchor_node).inputs.get(2).map(|&b| Addend::Bias(b));
    let mut chain = Chain { anchor: anchor_node, addend: own_bias, activation: Activation::Identity, last: n };
    for f in steps {
        if chain.activation != Activation::Identity {
            return Err("the cutlass epilogue applies its activation last".into());
        }
        match f {
            Fusion::Unary { op, .. } => chain.activation = activation(op)?,
            Fusion::Add { input, other, inner, count } => {
                if chain.addend.is_some() {
                    return Err("the cutlass epilogue adds one bias or one residual".into());
                }
                let s = &g.ty(input).shape;
                chain.addend = Some(if g.ty(other).shape == *s {
                    Addend::Residual(other)
                } else if inner == 1 && count == *s.last().unwrap_or(&1) as u64 {
                    Addend::Bias(other)
                } else {
                    return Err("only a bias along the last axis or a same-shaped residual is added".into());
                });
            }
        }
    }
    Ok(chain)
}

/// The fewest rows (per batch) of a GEMM the rule offers `cutlass`: the smallest tile's. A thinner GEMM (a CNN's
/// classifier at batch 1 to 32, a pooler's one row) wastes most of every tile: cuBLASLt ran ResNet-50's
/// classifier in 6.6-7.0 us where the best cutlass kernel took 11.1 (H200, fp16, b1 to b32,
/// bench/gpu_cutlass.md), and each cutlass candidate is nvcc programs a cold build waits for (about 35 s
/// of ResNet-50's 46 s cold compile went to its classifier's).
pub const MIN_ROWS: u64 = 64;

/// The pattern rule on a model graph, as `cutlass` applies it: node `n` (an anchor, or a node of an anchor's
/// chain) is a chain the templates compute ([`supports`]) on a GEMM of at least [`MIN_ROWS`] rows, or, with
/// `convs` (the target's `-convs`), on a convolution.
pub fn offered(g: &Graph, n: NodeId, convs: bool) -> bool {
    let uses = g.use_counts();
    let Ok(chain) = chain_of(g, n, &|v: ValueId| uses[v.index()]) else { return false };
    match g.node(chain.anchor).op {
        Op::NhwcConv(_) => convs,
        _ => matmul_shape(g, chain.anchor).is_ok_and(|(_, m, ..)| m >= MIN_ROWS),
    }
}

/// Whether node `n` ends a chain the templates compute, whatever its size (an anchor alone is a chain).
pub fn supports(g: &Graph, n: NodeId) -> bool {
    let uses = g.use_counts();
    chain_of(g, n, &|v: ValueId| uses[v.index()]).is_ok()
}
