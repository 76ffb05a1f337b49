//! A chain as the `gemm` lowering groups a kernel graph: an anchor and the epilogues fused into it (see
//! [`super::support`]), which the lowering walks and the layout pass (`layout.rs`) reads.

use super::support::{AnchorKind, Fusion};
use crate::ir::NodeId;

/// An anchor and the epilogues fused into it, in order.
pub(super) struct Chain {
    pub(super) anchor: NodeId,
    pub(super) kind: AnchorKind,
    pub(super) eps: Vec<(NodeId, Fusion)>,
}

impl Chain {
    pub(super) fn last(&self) -> NodeId {
        self.eps.last().map_or(self.anchor, |e| e.0)
    }
}
