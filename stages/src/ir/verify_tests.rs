use super::*;
use crate::ir::{DType, Op, TensorType, UnaryOp};

#[test]
fn two_different_outputs_of_one_name_are_rejected_an_alias_is_not() {
    let mut g = Graph::new("g");
    let x = g.add_input("x", TensorType::new(DType::F32, vec![3]));
    let a = g.add_node("y", Op::Unary(UnaryOp::Relu), &[x]).unwrap()[0];
    let b = g.add_node("y", Op::Unary(UnaryOp::Neg), &[x]).unwrap()[0];
    g.outputs = vec![a, a];
    verify(&g).unwrap();
    g.outputs = vec![a, b];
    let e = verify(&g).unwrap_err().to_string();
    assert!(e.contains("graph outputs 0 and 1 are different values both named 'y'"), "{e}");
}
