//! Recognizes layer normalization decomposed by exporters and replaces it with one [`Op::LayerNorm`]:
//!
//! ```text
//! mean = ReduceMean(x, axes=[a..rank], keepdims=1)
//! d    = Sub(x, mean)                      (one Sub, or two identical ones)
//! var  = ReduceMean(Pow(d, 2) | Mul(d, d), same axes, keepdims=1)
//! s    = Sqrt(Add(var, eps))
//! n    = Div(d, s) | Mul(d, Reciprocal(s))
//! y    = Add(Mul(n, scale), bias)          (scale and bias optional)
//! ```
//!
//! Checked: the axes are the trailing block `a..rank` in both reductions, the exponent is exactly 2, eps is a
//! positive scalar constant, scale and bias broadcast to `x.shape[a..]` without widening the result, and every
//! intermediate is used only inside the pattern. The rewrite is then exact in real arithmetic.

use super::pattern::{is_binary, other_operand, scalar, scalar_is, Uses};
use crate::ir::{broadcast_shapes, BinaryOp, Graph, NodeId, Op, ReduceKind, Tensor, UnaryOp, ValueId};

fn trailing_mean_axes(op: &Op, rank: usize) -> Option<usize> {
    match op {
        Op::Reduce { kind: ReduceKind::Mean, axes, keepdims: true } if !axes.is_empty() => {
            let a = axes[0];
            (axes.iter().copied().eq(a..rank)).then_some(a)
        }
        _ => None,
    }
}

/// One matched pattern: what to build and what it replaces.
struct Match {
    x: ValueId,
    axis: usize,
    epsilon: f32,
    scale: Option<ValueId>,
    bias: Option<ValueId>,
    root: ValueId,
    name: String,
}

fn match_at(g: &Graph, uses: &Uses, mean_node: NodeId) -> Option<Match> {
    let node = g.node(mean_node);
    let x = node.inputs[0];
    let xt = g.ty(x);
    if !xt.dtype.is_float() {
        return None;
    }
    let axis = trailing_mean_axes(&node.op, xt.rank())?;
    let mean = node.outputs[0];
    if uses.is_output(mean) {
        return None;
    }
    // Every use of mean is Sub(x, mean).
    let subs: Vec<NodeId> = uses.consumers[mean.index()].clone();
    if subs.is_empty() || subs.len() > 2 {
        return None;
    }
    for &s in &subs {
        let n = g.node(s);
        if !is_binary(&n.op, BinaryOp::Sub) || n.inputs != [x, mean] || uses.is_output(n.outputs[0]) {
            return None;
        }
    }
    let ds: Vec<ValueId> = subs.iter().map(|&s| g.node(s).outputs[0]).collect();
    // Variance: ReduceMean(d^2) with the same axes.
    let mut var_path = None;
    for &d in &ds {
        for &c in &uses.consumers[d.index()] {
            let cn = g.node(c);
            let squares = match cn.op {
                Op::Binary(BinaryOp::Pow) => cn.inputs[0] == d && scalar_is(g, cn.inputs[1], 2.0),
                Op::Binary(BinaryOp::Mul) => cn.inputs == [d, d],
                _ => false,
            };
            if squares {
                var_path = Some((d, c));
            }
        }
    }
    let (d_var, sq_node) = var_path?;
    let sq = g.node(sq_node).outputs[0];
    let var_node = uses.sole_consumer(sq)?;
    if trailing_mean_axes(&g.node(var_node).op, xt.rank()) != Some(axis) {
        return None;
    }
    let var = g.node(var_node).outputs[0];
    let add_eps = uses.sole_consumer(var).filter(|&a| is_binary(&g.node(a).op, BinaryOp::Add))?;
    let eps_v = other_operand(g, add_eps, var)?;
    let eps = scalar(g, eps_v).filter(|&e| e > 0.0 && e.is_finite())?;
    if g.ty(g.node(add_eps).outputs[0]) != g.ty(var) {
        return None;
    }
    let sqrt = uses.sole_consumer(g.node(add_eps).outputs[0]).filter(|&s| matches!(g.node(s).op, Op::Unary(UnaryOp::Sqrt)))?;
    let s = g.node(sqrt).outputs[0];
    let s_user = uses.sole_consumer(s)?;
    // Normalized value: Div(d, s) or Mul(d, Reciprocal(s)).
    let (norm_node, d_norm) = match g.node(s_user).op {
        Op::Binary(BinaryOp::Div) if g.node(s_user).inputs[1] == s => (s_user, g.node(s_user).inputs[0]),
        Op::Unary(UnaryOp::Reciprocal) => {
            let r = g.node(s_user).outputs[0];
            let m = uses.sole_consumer(r).filter(|&m| is_binary(&g.node(m).op, BinaryOp::Mul))?;
            (m, other_operand(g, m, r)?)
        }
        _ => return None,
    };
    if !ds.contains(&d_norm) {
        return None;
    }
    // Every d is used only by the square and the normalization.
    let mut allowed = vec![sq_node, norm_node];
    allowed.sort();
    let mut actual: Vec<NodeId> = ds.iter().flat_map(|d| uses.consumers[d.index()].iter().copied()).collect();
    actual.sort();
    actual.dedup();
    if actual != allowed || d_var == d_norm && ds.len() != 1 {
        return None;
    }
    let mut root = g.node(norm_node).outputs[0];
    if g.ty(root) != xt {
        return None;
    }
    let norm_shape = xt.shape[axis..].to_vec();
    let fits = |v: ValueId| {
        let t = g.ty(v);
        t.dtype == xt.dtype && t.rank() <= norm_shape.len() && broadcast_shapes(&norm_shape, &t.shape).ok().as_deref() == Some(&norm_shape[..])
    };
    let mut scale = None;
    let mut bias = None;
    if let Some(m) = uses.sole_consumer(root).filter(|&m| is_binary(&g.node(m).op, BinaryOp::Mul)) {
        let sc = other_operand(g, m, root)?;
        if fits(sc) {
            scale = Some(sc);
            root = g.node(m).outputs[0];
        }
    }
    if scale.is_some() {
        if let Some(a) = uses.sole_consumer(root).filter(|&a| is_binary(&g.node(a).op, BinaryOp::Add)) {
            let b = other_operand(g, a, root)?;
            if fits(b) {
                bias = Some(b);
                root = g.node(a).outputs[0];
            }
        }
    }
    Some(Match { x, axis, epsilon: eps as f32, scale, bias, root, name: node.name.clone() })
}

/// Replaces every recognized decomposed layer normalization; returns how many.
pub fn fuse_layernorm(g: &mut Graph) -> usize {
    let uses = Uses::new(g);
    let found: Vec<Match> = (0..g.nodes.len())
        .map(|i| NodeId(i as u32))
        .filter(|&n| matches!(g.node(n).op, Op::Reduce { kind: ReduceKind::Mean, .. }))
        .filter_map(|n| match_at(g, &uses, n))
        .collect();
    let count = found.len();
    for m in found {
        let xt = g.ty(m.x).clone();
        let scale = match m.scale {
            Some(s) => s,
            None => {
                let shape = xt.shape[m.axis..].to_vec();
                let ones = vec![1.0; shape.iter().product()];
                g.add_const(format!("{}/ones", m.name), Tensor::from_f64_as(xt.dtype, shape, &ones))
            }
        };
        let mut inputs = vec![m.x, scale];
        inputs.extend(m.bias);
        let ln = g
            .add(format!("{}/layernorm", m.name), Op::LayerNorm { axis: m.axis, epsilon: m.epsilon }, &inputs)
            .expect("matched LayerNorm operands infer");
        g.replace_uses(m.root, ln);
    }
    count
}

#[cfg(test)]
#[path = "layernorm_tests.rs"]
mod tests;
