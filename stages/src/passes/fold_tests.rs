use super::*;
use crate::interp::run_graph;
use crate::ir::*;

/// A typical exported shape computation: reshape x [2, 3, 4] to [x.shape[0], -1] through constants.
fn shape_graph() -> (Graph, ValueId) {
    let mut g = Graph::new("shapes");
    let x = g.add_input("x", TensorType::f32([2, 3, 4]));
    let shape = g.add_const("shape", Tensor::from_i64(vec![3], &[2, 3, 4]));
    let first = g.add_const("zero", Tensor::from_i64(vec![1], &[0]));
    let d0 = g.add("d0", Op::Gather { axis: 0 }, &[shape, first]).unwrap();
    let rest = g.add("rest", Op::Slice { axes: vec![0], starts: vec![1], ends: vec![3], steps: vec![1] }, &[shape]).unwrap();
    let prod = g.add("prod", Op::Reduce { kind: ReduceKind::Sum, axes: vec![0], keepdims: true }, &[rest]).unwrap();
    let target = g.add("target", Op::Concat { axis: 0 }, &[d0, prod]).unwrap();
    let y = g.add("y", Op::Reshape { shape: vec![2, 12] }, &[x]).unwrap();
    let w = g.add_const("w", Tensor::from_f32(vec![2, 2], &[1., 2., 3., 4.]));
    let wt = g.add("wt", Op::Transpose { perm: vec![1, 0] }, &[w]).unwrap();
    g.outputs.extend([y, target, wt]);
    (g, x)
}

#[test]
fn folds_shape_subgraphs_and_keeps_names() {
    let (mut g, _) = shape_graph();
    let before = run_graph(&g, &[Tensor::from_f32(vec![2, 3, 4], &[1.; 24])]).unwrap();
    let n = fold_constants(&mut g).unwrap();
    assert_eq!(n, 5); // d0, rest, prod, target, wt
    verify(&g).unwrap();
    assert_eq!(g.nodes.len(), 1);
    let target = g.outputs[1];
    assert_eq!(g.value(target).name, "target");
    assert_eq!(g.constant(target).unwrap().to_i64_vec(), vec![2, 7]);
    assert_eq!(g.constant(g.outputs[2]).unwrap().to_f32_vec(), vec![1., 3., 2., 4.]);
    let after = run_graph(&g, &[Tensor::from_f32(vec![2, 3, 4], &[1.; 24])]).unwrap();
    assert_eq!(before, after);
    // A second run finds nothing left.
    assert_eq!(fold_constants(&mut g).unwrap(), 0);
}

#[test]
fn keeps_large_expansions_of_small_constants() {
    let mut g = Graph::new("grow");
    let one = g.add_const("one", Tensor::from_f32(vec![1], &[1.0]));
    let big = g.add("big", Op::Expand { shape: vec![1024, 1025] }, &[one]).unwrap();
    let small = g.add("small", Op::Expand { shape: vec![1024, 1024] }, &[one]).unwrap();
    g.outputs.extend([big, small]);
    assert_eq!(fold_constants(&mut g).unwrap(), 1);
    assert_eq!(g.nodes.len(), 1);
    assert!(matches!(g.nodes[0].op, Op::Expand { .. }));
    assert!(g.constant(g.outputs[1]).is_some());
    assert!(worth_folding(4_000_000, 4_000_000));
    assert!(!worth_folding(1, FOLD_MAX_GROWN_ELEMENTS + 1));
}

#[test]
fn an_error_names_the_node() {
    let mut g = Graph::new("bad");
    let data = g.add_const("data", Tensor::from_i64(vec![2], &[1, 2]));
    let idx = g.add_const("idx", Tensor::from_i64(vec![1], &[7]));
    let y = g.add("pick", Op::Gather { axis: 0 }, &[data, idx]).unwrap();
    g.outputs.push(y);
    let e = fold_constants(&mut g).unwrap_err().to_string();
    assert!(e.contains("'bad'") && e.contains("node 'pick' (Gather)") && e.contains("index 7"), "{e}");
}
