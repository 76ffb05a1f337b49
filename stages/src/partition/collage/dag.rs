//! Node-level adjacency of a graph and the structural checks candidates need (convexity, exits, depth,
//! external inputs). Node sets are sorted `u32` node indices, which are also a topological order.

use crate::ir::{Graph, ValueDef, ValueId};

pub(crate) struct Dag {
    /// Distinct producer nodes of each node, sorted.
    pub preds: Vec<Vec<u32>>,
    /// Distinct consumer nodes of each node, sorted.
    pub succs: Vec<Vec<u32>>,
    /// For each value: the nodes consuming it (distinct, sorted) and whether it is a graph output.
    value_users: Vec<Vec<u32>>,
    is_output: Vec<bool>,
}

pub(crate) fn contains(set: &[u32], n: u32) -> bool {
    set.binary_search(&n).is_ok()
}

impl Dag {
    pub fn new(g: &Graph) -> Dag {
        let n = g.nodes.len();
        let mut preds = vec![Vec::new(); n];
        let mut succs = vec![Vec::new(); n];
        let mut value_users = vec![Vec::new(); g.values.len()];
        for (i, node) in g.nodes.iter().enumerate() {
            for &v in &node.inputs {
                value_users[v.index()].push(i as u32);
                if let ValueDef::Node { node: p, .. } = g.value(v).def {
                    preds[i].push(p.0);
                    succs[p.index()].push(i as u32);
                }
            }
        }
        for l in preds.iter_mut().chain(succs.iter_mut()).chain(value_users.iter_mut()) {
            l.sort_unstable();
            l.dedup();
        }
        let mut is_output = vec![false; g.values.len()];
        for &o in &g.outputs {
            is_output[o.index()] = true;
        }
        Dag { preds, succs, value_users, is_output }
    }

    pub fn len(&self) -> usize {
        self.preds.len()
    }

    /// Convex: no path leaves the set and comes back. Walks forward from the set's outside consumers, never
    /// past the set's last node (nothing later can lead back into it).
    pub fn is_convex(&self, set: &[u32]) -> bool {
        let Some(&last) = set.last() else { return true };
        let mut seen = std::collections::BTreeSet::new();
        let mut stack: Vec<u32> = Vec::new();
        for &n in set {
            for &s in &self.succs[n as usize] {
                if s < last && !contains(set, s) {
                    stack.push(s);
                }
            }
        }
        while let Some(x) = stack.pop() {
            if !seen.insert(x) {
                continue;
            }
            for &s in &self.succs[x as usize] {
                if contains(set, s) {
                    return false;
                }
                if s < last {
                    stack.push(s);
                }
            }
        }
        true
    }

    /// Output values of the set that are used outside it (by an outside node, or as a graph output).
    pub fn exits(&self, g: &Graph, set: &[u32]) -> usize {
        set.iter()
            .flat_map(|&n| g.nodes[n as usize].outputs.iter())
            .filter(|&&v| self.is_output[v.index()] || self.value_users[v.index()].iter().any(|&u| !contains(set, u)))
            .count()
    }

    /// The longest path inside the set, counted in nodes.
    pub fn depth(&self, set: &[u32]) -> usize {
        let mut d = vec![0usize; set.len()];
        for (i, &n) in set.iter().enumerate() {
            d[i] = 1 + self.preds[n as usize].iter().filter_map(|p| set.binary_search(p).ok()).map(|j| d[j]).max().unwrap_or(0);
        }
        d.into_iter().max().unwrap_or(0)
    }

    /// Distinct producer nodes outside the set that the set consumes from, sorted.
    pub fn external_producers(&self, set: &[u32]) -> Vec<u32> {
        let mut v: Vec<u32> = set.iter().flat_map(|&n| self.preds[n as usize].iter().copied()).filter(|&p| !contains(set, p)).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// Distinct node-produced values the set consumes from outside it, with their producers, sorted by value.
/// Graph inputs and constants are not listed: they live in memory whoever reads them.
pub(crate) fn external_inputs(g: &Graph, set: &[u32]) -> Vec<(ValueId, u32)> {
    let mut v: Vec<(ValueId, u32)> = set
        .iter()
        .flat_map(|&n| g.nodes[n as usize].inputs.iter())
        .filter_map(|&v| match g.value(v).def {
            ValueDef::Node { node, .. } if !contains(set, node.0) => Some((v, node.0)),
            _ => None,
        })
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}
