use tessera_kernels::runtime::cuda::dnn::DnnModule;
use super::*;
use crate::ir::{BinaryOp, ConvAttrs, DType, Op, Tensor, TensorType, UnaryOp};

fn cudnn() -> Target {
    Target::parse("cuda -compiler=cudnn").unwrap()
}

fn attrs(stride: usize, pad: usize, group: usize) -> ConvAttrs {
    ConvAttrs { strides: vec![stride, stride], pads: vec![pad; 4], dilations: vec![1, 1], group }
}

/// A ResNet basic block's second half: x -> Conv(w1,b1) -> Relu -> Conv(w2,b2) -> Add(x) -> Relu, all `dt`.
fn block(dt: DType) -> Graph {
    let mut g = Graph::new("block");
    let t = |s: &[usize]| TensorType::new(dt, s.to_vec());
    let x = g.add_input("x", t(&[1, 8, 6, 6]));
    let w1 = g.add_input("w1", t(&[8, 8, 3, 3]));
    let b1 = g.add_input("b1", t(&[8]));
    let w2 = g.add_input("w2", t(&[8, 8, 3, 3]));
    let b2 = g.add_input("b2", t(&[8]));
    let c1 = g.add("c1", Op::Conv(attrs(1, 1, 1)), &[x, w1, b1]).unwrap();
    let r1 = g.add("r1", Op::Unary(UnaryOp::Relu), &[c1]).unwrap();
    let c2 = g.add("c2", Op::Conv(attrs(1, 1, 1)), &[r1, w2, b2]).unwrap();
    let a = g.add("add", Op::Binary(BinaryOp::Add), &[c2, x]).unwrap();
    let r2 = g.add("r2", Op::Unary(UnaryOp::Relu), &[a]).unwrap();
    g.outputs.push(r2);
    g
}

#[test]
fn a_residual_block_is_two_fused_convolutions_in_every_precision() {
    for dt in [DType::F32, DType::F16, DType::BF16] {
        let g = block(dt);
        let s: Vec<bool> = (0..g.nodes.len() as u32).map(|n| CudnnBackend.supports(&g, NodeId(n), &cudnn())).collect();
        assert_eq!(s, [true; 5], "{dt:?}");
        let k = CudnnBackend.lower(&cudnn(), &g, "f0").unwrap();
        let convs: Vec<Conv> = postcard::from_bytes(&k.code).unwrap();
        assert_eq!(convs.len(), 2);
        let (c1, c2) = (&convs[0], &convs[1]);
        assert_eq!((c1.dtype, c2.dtype), (dt, dt), "the descriptors' storage type is the graph's");
        assert_eq!((c1.input, c1.weight, c1.output, c1.relu, c1.residual), ([1, 8, 6, 6], [8, 8, 3, 3], [1, 8, 6, 6], true, None));
        // c1's result feeds c2 through scratch (argument 6: 5 inputs, 1 output); c2 adds x and ends in ReLU.
        assert_eq!((c1.y.arg, c1.y.offset, c2.x.arg), (6, 0, 6));
        assert_eq!((c2.residual.map(|z| z.arg), c2.relu, c2.y.arg, c2.bias.arg), (Some(0), true, 5, 4));
        let m = CudnnBackend.compile_module(&cudnn(), &[k]).unwrap();
        assert_eq!(m.format, tessera_kernels::runtime::cuda::dnn::FORMAT);
        assert_eq!(DnnModule::decode(&m).unwrap().functions[0], convs);
    }
}

/// The block channels-last (as `-layout=nhwc` makes it): the same two fused calls, with the shapes in cuDNN's
/// logical order and the NHWC flag.
#[test]
fn a_channels_last_block_is_two_fused_nhwc_convolutions() {
    for dt in [DType::F32, DType::F16] {
        let mut g = Graph::new("block_nhwc");
        let t = |s: &[usize]| TensorType::new(dt, s.to_vec());
        let x = g.add_input("x", t(&[1, 6, 6, 8]));
        let w1 = g.add_input("w1", t(&[8, 3, 3, 8]));
        let b1 = g.add_input("b1", t(&[8]));
        let w2 = g.add_input("w2", t(&[8, 3, 3, 8]));
        let b2 = g.add_input("b2", t(&[8]));
        let c1 = g.add("c1", Op::NhwcConv(attrs(1, 1, 1)), &[x, w1, b1]).unwrap();
        let r1 = g.add("r1", Op::Unary(UnaryOp::Relu), &[c1]).unwrap();
        let c2 = g.add("c2", Op::NhwcConv(attrs(1, 1, 1)), &[r1, w2, b2]).unwrap();
        let a = g.add("add", Op::Binary(BinaryOp::Add), &[c2, x]).unwrap();
        let r2 = g.add("r2", Op::Unary(UnaryOp::Relu), &[a]).unwrap();
        g.outputs.push(r2);
        let s: Vec<bool> = (0..g.nodes.len() as u32).map(|n| CudnnBackend.supports(&g, NodeId(n), &cudnn())).collect();
        assert_eq!(s, [true; 5], "{dt:?}");
        let k = CudnnBackend.lower(&cudnn(), &g, "f0").unwrap();
        let convs: Vec<Conv> = postcard::from_bytes(&k.code).unwrap();
        assert_eq!(convs.len(), 2);
        let (c1, c2) = (&convs[0], &convs[1]);
        assert_eq!((c1.input, c1.weight, c1.output, c1.relu, c1.channels_last), ([1, 8, 6, 6], [8, 8, 3, 3], [1, 8, 6, 6], true, true));
        assert_eq!((c2.residual.map(|z| z.arg), c2.relu, c2.channels_last), (Some(0), true, true));
        assert!(tessera_kernels::runtime::cuda::library::CallDesc::describe(c1).contains("nhwc"));
        // Without a ReLU the chain is priced (NHWC needs no transform workspace), unlike channels-first.
        let cost = super::cost::estimate_us(&g, &[NodeId(0)]);
        assert!(cost.is_finite(), "{cost}");
    }
}

#[test]
fn what_the_fused_call_cannot_compute_is_not_supported() {
    let mut g = Graph::new("g");
    let x = g.add_input("x", TensorType::f32([1, 8, 6, 6]));
    let w = g.add_input("w", TensorType::f32([8, 8, 3, 3]));
    let dw = g.add_input("dw", TensorType::f32([8, 1, 3, 3]));
    let b = g.add_input("b", TensorType::f32([8]));
    let c = g.add("conv_nobias", Op::Conv(attrs(1, 1, 1)), &[x, w]).unwrap();
    let d = g.add("depthwise", Op::Conv(attrs(1, 1, 8)), &[x, dw, b]).unwrap();
    let r = g.add("relu", Op::Unary(UnaryOp::Relu), &[d]).unwrap();
    let a = g.add("add_after_relu", Op::Binary(BinaryOp::Add), &[r, c]).unwrap();
    g.outputs.push(a);
    let mut asym = attrs(2, 0, 1);
    asym.pads = vec![0, 0, 1, 1];
    let e = g.add("asym", Op::Conv(asym), &[x, w, b]).unwrap();
    g.outputs.push(e);
    let s: Vec<bool> = (0..g.nodes.len() as u32).map(|n| support::supports(&g, NodeId(n))).collect();
    assert_eq!(s, [false, false, false, false, false], "no bias, depthwise, after a depthwise, asymmetric pads");
    // Small constants (a 64-channel bias, say) are taken: the backend's kernel graph passes every constant as
    // an argument, where a code generator's would inline it.
    let mut h = Graph::new("h");
    let x = h.add_input("x", TensorType::f32([1, 2, 4, 4]));
    let w = h.add_const("w", Tensor::from_f32([2, 2, 1, 1], &[0.5; 4]));
    let b = h.add_const("b", Tensor::from_f32([2], &[0.25; 2]));
    let c = h.add("conv", Op::Conv(attrs(1, 0, 1)), &[x, w, b]).unwrap();
    h.outputs.push(c);
    support::anchor(&h, NodeId(0)).unwrap();
    let sig = crate::ir::subgraph_signature(&h, &[NodeId(0)], crate::ir::ConstMode::LiftLarge(CudnnBackend.inline_const_max()));
    assert_eq!(sig.inputs, vec![x, w, b], "weight and bias are arguments");
    // A code generator keeps the default (the `cuda` backend's).
    let codegen = crate::backend::INLINE_CONST_MAX;
    assert_eq!(crate::ir::subgraph_signature(&h, &[NodeId(0)], crate::ir::ConstMode::LiftLarge(codegen)).inputs, vec![x], "our codegen inlines them");
}

#[test]
fn inconsistent_geometry_is_refused_at_decode() {
    let g = block(DType::F32);
    let k = CudnnBackend.lower(&cudnn(), &g, "f0").unwrap();
    let mut convs: Vec<Conv> = postcard::from_bytes(&k.code).unwrap();
    convs[1].output[2] = 7;
    let bad = LoweredKernel { info: k.info.clone(), code: postcard::to_stdvec(&convs).unwrap() };
    let e = CudnnBackend.compile_module(&cudnn(), &[bad]).unwrap_err().to_string();
    assert!(e.contains("convolution 1") && e.contains("does not follow"), "{e}");
}

#[test]
fn only_chains_ending_in_relu_are_priced() {
    let g = block(DType::F16);
    let all: Vec<NodeId> = (0..5).map(NodeId).collect();
    assert!(cost::estimate_us(&g, &all).is_finite());
    assert!(cost::estimate_us(&g, &all[..2]).is_finite(), "conv + relu");
    assert_eq!(cost::estimate_us(&g, &all[..1]), f64::INFINITY, "a conv alone needs the identity activation");
    assert_eq!(cost::estimate_us(&g, &[NodeId(2), NodeId(3)]), f64::INFINITY, "conv + residual, no relu");
}

#[test]
fn relu_chains_have_a_choice_of_algorithm_and_others_only_the_default() {
    use tessera_kernels::runtime::cuda::dnn::Conv;
    let t = cudnn();
    let g = block(DType::F16);
    let configs = CudnnBackend.configs_for(&t, &g);
    assert_eq!(configs, RANKS.all());
    assert_eq!(configs[0], CudnnBackend.default_config(&t));
    for (rank, config) in configs.iter().enumerate() {
        let k = CudnnBackend.lower_config(&t, &g, "f0", config).unwrap();
        let calls: Vec<Conv> = postcard::from_bytes(&k.code).unwrap();
        assert!(calls.iter().all(|c| c.rank as usize == rank), "{config}");
        assert!(CudnnBackend.compile_module(&t, &[k]).is_ok());
    }
    // A convolution and its bias without ReLU: cuDNN's one algorithm only.
    let mut g = Graph::new("plain");
    let x = g.add_input("x", TensorType::f32([1, 4, 5, 5]));
    let w = g.add_input("w", TensorType::f32([4, 4, 3, 3]));
    let b = g.add_input("b", TensorType::f32([4]));
    let y = g.add("c", Op::Conv(attrs(1, 1, 1)), &[x, w, b]).unwrap();
    g.outputs.push(y);
    assert_eq!(CudnnBackend.configs_for(&t, &g), [CudnnBackend.default_config(&t)]);
    let e = CudnnBackend.lower_config(&t, &g, "f0", &RANKS.name(1)).unwrap_err().to_string();
    assert!(e.contains("without ReLU"), "{e}");
    // A damaged rank is refused at decode.
    let k = CudnnBackend.lower(&t, &g, "f0").unwrap();
    let mut calls: Vec<Conv> = postcard::from_bytes(&k.code).unwrap();
    calls[0].rank = 1;
    let bad = LoweredKernel { info: k.info.clone(), code: postcard::to_stdvec(&calls).unwrap() };
    let e = CudnnBackend.compile_module(&t, &[bad]).unwrap_err().to_string();
    assert!(e.contains("rank 1"), "{e}");
}

#[test]
fn the_workspace_grows_with_the_tensors_and_a_damaged_one_is_refused() {
    use tessera_kernels::runtime::cuda::dnn::{workspace_bytes, MIN_WORKSPACE_BYTES};
    // Small tensors: the least workspace; the scratch is the intermediate (c1's output) plus it.
    let g = block(DType::F16);
    let k = CudnnBackend.lower(&cudnn(), &g, "f0").unwrap();
    let convs: Vec<Conv> = postcard::from_bytes(&k.code).unwrap();
    assert!(convs.iter().all(|c| c.workspace_bytes == MIN_WORKSPACE_BYTES));
    assert_eq!(k.info.scratch_bytes, convs[1].workspace.offset + MIN_WORKSPACE_BYTES);
    // ResNet-50's batch-32 layer2 expansion, 1x1 128 -> 512 at 28x28 with a residual: x 6.4 MB, y and z
    // 25.7 MB each, w 128 KiB, f16; a quarter more, in MiB.
    let (x, w, y) = ([32, 128, 28, 28], [512, 128, 1, 1], [32, 512, 28, 28]);
    let bytes = (32 * 128 * 784 + 512 * 128 + 2 * 32 * 512 * 784) * 2 * 5 / 4;
    assert_eq!(workspace_bytes(DType::F16, x, w, y, true), (bytes as u64).div_ceil(1 << 20) << 20);
    assert!(workspace_bytes(DType::F16, x, w, y, true) > workspace_bytes(DType::F16, x, w, y, false));
    assert_eq!(workspace_bytes(DType::F16, [1, 8, 6, 6], [8, 8, 3, 3], [1, 8, 6, 6], true), MIN_WORKSPACE_BYTES);
    // A module's workspace is the largest its convolutions declare.
    let mut big = Graph::new("big");
    let t = |s: &[u32; 4]| TensorType::new(DType::F16, s.iter().map(|&d| d as usize).collect::<Vec<usize>>());
    let xin = big.add_input("x", t(&x));
    let wv = big.add_input("w", t(&w));
    let bv = big.add_input("b", TensorType::new(DType::F16, vec![512]));
    let z = big.add_input("z", t(&y));
    let c = big.add("c", Op::Conv(attrs(1, 0, 1)), &[xin, wv, bv]).unwrap();
    let a = big.add("add", Op::Binary(BinaryOp::Add), &[c, z]).unwrap();
    let r = big.add("relu", Op::Unary(UnaryOp::Relu), &[a]).unwrap();
    big.outputs.push(r);
    let k = CudnnBackend.lower(&cudnn(), &big, "f0").unwrap();
    let convs: Vec<Conv> = postcard::from_bytes(&k.code).unwrap();
    assert_eq!(convs[0].workspace_bytes, workspace_bytes(DType::F16, x, w, y, true));
    assert_eq!(k.info.scratch_bytes, convs[0].workspace.offset + convs[0].workspace_bytes);
    // Declared past the scratch, or below the least: refused at decode.
    for (bytes, says) in [(convs[0].workspace_bytes + 1, "not inside the scratch"), (MIN_WORKSPACE_BYTES - 1, "a workspace of")] {
        let mut bad_calls = convs.clone();
        bad_calls[0].workspace_bytes = bytes;
        let bad = LoweredKernel { info: k.info.clone(), code: postcard::to_stdvec(&bad_calls).unwrap() };
        let e = CudnnBackend.compile_module(&cudnn(), &[bad]).unwrap_err().to_string();
        assert!(e.contains(says), "{e}");
    }
}
