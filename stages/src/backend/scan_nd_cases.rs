//! CumSum, GatherND and ScatterND graphs the backends' tests share: every CumSum flag on a middle axis and
//! on integers (i64 and i32, wrapping), GatherND with constant (negative) and run-time tuples, batch dims
//! and bool data, ScatterND with constant tuples (distinct, and repeated), run-time tuples (seeded random
//! inputs repeat tuples) and whole-row slices, so the later-update-wins rule is exercised. Each graph has a follow-up elementwise
//! node so the ops also run between other kernels of one partition.

use crate::ir::{DType, Graph, Op, Tensor, TensorType, UnaryOp, ValueId};

fn node(g: &mut Graph, op: Op, inputs: &[ValueId]) -> ValueId {
    let name = format!("n{}", g.nodes.len());
    g.add(name, op, inputs).unwrap_or_else(|e| panic!("{e}"))
}

fn cst(g: &mut Graph, t: Tensor) -> ValueId {
    let name = format!("c{}", g.values.len());
    g.add_const(name, t)
}

/// (name, graph) pairs.
pub fn cases() -> Vec<(&'static str, Graph)> {
    let mut out = Vec::new();
    // CumSum: every flag combination over the middle axis of a 3-D float tensor, fed by a Tanh.
    let mut g = Graph::new("cumsum_f32");
    let x = g.add_input("x", TensorType::f32(vec![3, 37, 5]));
    let t = node(&mut g, Op::Unary(UnaryOp::Tanh), &[x]);
    for (exclusive, reverse) in [(false, false), (true, false), (false, true), (true, true)] {
        let c = node(&mut g, Op::CumSum { axis: 1, exclusive, reverse }, &[t]);
        g.outputs.push(c);
    }
    let last = node(&mut g, Op::CumSum { axis: 2, exclusive: false, reverse: false }, &[x]);
    g.outputs.push(last);
    out.push(("cumsum_f32", g));
    // CumSum on integers: OPT/RoBERTa positions from an attention mask, and i32 (wrapping is exact there).
    let mut g = Graph::new("cumsum_int");
    let m = g.add_input("mask", TensorType::new(DType::I64, vec![2, 16]));
    let pos = node(&mut g, Op::CumSum { axis: 1, exclusive: false, reverse: false }, &[m]);
    let n32 = g.add_input("n32", TensorType::new(DType::I32, vec![4, 9]));
    let c32 = node(&mut g, Op::CumSum { axis: 0, exclusive: true, reverse: true }, &[n32]);
    g.outputs.extend([pos, c32]);
    out.push(("cumsum_int", g));
    // GatherND: constant tuples with a negative entry (elements), run-time tuples of rows with a batch dim,
    // and bool data (the GPT-2/Llama mask pick).
    let mut g = Graph::new("gather_nd");
    let x = g.add_input("x", TensorType::f32(vec![4, 5, 6]));
    let ci = cst(&mut g, Tensor::from_i64([2, 2, 3], &[0, 1, 2, 3, -1, 5, 1, 1, 1, 2, 0, 0]));
    let a = node(&mut g, Op::GatherND { batch_dims: 0 }, &[x, ci]);
    let ri = g.add_input("rows", TensorType::new(DType::I64, vec![4, 3, 1]));
    let b = node(&mut g, Op::GatherND { batch_dims: 1 }, &[x, ri]);
    let e = node(&mut g, Op::Unary(UnaryOp::Exp), &[b]);
    let keep = g.add_input("keep", TensorType::new(DType::Bool, vec![1, 16]));
    let bi = g.add_input("bi", TensorType::new(DType::I32, vec![3, 2]));
    let k = node(&mut g, Op::GatherND { batch_dims: 0 }, &[keep, bi]);
    g.outputs.extend([a, e, k]);
    out.push(("gather_nd", g));
    // ScatterND: constant element tuples, run-time row tuples (repeats likely), integer data.
    let mut g = Graph::new("scatter_nd");
    let x = g.add_input("x", TensorType::f32(vec![6, 7]));
    let ci = cst(&mut g, Tensor::from_i64([3, 2], &[0, 0, 5, -1, 2, 3]));
    let u = g.add_input("u", TensorType::f32(vec![3]));
    let a = node(&mut g, Op::ScatterND, &[x, ci, u]);
    let r = node(&mut g, Op::Unary(UnaryOp::Neg), &[a]);
    let ri = g.add_input("rows", TensorType::new(DType::I64, vec![2, 2, 1]));
    let ur = g.add_input("ur", TensorType::f32(vec![2, 2, 7]));
    let b = node(&mut g, Op::ScatterND, &[r, ri, ur]);
    let xi = g.add_input("xi", TensorType::new(DType::I64, vec![3, 4]));
    let ii = g.add_input("ii", TensorType::new(DType::I64, vec![5, 2]));
    let ui = g.add_input("ui", TensorType::new(DType::I64, vec![5]));
    let c = node(&mut g, Op::ScatterND, &[xi, ii, ui]);
    // Constant tuples that repeat (row 1 twice, the second time as -2): the later update wins.
    let dup = cst(&mut g, Tensor::from_i64([3, 1], &[1, 2, -2]));
    let ud = g.add_input("ud", TensorType::new(DType::I64, vec![3, 4]));
    let d = node(&mut g, Op::ScatterND, &[c, dup, ud]);
    g.outputs.extend([b, d]);
    out.push(("scatter_nd", g));
    out
}
