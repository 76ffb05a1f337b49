//! The epilogue chain: which MatMul and Conv nodes anchor a chain, and how epilogues attach to one. The `gemm`
//! backend runs these chains (its `support.rs` restricts them to f32 and channels-first convolutions), the
//! library backends (`cublas`, `cudnn`, `cutlass`) restrict them to what their fused call computes, and the
//! partitioner's [`Combiner::GemmEpilogue`](super::Combiner::GemmEpilogue) grows candidates along them.
//!
//! Anchors: `MatMul` (batched, broadcast, rank-1 operands promoted as NumPy does), `Conv` (any number of spatial
//! dimensions, groups, strides, dilations, explicit pads, optional bias input) and `NhwcConv`, each f32, f16 or
//! bf16 throughout.
//!
//! Epilogues: `Relu`, `Clip`, `Gelu` (erf and tanh), `Sigmoid`, `HardSwish` and `Add`, in the anchor's type. The rule:
//! **an epilogue node is supported only if the value it is fused on is produced by an anchor or by another
//! supported epilogue (a chain back to one anchor), and that value has exactly one use in the graph** (one
//! consuming node, and not a graph output). The chain's intermediate values then never need to exist in
//! memory: the runtime applies the whole chain to the anchor's output in one pass while it is hot. For a
//! unary epilogue the fused value is its input; for `Add` it is the first operand that qualifies, and the other
//! operand must be one of (shapes right-aligned, the fused value's shape `S` unchanged by the Add):
//! - a same-shaped tensor `S` (a residual), any source;
//! - a single element (a scalar);
//! - for a MatMul chain, a bias along the output's last dimension (`[.., 1, S[-1]]`);
//! - for a Conv chain, a per-channel bias (`[.., C, 1, .., 1]` aligned with the output's channel axis).
//!
//! A backend applies the same rule in its `supports` on the model graph and in its fusion at lowering, on the
//! kernel graph (where a partition output counts as a use), so a partition the partitioner builds from
//! supported nodes, holding each epilogue's anchor, always lowers.

use crate::ir::{BinaryOp, DType, GeluApprox, Graph, NodeId, Op, UnaryOp, ValueId};

/// The kind of a chain's anchor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnchorKind {
    MatMul,
    Conv,
    /// A channels-last convolution: its bias and per-channel operands broadcast along the last axis, as a
    /// MatMul's do (the `gemm` backend itself runs channels-first convolutions only).
    NhwcConv,
}

/// A unary epilogue operation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unary {
    Relu,
    Clip { min: f32, max: f32 },
    Gelu(GeluApprox),
    Sigmoid,
    HardSwish,
}

/// How an epilogue node attaches to its chain.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fusion {
    Unary { input: ValueId, op: Unary },
    /// `fused + other`, where `other` element `i` is `other[(i / inner) % count]` of the fused tensor's flat
    /// index `i`.
    Add { input: ValueId, other: ValueId, inner: u64, count: u64 },
}

impl Fusion {
    pub fn input(&self) -> ValueId {
        match *self {
            Fusion::Unary { input, .. } | Fusion::Add { input, .. } => input,
        }
    }
}

/// Why a chain node's values do not share one float type (f32, f16 or bf16), if they do not. The chain rule
/// itself is type-agnostic, so `cublas`, `cudnn` and `cutlass` share it in every precision; `gemm` adds its f32-only check in
/// its `supports` and at lowering.
fn uniform_float(g: &Graph, n: NodeId) -> Result<(), String> {
    let node = g.node(n);
    let first = g.ty(node.outputs[0]).dtype;
    match node.inputs.iter().chain(&node.outputs).find(|&&v| g.ty(v).dtype != first || !matches!(first, DType::F32 | DType::F16 | DType::BF16)) {
        Some(&v) => Err(format!("MatMul and Conv chains are f32, f16 or bf16 throughout, got {}", g.ty(v))),
        None => Ok(()),
    }
}

/// Whether `n` is an anchor this backend runs; `Err` says why not (for lowering errors).
pub fn anchor(g: &Graph, n: NodeId) -> Result<AnchorKind, String> {
    let node = g.node(n);
    let kind = match node.op {
        Op::MatMul => AnchorKind::MatMul,
        Op::Conv(_) => AnchorKind::Conv,
        Op::NhwcConv(_) => AnchorKind::NhwcConv,
        _ => return Err(format!("gemm runs {} only as an epilogue of a MatMul or Conv", node.op.name())),
    };
    uniform_float(g, n)?;
    Ok(kind)
}

fn unary_of(op: &Op) -> Option<Unary> {
    Some(match *op {
        Op::Unary(UnaryOp::Relu) => Unary::Relu,
        Op::Unary(UnaryOp::Sigmoid) => Unary::Sigmoid,
        Op::Unary(UnaryOp::HardSwish) => Unary::HardSwish,
        Op::Clip { min, max } if !min.is_nan() && !max.is_nan() => Unary::Clip { min, max },
        Op::Gelu { approximate } => Unary::Gelu(approximate),
        _ => return None,
    })
}

/// Whether `op` can be an epilogue at all (before looking at the graph).
pub fn is_epilogue_op(op: &Op) -> bool {
    unary_of(op).is_some() || matches!(op, Op::Binary(BinaryOp::Add))
}

/// How `other` broadcasts against a chain value of shape `s`, as `(inner, count)` (see [`Fusion::Add`]).
pub fn classify_add(kind: AnchorKind, s: &[usize], t: &[usize]) -> Option<(u64, u64)> {
    let numel = |d: &[usize]| d.iter().product::<usize>() as u64;
    if t == s {
        return Some((1, numel(s)));
    }
    if t.len() > s.len() {
        return None;
    }
    if numel(t) == 1 {
        return Some((1, 1));
    }
    let (r, q) = (s.len(), t.len());
    // The axis of `s` that carries the bias, and where it sits in `t` (right-aligned).
    let axis = match kind {
        AnchorKind::MatMul | AnchorKind::NhwcConv => r.checked_sub(1)?,
        AnchorKind::Conv => 1,
    };
    let pos = (axis + q).checked_sub(r)?;
    let only_axis = t.iter().enumerate().all(|(i, &d)| if i == pos { d == s[axis] } else { d == 1 });
    if !only_axis {
        return None;
    }
    Some((numel(&s[axis + 1..]), s[axis] as u64))
}

/// The anchor at the root of `n`'s chain, if `n` is an anchor or a supported epilogue; `uses` counts the
/// uses of a value (consuming nodes plus graph outputs).
pub fn chain_anchor(g: &Graph, n: NodeId, uses: &dyn Fn(ValueId) -> usize) -> Option<(NodeId, AnchorKind)> {
    match anchor(g, n) {
        Ok(kind) => Some((n, kind)),
        Err(_) => fuse(g, n, uses).ok().map(|(_, root)| root),
    }
}

/// How epilogue node `n` fuses into the chain it continues, or why it cannot.
pub fn fusion(g: &Graph, n: NodeId, uses: &dyn Fn(ValueId) -> usize) -> Result<Fusion, String> {
    fuse(g, n, uses).map(|(f, _)| f)
}

/// [`fusion`] and the chain's anchor.
fn fuse(g: &Graph, n: NodeId, uses: &dyn Fn(ValueId) -> usize) -> Result<(Fusion, (NodeId, AnchorKind)), String> {
    let node = g.node(n);
    let why_not = || {
        format!(
            "gemm runs {} only fused into a MatMul or Conv chain of the same partition whose output has no other use",
            node.op.name()
        )
    };
    if !is_epilogue_op(&node.op) {
        return Err(format!("gemm cannot run {}", node.op.name()));
    }
    uniform_float(g, n)?;
    // The chain a value continues: its producer's chain, if the value has this node as its only use.
    let chained = |v: ValueId| -> Option<(NodeId, AnchorKind)> {
        if uses(v) != 1 {
            return None;
        }
        chain_anchor(g, g.producer(v)?, uses)
    };
    if let Some(op) = unary_of(&node.op) {
        let input = node.inputs[0];
        return chained(input).map(|root| (Fusion::Unary { input, op }, root)).ok_or_else(why_not);
    }
    // Add: the first operand that continues a chain and leaves its shape unchanged, the other broadcast into it.
    let out_shape = &g.ty(node.outputs[0]).shape;
    for (i, &input) in node.inputs.iter().enumerate() {
        let other = node.inputs[1 - i];
        if &g.ty(input).shape != out_shape {
            continue;
        }
        let Some(root) = chained(input) else { continue };
        if let Some((inner, count)) = classify_add(root.1, out_shape, &g.ty(other).shape) {
            return Ok((Fusion::Add { input, other, inner, count }, root));
        }
    }
    Err(why_not())
}

/// Uses of `v` in `g`: consuming node inputs plus graph outputs.
pub fn uses_in(g: &Graph, v: ValueId) -> usize {
    g.nodes.iter().map(|n| n.inputs.iter().filter(|&&i| i == v).count()).sum::<usize>() + g.outputs.iter().filter(|&&o| o == v).count()
}

#[cfg(test)]
#[path = "epilogue_tests.rs"]
mod tests;
