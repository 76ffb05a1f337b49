//! [`merge_sibling_matmuls`]: MatMuls that read the same activation with constant weights become one MatMul
//! over the weights side by side, and a Split hands each former product its columns.
//!
//! Why: BERT-style exports compute the query, key and value projections as three GEMMs of the same input
//! (`x @ Wq + bq`, `x @ Wk + bk`, `x @ Wv + bv`). At batch 1 each is a few microseconds of launch-bound work,
//! and three launches of `[S, 768] x [768, 768]` cost more than one of `[S, 768] x [768, 2304]`, which also
//! keeps the tensor cores busier. GPT-2 exports the projection already merged (`c_attn`, then a Split), so
//! after this pass both families reach the attention the same way, and the attention reads its heads from the
//! Split's outputs through strided views (no copy; see `ir::view`).
//!
//! The rewrite is exact in real arithmetic: each output column of a matrix product depends only on its own
//! weight column, and the bias adds are per column too. The reference interpreter computes the same dot
//! products in the same order, so there the results are bitwise the same.

use super::pattern::{is_binary, Uses};
use crate::ir::{BinaryOp, DType, Graph, NodeId, Op, Tensor, ValueId};

/// One MatMul that may join its siblings: `x @ w` with `w` a constant `[K, n]` matrix, and the bias added to
/// its product right after (a constant along the last axis), if any.
struct Member {
    matmul: NodeId,
    weight: ValueId,
    /// The Add node and its bias constant.
    bias: Option<(NodeId, ValueId)>,
    n: usize,
}

impl Member {
    /// The value the rest of the graph reads: the biased product, or the product.
    fn result(&self, g: &Graph) -> ValueId {
        match self.bias {
            Some((add, _)) => g.node(add).outputs[0],
            None => g.node(self.matmul).outputs[0],
        }
    }
}

/// `n` as a member: a MatMul whose weight is a single-use constant matrix, with its bias Add when the product
/// is read only by an Add of a single-use constant vector along the last axis.
fn member(g: &Graph, uses: &Uses, n: NodeId) -> Option<Member> {
    let node = g.node(n);
    if node.op != Op::MatMul {
        return None;
    }
    let (x, w) = (node.inputs[0], node.inputs[1]);
    let wt = g.constant(w)?;
    if g.constant(x).is_some() || wt.ty.shape.len() != 2 || wt.dtype() != DType::F32 || !uses.single(w) || g.ty(x).dtype != DType::F32 {
        return None;
    }
    let n_cols = wt.ty.shape[1];
    let out = node.outputs[0];
    let bias = uses.sole_consumer(out).filter(|&a| is_binary(&g.node(a).op, BinaryOp::Add)).and_then(|a| {
        let ins = &g.node(a).inputs;
        let b = if ins[0] == out { ins[1] } else { ins[0] };
        let bt = g.constant(b)?;
        let s = &bt.ty.shape;
        let along_last = !s.is_empty() && s[s.len() - 1] == n_cols && s[..s.len() - 1].iter().all(|&d| d == 1);
        (along_last && s.len() <= g.ty(out).shape.len() && bt.dtype() == DType::F32 && uses.single(b)).then_some((a, b))
    });
    Some(Member { matmul: n, weight: w, bias, n: n_cols })
}

/// Concatenates constant tensors along `axis` (the reference interpreter's Concat, so the bytes are exactly
/// what the graph would have computed).
fn concat(parts: &[&Tensor], axis: usize) -> Option<Tensor> {
    crate::interp::eval_op(&Op::Concat { axis }, parts).ok().map(|mut v| v.remove(0))
}

/// Merges every group of two or more sibling MatMuls (same activation, weights with the same number of rows,
/// all biased or all not) into one MatMul and a Split along the last axis; returns how many groups merged.
pub fn merge_sibling_matmuls(g: &mut Graph) -> usize {
    let uses = Uses::new(g);
    // Groups in the order of their first member's node: deterministic, whatever the graph's size.
    let mut groups: Vec<(ValueId, bool, Vec<Member>)> = Vec::new();
    for i in 0..g.nodes.len() {
        let Some(m) = member(g, &uses, NodeId(i as u32)) else { continue };
        let x = g.node(m.matmul).inputs[0];
        let rows = g.ty(m.weight).shape[0];
        match groups.iter_mut().find(|(gx, biased, ms)| *gx == x && *biased == m.bias.is_some() && g.ty(ms[0].weight).shape[0] == rows) {
            Some((_, _, ms)) => ms.push(m),
            None => groups.push((x, m.bias.is_some(), vec![m])),
        }
    }
    let mut merged = 0;
    for (x, biased, members) in groups {
        if members.len() < 2 {
            continue;
        }
        let weights: Vec<&Tensor> = members.iter().map(|m| g.constant(m.weight).expect("a member's weight is constant")).collect();
        let Some(w) = concat(&weights, 1) else { continue };
        let name = g.node(members[0].matmul).name.clone();
        let w = g.add_const(format!("{name}/siblings_weight"), w);
        let Ok(mut y) = g.add(format!("{name}/siblings"), Op::MatMul, &[x, w]) else { continue };
        if biased {
            // Each bias as a vector of its columns, then side by side.
            let vectors: Vec<Tensor> = members
                .iter()
                .map(|m| {
                    let (_, b) = m.bias.expect("a biased group's members have biases");
                    let mut t = g.constant(b).expect("a bias is constant").clone();
                    t.ty.shape = vec![m.n];
                    t
                })
                .collect();
            let Some(b) = concat(&vectors.iter().collect::<Vec<_>>(), 0) else { continue };
            let b = g.add_const(format!("{name}/siblings_bias"), b);
            let Ok(biased_y) = g.add(format!("{name}/siblings_bias_add"), Op::Binary(BinaryOp::Add), &[y, b]) else { continue };
            y = biased_y;
        }
        let axis = g.ty(y).shape.len() - 1;
        let sizes: Vec<usize> = members.iter().map(|m| m.n).collect();
        let Ok(parts) = g.add_node(format!("{name}/siblings_split"), Op::Split { axis, sizes }, &[y]) else { continue };
        for (m, part) in members.iter().zip(parts) {
            let old = m.result(g);
            debug_assert_eq!(g.ty(old), g.ty(part));
            g.replace_uses(old, part);
        }
        merged += 1;
    }
    merged
}

#[cfg(test)]
#[path = "siblings_tests.rs"]
mod tests;
