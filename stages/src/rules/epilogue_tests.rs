use super::*;
use crate::ir::TensorType;

#[test]
fn classify_add_shapes() {
    use AnchorKind::*;
    let s = [2, 3, 4];
    assert_eq!(classify_add(MatMul, &s, &[2, 3, 4]), Some((1, 24)));
    assert_eq!(classify_add(MatMul, &s, &[4]), Some((1, 4)));
    assert_eq!(classify_add(MatMul, &s, &[1, 1, 4]), Some((1, 4)));
    assert_eq!(classify_add(MatMul, &s, &[1]), Some((1, 1)));
    assert_eq!(classify_add(MatMul, &s, &[]), Some((1, 1)));
    assert_eq!(classify_add(MatMul, &s, &[3, 1]), None);
    assert_eq!(classify_add(MatMul, &s, &[3, 4]), None);
    assert_eq!(classify_add(MatMul, &s, &[1, 2, 3, 4]), None);
    let c = [2, 8, 5, 5];
    assert_eq!(classify_add(Conv, &c, &[8, 1, 1]), Some((25, 8)));
    assert_eq!(classify_add(Conv, &c, &[1, 8, 1, 1]), Some((25, 8)));
    assert_eq!(classify_add(Conv, &c, &[8]), None, "[8] aligns with the last axis, not channels");
    let l = [2, 5, 5, 8];
    assert_eq!(classify_add(NhwcConv, &l, &[8]), Some((1, 8)), "channels-last: the bias runs along the last axis");
    assert_eq!(classify_add(NhwcConv, &l, &[8, 1, 1]), None);
    assert_eq!(classify_add(Conv, &c, &[1, 8, 5, 1]), None);
}

#[test]
fn residual_add_of_two_matmuls_fuses_into_the_first() {
    let mut g = Graph::new("t");
    let a = g.add_input("a", TensorType::f32([4, 3]));
    let b = g.add_input("b", TensorType::f32([3, 5]));
    let m1 = g.add("m1", Op::MatMul, &[a, b]).unwrap();
    let m2 = g.add("m2", Op::MatMul, &[a, b]).unwrap();
    let s = g.add("s", Op::Binary(BinaryOp::Add), &[m1, m2]).unwrap();
    g.outputs.push(s);
    let f = fusion(&g, NodeId(2), &|v| uses_in(&g, v)).unwrap();
    assert_eq!(f, Fusion::Add { input: m1, other: m2, inner: 1, count: 20 });
}
