//! Reshape, Transpose, Reshape chains written as one Transpose where they are one. The dynamo exporter moves
//! heads through 3-D views: Llama's Kᵀ is `Reshape(Transpose(Reshape(K, [B * H, S, D]), [0, 2, 1]), [B, H, D,
//! S])`, which is `Transpose(K, [0, 1, 3, 2])`; the attention pass recognises Kᵀ only as a Transpose (then it
//! reads K in place instead of a transposed copy), and a backend runs one movement instead of three.
//!
//! A chain `y = Reshape(Transpose(Reshape(x, A), P), Y)` (the first Reshape optional) moves the factors of a
//! common refinement `F` of x's and A's dims (each dim of either a product of consecutive factors; size-1 dims
//! aside): the Transpose permutes A's groups of factors. When every dim of Y is a run of factors that were
//! consecutive and in order in `F`, those runs are the dims of a shape `G` that x reshapes to for free, and `y =
//! Transpose(Reshape(x, G), P')`, with Y's size-1 dims first in G. Both sides read the same elements in the
//! same order, so the rewrite is exact; the Reshape disappears when G is x's shape.

use super::pattern::{producer_if, Uses};
use crate::ir::{Graph, NodeId, Op, ValueId};

/// The factors of a common refinement of `a` and `b` (their size-1 dims left out) and, for each non-1 dim of
/// each, its range of factors; `None` when the dims do not refine into one sequence (`[6, 4]` and `[4, 6]`).
fn refine(a: &[usize], b: &[usize]) -> Option<(Vec<usize>, Vec<std::ops::Range<usize>>, Vec<std::ops::Range<usize>>)> {
    let (a, b): (Vec<usize>, Vec<usize>) = (a.iter().copied().filter(|&d| d != 1).collect(), b.iter().copied().filter(|&d| d != 1).collect());
    if a.contains(&0) || b.contains(&0) {
        return None;
    }
    let (mut f, mut ra, mut rb) = (Vec::new(), Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    let (mut left_a, mut left_b) = (a.first().copied().unwrap_or(1), b.first().copied().unwrap_or(1));
    let (mut start_a, mut start_b) = (0, 0);
    while i < a.len() && j < b.len() {
        let step = left_a.min(left_b);
        if left_a % step != 0 || left_b % step != 0 {
            return None;
        }
        f.push(step);
        left_a /= step;
        left_b /= step;
        if left_a == 1 {
            ra.push(start_a..f.len());
            start_a = f.len();
            i += 1;
            left_a = a.get(i).copied().unwrap_or(1);
        }
        if left_b == 1 {
            rb.push(start_b..f.len());
            start_b = f.len();
            j += 1;
            left_b = b.get(j).copied().unwrap_or(1);
        }
    }
    (i == a.len() && j == b.len()).then_some((f, ra, rb))
}

/// For `Reshape(Transpose(Reshape(x, A), perm), Y)`: `(G, P')` with `Transpose(Reshape(x, G), P')` the same.
pub(super) fn as_one_transpose(x: &[usize], a: &[usize], perm: &[usize], y: &[usize]) -> Option<(Vec<usize>, Vec<usize>)> {
    let (f, _, a_ranges) = refine(x, a)?;
    // The factors in the Transpose's output order: A's non-1 dims as the permutation reads them.
    let mut non1 = vec![None; a.len()];
    let mut k = 0;
    for (axis, &d) in a.iter().enumerate() {
        if d != 1 {
            non1[axis] = Some(k);
            k += 1;
        }
    }
    let order: Vec<usize> = perm.iter().filter_map(|&p| non1[p]).flat_map(|r| a_ranges[r].clone()).collect();
    // Y's non-1 dims as runs of `order`, each consecutive and increasing in F.
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    let mut at = 0;
    for &d in y.iter().filter(|&&d| d != 1) {
        let start = at;
        let mut size = 1;
        while size < d && at < order.len() {
            size *= f[order[at]];
            at += 1;
        }
        if size != d || at == start || (start + 1..at).any(|i| order[i] != order[i - 1] + 1) {
            return None;
        }
        runs.push(order[start]..order[at - 1] + 1);
    }
    if at != order.len() {
        return None;
    }
    // G: Y's size-1 dims first, then the runs in F's order; P' maps Y's dims to them.
    let ones = y.iter().filter(|&&d| d == 1).count();
    let mut by_start: Vec<usize> = (0..runs.len()).collect();
    by_start.sort_by_key(|&r| runs[r].start);
    let mut g = vec![1; ones];
    g.extend(by_start.iter().map(|&r| runs[r].clone().map(|i| f[i]).product::<usize>()));
    let mut rank_of = vec![0; runs.len()];
    for (pos, &r) in by_start.iter().enumerate() {
        rank_of[r] = ones + pos;
    }
    let (mut next_one, mut next_run) = (0, 0);
    let p: Vec<usize> = y
        .iter()
        .map(|&d| {
            if d == 1 {
                next_one += 1;
                next_one - 1
            } else {
                next_run += 1;
                rank_of[next_run - 1]
            }
        })
        .collect();
    Some((g, p))
}

struct Match {
    x: ValueId,
    g: Vec<usize>,
    perm: Vec<usize>,
    root: ValueId,
    name: String,
}

fn match_at(g: &Graph, uses: &Uses, outer: NodeId) -> Option<Match> {
    let node = g.node(outer);
    let Op::Reshape { shape: y } = &node.op else { return None };
    let t_out = node.inputs[0];
    let t = producer_if(g, t_out, |op| matches!(op, Op::Transpose { .. })).filter(|_| uses.single(t_out))?;
    let Op::Transpose { perm } = &g.node(t).op else { return None };
    let a_val = g.node(t).inputs[0];
    let (x, len) = match producer_if(g, a_val, |op| matches!(op, Op::Reshape { .. })).filter(|_| uses.single(a_val)) {
        Some(r) => (g.node(r).inputs[0], 3),
        None => (a_val, 2),
    };
    let (gs, p) = as_one_transpose(&g.ty(x).shape, &g.ty(a_val).shape, perm, y)?;
    let identity = p.iter().enumerate().all(|(i, &q)| i == q);
    let ops = usize::from(gs != g.ty(x).shape) + usize::from(!identity);
    // Strictly fewer nodes; none at all only where the chain's result is not a graph output (which keeps its name).
    if ops >= len || (ops == 0 && uses.is_output(node.outputs[0])) {
        return None;
    }
    Some(Match { x, g: gs, perm: p, root: node.outputs[0], name: node.name.clone() })
}

/// Rewrites every such chain; returns how many.
pub fn collapse_movement(g: &mut Graph) -> usize {
    let uses = Uses::new(g);
    let found: Vec<Match> = (0..g.nodes.len()).filter_map(|i| match_at(g, &uses, NodeId(i as u32))).collect();
    let mut count = 0;
    for m in found {
        let mut v = m.x;
        if g.ty(v).shape != m.g {
            match g.add(format!("{}/view", m.name), Op::Reshape { shape: m.g.clone() }, &[v]) {
                Ok(r) => v = r,
                Err(_) => continue,
            }
        }
        if m.perm.iter().enumerate().any(|(i, &q)| i != q) {
            match g.add(format!("{}/transpose", m.name), Op::Transpose { perm: m.perm.clone() }, &[v]) {
                Ok(t) => v = t,
                Err(_) => continue,
            }
        }
        if g.ty(v) != g.ty(m.root) {
            continue;
        }
        g.replace_uses(m.root, v);
        count += 1;
    }
    count
}

#[cfg(test)]
#[path = "movement_tests.rs"]
mod tests;
