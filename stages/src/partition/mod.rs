//! Partitioning (stage 2): split a graph into partitions, each carrying the target that runs it.
//!
//! This is the first, rule-first partitioner: every node goes to the cheapest target whose backend supports it
//! (analytical estimates plus a cost for crossing between backends), then nodes merge into the largest convex
//! partitions per target. The measured Collage search replaces the assignment step later; the partition
//! format, the convexity rules and [`check`] stay.
//!
//! A partition's `target` is the single source of truth for where it runs: later stages read it and never
//! re-derive it.

pub mod collage;

use crate::backend::Backend;
use crate::ir::{Graph, NodeId, ValueDef};
use crate::target::{Target, TargetSet};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Bump when the assignment or merging rules change.
pub const PARTITIONER_VERSION: u32 = 1;

/// Nominal bandwidth for a value that crosses between two partitions on one device (it must be written and
/// read back instead of staying in registers or cache), in bytes per microsecond.
const CROSSING_BYTES_PER_US: f64 = 10_000.0;
/// Extra cost of crossing between devices: latency, and a nominal host-device bandwidth (bytes per us).
const DEVICE_CROSSING_LATENCY_US: f64 = 10.0;
const DEVICE_CROSSING_BYTES_PER_US: f64 = 20_000.0;

/// Where partition costs came from; every report says which.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CostSource {
    /// The backends' analytical estimates (no measurement).
    Analytical,
    /// Every cost was measured (the tune stage).
    Measured,
    /// Some costs were measured, others estimated where nothing could be measured.
    Mixed,
}

impl CostSource {
    pub fn name(self) -> &'static str {
        match self {
            CostSource::Analytical => "analytical",
            CostSource::Measured => "measured",
            CostSource::Mixed => "mixed",
        }
    }
}

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

fn value_bytes(g: &Graph, v: crate::ir::ValueId) -> f64 {
    g.ty(v).size_bytes() as f64
}

/// Assigns every node a target and merges nodes into convex partitions.
pub fn partition_by_rules(g: &Graph, targets: &TargetSet, lookup: &BackendLookup) -> Result<Partitioning, PartitionError> {
    let mut backends: Vec<(&Target, &dyn Backend)> = Vec::new();
    for t in &targets.targets {
        let b = lookup(t).ok_or_else(|| PartitionError(format!("target '{t}': no backend '{}' in this build", t.backend_name())))?;
        backends.push((t, b));
    }

    // 1. Assignment, in topological order.
    let mut assigned: Vec<usize> = Vec::with_capacity(g.nodes.len());
    for (i, node) in g.nodes.iter().enumerate() {
        let n = NodeId(i as u32);
        let producer_targets: BTreeSet<usize> = node.inputs.iter().filter_map(|&v| g.producer(v)).map(|p| assigned[p.index()]).collect();
        let mut best: Option<(f64, usize)> = None;
        for (ti, (t, b)) in backends.iter().enumerate() {
            if !b.supports(g, n, t) {
                continue;
            }
            // Library backends do not run lone elementwise ops: those only join a producer's partition (epilogues).
            if node.op.is_elementwise() && !t.is_least_specialized() && !producer_targets.contains(&ti) {
                continue;
            }
            let mut cost = b.estimate_us(g, &[n], t);
            for &v in &node.inputs {
                if let Some(p) = g.producer(v) {
                    let pt = assigned[p.index()];
                    if pt != ti {
                        cost += value_bytes(g, v) / CROSSING_BYTES_PER_US;
                        if backends[pt].0.device() != t.device() {
                            cost += DEVICE_CROSSING_LATENCY_US + value_bytes(g, v) / DEVICE_CROSSING_BYTES_PER_US;
                        }
                    }
                }
            }
            if best.is_none_or(|(c, _)| cost < c) {
                best = Some((cost, ti));
            }
        }
        let Some((_, ti)) = best else {
            let tried: Vec<String> = targets.targets.iter().map(|t| t.to_string()).collect();
            return Err(PartitionError(format!(
                "node '{}' ({}, {} -> {}): no target can run it (tried: {})",
                node.name,
                node.op.name(),
                node.inputs.iter().map(|&v| g.ty(v).to_string()).collect::<Vec<_>>().join(", "),
                node.outputs.iter().map(|&v| g.ty(v).to_string()).collect::<Vec<_>>().join(", "),
                tried.join("; ")
            )));
        };
        assigned.push(ti);
    }

    let (parts, order) = merge_convex(g, &assigned);
    let partitions = order
        .into_iter()
        .map(|p| {
            let (ti, nodes) = &parts[p];
            let (t, b) = backends[*ti];
            Partition { target: t.clone(), cost_us: b.estimate_us(g, nodes, t), nodes: nodes.clone() }
        })
        .collect();
    Ok(Partitioning { partitions, cost_source: CostSource::Analytical })
}

/// Merges nodes with their assigned target (an index, one per node) into convex partitions: a node joins a
/// producer's partition of the same target unless that would let a path leave the partition and come back
/// (checked as reachability in the partition graph). Returns the partitions (target index, nodes in graph
/// order) and a topological order of them.
pub fn merge_convex(g: &Graph, assigned: &[usize]) -> (Vec<(usize, Vec<NodeId>)>, Vec<usize>) {
    let mut part_of: Vec<usize> = Vec::with_capacity(g.nodes.len());
    let mut parts: Vec<(usize, Vec<NodeId>)> = Vec::new();
    let mut preds: Vec<BTreeSet<usize>> = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let ti = assigned[i];
        let producer_parts: BTreeSet<usize> = node.inputs.iter().filter_map(|&v| g.producer(v)).map(|p| part_of[p.index()]).collect();
        let joinable = producer_parts.iter().copied().find(|&p| {
            parts[p].0 == ti && producer_parts.iter().all(|&q| q == p || !reaches(&preds, p, q))
        });
        let p = match joinable {
            Some(p) => p,
            None => {
                parts.push((ti, Vec::new()));
                preds.push(BTreeSet::new());
                parts.len() - 1
            }
        };
        parts[p].1.push(NodeId(i as u32));
        for &q in &producer_parts {
            if q != p {
                preds[p].insert(q);
            }
        }
        part_of.push(p);
    }
    let order = topo_order(&preds);
    (parts, order)
}

/// Whether partition `to` is reachable from partition `from` along producer -> consumer edges, i.e. `from` is
/// an ancestor of `to`. `preds[x]` lists the partitions `x` consumes from.
fn reaches(preds: &[BTreeSet<usize>], from: usize, to: usize) -> bool {
    let mut stack = vec![to];
    let mut seen = BTreeSet::new();
    while let Some(x) = stack.pop() {
        if x == from {
            return true;
        }
        if seen.insert(x) {
            stack.extend(preds[x].iter().copied());
        }
    }
    false
}

fn topo_order(preds: &[BTreeSet<usize>]) -> Vec<usize> {
    let n = preds.len();
    let mut indeg: Vec<usize> = preds.iter().map(|p| p.len()).collect();
    let mut succs = vec![Vec::new(); n];
    for (x, ps) in preds.iter().enumerate() {
        for &p in ps {
            succs[p].push(x);
        }
    }
    let mut ready: BTreeSet<usize> = (0..n).filter(|&x| indeg[x] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(x) = ready.pop_first() {
        order.push(x);
        for &s in &succs[x] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.insert(s);
            }
        }
    }
    assert_eq!(order.len(), n, "partition graph has a cycle");
    order
}

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
