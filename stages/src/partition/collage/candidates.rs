//! Candidate generation: every target's rule set run over the graph.

use super::dag::Dag;
use super::eval::{self, Cx};
use crate::ir::{Graph, NodeId};
use crate::partition::{BackendLookup, PartitionError};
use crate::target::TargetSet;

/// Bounds on candidates, so the candidate count (and with it measurement and search work) stays bounded.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Most nodes in one candidate. Default 8: enough for an anchor with a bias/activation/residual chain or an
    /// attention-score chain, small enough that growth stays cheap.
    pub max_nodes: usize,
    /// Longest producer-consumer path inside a candidate, in nodes. Default 6.
    pub max_depth: usize,
    /// Most output values used outside a candidate (by later nodes or as graph outputs). Default 2: a fused
    /// kernel that writes more results is rarely a win, and Collage bounds exits the same way.
    pub max_exits: usize,
    /// Most candidates grown from one base candidate by one `combine` rule. Default 24; candidates grown
    /// earlier (smaller, breadth first) win, so the bound trims the largest ones.
    pub max_per_seed: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_nodes: 8, max_depth: 6, max_exits: 2, max_per_seed: 24 }
    }
}

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
