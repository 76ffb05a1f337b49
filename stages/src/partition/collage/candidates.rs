//! Candidate generation: every target's rule set run over the graph.

use super::dag::Dag;
use super::eval::{self, Cx, Limits};
use crate::ir::{Graph, NodeId};
use crate::partition::{BackendLookup, PartitionError};
use crate::target::TargetSet;

/// A subgraph one target could run as one partition.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Candidate {
    /// Index in `targets.targets`.
    pub target: usize,
    /// Sorted (graph order, so also a topological order).
    pub nodes: Vec<NodeId>,
}

/// All candidates of all targets, sorted by (target, nodes) and deduplicated. Fails if a target has no
/// backend in this build, if the limits are unusable, or if no target can run some node (the error names it).
pub fn candidates(g: &Graph, targets: &TargetSet, lookup: &BackendLookup, limits: &Limits) -> Result<Vec<Candidate>, PartitionError> {
    if limits.max_nodes == 0 || limits.max_depth == 0 || limits.max_exits == 0 {
        return Err(PartitionError(format!("candidate limits must be at least 1: {limits:?}")));
    }
    let dag = Dag::new(g);
    let mut out: Vec<Candidate> = Vec::new();
    let mut covered = vec![false; g.nodes.len()];
    for (ti, t) in targets.targets.iter().enumerate() {
        let b = lookup(t).ok_or_else(|| PartitionError(format!("target '{t}': no backend '{}' in this build", t.backend_name())))?;
        let supported: Vec<bool> = (0..g.nodes.len()).map(|i| b.supports(g, NodeId(i as u32), t)).collect();
        let rule = b.rules();
        let cx = Cx::new(g, &dag, &supported, limits, &rule);
        for p in eval::eval(&rule, &cx) {
            for &n in &p.nodes {
                covered[n as usize] = true;
            }
            out.push(Candidate { target: ti, nodes: p.nodes.into_iter().map(NodeId).collect() });
        }
    }
    if let Some(i) = covered.iter().position(|&c| !c) {
        let node = &g.nodes[i];
        let tried: Vec<String> = targets.targets.iter().map(|t| t.to_string()).collect();
        return Err(PartitionError(format!(
            "node '{}' ({}, {} -> {}): no target can run it (tried: {})",
            node.name,
            node.op.name(),
            node.inputs.iter().map(|&v| g.ty(v).to_string()).collect::<Vec<_>>().join(", "),
            node.outputs.iter().map(|&v| g.ty(v).to_string()).collect::<Vec<_>>().join(", "),
            tried.join("; ")
        )));
    }
    out.sort();
    out.dedup();
    Ok(out)
}
