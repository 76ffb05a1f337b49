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

fn cases() -> Vec<Case> {
    vec![
        Case { name: "bias_gelu", graph: bias_gelu },
        Case { name: "batched_residual_relu", graph: batched_residual_relu },
        Case { name: "folded_gelu_tanh", graph: folded_gelu_tanh },
        Case { name: "narrow", graph: narrow },
        Case { name: "two_chains", graph: two_chains },
    ]
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
    assert!(support::anchor(&odd(DType::F16), NodeId(0)).unwrap_err().contains("odd K or N"));
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
    // A 40x48 problem fills one threadblock of every tile: the default and the 64x64 tile (the most blocks).
    let small = CutlassBackend.configs_for(&target("fp16"), &g);
    assert_eq!(small, [HALF_TILES[0], HALF_TILES[5]].iter().map(|t| format!("cutlass/v{VERSION}/{}", t.name())).collect::<Vec<_>>());
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
    let configs = CutlassBackend.configs_for(&target("fp16"), &ffn(1024));
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
    assert!(support::anchor(&o, NodeId(0)).unwrap_err().contains("bf16 GEMM with odd K or N"));
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
    let target = target(precision_of(dt));
    cases()
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
        assert!(c.cubins.iter().all(|b| &b[..4] == b"\x7fELF"));
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
    }
    // One module per configuration, compiled in parallel.
    let modules: Vec<(DType, String, Vec<LoweredKernel>, Module)> = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .enumerate()
            .map(|(i, (dt, cfg))| {
                s.spawn(move || {
                    let lowered = lower_all(*dt, Some(cfg), &format!("gpu{i}"));
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
        for (ci, (c, l)) in cases().iter().zip(lowered).enumerate() {
            let g = (c.graph)(*dt);
            let inputs = crate::interp::random_inputs(&g, 300 + ci as u64);
            let g32 = (c.graph)(DType::F32);
            let want = crate::interp::run_graph(&g32, &inputs.iter().map(widened).collect::<Vec<_>>()).unwrap();
            let got = call_gpu_function(loaded.as_ref(), ci, &l.info, &inputs).unwrap_or_else(|e| panic!("{} {cfg}: {}", c.name, e.0));
            let tol = if *dt == DType::F32 { 1e-4 } else { 1e-2 };
            match crate::backend::cuda::tests::compare_to_reference(&widened(&got[0]), &want[0], tol) {
                Ok(err) => report.push(format!("{} {cfg}: {err:.2e}", c.name)),
                Err(e) => failures.push(format!("{} {cfg}: {e}", c.name)),
            }
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{} of {} runs differ from the reference:\n{}", failures.len(), failures.len() + report.len(), failures.join("\n"));
}
