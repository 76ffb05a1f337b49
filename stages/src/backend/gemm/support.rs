//! The `gemm` backend's pattern rule: the shared epilogue chain ([`crate::rules::epilogue`]: anchors, and
//! how epilogues attach to them), restricted to f32 chains and channels-first convolutions.
//!
//! The same rule decides `supports` on the model graph and fusion in `lower` on the kernel graph (where a
//! partition output counts as a use), so a partition the partitioner builds from supported nodes, holding each
//! epilogue's anchor, always lowers.

pub use crate::rules::epilogue::{anchor, chain_anchor, fusion, uses_in, AnchorKind, Fusion, Unary};
use crate::ir::{DType, Graph, NodeId};

/// The pattern rule on a model graph (gemm's: f32 chains only, convolutions channels-first).
pub fn supports(g: &Graph, n: NodeId) -> bool {
    g.ty(g.node(n).outputs[0]).dtype == DType::F32 && chain_anchor(g, n, &|v| uses_in(g, v)).is_some_and(|(_, kind)| kind != AnchorKind::NhwcConv)
}

#[cfg(test)]
#[path = "support_tests.rs"]
mod tests;
