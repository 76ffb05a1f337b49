use super::super::simplify::testing::assert_same_outputs;
use super::*;
use crate::ir::{verify, TensorType};

fn weight(g: &mut Graph, name: &str, k: usize, n: usize, seed: f32) -> ValueId {
    g.add_const(name, Tensor::from_f32([k, n], &(0..k * n).map(|i| (i as f32 * 0.37 + seed).sin()).collect::<Vec<_>>()))
}

/// BERT's three projections (biases in either operand order, one bias of shape [1, n]) merge into one
/// MatMul, one Add and a Split; the results agree bitwise with the separate products.
#[test]
fn query_key_value_projections_merge() {
    let mut g = Graph::new("qkv");
    let x = g.add_input("x", TensorType::f32([1, 4, 6]));
    let mut outs = Vec::new();
    for (i, name) in ["q", "k", "v"].iter().enumerate() {
        let w = weight(&mut g, &format!("w{name}"), 6, 5, i as f32);
        let b = g.add_const(format!("b{name}"), Tensor::from_f32(if i == 2 { vec![1, 5] } else { vec![5] }, &[0.5, -1.0, 2.0, 0.25, i as f32]));
        let mm = g.add(format!("{name}_mm"), Op::MatMul, &[x, w]).unwrap();
        let ins = if i == 1 { [b, mm] } else { [mm, b] };
        let y = g.add(format!("{name}_bias"), Op::Binary(BinaryOp::Add), &ins).unwrap();
        outs.push(g.add(format!("{name}_relu"), Op::Unary(crate::ir::UnaryOp::Relu), &[y]).unwrap());
    }
    g.outputs = outs;
    let before = g.clone();
    assert_eq!(merge_sibling_matmuls(&mut g), 1);
    g.compact();
    verify(&g).unwrap();
    let ops: Vec<&str> = g.nodes.iter().map(|n| n.op.name()).collect();
    assert_eq!(ops.iter().filter(|&&o| o == "MatMul").count(), 1, "{ops:?}");
    assert_eq!(ops.iter().filter(|&&o| o == "Split").count(), 1, "{ops:?}");
    assert_same_outputs(&before, &g, 0.0);
}

/// What stays apart: a weight read twice, a weight that is not a constant, a biased product next to an
/// unbiased one (each then alone).
#[test]
fn only_true_siblings_merge() {
    let mut g = Graph::new("apart");
    let x = g.add_input("x", TensorType::f32([3, 4]));
    let other = g.add_input("other", TensorType::f32([4, 2]));
    let shared = weight(&mut g, "shared", 4, 2, 0.0);
    let a = g.add("a", Op::MatMul, &[x, shared]).unwrap();
    let a2 = g.add("a2", Op::MatMul, &[x, shared]).unwrap();
    let b = g.add("b", Op::MatMul, &[x, other]).unwrap();
    let w = weight(&mut g, "w", 4, 3, 1.0);
    let c = g.add("c", Op::MatMul, &[x, w]).unwrap();
    let wb = weight(&mut g, "wb", 4, 3, 2.0);
    let bias = g.add_const("bias", Tensor::from_f32([3], &[1.0, 2.0, 3.0]));
    let d = g.add("d", Op::MatMul, &[x, wb]).unwrap();
    let d = g.add("d_bias", Op::Binary(BinaryOp::Add), &[d, bias]).unwrap();
    g.outputs = vec![a, a2, b, c, d];
    assert_eq!(merge_sibling_matmuls(&mut g), 0);
}

/// Two unbiased siblings among other work merge; the graph outputs keep their names.
#[test]
fn unbiased_siblings_merge_and_outputs_keep_their_names() {
    let mut g = Graph::new("pair");
    let x = g.add_input("x", TensorType::f32([2, 3, 4]));
    let w1 = weight(&mut g, "w1", 4, 7, 0.5);
    let w2 = weight(&mut g, "w2", 4, 2, 1.5);
    let y1 = g.add("y1", Op::MatMul, &[x, w1]).unwrap();
    let y2 = g.add("y2", Op::MatMul, &[x, w2]).unwrap();
    g.outputs = vec![y1, y2];
    let before = g.clone();
    assert_eq!(merge_sibling_matmuls(&mut g), 1);
    g.compact();
    verify(&g).unwrap();
    assert_eq!(g.outputs.iter().map(|&o| g.value(o).name.as_str()).collect::<Vec<_>>(), ["y1", "y2"]);
    assert_same_outputs(&before, &g, 0.0);
}
