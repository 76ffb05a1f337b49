use super::*;
use crate::ir::{ConvAttrs, TensorType, UnaryOp};

#[test]
fn bigger_products_cost_more_and_epilogues_cost_per_element() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", TensorType::f32([128, 768]));
    let w1 = g.add_input("w1", TensorType::f32([768, 3072]));
    let w2 = g.add_input("w2", TensorType::f32([768, 768]));
    let big = g.add("big", Op::MatMul, &[x, w1]).unwrap();
    let gelu = g.add("gelu", Op::Gelu { approximate: GeluApprox::Erf }, &[big]).unwrap();
    let small = g.add("small", Op::MatMul, &[x, w2]).unwrap();
    let relu = g.add("relu", Op::Unary(UnaryOp::Relu), &[small]).unwrap();
    g.outputs.extend([gelu, relu]);
    let (big, gelu, small, relu) = (NodeId(0), NodeId(1), NodeId(2), NodeId(3));
    let (b, s) = (estimate_us(&g, &[big]), estimate_us(&g, &[small]));
    assert!(b > 3.0 * s && s > 0.0, "{b} vs {s}");
    // 2·128·768·3072 FLOPs at the nominal rate, plus one call.
    let want = 2.0 * 128.0 * 768.0 * 3072.0 / (SGEMM_GFLOPS * 1e3) + GEMM_CALL_US;
    assert!((b - want).abs() < 1e-6 * want, "{b} vs {want}");
    // An erf-GELU over 128 x 3072 elements is priced per element, fused or alone.
    let e = estimate_us(&g, &[gelu]);
    assert!((e - 128.0 * 3072.0 * EPILOGUE_ERF_NS / 1e3).abs() < 1e-6, "{e}");
    assert_eq!(estimate_us(&g, &[big, gelu]), b + e);
    assert!(estimate_us(&g, &[relu]) < estimate_us(&g, &[small]) / 10.0);
}

#[test]
fn nodes_it_cannot_run_are_infinite() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", TensorType::f32([4, 8]));
    let w = g.add_input("w", TensorType::f32([8, 8]));
    let m = g.add("m", Op::MatMul, &[x, w]).unwrap();
    let s = g.add("soft", Op::Softmax { axis: 1 }, &[m]).unwrap();
    let r = g.add("relu", Op::Unary(UnaryOp::Relu), &[x]).unwrap();
    g.outputs.extend([s, r]);
    assert!(estimate_us(&g, &[NodeId(0)]).is_finite());
    assert_eq!(estimate_us(&g, &[NodeId(0), NodeId(1)]), f64::INFINITY);
    // A Relu of a graph input has no chain to join.
    assert_eq!(estimate_us(&g, &[NodeId(2)]), f64::INFINITY);
}

#[test]
fn im2col_costs_on_top_of_the_same_gemm() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", TensorType::f32([1, 64, 56, 56]));
    let w3 = g.add_input("w3", TensorType::f32([64, 64, 3, 3]));
    let w1 = g.add_input("w1", TensorType::f32([64, 576, 1, 1]));
    let xx = g.add_input("xx", TensorType::f32([1, 576, 54, 54]));
    let a3 = ConvAttrs { strides: vec![1, 1], pads: vec![0; 4], dilations: vec![1, 1], group: 1 };
    let c3 = g.add("c3", Op::Conv(a3.clone()), &[x, w3]).unwrap();
    let c1 = g.add("c1", Op::Conv(a3), &[xx, w1]).unwrap();
    g.outputs.extend([c3, c1]);
    // Same GEMM (64 x 576 x 2916); the 3x3 one also pays for im2col.
    assert!(estimate_us(&g, &[NodeId(0)]) > estimate_us(&g, &[NodeId(1)]));
}
