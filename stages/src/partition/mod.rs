//! Partitioning (stage 2): split a graph into partitions, each carrying the target that runs it.
//!
//! [`collage`] generates candidate partitions per backend from composable rules, and finds the cheapest cover
//! by a shortest-path search over covered-prefix states (costs measured by the tune stage, [`crate::stages::tune`], or the
//! backends' estimates). This module holds the result types and [`check`], the invariant every partitioning
//! must satisfy.
//!
//! A partition's `target` is the single source of truth for where it runs: later stages read it and never
//! re-derive it.

pub mod collage;
pub mod plan;

use crate::backend::Backend;
use crate::ir::{Graph, NodeId, ValueDef};
use crate::target::Target;
use serde::{Deserialize, Serialize};

/// Bump when candidate generation, the search or merging changes.
pub const PARTITIONER_VERSION: u32 = 7;

pub use crate::context::CostSource;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Partition {
    pub target: Target,
    /// Nodes in graph (topological) order.
    pub nodes: Vec<NodeId>,
    /// Estimated cost of the partition, in microseconds.
    pub cost_us: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Partitioning {
    /// Partitions in a topological order of the partition graph.
    pub partitions: Vec<Partition>,
    pub cost_source: CostSource,
}

/// No target can run a node, or a target's backend is missing.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct PartitionError(pub String);

/// Looks up the backend a target selects.
pub type BackendLookup<'a> = dyn Fn(&Target) -> Option<&'a dyn Backend> + 'a;

/// Checks a partitioning: every node in exactly one partition, every partition's node list in graph order, and
/// the partition graph acyclic in the given order (which also proves each partition convex: a path that left
/// a partition and came back would need an edge to an earlier partition).
pub fn check(g: &Graph, p: &Partitioning) -> Result<(), String> {
    let mut owner = vec![usize::MAX; g.nodes.len()];
    for (pi, part) in p.partitions.iter().enumerate() {
        if part.nodes.is_empty() {
            return Err(format!("partition {pi} is empty"));
        }
        if part.nodes.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!("partition {pi}: nodes not in graph order"));
        }
        for &n in &part.nodes {
            if n.index() >= g.nodes.len() {
                return Err(format!("partition {pi}: node {} does not exist", n.0));
            }
            if owner[n.index()] != usize::MAX {
                return Err(format!("node '{}' is in partitions {} and {pi}", g.node(n).name, owner[n.index()]));
            }
            owner[n.index()] = pi;
        }
    }
    if let Some(i) = owner.iter().position(|&o| o == usize::MAX) {
        return Err(format!("node '{}' is in no partition", g.nodes[i].name));
    }
    for (i, node) in g.nodes.iter().enumerate() {
        for &v in &node.inputs {
            if let ValueDef::Node { node: p, .. } = g.value(v).def {
                if owner[p.index()] > owner[i] {
                    return Err(format!(
                        "node '{}' in partition {} consumes '{}' from later partition {}: not convex or not ordered",
                        node.name,
                        owner[i],
                        g.value(v).name,
                        owner[p.index()]
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
