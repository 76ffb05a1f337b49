//! The `gemm` backend end to end, through the real path: subgraph_signature (weights lifted) ->
//! extract_subgraph -> lower -> compile_module -> runtime::load_module -> call, against the reference
//! interpreter run on the original model graph. Relative error (max |got - want| / max |want|) below 1e-4;
//! NaN never passes, and outputs and scratch start as NaN so a value the plan forgets to write fails.

use tessera_kernels::runtime::{load_module, HostBuffer, LoadedModule};
use tessera_stages::backend::gemm::plan::{Plan, Step};
use tessera_stages::backend::gemm::GemmBackend;
use tessera_stages::backend::{Backend, LoweredKernel, Module, INLINE_CONST_MAX};
use tessera_stages::interp::{random_inputs, random_tensor, run_graph};
use tessera_stages::ir::*;
use tessera_stages::target::Target;

fn target() -> Target {
    Target::parse("cpu -compiler=gemm").unwrap()
}

/// A deterministic random f32 weight (values in [-1, 1)).
fn weight(g: &mut Graph, name: &str, shape: &[usize]) -> ValueId {
    let stream = g.values.len() as u64 + 1000;
    g.add_const(name, random_tensor(&TensorType::f32(shape.to_vec()), 42, stream, 0))
}

fn nan_buffer(bytes: usize) -> HostBuffer {
    let nan: Vec<u8> = f32::NAN.to_le_bytes().iter().copied().cycle().take(bytes).collect();
    HostBuffer::from_bytes(&nan, "test").unwrap()
}

/// One partition of `g` made of `nodes`, lowered and compiled as function `symbol`.
struct Compiled {
    sig: SubgraphSignature,
    lowered: LoweredKernel,
}

fn lower_nodes(g: &Graph, nodes: &[NodeId], symbol: &str) -> Compiled {
    let sig = subgraph_signature(g, nodes, ConstMode::LiftLarge(INLINE_CONST_MAX));
    let kernel = extract_subgraph(g, &sig);
    let lowered = GemmBackend.lower(&target(), &kernel, symbol).unwrap_or_else(|e| panic!("{e}"));
    Compiled { sig, lowered }
}

/// Calls function `index` of `module` for partition `sig` of `g` on the model inputs; returns its outputs.
fn call(module: &dyn LoadedModule, m: &Module, index: usize, g: &Graph, sig: &SubgraphSignature, inputs: &[Tensor]) -> Vec<Vec<f32>> {
    let info = &m.functions[index];
    let mut bufs: Vec<HostBuffer> = Vec::new();
    for &v in &sig.inputs {
        let t = match &g.value(v).def {
            ValueDef::Input(i) => inputs[*i].clone(),
            ValueDef::Const(t) => t.clone(),
            ValueDef::Node { .. } => panic!("the whole graph is one partition here"),
        };
        bufs.push(HostBuffer::from_bytes(t.bytes(), "input").unwrap());
    }
    for t in &info.outputs {
        bufs.push(nan_buffer(t.size_bytes()));
    }
    if info.scratch_bytes > 0 {
        bufs.push(nan_buffer(info.scratch_bytes as usize));
    }
    let args: Vec<*mut u8> = bufs.iter().map(|b| b.as_ptr()).collect();
    // SAFETY: buffers of exactly the listed types and scratch size, 64-byte aligned, outputs distinct.
    unsafe { module.call(index, &args) }.unwrap();
    let n_in = sig.inputs.len();
    bufs[n_in..n_in + info.outputs.len()]
        .iter()
        .map(|b| b.as_slice().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
        .collect()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    assert!(want.iter().all(|v| v.is_finite()), "{what}: the reference output is not finite");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let mut worst = 0f32;
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(!a.is_nan(), "{what}: element {i} is NaN (want {b})");
        let err = (a - b).abs() / scale.max(f32::MIN_POSITIVE);
        assert!(err < 1e-4 || a == b, "{what}: element {i}: got {a}, want {b} (relative error {err:e})");
        worst = worst.max(err);
    }
}

/// Compiles all of `g` as one gemm partition and checks every output against the interpreter.
fn check(g: &Graph) -> Module {
    verify(g).unwrap();
    let nodes: Vec<NodeId> = (0..g.nodes.len() as u32).map(NodeId).collect();
    for &n in &nodes {
        assert!(GemmBackend.supports(g, n, &target()), "{}: node {} ({}) unsupported", g.name, g.node(n).name, g.node(n).op.name());
    }
    let c = lower_nodes(g, &nodes, "f0");
    let m = GemmBackend.compile_module(&target(), &[c.lowered]).unwrap();
    let module = load_module(&m).unwrap();
    for seed in [1, 2] {
        let inputs = random_inputs(g, seed);
        let want = run_graph(g, &inputs).unwrap();
        let got = call(module.as_ref(), &m, 0, g, &c.sig, &inputs);
        for (k, &o) in c.sig.outputs.iter().enumerate() {
            let pos = g.outputs.iter().position(|&x| x == o).expect("partition outputs are graph outputs");
            assert_close(&got[k], &want[pos].to_f32_vec(), &format!("{} output {k} seed {seed}", g.name));
        }
    }
    m
}

fn steps(m: &Module) -> Vec<&'static str> {
    Plan::decode(&m.bytes).unwrap().functions[0]
        .steps
        .iter()
        .map(|s| match s {
            Step::Sgemm(_) => "gemm",
            Step::Im2col(_) => "im2col",
            Step::Depthwise2d(_) => "dw",
        })
        .collect()
}

// ---- MatMul ----

fn matmul_graph(name: &str, a: &[usize], b: &[usize], b_const: bool) -> Graph {
    let mut g = Graph::new(name);
    let x = g.add_input("a", TensorType::f32(a.to_vec()));
    let y = if b_const { weight(&mut g, "b", b) } else { g.add_input("b", TensorType::f32(b.to_vec())) };
    let m = g.add("mm", Op::MatMul, &[x, y]).unwrap();
    g.outputs.push(m);
    g
}

#[test]
fn matmul_shapes() {
    let cases: &[(&str, &[usize], &[usize], bool)] = &[
        ("plain", &[5, 7], &[7, 3], false),
        ("lifted_weight", &[4, 32], &[32, 24], true),
        ("inline_weight", &[4, 8], &[8, 6], true),
        ("batched", &[2, 3, 5, 7], &[2, 3, 7, 4], false),
        ("broadcast_batches", &[2, 1, 5, 7], &[3, 7, 4], false),
        ("broadcast_a", &[5, 7], &[3, 7, 4], false),
        ("stacked_on_shared_weight", &[2, 3, 5, 16], &[16, 9], true),
        ("rank1_a", &[7], &[2, 7, 4], false),
        ("rank1_b", &[2, 5, 7], &[7], false),
        ("rank1_both", &[7], &[7], false),
        ("tall_skinny", &[1000, 9], &[9, 2], false),
        ("short_wide", &[1, 300], &[300, 500], true),
        ("k_is_one", &[6, 1], &[1, 5], false),
        ("k_is_zero", &[3, 0], &[0, 4], false),
        ("m_is_zero", &[0, 5], &[5, 2], false),
    ];
    for &(name, a, b, c) in cases {
        check(&matmul_graph(name, a, b, c));
    }
}

// ---- Conv ----

fn conv_attrs(strides: &[usize], pads: &[usize], dilations: &[usize], group: usize) -> ConvAttrs {
    ConvAttrs { strides: strides.to_vec(), pads: pads.to_vec(), dilations: dilations.to_vec(), group }
}

fn conv_graph(name: &str, x: &[usize], w: &[usize], a: ConvAttrs, bias: bool) -> Graph {
    let mut g = Graph::new(name);
    let xi = g.add_input("x", TensorType::f32(x.to_vec()));
    let wi = weight(&mut g, "w", w);
    let mut ins = vec![xi, wi];
    if bias {
        ins.push(weight(&mut g, "bias", &[w[0]]));
    }
    let c = g.add("conv", Op::Conv(a), &ins).unwrap();
    g.outputs.push(c);
    g
}

#[test]
fn conv_variants() {
    // name, x shape, w shape, attributes, bias input, the steps it lowers to
    type Case = (&'static str, Vec<usize>, Vec<usize>, ConvAttrs, bool, &'static [&'static str]);
    let cases: Vec<Case> = vec![
        ("3x3_pad1", vec![2, 8, 9, 9], vec![16, 8, 3, 3], conv_attrs(&[1, 1], &[1, 1, 1, 1], &[1, 1], 1), false, &["im2col", "gemm", "im2col", "gemm"]),
        ("bias_input", vec![1, 4, 6, 6], vec![6, 4, 3, 3], conv_attrs(&[1, 1], &[0, 0, 0, 0], &[1, 1], 1), true, &["im2col", "gemm"]),
        ("groups", vec![1, 8, 7, 7], vec![12, 4, 3, 3], conv_attrs(&[1, 1], &[1, 1, 1, 1], &[1, 1], 2), false, &["im2col", "gemm"]),
        ("stride2_asymmetric_pads", vec![1, 3, 11, 10], vec![5, 3, 3, 4], conv_attrs(&[2, 2], &[0, 1, 2, 0], &[1, 1], 1), false, &["im2col", "gemm"]),
        ("dilation", vec![1, 4, 12, 12], vec![4, 4, 3, 3], conv_attrs(&[1, 1], &[2, 2, 2, 2], &[2, 3], 1), false, &["im2col", "gemm"]),
        ("depthwise_s1", vec![2, 16, 10, 10], vec![16, 1, 3, 3], conv_attrs(&[1, 1], &[1, 1, 1, 1], &[1, 1], 16), true, &["dw"]),
        ("depthwise_s2_asym", vec![1, 8, 13, 12], vec![8, 1, 3, 5], conv_attrs(&[2, 3], &[1, 0, 0, 2], &[1, 1], 8), false, &["dw"]),
        ("depthwise_dilated_multiplier", vec![1, 4, 9, 9], vec![8, 1, 3, 3], conv_attrs(&[1, 1], &[2, 2, 2, 2], &[2, 2], 4), false, &["dw"]),
        ("pointwise", vec![2, 16, 5, 5], vec![24, 16, 1, 1], conv_attrs(&[1, 1], &[0, 0, 0, 0], &[1, 1], 1), true, &["gemm"]),
        ("pointwise_groups", vec![2, 16, 5, 5], vec![8, 4, 1, 1], conv_attrs(&[1, 1], &[0, 0, 0, 0], &[1, 1], 4), false, &["gemm"]),
        ("1x1_stride2", vec![1, 8, 9, 9], vec![4, 8, 1, 1], conv_attrs(&[2, 2], &[0, 0, 0, 0], &[1, 1], 1), false, &["im2col", "gemm"]),
        ("7x7_stem", vec![1, 3, 32, 32], vec![16, 3, 7, 7], conv_attrs(&[2, 2], &[3, 3, 3, 3], &[1, 1], 1), true, &["im2col", "gemm"]),
        // Column matrices over 1M elements run fused, in blocks of output rows (runtime/gemm/exec.rs): a 3x3
        // over 144 x 16900 columns with a bias, and a 7x7 stride-2 stem over 147 x 13225, two samples.
        ("3x3_fused_blocks", vec![1, 16, 130, 130], vec![8, 16, 3, 3], conv_attrs(&[1, 1], &[1, 1, 1, 1], &[1, 1], 1), true, &["im2col", "gemm"]),
        ("7x7_stem_fused_blocks", vec![2, 3, 230, 229], vec![4, 3, 7, 7], conv_attrs(&[2, 2], &[3, 3, 3, 3], &[1, 1], 1), false, &["im2col", "gemm", "im2col", "gemm"]),
        ("conv1d", vec![2, 4, 20], vec![6, 4, 5], conv_attrs(&[2], &[2, 1], &[1], 1), false, &["im2col", "gemm", "im2col", "gemm"]),
        ("depthwise1d", vec![1, 6, 20], vec![6, 1, 3], conv_attrs(&[1], &[1, 1], &[2], 6), false, &["dw"]),
        ("conv3d", vec![1, 2, 5, 6, 4], vec![3, 2, 3, 2, 3], conv_attrs(&[1, 2, 1], &[1, 0, 1, 1, 1, 0], &[1, 1, 1], 1), true, &["im2col", "gemm"]),
    ];
    for (name, x, w, a, bias, want_steps) in cases {
        let m = check(&conv_graph(name, &x, &w, a, bias));
        assert_eq!(steps(&m), want_steps, "{name}");
    }
}

// ---- Epilogues ----

/// anchor (`conv` or a matmul) followed by `build`'s epilogue nodes; returns the graph.
fn with_epilogue(name: &str, conv: bool, build: impl Fn(&mut Graph, ValueId) -> ValueId) -> Graph {
    let mut g = Graph::new(name);
    let y = if conv {
        let x = g.add_input("x", TensorType::f32([2, 6, 7, 7]));
        let w = weight(&mut g, "w", &[8, 6, 3, 3]);
        g.add("conv", Op::Conv(conv_attrs(&[1, 1], &[1, 1, 1, 1], &[1, 1], 1)), &[x, w]).unwrap()
    } else {
        let x = g.add_input("x", TensorType::f32([2, 5, 24]));
        let w = weight(&mut g, "w", &[24, 16]);
        g.add("mm", Op::MatMul, &[x, w]).unwrap()
    };
    let out = build(&mut g, y);
    g.outputs.push(out);
    g
}

fn unary(op: Op) -> impl Fn(&mut Graph, ValueId) -> ValueId {
    move |g, y| g.add("ep", op.clone(), &[y]).unwrap()
}

fn add_const(shape: &'static [usize], left: bool) -> impl Fn(&mut Graph, ValueId) -> ValueId {
    move |g, y| {
        let b = weight(g, "bias", shape);
        let ins = if left { [b, y] } else { [y, b] };
        g.add("add", Op::Binary(BinaryOp::Add), &ins).unwrap()
    }
}

#[test]
fn each_epilogue_on_matmul_and_conv() {
    let unaries = [
        ("relu", Op::Unary(UnaryOp::Relu)),
        ("relu6", Op::Clip { min: 0.0, max: 6.0 }),
        ("clip_one_sided", Op::Clip { min: -0.25, max: f32::INFINITY }),
        ("gelu_erf", Op::Gelu { approximate: GeluApprox::Erf }),
        ("gelu_tanh", Op::Gelu { approximate: GeluApprox::Tanh }),
        ("sigmoid", Op::Unary(UnaryOp::Sigmoid)),
        ("hardswish", Op::Unary(UnaryOp::HardSwish)),
    ];
    for conv in [false, true] {
        for (name, op) in &unaries {
            let m = check(&with_epilogue(&format!("{name}_conv{conv}"), conv, unary(op.clone())));
            assert_eq!(steps(&m).iter().filter(|&&s| s == "gemm").count(), if conv { 2 } else { 1 }, "{name}: fused, no extra steps");
        }
    }
    // Biases: along the last dim for MatMul (both operand orders, lifted and inline), per channel for Conv, scalar.
    check(&with_epilogue("mm_bias", false, add_const(&[16], false)));
    check(&with_epilogue("mm_bias_left", false, add_const(&[16], true)));
    check(&with_epilogue("mm_bias_rank3", false, add_const(&[1, 1, 16], false)));
    check(&with_epilogue("mm_scalar", false, add_const(&[1], false)));
    check(&with_epilogue("conv_bias", true, add_const(&[8, 1, 1], false)));
    check(&with_epilogue("conv_bias_rank4_left", true, add_const(&[1, 8, 1, 1], true)));
    // A lifted (> 64 elements) per-channel bias comes in as an argument instead of a plan constant.
    check(&with_epilogue("mm_bias_wide", false, |g, y| {
        let w = weight(g, "w2", &[16, 80]);
        let m = g.add("mm2", Op::MatMul, &[y, w]).unwrap();
        let b = weight(g, "bias", &[80]);
        g.add("add", Op::Binary(BinaryOp::Add), &[m, b]).unwrap()
    }));
}

#[test]
fn residuals_and_chains() {
    // Residual from a graph input (same shape), then Relu: Conv + bias + residual + ReLU, ResNet's block tail.
    let mut g = Graph::new("resnet_tail");
    let x = g.add_input("x", TensorType::f32([1, 8, 6, 6]));
    let skip = g.add_input("skip", TensorType::f32([1, 8, 6, 6]));
    let w = weight(&mut g, "w", &[8, 8, 3, 3]);
    let b = weight(&mut g, "b", &[8, 1, 1]);
    let c = g.add("conv", Op::Conv(conv_attrs(&[1, 1], &[1, 1, 1, 1], &[1, 1], 1)), &[x, w]).unwrap();
    let a = g.add("bias", Op::Binary(BinaryOp::Add), &[c, b]).unwrap();
    let r = g.add("res", Op::Binary(BinaryOp::Add), &[skip, a]).unwrap();
    let y = g.add("relu", Op::Unary(UnaryOp::Relu), &[r]).unwrap();
    g.outputs.push(y);
    assert_eq!(steps(&check(&g)), ["im2col", "gemm"]);

    // Two MatMuls, one residual into the other, a third consuming the sum: intermediates live in scratch.
    let mut g = Graph::new("mlp");
    let x = g.add_input("x", TensorType::f32([6, 32]));
    let w1 = weight(&mut g, "w1", &[32, 32]);
    let w2 = weight(&mut g, "w2", &[32, 32]);
    let w3 = weight(&mut g, "w3", &[32, 10]);
    let m1 = g.add("m1", Op::MatMul, &[x, w1]).unwrap();
    let h = g.add("h", Op::Gelu { approximate: GeluApprox::Erf }, &[m1]).unwrap();
    let m2 = g.add("m2", Op::MatMul, &[h, w2]).unwrap();
    let s = g.add("s", Op::Binary(BinaryOp::Add), &[m2, h]).unwrap();
    let m3 = g.add("m3", Op::MatMul, &[s, w3]).unwrap();
    let y = g.add("y", Op::Unary(UnaryOp::Sigmoid), &[m3]).unwrap();
    g.outputs.push(y);
    let m = check(&g);
    assert_eq!(steps(&m), ["gemm", "gemm", "gemm"]);
    assert!(m.functions[0].scratch_bytes > 0);

    // The sum of two MatMuls, one fused as the other's residual; a value that is both an output and read inside.
    let mut g = Graph::new("two_outputs");
    let x = g.add_input("x", TensorType::f32([4, 12]));
    let w1 = weight(&mut g, "w1", &[12, 12]);
    let w2 = weight(&mut g, "w2", &[12, 12]);
    let m1 = g.add("m1", Op::MatMul, &[x, w1]).unwrap();
    let m2 = g.add("m2", Op::MatMul, &[x, w2]).unwrap();
    let s = g.add("s", Op::Binary(BinaryOp::Add), &[m1, m2]).unwrap();
    let m3 = g.add("m3", Op::MatMul, &[s, w1]).unwrap();
    g.outputs.extend([m3, s]);
    check(&g);
}

#[test]
fn a_module_of_several_functions() {
    let g1 = with_epilogue("a", false, unary(Op::Unary(UnaryOp::Relu)));
    let g2 = with_epilogue("b", true, add_const(&[8, 1, 1], false));
    let all = |g: &Graph| (0..g.nodes.len() as u32).map(NodeId).collect::<Vec<_>>();
    let c1 = lower_nodes(&g1, &all(&g1), "first");
    let c2 = lower_nodes(&g2, &all(&g2), "second");
    let m = GemmBackend.compile_module(&target(), &[c1.lowered.clone(), c2.lowered.clone()]).unwrap();
    let module = load_module(&m).unwrap();
    for (index, (g, c)) in [(&g1, &c1), (&g2, &c2)].into_iter().enumerate() {
        let inputs = random_inputs(g, 3);
        let want = run_graph(g, &inputs).unwrap();
        // Concurrent calls of one module share nothing mutable.
        let got: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2).map(|_| s.spawn(|| call(module.as_ref(), &m, index, g, &c.sig, &inputs))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for out in got {
            assert_close(&out[0], &want[0].to_f32_vec(), g.name.as_str());
        }
    }
}

#[test]
fn profiling_records_each_step_of_a_call() {
    use tessera_kernels::runtime::gemm::profile;
    // A depthwise 3x3 (stride 2) with its bias and ReLU6, then a pointwise conv: two steps.
    let graph = |batch: usize| {
        let mut g = Graph::new("profiled");
        let x = g.add_input("x", TensorType::f32([batch, 8, 10, 10]));
        let wd = weight(&mut g, "wd", &[8, 1, 3, 3]);
        let bd = weight(&mut g, "bd", &[8]);
        let d = g.add("dw", Op::Conv(conv_attrs(&[2, 2], &[1, 1, 1, 1], &[1, 1], 8)), &[x, wd, bd]).unwrap();
        let r = g.add("clip", Op::Clip { min: 0.0, max: 6.0 }, &[d]).unwrap();
        let wp = weight(&mut g, "wp", &[16, 8, 1, 1]);
        let y = g.add("pw", Op::Conv(conv_attrs(&[1, 1], &[0, 0, 0, 0], &[1, 1], 1)), &[r, wp]).unwrap();
        g.outputs.push(y);
        g
    };
    let g = graph(1);
    let all: Vec<NodeId> = (0..g.nodes.len() as u32).map(NodeId).collect();
    // A symbol of its own: other tests of this binary may call modules while recording is on.
    let c = lower_nodes(&g, &all, "profiled_fn");
    let m = GemmBackend.compile_module(&target(), std::slice::from_ref(&c.lowered)).unwrap();
    let module = load_module(&m).unwrap();
    let inputs = random_inputs(&g, 1);
    call(module.as_ref(), &m, 0, &g, &c.sig, &inputs);
    profile::set_enabled(true);
    let got = call(module.as_ref(), &m, 0, &g, &c.sig, &inputs);
    let calls: Vec<_> = profile::take().into_iter().filter(|c| c.symbol == "profiled_fn").collect();
    profile::set_enabled(false);
    call(module.as_ref(), &m, 0, &g, &c.sig, &inputs);
    assert!(profile::take().iter().all(|c| c.symbol != "profiled_fn"), "recorded while switched off");
    // Recording changes nothing computed.
    assert_close(&got[0], &run_graph(&g, &inputs).unwrap()[0].to_f32_vec(), "profiled");
    assert_eq!(calls.len(), 1);
    let what: Vec<&str> = calls[0].steps.iter().map(|s| s.what.as_str()).collect();
    assert_eq!(what, ["depthwise 3x3 s2 c=8 10x10->5x5 +add,clip", "sgemm 16x25x8"]);
    // 2 FLOPs per multiply-add: 8 planes x 25 outputs x 9 taps, and 16 x 25 x 8.
    assert_eq!(calls[0].steps.iter().map(|s| s.flops).collect::<Vec<_>>(), [2 * 8 * 25 * 9, 2 * 16 * 25 * 8]);
    // Input, weights and output (and the bias read by the epilogue), in bytes.
    assert_eq!(calls[0].steps[1].bytes, 4 * (16 * 8 + 8 * 25 + 16 * 25));
    assert_eq!(calls[0].steps[0].bytes, 4 * (8 * 100 + 8 * (25 + 9)) + 4 * 8);

    // The same layers over two images on two threads run as one unit of image lanes
    // (runtime/gemm/schedule.rs), recorded as one step labelled by image 0's layers, FLOPs of both images.
    let g2 = graph(2);
    let c = lower_nodes(&g2, &all, "profiled_images_fn");
    let m = GemmBackend.compile_module(&target(), std::slice::from_ref(&c.lowered)).unwrap();
    let module = load_module(&m).unwrap();
    let inputs = random_inputs(&g2, 1);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    profile::set_enabled(true);
    let got = pool.install(|| call(module.as_ref(), &m, 0, &g2, &c.sig, &inputs));
    let calls: Vec<_> = profile::take().into_iter().filter(|c| c.symbol == "profiled_images_fn").collect();
    profile::set_enabled(false);
    assert_close(&got[0], &run_graph(&g2, &inputs).unwrap()[0].to_f32_vec(), "profiled, two images");
    let what: Vec<&str> = calls[0].steps.iter().map(|s| s.what.as_str()).collect();
    assert_eq!(what, ["images x2: depthwise 3x3 s2 c=16 10x10->5x5 +add,clip | sgemm 2x 16x25x8"]);
    assert_eq!(calls[0].steps[0].flops, 2 * (2 * 8 * 25 * 9 + 2 * 16 * 25 * 8));
}

/// Runs `check` inside a pool of `threads` threads (the executor cuts work by the pool it runs on).
fn check_on(g: &Graph, threads: usize) -> Module {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap().install(|| check(g))
}

/// A batch of 4 images through a 3x3 convolution, a depthwise one and a pointwise one with a residual, and a
/// MatMul batched over 4 images: on 2 and 4 threads the images run side by side through those layers, each on one
/// thread, and on 8 each on two (runtime/gemm/schedule.rs); on 1 and 3 threads one layer after another. Every
/// thread count gives the interpreter's result.
#[test]
fn images_side_by_side_match_the_reference_on_any_thread_count() {
    let mut g = Graph::new("images");
    let x = g.add_input("x", TensorType::f32([4, 8, 12, 12]));
    let w = weight(&mut g, "w", &[16, 8, 3, 3]);
    let b = weight(&mut g, "b", &[16, 1, 1]);
    let c = g.add("conv", Op::Conv(conv_attrs(&[1, 1], &[1, 1, 1, 1], &[1, 1], 1)), &[x, w]).unwrap();
    let c = g.add("bias", Op::Binary(BinaryOp::Add), &[c, b]).unwrap();
    let c = g.add("relu", Op::Unary(UnaryOp::Relu), &[c]).unwrap();
    let wd = weight(&mut g, "wd", &[16, 1, 3, 3]);
    let d = g.add("dw", Op::Conv(conv_attrs(&[1, 1], &[1, 1, 1, 1], &[1, 1], 16)), &[c, wd]).unwrap();
    let d = g.add("clip", Op::Clip { min: 0.0, max: 6.0 }, &[d]).unwrap();
    let wp = weight(&mut g, "wp", &[8, 16, 1, 1]);
    let p = g.add("pw", Op::Conv(conv_attrs(&[1, 1], &[0, 0, 0, 0], &[1, 1], 1)), &[d, wp]).unwrap();
    let p = g.add("res", Op::Binary(BinaryOp::Add), &[p, x]).unwrap();
    g.outputs.push(p);
    // A MatMul batched over images (a weight per image), with a GELU.
    let mut mm = Graph::new("batched_matmul");
    let a = mm.add_input("a", TensorType::f32([4, 3, 8, 24]));
    let wm = weight(&mut mm, "wm", &[4, 3, 24, 40]);
    let y = mm.add("mm", Op::MatMul, &[a, wm]).unwrap();
    let y = mm.add("gelu", Op::Gelu { approximate: GeluApprox::Tanh }, &[y]).unwrap();
    mm.outputs.push(y);
    for threads in [1, 2, 3, 4, 8] {
        let m = check_on(&g, threads);
        assert_eq!(steps(&m), ["im2col", "gemm", "im2col", "gemm", "im2col", "gemm", "im2col", "gemm", "dw", "gemm"], "one convolution per image");
        check_on(&mm, threads);
    }
}

/// Outputs over the epilogue's parallel threshold (64K elements) and column matrices over the fused-block
/// threshold (1M elements), two images side by side on 2 threads (one image's blocks and epilogue on its own
/// thread) and on 4 (two threads per image), give the interpreter's result.
#[test]
fn large_outputs_with_epilogues_on_any_thread_count() {
    let mut g = Graph::new("large");
    let x = g.add_input("x", TensorType::f32([2, 16, 130, 130]));
    let w = weight(&mut g, "w", &[8, 16, 3, 3]);
    let b = weight(&mut g, "b", &[8, 1, 1]);
    let c = g.add("conv", Op::Conv(conv_attrs(&[1, 1], &[1, 1, 1, 1], &[1, 1], 1)), &[x, w]).unwrap();
    let c = g.add("bias", Op::Binary(BinaryOp::Add), &[c, b]).unwrap();
    let c = g.add("relu", Op::Unary(UnaryOp::Relu), &[c]).unwrap();
    let wd = weight(&mut g, "wd", &[8, 1, 3, 3]);
    let d = g.add("dw", Op::Conv(conv_attrs(&[1, 1], &[1, 1, 1, 1], &[1, 1], 8)), &[c, wd]).unwrap();
    let d = g.add("hs", Op::Unary(UnaryOp::HardSwish), &[d]).unwrap();
    g.outputs.push(d);
    for threads in [1, 2, 3, 4] {
        check_on(&g, threads);
    }
}

/// Appends a MobileNetV2 block to `g` after `x` (`c` channels): pointwise expansion to `e` channels with bias
/// and ReLU6, depthwise 3x3 with stride `stride`, bias and ReLU6, pointwise projection to `out` channels with
/// bias, and the residual `x` when shapes allow.
fn inverted_residual(g: &mut Graph, x: ValueId, c: usize, e: usize, out: usize, stride: usize, tag: &str) -> ValueId {
    let pw = |g: &mut Graph, x: ValueId, cin: usize, cout: usize, name: &str| {
        let w = weight(g, &format!("{name}_w"), &[cout, cin, 1, 1]);
        let b = weight(g, &format!("{name}_b"), &[cout, 1, 1]);
        let y = g.add(name, Op::Conv(conv_attrs(&[1, 1], &[0, 0, 0, 0], &[1, 1], 1)), &[x, w]).unwrap();
        g.add(&format!("{name}_bias"), Op::Binary(BinaryOp::Add), &[y, b]).unwrap()
    };
    let y = pw(g, x, c, e, &format!("{tag}_expand"));
    let y = g.add(&format!("{tag}_clip1"), Op::Clip { min: 0.0, max: 6.0 }, &[y]).unwrap();
    let wd = weight(g, &format!("{tag}_dw_w"), &[e, 1, 3, 3]);
    let bd = weight(g, &format!("{tag}_dw_b"), &[e, 1, 1]);
    let y = g.add(&format!("{tag}_dw"), Op::Conv(conv_attrs(&[stride, stride], &[1, 1, 1, 1], &[1, 1], e)), &[y, wd]).unwrap();
    let y = g.add(&format!("{tag}_dw_bias"), Op::Binary(BinaryOp::Add), &[y, bd]).unwrap();
    let y = g.add(&format!("{tag}_clip2"), Op::Clip { min: 0.0, max: 6.0 }, &[y]).unwrap();
    let y = pw(g, y, e, out, &format!("{tag}_project"));
    if stride == 1 && c == out {
        g.add(&format!("{tag}_residual"), Op::Binary(BinaryOp::Add), &[y, x]).unwrap()
    } else {
        y
    }
}

/// MobileNetV2 blocks in a row keep their intermediates channels-last (runtime/gemm/depthwise_nhwc.rs,
/// backend/gemm/layout.rs): expansions write NHWC, depthwise steps read and write it, a block's output stays
/// NHWC for the next block and for its residual, and only the last projection writes the kernel's NCHW
/// output. Batches of 1 and 3, strides 1 and 2, channel counts that are and are not multiples of 16, on 1 to
/// 4 threads, give the interpreter's result.
#[test]
fn channels_last_blocks_match_the_reference() {
    for (batch, c, e, side) in [(1, 16, 48, 9), (3, 12, 40, 8), (2, 8, 20, 7)] {
        let mut g = Graph::new("blocks");
        let x = g.add_input("x", TensorType::f32([batch, c, side, side]));
        let stem_w = weight(&mut g, "stem_w", &[c, c, 1, 1]);
        let y = g.add("stem", Op::Conv(conv_attrs(&[1, 1], &[0, 0, 0, 0], &[1, 1], 1)), &[x, stem_w]).unwrap();
        let y = inverted_residual(&mut g, y, c, e, c, 1, "b1");
        let y = inverted_residual(&mut g, y, c, e, c, 1, "b2");
        let y = inverted_residual(&mut g, y, c, e, 2 * c, 2, "b3");
        g.outputs.push(y);
        for threads in [1, 2, 3, 4] {
            let m = check_on(&g, threads);
            let plan = Plan::decode(&m.bytes).unwrap();
            let dw: Vec<bool> = plan.functions[0].steps.iter().filter_map(|s| if let Step::Depthwise2d(d) = s { Some(d.channels_last) } else { None }).collect();
            assert_eq!(dw, [true, true, true], "batch {batch}: every depthwise step channels-last");
        }
    }
}

// ---- Loading and calling errors ----

fn small_module() -> Module {
    let g = with_epilogue("small", false, add_const(&[16], false));
    let all: Vec<NodeId> = (0..g.nodes.len() as u32).map(NodeId).collect();
    GemmBackend.compile_module(&target(), &[lower_nodes(&g, &all, "f").lowered]).unwrap()
}

#[test]
fn corrupt_or_mismatched_modules_are_refused() {
    let m = small_module();
    let load_err = |m: &Module| load_module(m).err().expect("refused").to_string();
    let mut t = m.clone();
    t.bytes.truncate(t.bytes.len() / 2);
    assert!(load_err(&t).contains("corrupt"), "{}", load_err(&t));
    let mut t = m.clone();
    t.bytes[0] = 99;
    assert!(load_err(&t).contains("version"), "{}", load_err(&t));
    let mut t = m.clone();
    t.functions[0].outputs[0].shape[0] = 1;
    assert!(load_err(&t).contains("reaches element"), "{}", load_err(&t));
    let mut t = m.clone();
    t.functions[0].symbol = "g".into();
    assert!(load_err(&t).contains("signature is for function 'g'"), "{}", load_err(&t));
    let mut t = m.clone();
    t.functions.push(t.functions[0].clone());
    assert!(load_err(&t).contains("the module lists 2"), "{}", load_err(&t));
}

#[test]
fn bad_calls_are_errors() {
    let m = small_module();
    let module = load_module(&m).unwrap();
    let info = &m.functions[0];
    let bufs: Vec<HostBuffer> = info.inputs.iter().chain(&info.outputs).map(|t| nan_buffer(t.size_bytes())).collect();
    let mut args: Vec<*mut u8> = bufs.iter().map(|b| b.as_ptr()).collect();
    // SAFETY: every call below is refused before any buffer is touched.
    unsafe {
        assert!(module.call(1, &args).unwrap_err().to_string().contains("no function 1"));
        assert!(module.call(0, &args[1..]).unwrap_err().to_string().contains("arguments given"));
        args[0] = std::ptr::null_mut();
        assert!(module.call(0, &args).unwrap_err().to_string().contains("null or misaligned"));
        args[0] = bufs[0].as_ptr().add(1);
        assert!(module.call(0, &args).unwrap_err().to_string().contains("null or misaligned"));
    }
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Flipping bytes of a plan never makes loading panic, and a mutated plan that still validates runs
        /// without touching memory outside its buffers (a crash, not a wrong number, would fail this test).
        #[test]
        fn mutated_plans_load_or_fail_cleanly(edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4)) {
            let mut m = small_module();
            for (at, byte) in edits {
                let i = at.index(m.bytes.len());
                m.bytes[i] = byte;
            }
            if let Ok(module) = load_module(&m) {
                let info = &m.functions[0];
                let mut bufs: Vec<HostBuffer> = info.inputs.iter().chain(&info.outputs).map(|t| nan_buffer(t.size_bytes())).collect();
                if info.scratch_bytes > 0 {
                    bufs.push(nan_buffer(info.scratch_bytes as usize));
                }
                let args: Vec<*mut u8> = bufs.iter().map(|b| b.as_ptr()).collect();
                // SAFETY: buffers of exactly the signature's types; the plan was validated against it.
                unsafe { module.call(0, &args) }.unwrap();
            }
        }
    }
}

// ---- Zoo models: every MatMul/Conv chain of a real model, one module per model ----

/// Partitions of `g` the way a rule-based partitioner forms them for this backend: each anchor with every
/// supported epilogue of its chain.
fn chain_partitions(g: &Graph) -> Vec<Vec<NodeId>> {
    use tessera_stages::rules::epilogue::{chain_anchor, uses_in};
    let mut by_anchor: std::collections::BTreeMap<NodeId, Vec<NodeId>> = Default::default();
    for i in 0..g.nodes.len() as u32 {
        if let Some((a, _)) = chain_anchor(g, NodeId(i), &|v| uses_in(g, v)) {
            by_anchor.entry(a).or_default().push(NodeId(i));
        }
    }
    by_anchor.into_values().collect()
}

fn check_model(model: &str, opts: tessera_fixtures::ModelOptions) -> (usize, usize) {
    let mut g = tessera_fixtures::build_with(model, &opts).unwrap();
    tessera_stages::passes::simplify::simplify(&mut g).unwrap();
    let parts = chain_partitions(&g);
    assert!(!parts.is_empty(), "{model}: nothing for the gemm backend");
    let compiled: Vec<Compiled> = parts.iter().enumerate().map(|(i, p)| lower_nodes(&g, p, &format!("p{i}"))).collect();
    let m = GemmBackend.compile_module(&target(), &compiled.iter().map(|c| c.lowered.clone()).collect::<Vec<_>>()).unwrap();
    let module = load_module(&m).unwrap();
    // Every value a partition reads or provides, from one interpreter run of the model.
    let mut eval = g.clone();
    for c in &compiled {
        eval.outputs.extend(c.sig.inputs.iter().chain(&c.sig.outputs).filter(|&&v| g.producer(v).is_some()));
    }
    let inputs = random_inputs(&g, 5);
    let values = run_graph(&eval, &inputs).unwrap();
    let value_of = |v: ValueId| -> Tensor {
        match &g.value(v).def {
            ValueDef::Input(i) => inputs[*i].clone(),
            ValueDef::Const(t) => t.clone(),
            ValueDef::Node { .. } => values[eval.outputs.iter().position(|&o| o == v).unwrap()].clone(),
        }
    };
    // Call each function with its boundary values as a model input set of a graph whose inputs are exactly them.
    for (index, c) in compiled.iter().enumerate() {
        let mut boundary = Graph::new("boundary");
        let ins: Vec<Tensor> = c.sig.inputs.iter().map(|&v| value_of(v)).collect();
        let mut sig = c.sig.clone();
        sig.inputs = ins.iter().map(|t| boundary.add_input("i", t.ty.clone())).collect();
        let got = call(module.as_ref(), &m, index, &boundary, &sig, &ins);
        for (k, &o) in c.sig.outputs.iter().enumerate() {
            assert_close(&got[k], &value_of(o).to_f32_vec(), &format!("{model} partition {index} output {k}"));
        }
    }
    let fused = parts.iter().map(|p| p.len() - 1).sum();
    (parts.len(), fused)
}

#[test]
fn zoo_models_chain_by_chain() {
    use tessera_fixtures::ModelOptions;
    let cases = [
        ("mlp3", ModelOptions { batch: 2, seq: None, image: None }),
        ("resnet18", ModelOptions { batch: 1, seq: None, image: Some(64) }),
        ("mobilenetv2", ModelOptions { batch: 2, seq: None, image: Some(32) }),
        ("bert-tiny", ModelOptions { batch: 2, seq: Some(16), image: None }),
    ];
    for (model, opts) in cases {
        let (parts, fused) = check_model(model, opts);
        eprintln!("{model}: {parts} gemm partitions, {fused} epilogue nodes fused");
        // Every model has epilogues to fuse (biases, ReLU/ReLU6, GELU, residuals).
        assert!(fused > 0, "{model}: {parts} partitions, no epilogue fused");
    }
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// Batch dims of one operand: right-aligned sub-shape of `batch`, each dim kept or broadcast to 1.
    fn operand_batch(batch: &[usize], keep: &[bool], rank: usize) -> Vec<usize> {
        let lead = batch.len() - rank.min(batch.len());
        batch[lead..].iter().zip(&keep[lead..]).map(|(&d, &k)| if k { d } else { 1 }).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any MatMul NumPy accepts (ranks 1 to 4, broadcast batches) matches the interpreter.
        #[test]
        fn random_matmuls(
            batch in prop::collection::vec(1usize..4, 0..3),
            keep_a in prop::collection::vec(any::<bool>(), 3),
            keep_b in prop::collection::vec(any::<bool>(), 3),
            rank_a in 0usize..3, rank_b in 0usize..3,
            m in 1usize..6, k in 1usize..12, n in 1usize..6,
            vec_a in any::<bool>(), vec_b in any::<bool>(),
        ) {
            let mut a = if vec_a { vec![] } else { operand_batch(&batch, &keep_a, rank_a) };
            let mut b = if vec_b { vec![] } else { operand_batch(&batch, &keep_b, rank_b) };
            if vec_a { a.push(k) } else { a.extend([m, k]) }
            if vec_b { b.push(k) } else { b.extend([k, n]) }
            check(&matmul_graph("prop_matmul", &a, &b, false));
        }

        /// Random conv geometry (1 or 2 spatial dims, groups, strides, dilations, asymmetric pads) with a
        /// bias and a ReLU fused.
        #[test]
        fn random_convs(
            batch in 1usize..3, groups in 1usize..4, cg in 1usize..4, mg in 1usize..4,
            two_d in any::<bool>(),
            size in prop::collection::vec(1usize..9, 2),
            kernel in prop::collection::vec(1usize..4, 2),
            strides in prop::collection::vec(1usize..4, 2),
            dilations in prop::collection::vec(1usize..3, 2),
            pads in prop::collection::vec(0usize..3, 4),
        ) {
            let nd = if two_d { 2 } else { 1 };
            // Pads stay below the dilated kernel extent (as exporters produce) and the output is non-empty.
            let pads: Vec<usize> = (0..2 * nd).map(|i| pads[i].min(dilations[i % nd] * (kernel[i % nd] - 1))).collect();
            for d in 0..nd {
                prop_assume!(size[d] + pads[d] + pads[nd + d] > dilations[d] * (kernel[d] - 1));
            }
            let mut x = vec![batch, groups * cg];
            x.extend(&size[..nd]);
            let mut w = vec![groups * mg, cg];
            w.extend(&kernel[..nd]);
            let a = conv_attrs(&strides[..nd], &pads, &dilations[..nd], groups);
            let mut g = conv_graph("prop_conv", &x, &w, a, true);
            let c = g.outputs.pop().unwrap();
            let r = g.add("relu", Op::Unary(UnaryOp::Relu), &[c]).unwrap();
            g.outputs.push(r);
            check(&g);
        }

        /// MobileNetV2's blocks at realistic plane sizes (14x14 to 40x40, stride 1 or 2): a pointwise conv with
        /// its bias, then ReLU6 (Clip) and/or a residual Add, optionally behind a depthwise 3x3 with its own
        /// bias and ReLU6 (the depthwise step's phase planes and wide rows, the epilogues' flat indices).
        #[test]
        fn pointwise_blocks_with_epilogues(
            batch in 1usize..3, c in 1usize..40, m in 8usize..80, h in 14usize..40, w in 14usize..40,
            depthwise in any::<bool>(), stride in 1usize..3, clip in any::<bool>(), residual in any::<bool>(),
        ) {
            let mut g = Graph::new("prop_pointwise");
            let x = g.add_input("x", TensorType::f32([batch, c, h, w]));
            let mut y = x;
            if depthwise {
                let wd = weight(&mut g, "wd", &[c, 1, 3, 3]);
                let bd = weight(&mut g, "bd", &[c]);
                y = g.add("dw", Op::Conv(conv_attrs(&[stride, stride], &[1, 1, 1, 1], &[1, 1], c)), &[y, wd, bd]).unwrap();
                y = g.add("dw_clip", Op::Clip { min: 0.0, max: 6.0 }, &[y]).unwrap();
            }
            let wp = weight(&mut g, "wp", &[m, c, 1, 1]);
            let bp = weight(&mut g, "bp", &[m]);
            y = g.add("pw", Op::Conv(conv_attrs(&[1, 1], &[0, 0, 0, 0], &[1, 1], 1)), &[y, wp, bp]).unwrap();
            if residual {
                let shape = g.ty(y).shape.clone();
                let r = g.add_input("r", TensorType::f32(shape));
                y = g.add("res", Op::Binary(BinaryOp::Add), &[y, r]).unwrap();
            }
            if clip {
                y = g.add("clip", Op::Clip { min: 0.0, max: 6.0 }, &[y]).unwrap();
            }
            g.outputs.push(y);
            check(&g);
        }
    }
}
