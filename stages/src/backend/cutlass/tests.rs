use super::instance::{Activation, Element, F32_TILES, HALF_TILES};
use super::support::{self, Addend};
use super::*;
use crate::ir::{BinaryOp, DType, GeluApprox, Op, Tensor, TensorType, UnaryOp, ValueId};

fn target(precision: &str) -> Target {
    Target::parse(&format!("cuda -compiler=cutlass -precision={precision}")).unwrap()
}

fn precision_of(dt: DType) -> &'static str {
    match dt {
        DType::F16 => "fp16",
        DType::BF16 => "bf16",
        _ => "fp32",
    }
}

/// A test case: a kernel graph of one element type.
struct Case {
    name: &'static str,
    graph: fn(DType) -> Graph,
}

fn t(dt: DType, s: &[usize]) -> TensorType {
    TensorType::new(dt, s.to_vec())
}

/// x[64,96] @ w[96,40] + b[40], then GELU (erf).
fn bias_gelu(dt: DType) -> Graph {
    let mut g = Graph::new("bias_gelu");
    let x = g.add_input("x", t(dt, &[64, 96]));
    let w = g.add_input("w", t(dt, &[96, 40]));
    let b = g.add_input("b", t(dt, &[40]));
    let m = g.add("mm", Op::MatMul, &[x, w]).unwrap();
    let a = g.add("bias", Op::Binary(BinaryOp::Add), &[b, m]).unwrap();
    let y = g.add("gelu", Op::Gelu { approximate: GeluApprox::Erf }, &[a]).unwrap();
    g.outputs.push(y);
    g
}

/// a[3,50,24] @ b[3,24,36] + r[3,50,36], then ReLU: a strided batch with a residual.
fn batched_residual_relu(dt: DType) -> Graph {
    let mut g = Graph::new("batched_residual_relu");
    let a = g.add_input("a", t(dt, &[3, 50, 24]));
    let b = g.add_input("b", t(dt, &[3, 24, 36]));
    let r = g.add_input("r", t(dt, &[3, 50, 36]));
    let m = g.add("mm", Op::MatMul, &[a, b]).unwrap();
    let s = g.add("res", Op::Binary(BinaryOp::Add), &[m, r]).unwrap();
    let y = g.add("relu", Op::Unary(UnaryOp::Relu), &[s]).unwrap();
    g.outputs.push(y);
    g
}

/// a[4,33,64] @ w[64,200] (one weight for every batch: folded into one tall GEMM), then tanh-GELU.
fn folded_gelu_tanh(dt: DType) -> Graph {
    let mut g = Graph::new("folded_gelu_tanh");
    let a = g.add_input("a", t(dt, &[4, 33, 64]));
    let w = g.add_input("w", t(dt, &[64, 200]));
    let m = g.add("mm", Op::MatMul, &[a, w]).unwrap();
    let y = g.add("gelu", Op::Gelu { approximate: GeluApprox::Tanh }, &[m]).unwrap();
    g.outputs.push(y);
    g
}

/// a[2,72,64] @ b[2,64,48] + r[2,72,48], then GELU (erf): a strided batch with a residual, in extents the
/// Hopper kernels take (rows of 16 bytes).
fn batched_residual_gelu(dt: DType) -> Graph {
    let mut g = Graph::new("batched_residual_gelu");
    let a = g.add_input("a", t(dt, &[2, 72, 64]));
    let b = g.add_input("b", t(dt, &[2, 64, 48]));
    let r = g.add_input("r", t(dt, &[2, 72, 48]));
    let m = g.add("mm", Op::MatMul, &[a, b]).unwrap();
    let s = g.add("res", Op::Binary(BinaryOp::Add), &[r, m]).unwrap();
    let y = g.add("gelu", Op::Gelu { approximate: GeluApprox::Erf }, &[s]).unwrap();
    g.outputs.push(y);
    g
}

/// x[100,70] @ w[70,66]: extents only two halves wide, no epilogue.
fn narrow(dt: DType) -> Graph {
    let mut g = Graph::new("narrow");
    let x = g.add_input("x", t(dt, &[100, 70]));
    let w = g.add_input("w", t(dt, &[70, 66]));
    let m = g.add("mm", Op::MatMul, &[x, w]).unwrap();
    g.outputs.push(m);
    g
}

/// Two chains of one merged partition: x @ w1 + b1 -> Sigmoid -> @ w2; the first result lives in scratch.
fn two_chains(dt: DType) -> Graph {
    let mut g = Graph::new("two_chains");
    let x = g.add_input("x", t(dt, &[40, 32]));
    let w1 = g.add_input("w1", t(dt, &[32, 48]));
    let b1 = g.add_input("b1", t(dt, &[48]));
    let w2 = g.add_input("w2", t(dt, &[48, 16]));
    let m1 = g.add("mm1", Op::MatMul, &[x, w1]).unwrap();
    let a1 = g.add("bias1", Op::Binary(BinaryOp::Add), &[m1, b1]).unwrap();
    let h = g.add("sigmoid", Op::Unary(UnaryOp::Sigmoid), &[a1]).unwrap();
    let m2 = g.add("mm2", Op::MatMul, &[h, w2]).unwrap();
    g.outputs.push(m2);
    g
}

fn conv_attrs(stride: usize, pads: [usize; 4], dilation: usize) -> crate::ir::ConvAttrs {
    crate::ir::ConvAttrs { strides: vec![stride, stride], pads: pads.to_vec(), dilations: vec![dilation, dilation], group: 1 }
}

/// x[2,9,11,24] (NHWC) * w[40,3,3,24], stride 1, padding 1, its own bias, then ReLU: a ResNet 3x3.
fn conv_bias_relu(dt: DType) -> Graph {
    let mut g = Graph::new("conv_bias_relu");
    let x = g.add_input("x", t(dt, &[2, 9, 11, 24]));
    let w = g.add_input("w", t(dt, &[40, 3, 3, 24]));
    let b = g.add_input("b", t(dt, &[40]));
    let c = g.add("conv", Op::NhwcConv(conv_attrs(1, [1, 1, 1, 1], 1)), &[x, w, b]).unwrap();
    let y = g.add("relu", Op::Unary(UnaryOp::Relu), &[c]).unwrap();
    g.outputs.push(y);
    g
}

/// x[3,13,10,16] * w[24,1,1,16] + r (a 1x1 projection with a residual), then HardSwish.
fn conv_residual(dt: DType) -> Graph {
    let mut g = Graph::new("conv_residual");
    let x = g.add_input("x", t(dt, &[3, 13, 10, 16]));
    let w = g.add_input("w", t(dt, &[24, 1, 1, 16]));
    let r = g.add_input("r", t(dt, &[3, 13, 10, 24]));
    let c = g.add("conv", Op::NhwcConv(conv_attrs(1, [0, 0, 0, 0], 1)), &[x, w]).unwrap();
    let s = g.add("res", Op::Binary(BinaryOp::Add), &[r, c]).unwrap();
    let y = g.add("hardswish", Op::Unary(UnaryOp::HardSwish), &[s]).unwrap();
    g.outputs.push(y);
    g
}

/// x[1,17,15,6] * w[10,5,3,6], stride 2, uneven padding (top 1, left 2, bottom 0, right 1), dilation 2: channels two halves wide,
/// an odd-sized filter, taps that fall off every edge.
fn conv_strided_dilated(dt: DType) -> Graph {
    let mut g = Graph::new("conv_strided_dilated");
    let x = g.add_input("x", t(dt, &[1, 17, 15, 6]));
    let w = g.add_input("w", t(dt, &[10, 5, 3, 6]));
    let c = g.add("conv", Op::NhwcConv(conv_attrs(2, [1, 2, 0, 1], 2)), &[x, w]).unwrap();
    g.outputs.push(c);
    g
}

/// A convolution and a GEMM in one merged partition: conv(x) + b -> GELU -> @ m, the conv's result in scratch.
fn conv_then_gemm(dt: DType) -> Graph {
    let mut g = Graph::new("conv_then_gemm");
    let x = g.add_input("x", t(dt, &[2, 6, 6, 8]));
    let w = g.add_input("w", t(dt, &[32, 3, 3, 8]));
    let b = g.add_input("b", t(dt, &[32]));
    let m = g.add_input("m", t(dt, &[32, 16]));
    let c = g.add("conv", Op::NhwcConv(conv_attrs(1, [1, 1, 1, 1], 1)), &[x, w]).unwrap();
    let a = g.add("bias", Op::Binary(BinaryOp::Add), &[c, b]).unwrap();
    let h = g.add("gelu", Op::Gelu { approximate: GeluApprox::Erf }, &[a]).unwrap();
    let y = g.add("mm", Op::MatMul, &[h, m]).unwrap();
    g.outputs.push(y);
    g
}

/// The convolution cases (16-bit element types only).
fn conv_cases() -> Vec<Case> {
    vec![
        Case { name: "conv_bias_relu", graph: conv_bias_relu },
        Case { name: "conv_residual", graph: conv_residual },
        Case { name: "conv_strided_dilated", graph: conv_strided_dilated },
        Case { name: "conv_then_gemm", graph: conv_then_gemm },
    ]
}

fn cases() -> Vec<Case> {
    vec![
        Case { name: "bias_gelu", graph: bias_gelu },
        Case { name: "batched_residual_relu", graph: batched_residual_relu },
        Case { name: "folded_gelu_tanh", graph: folded_gelu_tanh },
        Case { name: "narrow", graph: narrow },
        Case { name: "two_chains", graph: two_chains },
        Case { name: "batched_residual_gelu", graph: batched_residual_gelu },
    ]
}

/// The cases the Hopper kernels run (16-byte rows).
fn hopper_cases() -> Vec<Case> {
    cases().into_iter().filter(|c| !matches!(c.name, "batched_residual_relu" | "narrow")).collect()
}

fn hopper_config(i: usize) -> String {
    format!("cutlass/v{VERSION}/{}", hopper::HOPPER_TILES[i].name())
}

#[test]
fn chains_take_one_addend_then_one_activation() {
    let g = bias_gelu(DType::F16);
    let uses = g.use_counts();
    let c = support::chain_of(&g, NodeId(2), &|v: ValueId| uses[v.index()]).unwrap();
    assert_eq!((c.anchor, c.activation), (NodeId(0), Activation::Gelu));
    assert!(matches!(c.addend, Some(Addend::Bias(_))), "{c:?}");
    let r = batched_residual_relu(DType::F32);
    let uses = r.use_counts();
    let c = support::chain_of(&r, NodeId(2), &|v: ValueId| uses[v.index()]).unwrap();
    assert!(matches!(c.addend, Some(Addend::Residual(_))) && c.activation == Activation::Relu, "{c:?}");
    // What the epilogue cannot compute: an add after the activation, two addends, Clip, odd fp16 extents.
    let mut h = Graph::new("h");
    let x = h.add_input("x", TensorType::f32([4, 16]));
    let w = h.add_input("w", TensorType::f32([16, 32]));
    let b = h.add_input("b", TensorType::f32([32]));
    let r = h.add_input("r", TensorType::f32([4, 32]));
    let m = h.add("mm", Op::MatMul, &[x, w]).unwrap();
    let a = h.add("bias", Op::Binary(BinaryOp::Add), &[m, b]).unwrap();
    let a2 = h.add("res", Op::Binary(BinaryOp::Add), &[a, r]).unwrap();
    let y = h.add("relu", Op::Unary(UnaryOp::Relu), &[a]).unwrap();
    h.outputs.extend([a2, y]);
    let s: Vec<bool> = (0..4).map(|n| support::supports(&h, NodeId(n))).collect();
    assert_eq!(s, [true, true, false, false], "the bias's value is used twice: nothing fuses past it");
    let odd = |dt: DType| {
        let mut o = Graph::new("odd");
        let x = o.add_input("x", TensorType::new(dt, vec![8, 7]));
        let w = o.add_input("w", TensorType::new(dt, vec![7, 8]));
        let m = o.add("mm", Op::MatMul, &[x, w]).unwrap();
        o.outputs.push(m);
        o
    };
    assert!(support::anchor(&odd(DType::F16), NodeId(0)).unwrap_err().0.contains("odd K or N"));
    let x32 = odd(DType::F32);
    assert!(support::anchor(&x32, NodeId(0)).is_ok(), "fp32 SIMT reads single elements");
}

#[test]
fn lowering_writes_one_launch_per_chain_with_its_tile() {
    let g = two_chains(DType::F16);
    let l = CutlassBackend.lower(&target("fp16"), &g, "k").unwrap();
    let code: CutlassCode = postcard::from_bytes(&l.code).unwrap();
    let launches = &code.launches.launches;
    assert_eq!(launches.len(), 2);
    let tile = HALF_TILES[0];
    assert_eq!((launches[0].grid, launches[0].block, launches[0].shared_bytes), ([1, 1, 1], [tile.threads(), 1, 1], 65536));
    // x, w1, b1 (as C), scratch (the first chain's result); then scratch, w2, the output.
    let args: Vec<(u32, u64)> = launches.iter().flat_map(|l| l.args.iter().map(|a| (a.index, a.offset))).collect();
    assert_eq!(args, [(0, 0), (1, 0), (2, 0), (5, 0), (5, 0), (3, 0), (4, 0)]);
    assert_eq!(l.info.scratch_bytes, 40 * 48 * 2);
    assert_eq!(code.types.len(), 2, "a sigmoid and an identity instantiation: {:?}", code.types.iter().map(|t| &t.0).collect::<Vec<_>>());
    assert!(code.source.contains("tessera::gemm<gemm_f16_128x128x32_64x64x32_s4_a888_sigmoid, 40, 48, 32, 1, 0LL, 0LL, 0, 0LL>(a, b, c, d);"), "{}", code.source);
    // Another tile is another configuration; an fp32 tile on an fp16 kernel is refused.
    let other = format!("cutlass/v{VERSION}/{}", HALF_TILES[3].name());
    // A 40x48 problem fills one threadblock of every tile: the default and the 64x64 tile (the most blocks),
    // and the Hopper tile with the most tiles (the smallest, 64x128).
    let small = CutlassBackend.configs_for(&target("fp16"), &g);
    let mut want: Vec<String> = [HALF_TILES[0], HALF_TILES[5]].iter().map(|t| format!("cutlass/v{VERSION}/{}", t.name())).collect();
    want.push(hopper_config(2));
    assert_eq!(small, want);
    // BERT-base's FFN GEMM (rows x 3072): at batch 8 (1024 rows) every tile fills half the GPU (128x256: 96
    // blocks); at batch 1 (128 rows) only 64x64 does (96 blocks), beside the default.
    let ffn = |rows: usize| {
        let mut g = Graph::new("ffn");
        let x = g.add_input("x", t(DType::F16, &[rows, 768]));
        let w = g.add_input("w", t(DType::F16, &[768, 3072]));
        let m = g.add("mm", Op::MatMul, &[x, w]).unwrap();
        g.outputs.push(m);
        g
    };
    // On sm_90 the Hopper tiles with work enough and the default are measured, not the other sm80 tiles (which
    // lose to them): at 1024 rows pingpong 64x128 (384 tiles) and 128x128 (192, a full wave), not the cooperative
    // tiles (96 each, under two waves); at 4096 rows every one. On sm_80 there is no Hopper family.
    let configs = CutlassBackend.configs_for(&target("fp16"), &ffn(1024));
    let default = format!("cutlass/v{VERSION}/{}", HALF_TILES[0].name());
    assert_eq!(configs, [default.clone(), hopper_config(0), hopper_config(2)]);
    let mut want = vec![default];
    want.extend((0..hopper::HOPPER_TILES.len()).map(hopper_config));
    assert_eq!(CutlassBackend.configs_for(&target("fp16"), &ffn(4096)), want);
    let ampere = Target::parse("cuda -compiler=cutlass -precision=fp16 -arch=sm_80").unwrap();
    let configs = CutlassBackend.configs_for(&ampere, &ffn(1024));
    assert_eq!(configs.len(), HALF_TILES.len(), "{configs:?}");
    assert_eq!(CutlassBackend.configs_for(&target("fp16"), &ffn(128)), small);
    assert!(configs.contains(&other));
    let l2 = CutlassBackend.lower_config(&target("fp16"), &g, "k", &other).unwrap();
    assert_ne!(l2.code, l.code);
    let wrong = format!("cutlass/v{VERSION}/{}", F32_TILES[0].name());
    let e = CutlassBackend.lower_config(&target("fp16"), &g, "k", &wrong).unwrap_err();
    assert!(matches!(&e, BackendError::Unsupported { why, .. } if why.contains("no F16 configuration")), "{e:?}");
    assert_eq!(CutlassBackend.configs(&target("fp32")).len(), F32_TILES.len());
}

/// bf16 kernels instantiate the same tensor-core tiles over `cutlass::bfloat16_t` (the fp16 instantiation's
/// shape and shared memory: both are 16-bit), named apart from fp16's; odd extents are refused as in fp16.
#[test]
fn bf16_kernels_instantiate_bfloat16_on_the_tensor_core_tiles() {
    let g = two_chains(DType::BF16);
    let l = CutlassBackend.lower(&target("bf16"), &g, "k").unwrap();
    let code: CutlassCode = postcard::from_bytes(&l.code).unwrap();
    assert_eq!(code.launches.launches[0].shared_bytes, 65536);
    assert!(code.source.contains("tessera::gemm<gemm_bf16_128x128x32_64x64x32_s4_a888_sigmoid, 40, 48, 32, 1, 0LL, 0LL, 0, 0LL>(a, b, c, d);"), "{}", code.source);
    let decl = &code.types.iter().find(|t| t.0.starts_with("gemm_bf16_")).unwrap().1;
    assert!(decl.contains("cutlass::bfloat16_t, cutlass::layout::RowMajor") && decl.contains("OpClassTensorOp") && decl.contains("GemmShape<16, 8, 16>"), "{decl}");
    assert_eq!(CutlassBackend.configs_for(&target("bf16"), &g), CutlassBackend.configs_for(&target("fp16"), &two_chains(DType::F16)));
    let mut o = Graph::new("odd");
    let x = o.add_input("x", TensorType::new(DType::BF16, vec![8, 7]));
    let w = o.add_input("w", TensorType::new(DType::BF16, vec![7, 8]));
    let m = o.add("mm", Op::MatMul, &[x, w]).unwrap();
    o.outputs.push(m);
    assert!(support::anchor(&o, NodeId(0)).unwrap_err().0.contains("bf16 GEMM with odd K or N"));
}

/// A Hopper configuration lowers each chain to an entry taking the whole `Params`, with the problem the probe
/// builds it for; kernels it cannot run are refused with the reason.
#[test]
fn hopper_configurations_lower_to_parameter_launches() {
    let g = batched_residual_gelu(DType::F16);
    let l = CutlassBackend.lower_config(&target("fp16"), &g, "k", &hopper_config(0)).unwrap();
    let code: CutlassCode = postcard::from_bytes(&l.code).unwrap();
    let p = code.problems[0].as_ref().unwrap();
    assert_eq!((p.m, p.n, p.k, p.batch, p.a_stride, p.b_stride, p.source), (72, 48, 64, 2, 72 * 64, 64 * 48, hopper::Source::Residual));
    assert!(code.source.contains("k_k0(typename sm90_pingpong_128x128x64_f16_res_gelu::Params const __grid_constant__ params)"), "{}", code.source);
    let args: Vec<u32> = code.launches.launches[0].args.iter().map(|a| a.index).collect();
    assert_eq!(args, [0, 1, 2, 3], "A, B, the residual, D");
    let e = CutlassBackend.lower_config(&target("fp16"), &narrow(DType::F16), "k", &hopper_config(0)).unwrap_err();
    assert!(e.to_string().contains("multiples of 8"), "{e}");
    let e = CutlassBackend.lower_config(&target("fp32"), &bias_gelu(DType::F32), "k", &hopper_config(0)).unwrap_err();
    assert!(e.to_string().contains("no F32 configuration"), "{e}");
}

/// A Hopper module compiles here, GPU or not: its launches pass parameter blocks whose tensor maps and
/// pointers name the right arguments, and two probes of the same source give the same bytes.
#[test]
fn hopper_modules_carry_parameter_blocks_without_a_gpu() {
    if !toolchain_or_skip() {
        return;
    }
    let target = target("fp16");
    let graphs = [bias_gelu(DType::F16), batched_residual_gelu(DType::F16)];
    let lowered: Vec<LoweredKernel> = graphs.iter().enumerate().map(|(i, g)| CutlassBackend.lower_config(&target, g, &format!("h{i}"), &hopper_config(0)).unwrap()).collect();
    let m = CutlassBackend.compile_module(&target, &lowered).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.format, tessera_kernels::runtime::cuda::PARAMS_FORMAT);
    let c = CubinModule::decode(&m).unwrap();
    assert_eq!(c.arch, "sm_90a");
    for (f, params) in c.functions.iter().zip(&c.launch_params) {
        let l = &f.launches[0];
        assert!(params[0].is_some() && l.args.is_empty() && l.block == [384, 1, 1] && l.grid.iter().product::<u32>() <= hopper::SMS && l.shared_bytes > 100_000, "{l:?}");
    }
    // bias_gelu: A, B and D by TMA (x, w, the output: arguments 0, 1, 3), the bias (argument 2) by pointer.
    let p = c.launch_params[0][0].as_ref().unwrap();
    let mut maps: Vec<u32> = p.tensor_maps.iter().map(|t| t.arg.index).collect();
    maps.sort();
    assert_eq!(maps, [0, 1, 3]);
    assert_eq!(p.pointers.iter().map(|q| q.arg.index).collect::<Vec<_>>(), [2]);
    // A's map: K innermost (96 of them), then the 64 rows, then the batch.
    let a = p.tensor_maps.iter().find(|t| t.arg.index == 0).unwrap();
    assert_eq!((a.dims[0], a.dims[1], a.strides[0]), (96, 64, 96 * 2));
    // The residual case: A, B, C and D by TMA, batches 72 x 64 apart in A.
    let p = c.launch_params[1][0].as_ref().unwrap();
    let mut maps: Vec<u32> = p.tensor_maps.iter().map(|t| t.arg.index).collect();
    maps.sort();
    assert_eq!(maps, [0, 1, 2, 3]);
    let a = p.tensor_maps.iter().find(|t| t.arg.index == 0).unwrap();
    assert_eq!(a.dims, [64, 72, 2]);
    assert_eq!(a.strides, [64 * 2, 72 * 64 * 2]);
    // The same probe again: the same blocks (padding zeroed, no address of this run in them).
    let codes: Vec<CutlassCode> = lowered.iter().map(|k| decode(k).unwrap()).collect();
    let (src, at) = probe_of(&codes);
    let args: Vec<Vec<_>> = at.iter().map(|&(k, l)| codes[k].launches.launches[l].args.clone()).collect();
    let again = hopper::read_probe(&toolchain::toolchain().unwrap().probe_uncached(&src).unwrap(), &args).unwrap();
    assert_eq!(again.iter().map(|p| Some(p.params.clone())).collect::<Vec<_>>(), c.launch_params.iter().map(|v| v[0].clone()).collect::<Vec<_>>());
}

/// Whether the toolchain is here; with TESSERA_REQUIRE_CUTLASS set (the test script sets it) its absence fails.
fn toolchain_or_skip() -> bool {
    match toolchain::toolchain() {
        Ok(_) => true,
        Err(why) if std::env::var_os("TESSERA_REQUIRE_CUTLASS").is_some() => panic!("TESSERA_REQUIRE_CUTLASS is set: {why}"),
        Err(why) => {
            eprintln!("skipping: {why}");
            false
        }
    }
}

fn lower_all(dt: DType, config: Option<&str>, prefix: &str) -> Vec<LoweredKernel> {
    lower_cases(&cases(), dt, config, prefix)
}

/// The cases a configuration runs: the Hopper ones take 16-byte rows only.
fn cases_of(config: &str) -> Vec<Case> {
    if config.contains("/sm90_") {
        hopper_cases()
    } else {
        cases()
    }
}

/// The cases a configuration runs on the GPU: with the sm80 tiles in 16-bit types, the convolutions too.
fn gpu_cases(dt: DType, config: &str) -> Vec<Case> {
    let mut out = cases_of(config);
    if dt != DType::F32 && !config.contains("/sm90_") {
        out.extend(conv_cases());
    }
    out
}

fn lower_cases(cases: &[Case], dt: DType, config: Option<&str>, prefix: &str) -> Vec<LoweredKernel> {
    let target = target(precision_of(dt));
    cases
        .iter()
        .map(|c| {
            let g = (c.graph)(dt);
            let sym = format!("{prefix}_{}", c.name);
            match config {
                None => CutlassBackend.lower(&target, &g, &sym),
                Some(cfg) => CutlassBackend.lower_config(&target, &g, &sym, cfg),
            }
            .unwrap_or_else(|e| panic!("{}: {e}", c.name))
        })
        .collect()
}

/// Every case in both element types compiles to an sm_90 cubin here, GPU or not, a program per kernel, and the
/// same source gives the same bytes (frozen builds rebuild cutlass modules byte for byte).
#[test]
fn kernels_compile_to_identical_cubins_without_a_gpu() {
    if !toolchain_or_skip() {
        return;
    }
    for dt in [DType::F16, DType::BF16, DType::F32] {
        let target = target(precision_of(dt));
        let lowered = lower_all(dt, None, "cpl");
        let a = CutlassBackend.compile_module(&target, &lowered).unwrap_or_else(|e| panic!("{dt:?}: {e}"));
        let c = CubinModule::decode(&a).unwrap();
        assert_eq!((c.arch.as_str(), c.cubins.len()), ("sm_90", cases().len()), "a program per kernel");
        assert_eq!(c.functions.len(), cases().len());
        // Each kernel's cubin is what a fresh nvcc run (no process cache) makes of its program (fp16's: the
        // others are the same template).
        let tools = toolchain::toolchain().unwrap();
        for (k, cubin) in lowered.iter().zip(&c.cubins).filter(|_| dt == DType::F16) {
            let fresh = tools.compile_uncached("sm_90", &module_source(std::slice::from_ref(k)).unwrap()).unwrap();
            assert!(fresh == *cubin, "{dt:?} {}: two compiles of one source differ", k.info.symbol);
        }
        // A module of some of the kernels takes their cubins from the first compile.
        let part = CutlassBackend.compile_module(&target, &lowered[1..3]).unwrap();
        assert_eq!(CubinModule::decode(&part).unwrap().cubins, c.cubins[1..3].to_vec());
    }
    // The toolchain's versions are compile-key facts.
    let env = CutlassBackend.environment(&target("fp16"));
    let names: Vec<&str> = env.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["cutlass.version", "nvcc.options", "nvcc.version"]);
}

/// fp16 and bf16 inputs as fp32 tensors of the same values, for the fp32 reference.
fn widened(t: &Tensor) -> Tensor {
    let v: Vec<f32> = t.to_f64_vec().into_iter().map(|x| x as f32).collect();
    Tensor::from_f32(t.ty.shape.clone(), &v)
}

/// Every case, in both element types and every tile configuration, against the reference interpreter on the
/// GPU (TESSERA_GPU=1): fp32 within 1e-4, fp16 and bf16 within 1e-2 of the fp32 reference on the same values.
#[test]
fn every_tile_matches_the_reference_on_the_gpu() {
    use tessera_kernels::runtime::cuda::call::call_gpu_function;
    if std::env::var_os("TESSERA_GPU").is_none() {
        eprintln!("skipping: set TESSERA_GPU=1 on a machine with an NVIDIA GPU");
        return;
    }
    let mut jobs: Vec<(DType, String)> = Vec::new();
    for dt in [DType::F16, DType::BF16, DType::F32] {
        let e = Element::of(dt).unwrap();
        jobs.extend(instance::tiles(e).iter().map(|t| (dt, format!("cutlass/v{VERSION}/{}", t.name()))));
        if e.is_half() {
            jobs.extend((0..hopper::HOPPER_TILES.len()).map(|i| (dt, hopper_config(i))));
        }
    }
    // One module per configuration, compiled in parallel.
    let modules: Vec<(DType, String, Vec<LoweredKernel>, Module)> = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .enumerate()
            .map(|(i, (dt, cfg))| {
                s.spawn(move || {
                    let lowered = lower_cases(&gpu_cases(*dt, cfg), *dt, Some(cfg), &format!("gpu{i}"));
                    let m = CutlassBackend.compile_module(&target(precision_of(*dt)), &lowered).unwrap_or_else(|e| panic!("{cfg}: {e}"));
                    (*dt, cfg.clone(), lowered, m)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut failures = Vec::new();
    let mut report = Vec::new();
    for (dt, cfg, lowered, module) in &modules {
        let loaded = tessera_kernels::runtime::load_module(module).unwrap_or_else(|e| panic!("{cfg}: {}", e.0));
        for (ci, (c, l)) in gpu_cases(*dt, cfg).iter().zip(lowered).enumerate() {
            let g = (c.graph)(*dt);
            let inputs = crate::interp::random_inputs(&g, 300 + ci as u64);
            let g32 = (c.graph)(DType::F32);
            let want = crate::interp::run_graph(&g32, &inputs.iter().map(widened).collect::<Vec<_>>()).unwrap();
            let got = call_gpu_function(loaded.as_ref(), ci, &l.info, &inputs).unwrap_or_else(|e| panic!("{} {cfg}: {}", c.name, e.0));
            let tol = if *dt == DType::F32 { 1e-4 } else { 1e-2 };
            match crate::backend::compare::compare_to_reference(&widened(&got[0]), &want[0], tol) {
                Ok(err) => report.push(format!("{} {cfg}: {err:.2e}", c.name)),
                Err(e) => failures.push(format!("{} {cfg}: {e}", c.name)),
            }
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{} of {} runs differ from the reference:\n{}", failures.len(), failures.len() + report.len(), failures.join("\n"));
}


/// Convolution chains: the conv's own bias is the epilogue's addend, so a residual after it does not fuse;
/// fp32, grouped and odd-channel convolutions stay elsewhere; a Hopper tile refuses a convolution.
#[test]
fn convolutions_fuse_their_bias_or_a_residual_and_run_on_the_sm80_tiles() {
    let count = |g: &Graph| {
        let uses = g.use_counts();
        move |v: ValueId| uses[v.index()]
    };
    let g = conv_bias_relu(DType::F16);
    let last = NodeId(1);
    let chain = support::chain_of(&g, last, &count(&g)).unwrap();
    assert_eq!((chain.addend, chain.activation), (Some(Addend::Bias(ValueId(2))), Activation::Relu));
    let g = conv_residual(DType::F16);
    let chain = support::chain_of(&g, NodeId(2), &count(&g)).unwrap();
    assert_eq!((chain.addend, chain.activation), (Some(Addend::Residual(ValueId(2))), Activation::HardSwish));
    // Bias and residual both: two addends.
    let mut g = Graph::new("bias_and_residual");
    let x = g.add_input("x", t(DType::F16, &[2, 9, 11, 24]));
    let w = g.add_input("w", t(DType::F16, &[40, 3, 3, 24]));
    let b = g.add_input("b", t(DType::F16, &[40]));
    let r = g.add_input("r", t(DType::F16, &[2, 9, 11, 40]));
    let c = g.add("conv", Op::NhwcConv(conv_attrs(1, [1, 1, 1, 1], 1)), &[x, w, b]).unwrap();
    let s = g.add("res", Op::Binary(BinaryOp::Add), &[c, r]).unwrap();
    g.outputs.push(s);
    let err = support::chain_of(&g, NodeId(1), &count(&g)).unwrap_err();
    assert!(err.0.contains("one bias or one residual"), "{err}");
    assert!(!support::anchor(&conv_bias_relu(DType::F32), NodeId(0)).unwrap_err().0.is_empty());
    let mut grouped = conv_residual(DType::F16);
    if let Op::NhwcConv(a) = &mut grouped.nodes[0].op {
        a.group = 2;
    }
    assert!(support::anchor(&grouped, NodeId(0)).unwrap_err().0.contains("one group"));
    let mut odd = Graph::new("odd");
    let x = odd.add_input("x", t(DType::F16, &[1, 8, 8, 3]));
    let w = odd.add_input("w", t(DType::F16, &[64, 7, 7, 3]));
    odd.add("stem", Op::NhwcConv(conv_attrs(2, [3, 3, 3, 3], 1)), &[x, w]).unwrap();
    assert!(support::anchor(&odd, NodeId(0)).unwrap_err().0.contains("in pairs"));
    // The rule admits a convolution's chain only with -convs; GEMM chains either way.
    let g = conv_then_gemm(DType::F16);
    let with = Target::parse("cuda -compiler=cutlass -precision=fp16 -convs").unwrap();
    let admitted = |t: &Target| (0..g.nodes.len() as u32).filter(|&i| CutlassBackend.supports(&g, NodeId(i), t)).collect::<Vec<_>>();
    assert_eq!(admitted(&with), [0, 1, 2, 3]);
    assert_eq!(admitted(&target("fp16")), [3], "the MatMul alone");
    // Lowering: one launch per chain, with the implicit GEMM's grid; the conv prelude only where needed.
    let target = target("fp16");
    let k = CutlassBackend.lower(&target, &conv_then_gemm(DType::F16), "cg").unwrap();
    let code = decode(&k).unwrap();
    assert_eq!(code.launches.launches.len(), 2);
    // 2*6*6 = 72 pixels by 32 channels on 128x128 tiles; the GEMM's 72x16.
    assert_eq!(code.launches.launches[0].grid, [1, 1, 1]);
    assert_eq!(code.launches.launches[0].args.len(), 4, "x, w, bias, scratch");
    let src = module_source(std::slice::from_ref(&k)).unwrap();
    assert!(src.contains("tessera::conv2d<conv_f16_128x128x32_64x64x32_s4_a88_gelu, 2, 6, 6, 8, 32, 3, 3, 6, 6, 1, 1, 1, 1, 1, 1, true>"), "{src}");
    assert!(src.contains("conv2d_fprop"), "the conv prelude's headers");
    let plain = CutlassBackend.lower(&target, &bias_gelu(DType::F16), "bg").unwrap();
    assert!(!module_source(std::slice::from_ref(&plain)).unwrap().contains("conv2d_fprop"));
    let strided = decode(&CutlassBackend.lower(&target, &conv_strided_dilated(DType::F16), "sd").unwrap()).unwrap();
    assert!(strided.source.contains(", 1, 17, 15, 6, 10, 5, 3, 5, 7, 1, 2, 2, 2, 2, 2, false>"), "{}", strided.source);
    // Only sm80 tiles are offered for a convolution, and a Hopper tile refuses one.
    let sm90 = Target::parse("cuda -compiler=cutlass -precision=fp16 -arch=sm_90").unwrap();
    let configs = CutlassBackend.configs_for(&sm90, &conv_bias_relu(DType::F16));
    assert!(configs.iter().all(|c| !c.contains("/sm90_")), "{configs:?}");
    assert_eq!(configs.len(), 2, "the default and one more: {configs:?}");
    let err = CutlassBackend.lower_config(&sm90, &conv_bias_relu(DType::F16), "h", &hopper_config(0)).unwrap_err();
    assert!(err.to_string().contains("Hopper tiles run GEMMs"), "{err}");
}

/// The convolution cases compile to sm_90 cubins here, GPU or not, in both 16-bit types.
#[test]
fn convolutions_compile_without_a_gpu() {
    if !toolchain_or_skip() {
        return;
    }
    for dt in [DType::F16, DType::BF16] {
        let lowered = lower_cases(&conv_cases(), dt, None, "conv");
        let m = CutlassBackend.compile_module(&target(precision_of(dt)), &lowered).unwrap_or_else(|e| panic!("{dt:?}: {e}"));
        assert_eq!(CubinModule::decode(&m).unwrap().cubins.len(), conv_cases().len());
    }
}

/// The rule offers GEMMs of at least one smallest tile's rows: a classifier's few rows are left to the others
/// (each candidate costs nvcc time), though the kernel still lowers when asked.
#[test]
fn thin_gemms_are_not_offered() {
    let fp16 = target("fp16");
    let g = two_chains(DType::F16);
    assert!((0..g.nodes.len() as u32).all(|i| !CutlassBackend.supports(&g, NodeId(i), &fp16)), "40 rows");
    assert!(CutlassBackend.lower(&fp16, &g, "thin").is_ok());
    let g = bias_gelu(DType::F16);
    assert!((0..g.nodes.len() as u32).all(|i| CutlassBackend.supports(&g, NodeId(i), &fp16)), "64 rows and their epilogue");
    let mut fc = Graph::new("fc");
    let x = fc.add_input("x", t(DType::F16, &[32, 2048]));
    let w = fc.add_input("w", t(DType::F16, &[2048, 1000]));
    let m = fc.add("fc", Op::MatMul, &[x, w]).unwrap();
    fc.outputs.push(m);
    assert!(!CutlassBackend.supports(&fc, NodeId(0), &fp16), "ResNet-50's classifier at batch 32");
}
