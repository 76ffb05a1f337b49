//! The `cudnn` backend's pattern rule: which convolutions cuDNN runs, and which epilogues fuse into them.
//!
//! Anchors: 2-D `Conv` (NCHW) or `NhwcConv` (channels-last, `-layout=nhwc`: cuDNN's tensor-core kernels' own
//! layout, read without transforms) of one float type (f32, f16 or bf16) throughout, with a bias input (batch norm folded
//! into a convolution gives one), symmetric pads, and not depthwise (one input channel per group: our own
//! `cuda` kernel runs those directly, and cuDNN's NCHW depthwise paths are slow). Weight and bias, however
//! small, are device operands: the backend's kernel graphs lift every constant to an argument
//! ([`crate::backend::Backend::inline_const_max`] is 0).
//!
//! Epilogues follow the shared chain rule ([`crate::rules::epilogue`]), restricted to
//! what `cudnnConvolutionBiasActivationForward` computes, `relu?(conv + z + bias)`: one `Add` of a same-shaped
//! residual, and `Relu` last. (The bias is the convolution's own input; a second, per-channel `Add` is not taken.)

use crate::rules::epilogue::{self as chain, Fusion, Unary};
use crate::backend::{refuse, Refusal};
use crate::ir::{channels_first_perm, permuted, ConvAttrs, Graph, NodeId, Op, ValueId};

/// A convolution's attributes and whether it is channels-last.
pub fn conv_of(op: &Op) -> Option<(&ConvAttrs, bool)> {
    match op {
        Op::Conv(a) => Some((a, false)),
        Op::NhwcConv(a) => Some((a, true)),
        _ => None,
    }
}

/// A convolution operand's shape in cuDNN's logical order (`[n, c, h, w]`, `[k, c, r, s]`), whatever its layout
/// in memory.
pub fn logical_dims(shape: &[usize], channels_last: bool) -> Vec<usize> {
    if channels_last && shape.len() >= 3 {
        permuted(shape, &channels_first_perm(shape.len()))
    } else {
        shape.to_vec()
    }
}

/// Whether `n` is a convolution cuDNN runs fused, or why not.
pub fn anchor(g: &Graph, n: NodeId) -> Result<(), Refusal> {
    let node = g.node(n);
    let Some((a, last)) = conv_of(&node.op) else {
        return Err(refuse!("cudnn runs Conv and NhwcConv, not {}", node.op.name()));
    };
    chain::anchor(g, n)?;
    let x = &logical_dims(&g.ty(node.inputs[0]).shape, last);
    let w = &logical_dims(&g.ty(node.inputs[1]).shape, last);
    if x.len() != 4 {
        return Err(refuse!("cudnn runs 2-D convolutions, got a {}-D input", x.len()));
    }
    if node.inputs.len() < 3 {
        return Err("cudnn runs convolutions with a bias".into());
    }
    if a.pads.len() != 4 || a.pads[0] != a.pads[2] || a.pads[1] != a.pads[3] {
        return Err(refuse!("cudnn takes symmetric pads, got {:?}", a.pads));
    }
    if a.group > 1 && w[1] == 1 {
        return Err("depthwise convolutions run on our own kernel".into());
    }
    if x.iter().chain(w).any(|&d| d > i32::MAX as usize) {
        return Err("dimensions too large for cuDNN".into());
    }
    Ok(())
}

/// The chain ending at epilogue node `n`: its convolution, the residual it adds (if any) and whether ReLU
/// ends it, if cuDNN's fused call computes it.
pub fn chain_of(g: &Graph, n: NodeId, uses: &dyn Fn(ValueId) -> usize) -> Result<(NodeId, Option<ValueId>, bool), Refusal> {
    let (mut residual, mut relu, mut steps) = (None, false, 0);
    let mut at = n;
    loop {
        if conv_of(&g.node(at).op).is_some() {
            anchor(g, at)?;
            return Ok((at, residual, relu));
        }
        let f = chain::fusion(g, at, uses)?;
        match f {
            Fusion::Unary { op: Unary::Relu, .. } if steps == 0 => relu = true,
            Fusion::Unary { op: Unary::Relu, .. } => return Err("cuDNN applies ReLU last".into()),
            Fusion::Unary { op, .. } => return Err(refuse!("cuDNN's fused convolution has no {op:?}")),
            Fusion::Add { input, other, .. } => {
                if residual.is_some() || g.ty(other).shape != g.ty(input).shape {
                    return Err("cuDNN's fused convolution adds one same-shaped residual".into());
                }
                residual = Some(other);
            }
        }
        steps += 1;
        at = g.producer(f.input()).ok_or("a fused value has a producer")?;
    }
}

/// The pattern rule on a model graph.
pub fn supports(g: &Graph, n: NodeId) -> bool {
    match g.node(n).op {
        Op::Conv(_) | Op::NhwcConv(_) => anchor(g, n).is_ok(),
        _ => {
            let uses = g.use_counts();
            chain_of(g, n, &|v| uses[v.index()]).is_ok()
        }
    }
}
