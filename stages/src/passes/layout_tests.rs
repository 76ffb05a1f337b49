//! Tests of [`super::to_channels_last`]: a residual network's chain stays channels-last between one transpose in
//! and one out, the interface keeps its names and types, and the reference gives the same outputs before and
//! after, on a fixed network and on random convolution chains.

use super::*;
use crate::interp::{random_inputs, run_graph, random_tensor};
use crate::ir::{BinaryOp, ConvAttrs, PoolAttrs, Tensor, TensorType, UnaryOp};
use proptest::prelude::*;

fn conv_attrs(stride: usize, pad: usize, dilation: usize, group: usize) -> ConvAttrs {
    ConvAttrs { strides: vec![stride; 2], pads: vec![pad; 4], dilations: vec![dilation; 2], group }
}

/// A constant of `shape` with seeded random values.
fn weight(g: &mut Graph, name: &str, shape: &[usize], seed: u64) -> ValueId {
    let t = random_tensor(&TensorType::f32(shape.to_vec()), seed, 0, 0);
    g.add_const(name, t)
}

fn conv(g: &mut Graph, name: &str, x: ValueId, cout: usize, k: usize, a: ConvAttrs, bias: bool, seed: u64) -> ValueId {
    let cin = g.ty(x).shape[1];
    let w = weight(g, &format!("{name}.w"), &[cout, cin / a.group, k, k], seed);
    let mut ins = vec![x, w];
    if bias {
        ins.push(weight(g, &format!("{name}.b"), &[cout], seed + 1));
    }
    g.add(name, Op::Conv(a), &ins).unwrap()
}

fn relu(g: &mut Graph, name: &str, x: ValueId) -> ValueId {
    g.add(name, Op::Unary(UnaryOp::Relu), &[x]).unwrap()
}

/// Stem conv, max pool, a residual block, a per-channel scale (a `[C, 1, 1]` constant), global average pool,
/// flatten and a classifier: ResNet's shape in miniature.
fn resnet_like() -> Graph {
    let mut g = Graph::new("resnet_like");
    let x = g.add_input("image", TensorType::f32([2, 3, 12, 12]));
    let s = conv(&mut g, "stem", x, 8, 3, conv_attrs(2, 1, 1, 1), true, 10);
    let s = relu(&mut g, "stem.relu", s);
    let pool = PoolAttrs { kernel: vec![3, 3], strides: vec![2, 2], pads: vec![1; 4], dilations: vec![1, 1], ceil_mode: false };
    let p = g.add("pool", Op::MaxPool(pool), &[s]).unwrap();
    let c1 = conv(&mut g, "c1", p, 8, 3, conv_attrs(1, 1, 1, 1), true, 20);
    let r1 = relu(&mut g, "c1.relu", c1);
    let c2 = conv(&mut g, "c2", r1, 8, 3, conv_attrs(1, 1, 1, 2), false, 30);
    let sum = g.add("residual", Op::Binary(BinaryOp::Add), &[c2, p]).unwrap();
    let scale = weight(&mut g, "scale", &[8, 1, 1], 40);
    let scaled = g.add("scaled", Op::Binary(BinaryOp::Mul), &[sum, scale]).unwrap();
    let out = relu(&mut g, "block.relu", scaled);
    let gap = g.add("gap", Op::GlobalAveragePool, &[out]).unwrap();
    let flat = g.add("flatten", Op::Reshape { shape: vec![2, 8] }, &[gap]).unwrap();
    let fc = weight(&mut g, "fc", &[8, 5], 50);
    let logits = g.add("logits", Op::MatMul, &[flat, fc]).unwrap();
    g.outputs.push(logits);
    g.outputs.push(p);
    g
}

/// The outputs of both graphs on the same random inputs agree within `tol` of the largest magnitude.
fn assert_same(before: &Graph, after: &Graph, tol: f64) {
    for seed in [1, 2, 3] {
        let inputs = random_inputs(before, seed);
        let a = run_graph(before, &inputs).expect("channels-first graph runs");
        let b = run_graph(after, &inputs).expect("channels-last graph runs");
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.ty, y.ty);
            let (x, y) = (x.to_f64_vec(), y.to_f64_vec());
            let scale = x.iter().fold(1.0f64, |m, v| m.max(v.abs()));
            for (i, (p, q)) in x.iter().zip(&y).enumerate() {
                assert!(!q.is_nan() && (p - q).abs() <= tol * scale, "element {i}: {p} vs {q} (tolerance {tol} x {scale})");
            }
        }
    }
}

fn count(g: &Graph, name: &str) -> usize {
    g.nodes.iter().filter(|n| n.op.name() == name).count()
}

#[test]
fn a_residual_network_runs_channels_last_between_one_transpose_in_and_one_out() {
    let g = resnet_like();
    let h = to_channels_last(&g).unwrap();
    crate::ir::verify(&h).unwrap();
    assert_eq!((count(&h, "Conv"), count(&h, "NhwcConv"), count(&h, "MaxPool"), count(&h, "NhwcMaxPool")), (0, 3, 0, 1));
    // In: the image. Out: the pooled features (before flatten) and the pool's output, which is a graph output.
    assert_eq!(count(&h, "Transpose"), 3, "{:?}", h.nodes.iter().map(|n| (&n.name, n.op.name())).collect::<Vec<_>>());
    // Weights are permuted at compile time, not by nodes.
    let w = h.values.iter().find(|v| v.name == "c1.w.nhwc").expect("c1's weight channels-last");
    assert_eq!(w.ty.shape, [8, 3, 3, 8]);
    let s = h.values.iter().find(|v| v.name == "scale.nhwc").expect("the per-channel scale channels-last");
    assert_eq!(s.ty.shape, [1, 1, 1, 8]);
    // The interface: same names, same types.
    for (a, b) in g.inputs.iter().chain(&g.outputs).zip(h.inputs.iter().chain(&h.outputs)) {
        assert_eq!((&g.value(*a).name, &g.value(*a).ty), (&h.value(*b).name, &h.value(*b).ty));
    }
    assert_same(&g, &h, 1e-6);
}

#[test]
fn graphs_without_a_2d_convolution_come_back_unchanged() {
    let mut g = Graph::new("mlp");
    let x = g.add_input("x", TensorType::f32([2, 3, 4, 5]));
    let y = relu(&mut g, "r", x);
    g.outputs.push(y);
    let h = to_channels_last(&g).unwrap();
    assert_eq!(h.nodes.len(), 1);
    assert!(matches!(h.nodes[0].op, Op::Unary(UnaryOp::Relu)));
}

#[test]
fn a_lower_rank_operand_that_is_not_a_constant_keeps_its_node_channels_first() {
    let mut g = Graph::new("bias_input");
    let x = g.add_input("x", TensorType::f32([1, 4, 6, 6]));
    let b = g.add_input("b", TensorType::f32([4, 1, 1]));
    let c = conv(&mut g, "c", x, 4, 1, conv_attrs(1, 0, 1, 1), true, 3);
    let y = g.add("add", Op::Binary(BinaryOp::Add), &[c, b]).unwrap();
    g.outputs.push(y);
    let h = to_channels_last(&g).unwrap();
    let add = h.nodes.iter().find(|n| n.name == "add").unwrap();
    assert_eq!(h.ty(add.inputs[0]).shape, [1, 4, 6, 6], "the Add reads the conv channels-first");
    assert_same(&g, &h, 0.0);
}

#[test]
fn the_reference_runs_channels_last_ops_as_their_channels_first_twins() {
    let x = random_tensor(&TensorType::f32([1, 5, 5, 4]), 1, 0, 0);
    let w = random_tensor(&TensorType::f32([6, 3, 3, 2]), 2, 0, 0);
    let b = Tensor::from_f32([6], &[0.5; 6]);
    let a = conv_attrs(2, 1, 1, 2);
    let y = eval_op(&Op::NhwcConv(a.clone()), &[&x, &w, &b]).unwrap().remove(0);
    assert_eq!(y.shape(), [1, 3, 3, 6]);
    let t = |t: &Tensor, perm: Vec<usize>| eval_op(&Op::Transpose { perm }, &[t]).unwrap().remove(0);
    let twin = eval_op(&Op::Conv(a), &[&t(&x, channels_first_perm(4)), &t(&w, channels_first_perm(4)), &b]).unwrap().remove(0);
    assert_eq!(y, t(&twin, channels_last_perm(4)));
}

/// One random chain: convolutions of random geometry with ReLU, a residual Add where shapes allow, an optional
/// max pool.
#[derive(Clone, Debug)]
struct Chain {
    n: usize,
    c: usize,
    hw: usize,
    layers: Vec<(usize, usize, usize, usize, bool)>,
    pool: bool,
}

fn chain() -> impl Strategy<Value = Chain> {
    let layer = (prop_oneof![Just(1usize), Just(3)], 1usize..3, 1usize..3, prop_oneof![Just(1usize), Just(2)], any::<bool>());
    (1usize..3, prop_oneof![Just(2usize), Just(4)], 5usize..10, prop::collection::vec(layer, 1..4), any::<bool>())
        .prop_map(|(n, c, hw, layers, pool)| Chain { n, c, hw, layers, pool })
}

fn build(s: &Chain) -> Graph {
    let mut g = Graph::new("chain");
    let mut x = g.add_input("x", TensorType::f32([s.n, s.c, s.hw, s.hw]));
    for (i, &(k, stride, dilation, group, bias)) in s.layers.iter().enumerate() {
        let pad = (k / 2) * dilation;
        let y = conv(&mut g, &format!("c{i}"), x, s.c, k, conv_attrs(stride, pad, dilation, group), bias, i as u64 * 7);
        let y = if g.ty(y).shape == g.ty(x).shape { g.add(format!("add{i}"), Op::Binary(BinaryOp::Add), &[y, x]).unwrap() } else { y };
        x = relu(&mut g, &format!("r{i}"), y);
    }
    if s.pool && g.ty(x).shape[2] >= 2 && g.ty(x).shape[3] >= 2 {
        let pool = PoolAttrs { kernel: vec![2, 2], strides: vec![1, 1], pads: vec![0; 4], dilations: vec![1, 1], ceil_mode: false };
        x = g.add("pool", Op::MaxPool(pool), &[x]).unwrap();
    }
    g.outputs.push(x);
    g
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
    /// Channels-last computes what channels-first does, exactly: the reference runs the same arithmetic.
    #[test]
    fn channels_last_chains_match_channels_first(s in chain()) {
        let g = build(&s);
        let h = to_channels_last(&g).unwrap();
        crate::ir::verify(&h).unwrap();
        prop_assert_eq!(count(&h, "Conv"), 0);
        prop_assert_eq!(count(&h, "Transpose"), 2);
        assert_same(&g, &h, 0.0);
    }
}

/// ConvNeXt's block as torchvision exports it: depthwise conv, permute to channels-last, LayerNorm over
/// channels, the MLP, permute back, layer scale, residual. Channels-last, both permutes vanish: the only
/// transposes left are the image in and the result out.
#[test]
fn an_exported_models_own_permutes_cancel_between_channels_last_values() {
    let mut g = Graph::new("convnext_block");
    let x = g.add_input("x", TensorType::f32([2, 8, 6, 6]));
    let dw = conv(&mut g, "dw", x, 8, 3, conv_attrs(1, 1, 1, 8), true, 1);
    let p1 = g.add("permute1", Op::Transpose { perm: vec![0, 2, 3, 1] }, &[dw]).unwrap();
    let scale = weight(&mut g, "ln.w", &[8], 2);
    let ln = g.add("ln", Op::LayerNorm { axis: 3, epsilon: 1e-6 }, &[p1, scale]).unwrap();
    let w1 = weight(&mut g, "fc1", &[8, 16], 3);
    let h = g.add("fc1.mm", Op::MatMul, &[ln, w1]).unwrap();
    let h = g.add("gelu", Op::Gelu { approximate: crate::ir::GeluApprox::Erf }, &[h]).unwrap();
    let w2 = weight(&mut g, "fc2", &[16, 8], 4);
    let y = g.add("fc2.mm", Op::MatMul, &[h, w2]).unwrap();
    let p2 = g.add("permute2", Op::Transpose { perm: vec![0, 3, 1, 2] }, &[y]).unwrap();
    let gamma = weight(&mut g, "gamma", &[8, 1, 1], 5);
    let scaled = g.add("layer_scale", Op::Binary(BinaryOp::Mul), &[p2, gamma]).unwrap();
    let sum = g.add("residual", Op::Binary(BinaryOp::Add), &[scaled, x]).unwrap();
    let next = conv(&mut g, "next", sum, 8, 1, conv_attrs(1, 0, 1, 1), true, 6);
    g.outputs.push(next);
    let h = to_channels_last(&g).unwrap();
    crate::ir::verify(&h).unwrap();
    let transposes: Vec<&str> = h.nodes.iter().filter(|n| n.op.name() == "Transpose").map(|n| n.name.as_str()).collect();
    assert_eq!(transposes, ["x.to_nhwc", "next.to_nchw"]);
    assert_same(&g, &h, 1e-6);
}

/// A permute whose result leaves the graph keeps its node and its name.
#[test]
fn a_permute_that_is_a_graph_output_stays() {
    let mut g = Graph::new("out");
    let x = g.add_input("x", TensorType::f32([1, 4, 5, 5]));
    let c = conv(&mut g, "c", x, 4, 3, conv_attrs(1, 1, 1, 1), false, 1);
    let p = g.add("permute", Op::Transpose { perm: vec![0, 2, 3, 1] }, &[c]).unwrap();
    g.outputs.push(p);
    let h = to_channels_last(&g).unwrap();
    assert_eq!(h.value(h.outputs[0]).name, "permute");
    assert_same(&g, &h, 0.0);
}
