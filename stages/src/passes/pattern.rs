//! Small helpers for the pattern-matching rewrites of [`super::simplify`]: who produces and who consumes a
//! value, scalar constants checked against an exact value, commutative operand matching.

use crate::ir::{BinaryOp, DType, Graph, NodeId, Op, ValueId};
use half::{bf16, f16};

/// Use counts and consumers, computed once per pass over a compacted graph.
pub struct Uses {
    pub counts: Vec<usize>,
    pub consumers: Vec<Vec<NodeId>>,
    is_output: Vec<bool>,
}

impl Uses {
    pub fn new(g: &Graph) -> Self {
        let mut is_output = vec![false; g.values.len()];
        for &o in &g.outputs {
            is_output[o.index()] = true;
        }
        Uses { counts: g.use_counts(), consumers: g.consumers(), is_output }
    }

    /// True when `v` is read by exactly one node and is not a graph output: an intermediate a rewrite may
    /// swallow.
    pub fn single(&self, v: ValueId) -> bool {
        self.counts[v.index()] == 1 && !self.is_output[v.index()]
    }

    /// The only consumer of `v`, when it has exactly one and is not a graph output.
    pub fn sole_consumer(&self, v: ValueId) -> Option<NodeId> {
        if self.single(v) {
            self.consumers[v.index()].first().copied()
        } else {
            None
        }
    }

    pub fn is_output(&self, v: ValueId) -> bool {
        self.is_output[v.index()]
    }
}

/// The node producing `v` if its op satisfies `pred`.
pub fn producer_if(g: &Graph, v: ValueId, pred: impl Fn(&Op) -> bool) -> Option<NodeId> {
    g.producer(v).filter(|&n| pred(&g.node(n).op))
}

pub fn is_binary(op: &Op, b: BinaryOp) -> bool {
    matches!(op, Op::Binary(x) if *x == b)
}

/// The value of a one-element constant.
pub fn scalar(g: &Graph, v: ValueId) -> Option<f64> {
    let t = g.constant(v)?;
    (t.numel() == 1 && t.dtype().is_float()).then(|| t.to_f64_vec()[0])
}

/// `exact` rounded to the precision of `dtype`.
fn round_to(dtype: DType, exact: f64) -> f64 {
    match dtype {
        DType::F16 => f16::from_f64(exact).to_f64(),
        DType::BF16 => bf16::from_f64(exact).to_f64(),
        _ => exact as f32 as f64,
    }
}

/// True when the constant `v` is a scalar equal to `exact`: the value rounded to the constant's precision,
/// or within 1e-6 relative of it (exporters print constants such as 0.7978846 to 7 digits). Anything looser
/// would change the rewritten computation by more than its rounding error.
pub fn scalar_is(g: &Graph, v: ValueId, exact: f64) -> bool {
    let Some(c) = scalar(g, v) else { return false };
    let dtype = g.ty(v).dtype;
    c == round_to(dtype, exact) || (c - exact).abs() <= 1e-6 * exact.abs()
}

/// For a binary node, the operand that is not `known` (commutative match), if `known` is one of them.
pub fn other_operand(g: &Graph, n: NodeId, known: ValueId) -> Option<ValueId> {
    let ins = &g.node(n).inputs;
    if ins.len() != 2 {
        return None;
    }
    if ins[0] == known {
        Some(ins[1])
    } else if ins[1] == known {
        Some(ins[0])
    } else {
        None
    }
}

/// For a commutative binary node, `(constant scalar operand, other operand)` if one operand is a scalar
/// constant satisfying `pred`.
pub fn split_scalar(g: &Graph, n: NodeId, pred: impl Fn(&Graph, ValueId) -> bool) -> Option<(ValueId, ValueId)> {
    let ins = &g.node(n).inputs;
    if ins.len() != 2 {
        return None;
    }
    if pred(g, ins[1]) {
        Some((ins[1], ins[0]))
    } else if pred(g, ins[0]) {
        Some((ins[0], ins[1]))
    } else {
        None
    }
}

/// The leaves of a product tree rooted at `v`: Mul nodes whose result is used only inside the tree are
/// expanded (the root always is), up to `max_leaves` leaves. Returns the leaves and the Mul nodes expanded.
pub fn product_leaves(g: &Graph, uses: &Uses, v: ValueId, max_leaves: usize) -> Option<(Vec<ValueId>, Vec<NodeId>)> {
    let mut leaves = Vec::new();
    let mut inner = Vec::new();
    let mut stack = vec![(v, true)];
    while let Some((x, root)) = stack.pop() {
        match producer_if(g, x, |op| is_binary(op, BinaryOp::Mul)) {
            Some(n) if root || uses.single(x) => {
                inner.push(n);
                let ins = &g.node(n).inputs;
                stack.push((ins[1], false));
                stack.push((ins[0], false));
            }
            _ => leaves.push(x),
        }
        if leaves.len() + stack.len() > max_leaves {
            return None;
        }
    }
    Some((leaves, inner))
}
