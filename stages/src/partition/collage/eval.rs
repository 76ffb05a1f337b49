//! Evaluating partition rules ([`crate::rules`]) over a graph: the proto-candidates of a rule set.
//!
//! Growth only keeps convex intermediates (a convex set minus a sink inside it stays convex, so convex sets
//! reachable through connected convex steps are all found) and stops after `max_per_seed` grown candidates
//! per base candidate, so counts stay bounded.

use super::dag::{contains, Dag};
use crate::ir::{Graph, NodeId};
use crate::rules::epilogue as support;
use crate::rules::{Combiner, Kind, Rule};
use std::collections::BTreeSet;

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

/// A candidate before it has a target: sorted node indices and its kind.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Proto {
    pub nodes: Vec<u32>,
    pub kind: Kind,
}

/// What rules evaluate against.
pub(crate) struct Cx<'a> {
    pub g: &'a Graph,
    pub dag: &'a Dag,
    /// Whether the backend supports each node on the model graph.
    pub supported: &'a [bool],
    pub limits: &'a Limits,
    /// For a rule set that uses [`Combiner::GemmEpilogue`]: each supported epilogue's chain predecessor (the
    /// producer of its fused input).
    pub chain_prev: Option<Vec<Option<u32>>>,
}

impl<'a> Cx<'a> {
    /// The context `rule` is evaluated in.
    pub fn new(g: &'a Graph, dag: &'a Dag, supported: &'a [bool], limits: &'a Limits, rule: &Rule) -> Cx<'a> {
        let chain_prev = rule.uses_gemm_epilogue().then(|| gemm_chain_prev(g, supported));
        Cx { g, dag, supported, limits, chain_prev }
    }

    fn kind(&self, n: u32) -> Kind {
        Kind::of(&self.g.nodes[n as usize].op)
    }
}

/// For each gemm-supported epilogue node, the node producing the value it fuses on.
fn gemm_chain_prev(g: &Graph, supported: &[bool]) -> Vec<Option<u32>> {
    let uses = g.use_counts();
    let count = |v: crate::ir::ValueId| uses[v.index()];
    (0..g.nodes.len())
        .map(|i| {
            let n = NodeId(i as u32);
            if !supported[i] || support::anchor(g, n).is_ok() {
                return None;
            }
            support::fusion(g, n, &count).ok().and_then(|f| g.producer(f.input())).map(|p| p.0)
        })
        .collect()
}

/// The rule's candidates, deduplicated and sorted.
pub(crate) fn eval(rule: &Rule, cx: &Cx) -> Vec<Proto> {
    let mut out = match rule {
        Rule::Primitive { kinds } => (0..cx.dag.len() as u32)
            .filter(|&n| cx.supported[n as usize] && kinds.has(cx.kind(n)))
            .map(|n| Proto { nodes: vec![n], kind: cx.kind(n) })
            .collect(),
        Rule::Union(rules) => rules.iter().flat_map(|r| eval(r, cx)).collect(),
        Rule::Combine { base, combiners } => combine(cx, &eval(base, cx), combiners),
        Rule::OnlyValid(rule) => eval(rule, cx).into_iter().filter(|p| valid(cx, &p.nodes)).collect::<Vec<_>>(),
    };
    out.sort();
    out.dedup_by(|a, b| a.nodes == b.nodes);
    out
}

/// Which side of the candidate an adjacent node sits on.
#[derive(Clone, Copy, PartialEq)]
enum Side {
    /// The node produces a value the candidate consumes.
    Up,
    /// The node consumes a value the candidate produces.
    Down,
}

/// Whether `combiner` lets candidate `cand` absorb node `n` on `side`.
fn fires(combiner: &Combiner, cx: &Cx, cand: &Proto, n: u32, side: Side) -> bool {
    match combiner {
        Combiner::ByKind { upstream, downstream } => {
            let k = cx.kind(n);
            match side {
                Side::Up => upstream.has(k) && downstream.has(cand.kind),
                Side::Down => upstream.has(cand.kind) && downstream.has(k),
            }
        }
        Combiner::GemmEpilogue => {
            side == Side::Down && cx.chain_prev.as_ref().and_then(|c| c[n as usize]).is_some_and(|p| contains(&cand.nodes, p))
        }
    }
}

/// Grows each base candidate by adjacent supported nodes where a combiner fires, breadth first, keeping
/// convex candidates within the size and depth bounds; at most `max_per_seed` new candidates per base one.
fn combine(cx: &Cx, base: &[Proto], combiners: &[Combiner]) -> Vec<Proto> {
    let lim = cx.limits;
    let mut seen: BTreeSet<Vec<u32>> = base.iter().map(|p| p.nodes.clone()).collect();
    let mut out = Vec::new();
    for seed in base {
        let mut grown = 0usize;
        let mut frontier = vec![seed.clone()];
        'rounds: while !frontier.is_empty() {
            let mut next = Vec::new();
            for cand in &frontier {
                if cand.nodes.len() >= lim.max_nodes {
                    continue;
                }
                let mut adjacent: Vec<(u32, Side)> = Vec::new();
                for &m in &cand.nodes {
                    adjacent.extend(cx.dag.preds[m as usize].iter().map(|&p| (p, Side::Up)));
                    adjacent.extend(cx.dag.succs[m as usize].iter().map(|&s| (s, Side::Down)));
                }
                adjacent.sort_unstable_by_key(|&(n, s)| (n, s == Side::Down));
                adjacent.dedup_by_key(|&mut (n, s)| (n, s == Side::Down));
                for &(n, side) in &adjacent {
                    if contains(&cand.nodes, n) || !cx.supported[n as usize] || !combiners.iter().any(|c| fires(c, cx, cand, n, side)) {
                        continue;
                    }
                    let mut nodes = cand.nodes.clone();
                    let at = nodes.binary_search(&n).unwrap_err();
                    nodes.insert(at, n);
                    if seen.contains(&nodes) || cx.dag.depth(&nodes) > lim.max_depth || !cx.dag.is_convex(&nodes) {
                        continue;
                    }
                    seen.insert(nodes.clone());
                    let p = Proto { nodes, kind: cand.kind.max(cx.kind(n)) };
                    out.push(p.clone());
                    next.push(p);
                    grown += 1;
                    if grown >= lim.max_per_seed {
                        break 'rounds;
                    }
                }
            }
            frontier = next;
        }
    }
    out
}

/// The `only_valid` filter.
fn valid(cx: &Cx, nodes: &[u32]) -> bool {
    let lim = cx.limits;
    if nodes.is_empty() || nodes.len() > lim.max_nodes || !nodes.iter().all(|&n| cx.supported[n as usize]) {
        return false;
    }
    if let Some(prev) = &cx.chain_prev {
        // Every epilogue's chain predecessor inside; supported non-anchors always have one.
        let ok = nodes.iter().all(|&n| match prev[n as usize] {
            Some(p) => contains(nodes, p),
            None => support::anchor(cx.g, NodeId(n)).is_ok(),
        });
        if !ok {
            return false;
        }
    }
    // A single node is always a valid candidate, whatever its number of outputs (a Split with three consumers
    // must still be coverable): the exit bound limits what fusion may grow, not what a primitive is.
    let exits_ok = nodes.len() == 1 || cx.dag.exits(cx.g, nodes) <= lim.max_exits;
    cx.dag.depth(nodes) <= lim.max_depth && exits_ok && cx.dag.is_convex(nodes)
}
