//! Graphs of the unary math ops added for ONNX's Cos, Sin, ... Mish, which the `c` and `cuda` backends' tests
//! share: each op on seeded inputs (uniform in [-1, 1)) brought into a range that exercises it (a scale for
//! the periodic and growing ones, |x| + 1 for Acosh, half-integers for Round's ties, ±200 for Softplus and
//! Mish, where a naive log(1 + exp(x)) overflows), and one kernel of several of them fused with a binary op.

use crate::ir::{BinaryOp, Graph, Op, Tensor, TensorType, UnaryOp, ValueId};

fn node(g: &mut Graph, op: Op, inputs: &[ValueId]) -> ValueId {
    let name = format!("n{}", g.nodes.len());
    g.add(name, op, inputs).unwrap_or_else(|e| panic!("{e}"))
}

fn scalar(g: &mut Graph, v: f32) -> ValueId {
    let name = format!("c{}", g.values.len());
    g.add_const(name, Tensor::scalar_f32(v))
}

fn mul(g: &mut Graph, x: ValueId, s: f32) -> ValueId {
    let c = scalar(g, s);
    node(g, Op::Binary(BinaryOp::Mul), &[x, c])
}

/// (name, graph) pairs.
pub fn cases() -> Vec<(&'static str, Graph)> {
    use UnaryOp::*;
    let mut out = Vec::new();
    for (name, u, scale) in [
        ("cos", Cos, 10.0),
        ("sin", Sin, 10.0),
        ("tan", Tan, 1.5),
        ("acos", Acos, 1.0),
        ("asin", Asin, 1.0),
        ("atan", Atan, 10.0),
        ("cosh", Cosh, 10.0),
        ("sinh", Sinh, 10.0),
        ("asinh", Asinh, 50.0),
        ("atanh", Atanh, 0.999),
        ("softplus", Softplus, 200.0),
        ("mish", Mish, 200.0),
    ] {
        let mut g = Graph::new(name);
        let x = g.add_input("x", TensorType::f32(vec![3, 17]));
        let v = mul(&mut g, x, scale);
        let y = node(&mut g, Op::Unary(u), &[v]);
        g.outputs.push(y);
        out.push((name, g));
    }
    // Acosh on [1, 9).
    let mut g = Graph::new("acosh");
    let x = g.add_input("x", TensorType::f32(vec![3, 17]));
    let a = node(&mut g, Op::Unary(Abs), &[x]);
    let s = mul(&mut g, a, 8.0);
    let one = scalar(&mut g, 1.0);
    let v = node(&mut g, Op::Binary(BinaryOp::Add), &[s, one]);
    let y = node(&mut g, Op::Unary(Acosh), &[v]);
    g.outputs.push(y);
    out.push(("acosh", g));
    // Round on floor(8x) / 2: every other value a tie (-4, -3.5, ..., 3.5), and on 7x.
    let mut g = Graph::new("round");
    let x = g.add_input("x", TensorType::f32(vec![64]));
    let s = mul(&mut g, x, 8.0);
    let f = node(&mut g, Op::Unary(Floor), &[s]);
    let h = mul(&mut g, f, 0.5);
    let r = node(&mut g, Op::Unary(Round), &[h]);
    let s7 = mul(&mut g, x, 7.0);
    let r7 = node(&mut g, Op::Unary(Round), &[s7]);
    g.outputs.extend([r, r7]);
    out.push(("round", g));
    // Several in one kernel: atan(cos(x)² + sin(x)²) and sinh(mish(x)).
    let mut g = Graph::new("fused");
    let x = g.add_input("x", TensorType::f32(vec![2, 5, 7]));
    let c = node(&mut g, Op::Unary(Cos), &[x]);
    let s = node(&mut g, Op::Unary(Sin), &[x]);
    let cc = node(&mut g, Op::Binary(BinaryOp::Mul), &[c, c]);
    let ss = node(&mut g, Op::Binary(BinaryOp::Mul), &[s, s]);
    let sum = node(&mut g, Op::Binary(BinaryOp::Add), &[cc, ss]);
    let at = node(&mut g, Op::Unary(Atan), &[sum]);
    let m = node(&mut g, Op::Unary(Mish), &[x]);
    let sh = node(&mut g, Op::Unary(Sinh), &[m]);
    g.outputs.extend([at, sh]);
    out.push(("fused", g));
    out
}
