use super::*;
use crate::ir::TensorType;
use crate::passes::simplify::testing::assert_same_outputs;

fn bin(g: &mut Graph, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
    g.add("n", Op::Binary(op), &[a, b]).unwrap()
}

/// The PyTorch (pre-opset-17) export of nn.LayerNorm over the last axis.
fn decomposed(exponent: f32, eps: f32, with_affine: bool, reciprocal: bool) -> Graph {
    let mut g = Graph::new("ln");
    let x = g.add_input("x", TensorType::f32([2, 3, 16]));
    let mean_op = Op::Reduce { kind: ReduceKind::Mean, axes: vec![2], keepdims: true };
    let mean = g.add("mean", mean_op.clone(), &[x]).unwrap();
    let d = bin(&mut g, BinaryOp::Sub, x, mean);
    let two = g.add_const("two", Tensor::scalar_f32(exponent));
    let sq = bin(&mut g, BinaryOp::Pow, d, two);
    let var = g.add("var", mean_op, &[sq]).unwrap();
    let e = g.add_const("eps", Tensor::scalar_f32(eps));
    let ve = bin(&mut g, BinaryOp::Add, var, e);
    let s = g.add("sqrt", Op::Unary(UnaryOp::Sqrt), &[ve]).unwrap();
    let n = if reciprocal {
        let r = g.add("rcp", Op::Unary(UnaryOp::Reciprocal), &[s]).unwrap();
        bin(&mut g, BinaryOp::Mul, d, r)
    } else {
        bin(&mut g, BinaryOp::Div, d, s)
    };
    let y = if with_affine {
        let scale: Vec<f32> = (0..16).map(|i| 0.5 + i as f32 * 0.1).collect();
        let bias: Vec<f32> = (0..16).map(|i| i as f32 * -0.05).collect();
        let sc = g.add_const("scale", Tensor::from_f32([16], &scale));
        let b = g.add_const("bias", Tensor::from_f32([16], &bias));
        let m = bin(&mut g, BinaryOp::Mul, n, sc);
        bin(&mut g, BinaryOp::Add, m, b)
    } else {
        n
    };
    g.outputs.push(y);
    g
}

#[test]
fn decomposed_layernorm_becomes_one_op() {
    for (affine, rcp) in [(true, false), (false, false), (true, true)] {
        let g0 = decomposed(2.0, 1e-5, affine, rcp);
        let mut g = g0.clone();
        assert_eq!(fuse_layernorm(&mut g), 1, "affine={affine} reciprocal={rcp}");
        g.compact();
        crate::ir::verify(&g).unwrap();
        assert_eq!(g.nodes.len(), 1);
        assert!(matches!(g.nodes[0].op, Op::LayerNorm { axis: 2, epsilon } if epsilon == 1e-5));
        assert_same_outputs(&g0, &g, 1e-5);
    }
}

#[test]
fn wrong_exponent_or_eps_does_not_match() {
    assert_eq!(fuse_layernorm(&mut decomposed(3.0, 1e-5, true, false)), 0);
    assert_eq!(fuse_layernorm(&mut decomposed(2.0, -1.0, true, false)), 0);
}

#[test]
fn non_trailing_axes_do_not_match() {
    let mut g = Graph::new("ln");
    let x = g.add_input("x", TensorType::f32([2, 3, 4]));
    let mean_op = Op::Reduce { kind: ReduceKind::Mean, axes: vec![1], keepdims: true };
    let mean = g.add("mean", mean_op.clone(), &[x]).unwrap();
    let d = bin(&mut g, BinaryOp::Sub, x, mean);
    let sq = bin(&mut g, BinaryOp::Mul, d, d);
    let var = g.add("var", mean_op, &[sq]).unwrap();
    let e = g.add_const("eps", Tensor::scalar_f32(1e-5));
    let ve = bin(&mut g, BinaryOp::Add, var, e);
    let s = g.add("sqrt", Op::Unary(UnaryOp::Sqrt), &[ve]).unwrap();
    let y = bin(&mut g, BinaryOp::Div, d, s);
    g.outputs.push(y);
    assert_eq!(fuse_layernorm(&mut g), 0);
}
