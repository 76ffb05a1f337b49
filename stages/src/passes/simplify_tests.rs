use super::testing::assert_same_outputs;
use super::*;
use crate::ir::{Tensor, TensorType};

#[test]
fn identities_go_but_named_outputs_stay() {
    let mut g = Graph::new("id");
    let x = g.add_input("x", TensorType::f32([2]));
    let a = g.add("a", Op::Identity, &[x]).unwrap();
    let b = g.add("b", Op::Unary(crate::ir::UnaryOp::Relu), &[a]).unwrap();
    let c = g.add("c", Op::Identity, &[b]).unwrap();
    let d = g.add("d", Op::Identity, &[x]).unwrap();
    g.outputs.extend([c, d]);
    let g0 = g.clone();
    assert_eq!(remove_identities(&mut g), 2);
    g.compact();
    verify(&g).unwrap();
    // The Relu now produces the first output and took its name; input -> output Identity stays.
    assert_eq!(g.nodes.len(), 2);
    assert_eq!(g.value(g.outputs[0]).name, "c");
    assert_eq!(g.value(g.outputs[1]).name, "d");
    assert_same_outputs(&g0, &g, 0.0);
}

/// GPT-2's Conv1D (rows flattened, GEMM and bias, rows back) before a residual add, and a chain of two
/// Reshapes after a bare MatMul (MultiheadAttention's out-projection): both become batched MatMuls the add
/// reads directly. A Reshape that regroups columns, or a MatMul output used twice, stays.
#[test]
fn matmuls_reshaped_to_split_rows_become_batched() {
    use crate::ir::BinaryOp;
    let mut g = Graph::new("conv1d");
    let x = g.add_input("x", TensorType::f32([2, 3, 4]));
    let w = g.add_const("w", Tensor::from_f32([4, 5], &(0..20).map(|i| i as f32 * 0.1).collect::<Vec<_>>()));
    let b = g.add_const("b", Tensor::from_f32([5], &[0.5, -0.5, 1.0, 0.0, 2.0]));
    let res = g.add_input("res", TensorType::f32([2, 3, 5]));
    let flat = g.add("flat", Op::Reshape { shape: vec![6, 4] }, &[x]).unwrap();
    let mm = g.add("mm", Op::MatMul, &[flat, w]).unwrap();
    let y = g.add("bias", Op::Binary(BinaryOp::Add), &[b, mm]).unwrap();
    let back = g.add("back", Op::Reshape { shape: vec![2, 3, 5] }, &[y]).unwrap();
    let out = g.add("residual", Op::Binary(BinaryOp::Add), &[back, res]).unwrap();
    // A bare MatMul reshaped twice, then added.
    let mm2 = g.add("mm2", Op::MatMul, &[flat, w]).unwrap();
    let r1 = g.add("r1", Op::Reshape { shape: vec![6, 1, 5] }, &[mm2]).unwrap();
    let r2 = g.add("r2", Op::Reshape { shape: vec![1, 6, 5] }, &[r1]).unwrap();
    let res2 = g.add_input("res2", TensorType::f32([1, 6, 5]));
    let out2 = g.add("residual2", Op::Binary(BinaryOp::Add), &[r2, res2]).unwrap();
    // Columns regrouped: stays.
    let mm3 = g.add("mm3", Op::MatMul, &[flat, w]).unwrap();
    let cols = g.add("cols", Op::Reshape { shape: vec![3, 10] }, &[mm3]).unwrap();
    g.outputs.extend([out, out2, cols]);
    let g0 = g.clone();
    assert_eq!(batch_matmul_rows(&mut g), 2);
    g.compact();
    verify(&g).unwrap();
    for name in ["residual", "residual2"] {
        let add = g.nodes.iter().find(|n| n.name == name).unwrap();
        let producers: Vec<&str> = add.inputs.iter().filter_map(|&v| g.producer(v)).map(|p| g.node(p).op.name()).collect();
        assert!(producers.contains(&"Add") || producers.contains(&"MatMul"), "{name}: {producers:?}");
        assert!(!producers.contains(&"Reshape"), "{name}: {producers:?}");
    }
    assert!(g.nodes.iter().any(|n| n.name == "cols"), "a column regrouping stays");
    assert_same_outputs(&g0, &g, 1e-6);
}

/// Flatten-then-restore around an op disappears; a chain ending in a new shape becomes one Reshape; a
/// Reshape writing a graph output stays (with its name).
#[test]
fn reshape_chains_collapse() {
    let mut g = Graph::new("reshapes");
    let x = g.add_input("x", TensorType::f32([1, 4, 6]));
    let e = g.add("exp", Op::Unary(crate::ir::UnaryOp::Exp), &[x]).unwrap();
    let flat = g.add("flat", Op::Reshape { shape: vec![4, 6] }, &[e]).unwrap();
    let back = g.add("back", Op::Reshape { shape: vec![1, 4, 6] }, &[flat]).unwrap();
    let n = g.add("neg", Op::Unary(crate::ir::UnaryOp::Neg), &[back]).unwrap();
    let r1 = g.add("r1", Op::Reshape { shape: vec![24] }, &[n]).unwrap();
    let r2 = g.add("r2", Op::Reshape { shape: vec![2, 12] }, &[r1]).unwrap();
    let same = g.add("same", Op::Reshape { shape: vec![1, 4, 6] }, &[n]).unwrap();
    g.outputs = vec![r2, same];
    let before = g.clone();
    assert_eq!(collapse_reshapes(&mut g), 2);
    g.compact();
    verify(&g).unwrap();
    let ops: Vec<&str> = g.nodes.iter().map(|n| n.op.name()).collect();
    assert_eq!(ops, ["Exp", "Neg", "Reshape", "Reshape"], "{ops:?}");
    let neg = g.nodes.iter().find(|n| n.name == "neg").unwrap();
    assert_eq!(g.producer(neg.inputs[0]).map(|p| g.node(p).name.as_str()), Some("exp"));
    assert_eq!(g.outputs.iter().map(|&o| g.value(o).name.as_str()).collect::<Vec<_>>(), ["r2", "same"]);
    assert_same_outputs(&before, &g, 0.0);
}

#[test]
fn casts_to_the_same_dtype_go() {
    let mut g = Graph::new("cast");
    let x = g.add_input("x", TensorType::f32([2]));
    let a = g.add("same", Op::Cast { to: crate::ir::DType::F32 }, &[x]).unwrap();
    let b = g.add("exp", Op::Unary(crate::ir::UnaryOp::Exp), &[a]).unwrap();
    let c = g.add("to_i64", Op::Cast { to: crate::ir::DType::I64 }, &[b]).unwrap();
    g.outputs.push(c);
    let g0 = g.clone();
    assert_eq!(remove_identities(&mut g), 1, "only the cast that changes nothing");
    g.compact();
    assert_eq!(g.nodes.iter().map(|n| n.op.name()).collect::<Vec<_>>(), ["Exp", "Cast"]);
    assert_same_outputs(&g0, &g, 0.0);
}

#[test]
fn transposed_weight_is_folded() {
    let mut g = Graph::new("gemm");
    let x = g.add_input("x", TensorType::f32([2, 3]));
    let w = g.add_const("w", Tensor::from_f32([4, 3], &(0..12).map(|i| i as f32).collect::<Vec<_>>()));
    let wt = g.add("wt", Op::Transpose { perm: vec![1, 0] }, &[w]).unwrap();
    let y = g.add("mm", Op::MatMul, &[x, wt]).unwrap();
    g.outputs.push(y);
    let g0 = g.clone();
    let r = simplify(&mut g).unwrap();
    assert_eq!(r.transposes, 1);
    assert_eq!(g.nodes.len(), 1);
    assert_eq!(g.ty(g.nodes[0].inputs[1]).shape, vec![3, 4]);
    assert_same_outputs(&g0, &g, 0.0);
}

#[test]
fn transposes_of_size_one_axes_become_reshapes() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", TensorType::f32(vec![1, 5, 1, 6]));
    // [1,5,1,6] -> [5,1,6,1]: the 5 and the 6 keep their order: a relabelling.
    let a = g.add("a", Op::Transpose { perm: vec![1, 0, 3, 2] }, &[x]).unwrap();
    // [5,1,6,1] -> [6,5,1,1]: a real transpose, kept.
    let b = g.add("b", Op::Transpose { perm: vec![2, 0, 1, 3] }, &[a]).unwrap();
    let c = g.add("c", Op::Unary(crate::ir::UnaryOp::Neg), &[b]).unwrap();
    g.outputs = vec![c];
    let before = g.clone();
    assert_eq!(transposes_as_reshapes(&mut g), 1);
    g.compact();
    let ops: Vec<&str> = g.nodes.iter().map(|n| n.op.name()).collect();
    assert_eq!(ops, ["Reshape", "Transpose", "Neg"]);
    assert_same_outputs(&before, &g, 0.0);
}

#[test]
fn simplify_verifies_and_reports() {
    let mut g = Graph::new("empty");
    let x = g.add_input("x", TensorType::f32([1]));
    let y = g.add("y", Op::Unary(crate::ir::UnaryOp::Exp), &[x]).unwrap();
    g.outputs.push(y);
    assert_eq!(simplify(&mut g).unwrap(), SimplifyReport::default());
}
