use super::*;
use crate::ir::{ConvAttrs, TensorType};
use crate::passes::simplify::testing::assert_same_outputs;

fn conv_bn(with_bias: bool, conv_is_output: bool) -> Graph {
    let mut g = Graph::new("cbn");
    let x = g.add_input("x", TensorType::f32([1, 3, 6, 6]));
    let wv: Vec<f32> = (0..4 * 3 * 3 * 3).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.1).collect();
    let w = g.add_const("w", Tensor::from_f32([4, 3, 3, 3], &wv));
    let attrs = ConvAttrs { strides: vec![1, 1], pads: vec![1, 1, 1, 1], dilations: vec![1, 1], group: 1 };
    let mut ins = vec![x, w];
    if with_bias {
        ins.push(g.add_const("b", Tensor::from_f32([4], &[0.1, -0.2, 0.3, 0.0])));
    }
    let c = g.add("conv", Op::Conv(attrs), &ins).unwrap();
    let p = |g: &mut Graph, n: &str, v: [f32; 4]| g.add_const(n, Tensor::from_f32([4], &v));
    let gamma = p(&mut g, "gamma", [1.0, 0.5, 2.0, -1.0]);
    let beta = p(&mut g, "beta", [0.0, 0.1, -0.3, 0.2]);
    let mean = p(&mut g, "mean", [0.05, -0.1, 0.2, 0.0]);
    let var = p(&mut g, "var", [1.0, 0.25, 4.0, 0.5]);
    let y = g.add("bn", Op::BatchNorm { epsilon: 1e-5 }, &[c, gamma, beta, mean, var]).unwrap();
    g.outputs.push(y);
    if conv_is_output {
        g.outputs.push(c);
    }
    g
}

#[test]
fn folds_with_and_without_conv_bias() {
    for bias in [true, false] {
        let g0 = conv_bn(bias, false);
        let mut g = g0.clone();
        assert_eq!(fold_batchnorm_into_conv(&mut g), 1);
        g.compact();
        crate::ir::verify(&g).unwrap();
        assert_eq!(g.nodes.len(), 1);
        assert!(matches!(g.nodes[0].op, Op::Conv(_)));
        assert_same_outputs(&g0, &g, 1e-5);
    }
}

#[test]
fn conv_output_with_another_use_is_not_folded() {
    let mut g = conv_bn(true, true);
    assert_eq!(fold_batchnorm_into_conv(&mut g), 0);
}

/// conv -> bn -> conv -> bn: the second fold reads the first one's output, so no BatchNorm may survive.
#[test]
fn chained_folds_leave_no_batchnorm() {
    let mut g = Graph::new("chain");
    let x = g.add_input("x", TensorType::f32([1, 4, 5, 5]));
    let attrs = ConvAttrs { strides: vec![1, 1], pads: vec![1; 4], dilations: vec![1, 1], group: 1 };
    let mut v = x;
    for layer in 0..2 {
        let w: Vec<f32> = (0..4 * 4 * 9).map(|i| ((i * 7 + layer) % 11) as f32 / 11.0 - 0.5).collect();
        let w = g.add_const(format!("w{layer}"), Tensor::from_f32([4, 4, 3, 3], &w));
        let c = g.add(format!("conv{layer}"), Op::Conv(attrs.clone()), &[v, w]).unwrap();
        let p = |g: &mut Graph, n: &str, v: [f32; 4]| g.add_const(format!("{n}{layer}"), Tensor::from_f32([4], &v));
        let gamma = p(&mut g, "gamma", [1.0, 0.5, 2.0, -1.0]);
        let beta = p(&mut g, "beta", [0.0, 0.1, -0.3, 0.2]);
        let mean = p(&mut g, "mean", [0.05, -0.1, 0.2, 0.0]);
        let var = p(&mut g, "var", [1.0, 0.25, 4.0, 0.5]);
        v = g.add(format!("bn{layer}"), Op::BatchNorm { epsilon: 1e-5 }, &[c, gamma, beta, mean, var]).unwrap();
    }
    g.outputs.push(v);
    let g0 = g.clone();
    assert_eq!(fold_batchnorm_into_conv(&mut g), 2);
    g.compact();
    crate::ir::verify(&g).unwrap();
    assert!(g.nodes.iter().all(|n| matches!(n.op, Op::Conv(_))), "{:?}", g.nodes.iter().map(|n| n.op.name()).collect::<Vec<_>>());
    assert_eq!(g.nodes.len(), 2);
    assert_same_outputs(&g0, &g, 1e-5);
}
