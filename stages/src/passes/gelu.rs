//! Recognizes GELU written out by exporters and replaces it with one [`Op::Gelu`].
//!
//! - erf form: `0.5 * x * (1 + erf(x / sqrt(2)))`, with the division spelled `Div(x, 1.4142135)` (PyTorch) or
//!   `Mul(x, 0.70710677)`, and the product `0.5 * x * t` in any association and operand order.
//! - tanh form (GPT-2's `gelu_new`): `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`, with the cube
//!   spelled `Pow(x, 3)` or `x * x * x`.
//!
//! Every constant is checked ([`scalar_is`]): sqrt(2) or 1/sqrt(2), 1, 0.5, sqrt(2/pi), 0.044715 and the
//! exponent 3. Every intermediate must be used only inside the pattern, and the result must have x's type
//! (so no constant of higher rank broadcasts it). The rewrite is then exact in real arithmetic.

use super::pattern::{is_binary, other_operand, producer_if, product_leaves, scalar_is, split_scalar, Uses};
use crate::ir::{BinaryOp, GeluApprox, Graph, NodeId, Op, UnaryOp, ValueId};

const SQRT_2: f64 = std::f64::consts::SQRT_2;
const FRAC_1_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;
/// sqrt(2 / pi)
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_CUBIC: f64 = 0.044715;

/// The x of `x / sqrt2` (Div by sqrt 2 or Mul by 1/sqrt 2).
fn erf_argument(g: &Graph, uses: &Uses, v: ValueId) -> Option<ValueId> {
    if !uses.single(v) {
        return None;
    }
    let n = g.producer(v)?;
    let node = g.node(n);
    match node.op {
        Op::Binary(BinaryOp::Div) if scalar_is(g, node.inputs[1], SQRT_2) => Some(node.inputs[0]),
        Op::Binary(BinaryOp::Mul) => split_scalar(g, n, |g, c| scalar_is(g, c, FRAC_1_SQRT_2)).map(|(_, x)| x),
        _ => None,
    }
}

/// True when `v` is `x^3`: `Pow(x, 3)`, `x * (x * x)` or `(x * x) * x`, each intermediate used once.
fn is_cube(g: &Graph, uses: &Uses, v: ValueId, x: ValueId) -> bool {
    if !uses.single(v) {
        return false;
    }
    let Some(n) = g.producer(v) else { return false };
    let node = g.node(n);
    match node.op {
        Op::Binary(BinaryOp::Pow) => node.inputs[0] == x && scalar_is(g, node.inputs[1], 3.0),
        Op::Binary(BinaryOp::Mul) => {
            let Some(other) = other_operand(g, n, x) else { return false };
            uses.single(other)
                && producer_if(g, other, |op| is_binary(op, BinaryOp::Mul)).is_some_and(|sq| g.node(sq).inputs == [x, x])
        }
        _ => false,
    }
}

/// The x of `sqrt(2/pi) * (x + 0.044715 * x^3)`.
fn tanh_argument(g: &Graph, uses: &Uses, v: ValueId) -> Option<ValueId> {
    if !uses.single(v) {
        return None;
    }
    let outer = producer_if(g, v, |op| is_binary(op, BinaryOp::Mul))?;
    let (_, inner) = split_scalar(g, outer, |g, c| scalar_is(g, c, SQRT_2_OVER_PI))?;
    if !uses.single(inner) {
        return None;
    }
    let add = producer_if(g, inner, |op| is_binary(op, BinaryOp::Add))?;
    let ins = g.node(add).inputs.clone();
    for (x, m) in [(ins[0], ins[1]), (ins[1], ins[0])] {
        if !uses.single(m) {
            continue;
        }
        let Some(mul) = producer_if(g, m, |op| is_binary(op, BinaryOp::Mul)) else { continue };
        if let Some((_, cube)) = split_scalar(g, mul, |g, c| scalar_is(g, c, GELU_CUBIC)) {
            if is_cube(g, uses, cube, x) {
                return Some(x);
            }
        }
    }
    None
}

/// Given `t = 1 + f(x)` (f = erf or tanh, already matched), finds the root of `0.5 * x * t` and returns it.
fn half_x_times(g: &Graph, uses: &Uses, act_out: ValueId, x: ValueId) -> Option<ValueId> {
    let add = uses.sole_consumer(act_out).filter(|&a| is_binary(&g.node(a).op, BinaryOp::Add))?;
    let one = other_operand(g, add, act_out)?;
    if !scalar_is(g, one, 1.0) {
        return None;
    }
    let t = g.node(add).outputs[0];
    let m1 = uses.sole_consumer(t).filter(|&m| is_binary(&g.node(m).op, BinaryOp::Mul))?;
    let m1_out = g.node(m1).outputs[0];
    // The root is m1 itself, or the Mul that consumes it: try the larger first.
    let mut roots: Vec<NodeId> = Vec::new();
    if let Some(m2) = uses.sole_consumer(m1_out).filter(|&m| is_binary(&g.node(m).op, BinaryOp::Mul)) {
        roots.push(m2);
    }
    roots.push(m1);
    for root in roots {
        let out = g.node(root).outputs[0];
        let Some((leaves, _)) = product_leaves(g, uses, out, 3) else { continue };
        if leaves.len() != 3 || g.ty(out) != g.ty(x) {
            continue;
        }
        let has = |v: ValueId| leaves.iter().filter(|&&l| l == v).count() == 1;
        let half = leaves.iter().find(|&&l| l != x && l != t && scalar_is(g, l, 0.5));
        if has(x) && has(t) && half.is_some() {
            return Some(out);
        }
    }
    None
}

/// Replaces every recognized GELU; returns how many.
pub fn fuse_gelu(g: &mut Graph) -> usize {
    let uses = Uses::new(g);
    let mut found: Vec<(ValueId, ValueId, GeluApprox, String)> = Vec::new();
    for node in &g.nodes {
        let (x, approx) = match node.op {
            Op::Unary(UnaryOp::Erf) => match erf_argument(g, &uses, node.inputs[0]) {
                Some(x) => (x, GeluApprox::Erf),
                None => continue,
            },
            Op::Unary(UnaryOp::Tanh) => match tanh_argument(g, &uses, node.inputs[0]) {
                Some(x) => (x, GeluApprox::Tanh),
                None => continue,
            },
            _ => continue,
        };
        if !g.ty(x).dtype.is_float() {
            continue;
        }
        if let Some(root) = half_x_times(g, &uses, node.outputs[0], x) {
            found.push((root, x, approx, node.name.clone()));
        }
    }
    let count = found.len();
    for (root, x, approximate, name) in found {
        let gelu = g.add(format!("{name}/gelu"), Op::Gelu { approximate }, &[x]).expect("Gelu of a float value infers");
        g.replace_uses(root, gelu);
    }
    count
}

#[cfg(test)]
#[path = "gelu_tests.rs"]
mod tests;
