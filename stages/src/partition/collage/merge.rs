//! After the search: adjacent winners on one target merge into one partition wherever the partition graph
//! stays acyclic, and the result becomes a [`Partitioning`].
//!
//! Winners merge as whole units (never node by node, as [`crate::partition::merge_convex`] does), so a gemm
//! epilogue always stays with its anchor. A winner joins a producer's group; a group of data movement alone
//! also joins the one group that reads it, on its target: kernels that read operands through views (the `cuda`
//! backend's attention reading its heads out of a projection) can then skip the movement, which they cannot
//! across a partition boundary.

use super::dag::Dag;
use crate::rules::Kind;
use crate::ir::{Graph, NodeId};
use crate::partition::{CostSource, Partition, Partitioning};
use crate::target::TargetSet;
use std::collections::BTreeSet;

/// One partition of the result.
#[derive(Clone, Debug, PartialEq)]
pub struct Chosen {
    /// Index in `targets.targets`.
    pub target: usize,
    /// Sorted.
    pub nodes: Vec<NodeId>,
    /// The candidate's cost; for a merge of several winners, the sum of their costs (the merged partition was
    /// never costed as a whole). Crossing charges are not included.
    pub cost_us: f64,
    /// The cheapest candidate of another target holding this partition's first node: (target index, cost).
    pub alternative: Option<(usize, f64)>,
}

/// Merges winners given in a topological order of the partition graph (target, sorted nodes, cost): a winner
/// joins the group of one of its producers on the same target unless another producer group is reachable
/// from that group (a path would leave the merged group and come back). Returns the groups (target, sorted
/// nodes, summed cost) in a topological order.
pub(crate) fn merge_winners(g: &Graph, dag: &Dag, units: &[(usize, Vec<u32>, f64)]) -> Vec<(usize, Vec<u32>, f64)> {
    let mut group_of = vec![usize::MAX; dag.len()];
    let mut groups: Vec<(usize, Vec<u32>, f64)> = Vec::new();
    let mut preds: Vec<BTreeSet<usize>> = Vec::new();
    for (target, nodes, cost) in units {
        let producer_groups: BTreeSet<usize> = dag.external_producers(nodes).iter().map(|&p| group_of[p as usize]).collect();
        debug_assert!(!producer_groups.contains(&usize::MAX), "winners must come in a topological order");
        let joinable =
            producer_groups.iter().copied().find(|&p| groups[p].0 == *target && producer_groups.iter().all(|&q| q == p || !reaches(&preds, p, q)));
        let gi = match joinable {
            Some(p) => p,
            None => {
                groups.push((*target, Vec::new(), 0.0));
                preds.push(BTreeSet::new());
                groups.len() - 1
            }
        };
        groups[gi].1.extend_from_slice(nodes);
        groups[gi].2 += cost;
        for &n in nodes {
            group_of[n as usize] = gi;
        }
        for &q in &producer_groups {
            if q != gi {
                preds[gi].insert(q);
            }
        }
    }
    // Movement alone joins its only reader on the same target. Its readers being one group, nothing else
    // depends on it: folding it in cannot close a cycle (a path from the reader back to the movement's producers
    // would already be one through the movement).
    for gi in 0..groups.len() {
        let movement = !groups[gi].1.is_empty() && groups[gi].1.iter().all(|&n| Kind::of(&g.nodes[n as usize].op) == Kind::Injective);
        if !movement {
            continue;
        }
        let readers: BTreeSet<usize> = groups[gi].1.iter().flat_map(|&n| dag.succs[n as usize].iter()).map(|&s| group_of[s as usize]).filter(|&r| r != gi).collect();
        let [reader] = readers.into_iter().collect::<Vec<_>>()[..] else { continue };
        if groups[reader].0 != groups[gi].0 {
            continue;
        }
        let (nodes, cost) = (std::mem::take(&mut groups[gi].1), groups[gi].2);
        for &n in &nodes {
            group_of[n as usize] = reader;
        }
        groups[reader].1.extend(nodes);
        groups[reader].2 += cost;
        let moved = std::mem::take(&mut preds[gi]);
        preds[reader].remove(&gi);
        preds[reader].extend(moved);
    }
    for g in &mut groups {
        g.1.sort_unstable();
    }
    topo_order(&preds).into_iter().map(|i| std::mem::take(&mut groups[i])).filter(|g| !g.1.is_empty()).collect()
}

/// Whether group `from` is an ancestor of group `to`.
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

/// Kahn's algorithm, smallest ready index first (groups are numbered in creation order).
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
    debug_assert_eq!(order.len(), n, "merging keeps the group graph acyclic");
    order
}

/// The search's partitions as a [`Partitioning`] (partitions keep the order of `chosen`).
pub fn to_partitioning(targets: &TargetSet, chosen: &[Chosen], source: CostSource) -> Partitioning {
    Partitioning {
        partitions: chosen
            .iter()
            .map(|c| Partition { target: targets.targets[c.target].clone(), nodes: c.nodes.clone(), cost_us: c.cost_us })
            .collect(),
        cost_source: source,
    }
}
