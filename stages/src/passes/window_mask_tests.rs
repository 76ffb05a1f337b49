use super::*;
use crate::interp::random_tensor;
use crate::ir::TensorType;
use crate::passes::simplify::testing::assert_same_outputs;

/// Scores `[a * b, heads, n, n]` plus a mask `m` added in the view `[a, b, heads, n, n]`, as Swin's shifted
/// windows do, then a Softmax (so the result is read by something else than the Reshape).
fn split_add(a: usize, b: usize, mask: &[usize], constant: bool) -> Graph {
    let (heads, n) = (2, 4);
    let mut g = Graph::new("window_mask");
    let x = g.add_input("x", TensorType::f32([a * b, heads, n, n]));
    let m = if constant {
        g.add_const("m", random_tensor(&TensorType::f32(mask.to_vec()), 7, 1, 0))
    } else {
        g.add_input("m", TensorType::f32(mask.to_vec()))
    };
    let v = g.add("split", Op::Reshape { shape: vec![a, b, heads, n, n] }, &[x]).unwrap();
    let s = g.add("add", Op::Binary(BinaryOp::Add), &[v, m]).unwrap();
    let y = g.add("back", Op::Reshape { shape: vec![a * b, heads, n, n] }, &[s]).unwrap();
    let p = g.add("softmax", Op::Softmax { axis: 3 }, &[y]).unwrap();
    g.outputs.push(p);
    g
}

fn rewrites(a: usize, b: usize, mask: &[usize], constant: bool) {
    let g0 = split_add(a, b, mask, constant);
    let mut g = g0.clone();
    assert_eq!(unsplit_masked_adds(&mut g), 1, "{a}x{b}, mask {mask:?}");
    g.compact();
    // The Softmax reads the Add directly now.
    let softmax = g.nodes.iter().find(|n| matches!(n.op, Op::Softmax { .. })).unwrap();
    let add = g.producer(softmax.inputs[0]).unwrap();
    assert!(matches!(g.node(add).op, Op::Binary(BinaryOp::Add)), "{a}x{b}, mask {mask:?}");
    assert_same_outputs(&g0, &g, 1e-6);
}

#[test]
fn swin_batch_one_constant_mask() {
    // torchvision's Swin at batch 1: windows 4, the mask [windows, 1, n, n] unsqueezed to the view's rank.
    rewrites(1, 4, &[1, 4, 1, 4, 4], true);
    rewrites(1, 4, &[4, 1, 4, 4], true);
}

#[test]
fn batches_of_windows_and_computed_masks() {
    rewrites(3, 4, &[1, 4, 1, 4, 4], true);
    rewrites(3, 4, &[4, 1, 4, 4], false);
    // A mask that varies over the outer split too, and one over the keys only.
    rewrites(3, 4, &[3, 4, 2, 4, 4], false);
    rewrites(2, 2, &[4], true);
}

#[test]
fn other_reshapes_are_left_alone() {
    // The outer Reshape does not restore x's shape.
    let mut g = Graph::new("other");
    let x = g.add_input("x", TensorType::f32([4, 2, 3]));
    let m = g.add_input("m", TensorType::f32([2, 1, 1, 3]));
    let v = g.add("split", Op::Reshape { shape: vec![2, 2, 2, 3] }, &[x]).unwrap();
    let s = g.add("add", Op::Binary(BinaryOp::Add), &[v, m]).unwrap();
    let y = g.add("back", Op::Reshape { shape: vec![8, 3] }, &[s]).unwrap();
    g.outputs.push(y);
    assert_eq!(unsplit_masked_adds(&mut g), 0);
    // A mask that would widen the split view.
    let mut g = split_add(1, 4, &[1, 4, 1, 4, 4], false);
    let m = g.inputs[1];
    g.values[m.index()].ty = TensorType::f32([2, 4, 1, 4, 4]);
    assert_eq!(unsplit_masked_adds(&mut g), 0);
}
