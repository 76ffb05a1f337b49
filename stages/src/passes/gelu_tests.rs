use super::*;
use crate::ir::{Tensor, TensorType};
use crate::passes::simplify::testing::assert_same_outputs;

fn c(g: &mut Graph, v: f32) -> ValueId {
    g.add_const(format!("c{v}"), Tensor::scalar_f32(v))
}
fn bin(g: &mut Graph, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
    g.add("n", Op::Binary(op), &[a, b]).unwrap()
}

/// PyTorch's spelling: Div(x, 1.4142135), Erf, Add 1, Mul x, Mul 0.5.
fn erf_gelu_pytorch(sqrt2: f32) -> Graph {
    let mut g = Graph::new("gelu");
    let x = g.add_input("x", TensorType::f32([2, 8]));
    let s = c(&mut g, sqrt2);
    let d = bin(&mut g, BinaryOp::Div, x, s);
    let e = g.add("erf", Op::Unary(UnaryOp::Erf), &[d]).unwrap();
    let one = c(&mut g, 1.0);
    let t = bin(&mut g, BinaryOp::Add, e, one);
    let m = bin(&mut g, BinaryOp::Mul, x, t);
    let h = c(&mut g, 0.5);
    let y = bin(&mut g, BinaryOp::Mul, m, h);
    g.outputs.push(y);
    g
}

#[test]
fn erf_gelu_pytorch_spelling() {
    let g0 = erf_gelu_pytorch(std::f32::consts::SQRT_2);
    let mut g = g0.clone();
    assert_eq!(fuse_gelu(&mut g), 1);
    g.compact();
    assert_eq!(g.nodes.len(), 1);
    assert!(matches!(g.nodes[0].op, Op::Gelu { approximate: GeluApprox::Erf }));
    assert_same_outputs(&g0, &g, 1e-5);
}

#[test]
fn erf_gelu_with_wrong_constant_is_left_alone() {
    let mut g = erf_gelu_pytorch(1.414);
    assert_eq!(fuse_gelu(&mut g), 0);
}

/// `Mul(x, 0.70710677)` and the product as `(0.5 * x) * t`, operands swapped.
#[test]
fn erf_gelu_mul_spelling_other_association() {
    let mut g = Graph::new("gelu");
    let x = g.add_input("x", TensorType::f32([3, 4]));
    let s = c(&mut g, std::f32::consts::FRAC_1_SQRT_2);
    let d = bin(&mut g, BinaryOp::Mul, s, x);
    let e = g.add("erf", Op::Unary(UnaryOp::Erf), &[d]).unwrap();
    let one = c(&mut g, 1.0);
    let t = bin(&mut g, BinaryOp::Add, one, e);
    let h = c(&mut g, 0.5);
    let hx = bin(&mut g, BinaryOp::Mul, h, x);
    let y = bin(&mut g, BinaryOp::Mul, t, hx);
    g.outputs.push(y);
    let g0 = g.clone();
    assert_eq!(fuse_gelu(&mut g), 1);
    g.compact();
    assert_eq!(g.nodes.len(), 1);
    assert_same_outputs(&g0, &g, 1e-5);
}

/// An intermediate with another use blocks the rewrite (it would have to be recomputed).
#[test]
fn shared_intermediate_blocks_the_rewrite() {
    let mut g = erf_gelu_pytorch(std::f32::consts::SQRT_2);
    let erf_out = g.nodes[1].outputs[0];
    g.outputs.push(erf_out);
    assert_eq!(fuse_gelu(&mut g), 0);
}

fn tanh_gelu(pow: bool, k: f32) -> Graph {
    let mut g = Graph::new("gelu_new");
    let x = g.add_input("x", TensorType::f32([2, 5]));
    let cube = if pow {
        let three = c(&mut g, 3.0);
        bin(&mut g, BinaryOp::Pow, x, three)
    } else {
        let sq = bin(&mut g, BinaryOp::Mul, x, x);
        bin(&mut g, BinaryOp::Mul, sq, x)
    };
    let kc = c(&mut g, k);
    let m = bin(&mut g, BinaryOp::Mul, kc, cube);
    let inner = bin(&mut g, BinaryOp::Add, x, m);
    let s = c(&mut g, 0.797_884_6);
    let a = bin(&mut g, BinaryOp::Mul, s, inner);
    let th = g.add("tanh", Op::Unary(UnaryOp::Tanh), &[a]).unwrap();
    let one = c(&mut g, 1.0);
    let t = bin(&mut g, BinaryOp::Add, one, th);
    let h = c(&mut g, 0.5);
    let hx = bin(&mut g, BinaryOp::Mul, h, x);
    let y = bin(&mut g, BinaryOp::Mul, hx, t);
    g.outputs.push(y);
    g
}

#[test]
fn tanh_gelu_gpt2_spellings() {
    for pow in [true, false] {
        let g0 = tanh_gelu(pow, 0.044715);
        let mut g = g0.clone();
        assert_eq!(fuse_gelu(&mut g), 1, "pow={pow}");
        g.compact();
        assert_eq!(g.nodes.len(), 1);
        assert!(matches!(g.nodes[0].op, Op::Gelu { approximate: GeluApprox::Tanh }));
        assert_same_outputs(&g0, &g, 1e-5);
    }
    let mut g = tanh_gelu(true, 0.04);
    assert_eq!(fuse_gelu(&mut g), 0, "a wrong cubic coefficient must not match");
}
