//! Which intermediates of a kernel the `gemm` backend keeps channels-last (NHWC) rather than in the IR's
//! channels-first (NCHW) layout.
//!
//! A depthwise convolution is several times faster channels-last: a tap is one vector multiply-add over 16
//! channels, where channels-first it works along a plane's rows and re-lays them for every stride and border
//! (MobileNetV2's small planes spent 3x their multiply-adds there). The pointwise convolutions around it are
//! GEMMs either way, with the operands' strides swapped, so a run of pointwise and depthwise layers can stay
//! channels-last end to end and convert nowhere: a pointwise GEMM reads either layout and writes either.
//!
//! Only kernels with a depthwise layer are laid out so: the gemm crate runs ResNet's 1x1 GEMMs a little faster
//! channels-first (measured 1 thread, EPYC: 24x3136x144 94 us channels-first against 137 channels-last), and
//! its 3x3 convolutions (im2col) read channels-first.
//!
//! A materialized value (a chain's end) is channels-last when it is 4-D, stays inside the kernel, is computed
//! by a pointwise (1x1, stride 1, unpadded, one group) or depthwise (multiplier 1) convolution, and every
//! reader takes it so: a pointwise convolution, a depthwise one whose own result is channels-last, or a
//! same-shaped residual Add of a channels-last chain. A depthwise result is channels-last only with its
//! input. A chain's other Adds must be scalars or per-channel (those become per-element-`% C`). The set is
//! the largest one meeting these rules: start from every candidate and drop what breaks a rule until
//! nothing does.

use super::chain::Chain;
use super::support::Fusion;
use crate::ir::{Graph, NodeId, Op, ValueId};
use std::collections::{BTreeMap, BTreeSet};

/// What a convolution anchor is, for layout purposes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ConvShape {
    /// 1x1, stride 1, no padding, one group, 2-D: a GEMM per image in either layout.
    Pointwise,
    /// One input channel per group and one output channel per group, 2-D.
    Depthwise,
    /// Anything else (im2col convolutions, 1-D or 3-D ones, MatMul).
    Other,
}

pub(super) fn conv_shape(g: &Graph, n: NodeId) -> ConvShape {
    let node = g.node(n);
    let Op::Conv(a) = &node.op else { return ConvShape::Other };
    let (xs, ws) = (&g.ty(node.inputs[0]).shape, &g.ty(node.inputs[1]).shape);
    if xs.len() != 4 || ws.len() != 4 {
        return ConvShape::Other;
    }
    let c = xs[1];
    if a.group == 1 && ws[2] * ws[3] == 1 && a.strides.iter().all(|&s| s == 1) && a.pads.iter().all(|&p| p == 0) {
        ConvShape::Pointwise
    } else if c > 1 && a.group == c && ws[0] == c && ws[1] == 1 {
        ConvShape::Depthwise
    } else {
        ConvShape::Other
    }
}

/// The chain ends of `chains` (a kernel's chains) to keep channels-last.
pub(super) fn channels_last(g: &Graph, chains: &[Chain]) -> BTreeSet<ValueId> {
    if !chains.iter().any(|ch| conv_shape(g, ch.anchor) == ConvShape::Depthwise) {
        return BTreeSet::new();
    }
    let end = |ch: &Chain| g.node(ch.last()).outputs[0];
    let producer: BTreeMap<ValueId, usize> = chains.iter().enumerate().map(|(i, ch)| (end(ch), i)).collect();
    let mut set: BTreeSet<ValueId> = producer
        .iter()
        .filter(|&(&v, &p)| g.ty(v).shape.len() == 4 && !g.outputs.contains(&v) && conv_shape(g, chains[p].anchor) != ConvShape::Other)
        .map(|(&v, _)| v)
        .collect();
    loop {
        let keep: BTreeSet<ValueId> = set.iter().copied().filter(|&v| keeps(g, chains, &producer, &set, v)).collect();
        if keep.len() == set.len() {
            return keep;
        }
        set = keep;
    }
}

/// Whether `v` can stay channels-last while the values of `set` are.
fn keeps(g: &Graph, chains: &[Chain], producer: &BTreeMap<ValueId, usize>, set: &BTreeSet<ValueId>, v: ValueId) -> bool {
    let shape = &g.ty(v).shape;
    let (channels, numel) = (shape[1] as u64, g.ty(v).numel() as u64);
    let spatial = numel / (shape[0] as u64 * channels).max(1);
    let end = |ch: &Chain| g.node(ch.last()).outputs[0];
    let own = &chains[producer[&v]];
    if conv_shape(g, own.anchor) == ConvShape::Depthwise && !set.contains(&g.node(own.anchor).inputs[0]) {
        return false;
    }
    let adds_fit = own.eps.iter().all(|(_, f)| match *f {
        Fusion::Add { other, inner, count, .. } => {
            count == 1 || (inner == spatial && count == channels) || (inner == 1 && count == numel && set.contains(&other))
        }
        Fusion::Unary { .. } => true,
    });
    if !adds_fit {
        return false;
    }
    chains.iter().all(|q| {
        let anchor_reads = g.node(q.anchor).inputs.iter().enumerate().filter(|&(_, &i)| i == v).all(|(k, _)| {
            k == 0
                && match conv_shape(g, q.anchor) {
                    ConvShape::Pointwise => true,
                    ConvShape::Depthwise => set.contains(&end(q)),
                    ConvShape::Other => false,
                }
        });
        let add_reads = q.eps.iter().all(|(_, f)| match *f {
            Fusion::Add { other, inner, count, .. } if other == v => inner == 1 && count == numel && set.contains(&end(q)),
            _ => true,
        });
        anchor_reads && add_reads
    })
}
