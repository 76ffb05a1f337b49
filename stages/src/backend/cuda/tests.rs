//! Code generation tests of the `cuda` backend that need no GPU: every op family lowers, the module compiles
//! to a cubin with NVRTC (when the toolkit is present; `TESSERA_REQUIRE_NVRTC=1`, as the test script sets,
//! makes its absence a failure instead of a skip), and lowering is deterministic.

use super::*;
use crate::ir::*;
use tessera_kernels::runtime::cuda::format::{FunctionLaunches, Launch};

fn target() -> Target {
    Target::parse("cuda -compiler=nvrtc").unwrap()
}

fn nvrtc_or_skip(what: &str) -> bool {
    match libs::toolkit() {
        Ok(_) => true,
        Err(why) => {
            assert!(std::env::var_os("TESSERA_REQUIRE_NVRTC").is_none(), "TESSERA_REQUIRE_NVRTC is set but NVRTC is missing: {why}");
            eprintln!("skipping {what}: {why}");
            false
        }
    }
}

fn f32in(g: &mut Graph, name: &str, shape: &[usize]) -> ValueId {
    g.add_input(name, TensorType::f32(shape.to_vec()))
}

fn node(g: &mut Graph, op: Op, inputs: &[ValueId]) -> ValueId {
    let name = format!("n{}", g.nodes.len());
    g.add(name, op, inputs).unwrap_or_else(|e| panic!("{e}"))
}

/// A graph touching every kernel family: GEMM with epilogue, conv (tiled and depthwise), pooling,
/// reductions, normalizations, data movement.
fn zoo_of_ops() -> Graph {
    let mut g = Graph::new("ops");
    let x = f32in(&mut g, "x", &[2, 16, 8, 8]);
    let w = f32in(&mut g, "w", &[16, 16, 3, 3]);
    let b = f32in(&mut g, "b", &[16]);
    let c = node(&mut g, Op::Conv(ConvAttrs { strides: vec![1, 1], pads: vec![1, 1, 1, 1], dilations: vec![1, 1], group: 1 }), &[x, w, b]);
    let r = node(&mut g, Op::Unary(UnaryOp::Relu), &[c]);
    let dw = f32in(&mut g, "dw", &[16, 1, 3, 3]);
    let d = node(&mut g, Op::Conv(ConvAttrs { strides: vec![2, 2], pads: vec![1, 1, 1, 1], dilations: vec![1, 1], group: 16 }), &[r, dw]);
    let p = node(&mut g, Op::MaxPool(PoolAttrs { kernel: vec![2, 2], strides: vec![2, 2], pads: vec![0, 0, 0, 0], dilations: vec![1, 1], ceil_mode: false }), &[d]);
    let gap = node(&mut g, Op::GlobalAveragePool, &[p]);
    let flat = node(&mut g, Op::Reshape { shape: vec![2, 16] }, &[gap]);
    let wm = f32in(&mut g, "wm", &[16, 32]);
    let mm = node(&mut g, Op::MatMul, &[flat, wm]);
    let ge = node(&mut g, Op::Gelu { approximate: GeluApprox::Erf }, &[mm]);
    let sc = f32in(&mut g, "sc", &[32]);
    let ln = node(&mut g, Op::LayerNorm { axis: 1, epsilon: 1e-5 }, &[ge, sc]);
    let sm = node(&mut g, Op::Softmax { axis: 1 }, &[ln]);
    let t = node(&mut g, Op::Transpose { perm: vec![1, 0] }, &[sm]);
    let red = node(&mut g, Op::Reduce { kind: ReduceKind::Max, axes: vec![1], keepdims: false }, &[t]);
    g.outputs = vec![red, ln];
    g
}

#[test]
fn every_kernel_family_lowers_and_lowering_is_deterministic() {
    let g = zoo_of_ops();
    let a = CudaBackend.lower(&target(), &g, "ops").unwrap();
    let b = CudaBackend.lower(&target(), &g, "ops").unwrap();
    assert_eq!(a, b);
    let code: CudaCode = postcard::from_bytes(&a.code).unwrap();
    assert!(code.launches.launches.len() >= 8, "{}", code.source);
    for l in &code.launches.launches {
        // `__launch_bounds__(threads)` or `__launch_bounds__(threads, blocks per SM)`, threads the launch's.
        let head = &code.source[..code.source.find(&format!(") {}(", l.entry)).unwrap_or_else(|| panic!("{}", l.entry))];
        let bounds = &head[head.rfind("void __launch_bounds__(").expect("launch bounds") + "void __launch_bounds__(".len()..];
        assert_eq!(bounds.split(", ").next(), Some(l.block.iter().product::<u32>().to_string().as_str()), "{}", l.entry);
    }
}

#[test]
fn a_module_compiles_to_an_sm90_cubin() {
    if !nvrtc_or_skip("the NVRTC compile test") {
        return;
    }
    let g = zoo_of_ops();
    let k = CudaBackend.lower(&target(), &g, "ops").unwrap();
    let m = CudaBackend.compile_module(&target(), &[k]).unwrap();
    assert_eq!(m.format, tessera_kernels::runtime::cuda::FORMAT);
    let c = CubinModule::decode(&m).unwrap();
    assert_eq!(c.arch, "sm_90");
    assert_eq!(&c.cubins[0][..4], b"\x7fELF");
}

/// How modules are cut into programs: whole up to ONE_PROGRAM_MAX launches; beyond, runs of
/// LAUNCHES_PER_PROGRAM launches, a kernel's consecutive launches in one unit, a kernel without entry
/// offsets whole.
#[test]
fn programs_cut_large_modules_by_launches() {
    let code = |launches: usize, split: bool| CudaCode {
        source: String::new(),
        launches: FunctionLaunches { launches: (0..launches).map(|j| Launch { entry: format!("e{j}"), grid: [1, 1, 1], block: [32, 1, 1], shared_bytes: 0, args: vec![] }).collect() },
        entry_offsets: if split { vec![0; launches] } else { vec![] },
    };
    let u = |kernel: usize, launches: std::ops::Range<usize>| Unit { kernel, launches };
    assert_eq!(programs(&[code(5, true), code(7, true)]), vec![vec![u(0, 0..5), u(1, 0..7)]], "12 launches: one program");
    assert_eq!(programs(&[code(10, true), code(3, false), code(4, true)]), vec![vec![u(0, 0..6)], vec![u(0, 6..10)], vec![u(1, 0..3), u(2, 0..3)], vec![u(2, 3..4)]]);
    assert_eq!(programs(&[code(20, false)]), vec![vec![u(0, 0..20)]], "a kernel in one piece stays whole");
}

/// A module of more launches than one program takes is compiled as several programs: each launch names the
/// cubin holding its kernel (whose entry is in that cubin only), two compiles give the same bytes, and the
/// module runs the same kernels (its launches are the lowered ones).
#[test]
fn a_large_module_is_compiled_as_several_programs() {
    if !nvrtc_or_skip("the NVRTC program split test") {
        return;
    }
    let g = zoo_of_ops();
    let kernels: Vec<LoweredKernel> = (0..3).map(|i| CudaBackend.lower(&target(), &g, &format!("ops{i}")).unwrap()).collect();
    let codes: Vec<CudaCode> = kernels.iter().map(|k| postcard::from_bytes(&k.code).unwrap()).collect();
    let total: usize = codes.iter().map(|c| c.launches.launches.len()).sum();
    assert!(total > ONE_PROGRAM_MAX, "{total} launches");
    let m = CudaBackend.compile_module(&target(), &kernels).unwrap();
    let c = CubinModule::decode(&m).unwrap();
    assert_eq!(c.cubins.len(), total.div_ceil(LAUNCHES_PER_PROGRAM));
    assert_eq!(c.functions, codes.iter().map(|c| c.launches.clone()).collect::<Vec<_>>());
    let has = |cubin: &[u8], name: &str| cubin.windows(name.len()).any(|w| w == name.as_bytes());
    for (f, cubins) in c.functions.iter().zip(&c.launch_cubins) {
        for (l, &ci) in f.launches.iter().zip(cubins) {
            for (j, cubin) in c.cubins.iter().enumerate() {
                assert_eq!(has(cubin, &format!("{}\0", l.entry)), j == ci as usize, "{} in cubin {j}", l.entry);
            }
        }
    }
    assert_eq!(CudaBackend.compile_module(&target(), &kernels).unwrap().bytes, m.bytes, "the same kernels give the same module");
    let one = CubinModule::decode(&CudaBackend.compile_module(&target(), &kernels[..1]).unwrap()).unwrap();
    assert_eq!(one.cubins.len(), if codes[0].launches.launches.len() > ONE_PROGRAM_MAX { 2 } else { 1 });
    let twice = [kernels[0].clone(), kernels[0].clone()];
    assert!(CudaBackend.compile_module(&target(), &twice).unwrap_err().to_string().contains("two kernels of one module are named 'ops0'"));
}

#[test]
fn nvrtc_errors_name_the_kernel() {
    if !nvrtc_or_skip("the NVRTC error test") {
        return;
    }
    let code = CudaCode { source: "extern \"C\" __global__ void bad_k0_0() { undefined_thing(); }\n".into(), launches: Default::default(), entry_offsets: vec![] };
    let k = LoweredKernel {
        info: crate::backend::FunctionInfo { symbol: "bad".into(), inputs: vec![], outputs: vec![], scratch_bytes: 0 },
        code: postcard::to_stdvec(&code).unwrap(),
    };
    let e = CudaBackend.compile_module(&target(), &[k]).unwrap_err();
    assert!(matches!(&e, BackendError::Compile { tool: "NVRTC", kernels, located: true, .. } if kernels == &["bad".to_string()]), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("kernel bad") && e.contains("undefined_thing"), "{e}");
}

#[test]
fn small_gemms_take_small_tiles_and_split_k_large_ones_do_not() {
    use gemm::{Schedule, Tiles, SMALL_TILES};
    // A large problem fills the GPU with the default tile.
    assert_eq!(Schedule::for_problem(4096, 4096, 4096, 1), Schedule { tiles: Tiles::default(), splits: 1 });
    // ResNet-50 stage 4 at batch 1: 512 x 49, K = 4608: small tiles, K split.
    let s = Schedule::for_problem(512, 49, 4608, 1);
    assert_eq!(s.tiles, SMALL_TILES);
    assert!(s.splits > 1 && s.splits <= gemm::MAX_SPLITS, "{s:?}");
    // A shallow K is never split below the minimum slice.
    assert_eq!(Schedule::for_problem(64, 64, 64, 1).splits, 1);
}

/// `zoo_of_ops` in fp16 or bf16 (the precision pass's rewrite), plus a GEMM deep enough to split K.
fn zoo_of_ops_narrow(narrow: DType) -> Graph {
    let mut g = zoo_of_ops();
    let a = f32in(&mut g, "a", &[4, 512]);
    let bw = f32in(&mut g, "bw", &[512, 96]);
    let mm = node(&mut g, Op::MatMul, &[a, bw]);
    let pad = node(&mut g, Op::Pad { pads: vec![0, 1, 0, 1], mode: PadMode::Constant, value: 0.5 }, &[mm]);
    g.outputs.push(pad);
    crate::passes::precision::to_narrow(&g, narrow).unwrap()
}

/// The 16-bit float types the backend stores, with the CUDA type of their buffers.
const NARROW: [(DType, &str); 2] = [(DType::F16, "__half"), (DType::BF16, "__nv_bfloat16")];

#[test]
fn fp16_and_bf16_graphs_lower_to_tensor_core_gemms_and_fp32_accumulation() {
    for (dt, cty) in NARROW {
        let g = zoo_of_ops_narrow(dt);
        assert!(g.nodes.iter().any(|n| matches!(n.op, Op::MatMul) && g.ty(n.outputs[0]).dtype == dt));
        let k = CudaBackend.lower(&target(), &g, "ops16").unwrap();
        let code: CudaCode = postcard::from_bytes(&k.code).unwrap();
        // Tensor cores for both GEMMs and the conv (gemm.cuh's tensor-core loops, fp32 accumulators), on
        // operands and buffers of the type.
        assert!(code.source.matches("tsr_gemm::tc_").count() >= 3, "{}", code.source);
        assert!(code.source.matches(&format!(", {cty}>(slice, a, b, index, out);")).count() >= 3, "{}", code.source);
        assert!(code.source.contains(&format!("{cty}* __restrict__")));
        let module = module_source(std::slice::from_ref(&k)).unwrap();
        assert!(module.contains("nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>"));
        let other = NARROW.iter().find(|(d, _)| *d != dt).unwrap().1;
        assert!(!code.source.contains(&format!("{other}*")), "{dt}: no buffer of the other 16-bit type");
        // The deep GEMM splits K: its slices are summed by a second kernel.
        assert!(code.source.contains("slice * "), "{}", code.source);
        assert!(module_source(&[k]).unwrap().starts_with("/* tessera cuda module */\n#include <mma.h>"));
        // The deep GEMM has contiguous operands: it runs the cp.async pipeline, its three stages.
        assert!(code.source.contains(&format!(", {}, {cty}>(slice, a, b, index, out);", gemm::PIPELINE_STAGES)), "{}", code.source);
        assert!(code.source.contains("tsr_gemm::tc_pipelined<"), "{}", code.source);
    }
    assert_eq!(gemm::TcSchedule::for_problem(4, 96, 512, 1).tiles, gemm::SMALL_TC_TILES);
    assert!(gemm::TcSchedule::for_problem(4, 96, 512, 1).splits > 1);
}

/// The fp16 and bf16 zoos compile, in one module (the 16-bit helpers are declared once for both types, as a
/// model with `-overflow=bf16` mixes them).
#[test]
fn fp16_and_bf16_modules_compile_to_sm90_cubins() {
    if !nvrtc_or_skip("the fp16/bf16 NVRTC compile test") {
        return;
    }
    let mut lowered: Vec<LoweredKernel> = NARROW.iter().map(|&(dt, _)| CudaBackend.lower(&target(), &zoo_of_ops_narrow(dt), &format!("ops_{dt}")).unwrap()).collect();
    // `-overflow=bf16`: every other node kept in bf16, so kernels read, write and convert both types.
    let g = zoo_of_ops();
    let keep: Vec<bool> = (0..g.nodes.len()).map(|i| i % 2 == 0).collect();
    let mixed = crate::passes::precision::to_narrow_keeping(&g, DType::F16, &keep, DType::BF16).unwrap();
    lowered.push(CudaBackend.lower(&target(), &mixed, "ops_mixed").unwrap());
    let m = CudaBackend.compile_module(&target(), &lowered).unwrap_or_else(|e| panic!("{e}"));
    let c = CubinModule::decode(&m).unwrap();
    assert_eq!(&c.cubins[0][..4], b"\x7fELF");
}

/// Every shared attention case lowers to one kernel (none for an empty output, a zero fill for no keys),
/// deterministically, and the module compiles to a cubin; so does every tile on the BERT and ViT shapes.
#[test]
fn attention_kernels_lower_and_compile() {
    use attention::{AttnTiles, MID_TILES, SMALL_TILES};
    let cases = crate::backend::attention_cases::cases();
    let mut lowered = Vec::new();
    for c in &cases {
        let g = c.graph();
        let sym = format!("attn_{}", c.name);
        let a = CudaBackend.lower(&target(), &g, &sym).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_eq!(a, CudaBackend.lower(&target(), &g, &sym).unwrap(), "{}: lowering is deterministic", c.name);
        let code: CudaCode = postcard::from_bytes(&a.code).unwrap();
        assert_eq!(code.launches.launches.len(), 1, "{}", c.name);
        let l = &code.launches.launches[0];
        if c.sk == 0 {
            assert_eq!(l.shared_bytes, 0, "{}: no keys is a plain zero fill", c.name);
            assert!(code.source.contains("= 0.0f;"), "{}", code.source);
        } else {
            let types: Vec<_> = g.nodes[0].inputs.iter().map(|&v| g.ty(v)).collect();
            let Op::Attention(attrs) = &g.nodes[0].op else { unreachable!("the case is one Attention") };
            let dims = attention_dims(attrs, &types).unwrap();
            let t = AttnTiles::for_problem(dims.batch.iter().product(), c.sq);
            assert!(l.shared_bytes > 0 && code.source.contains("tsr_attention::simt<"), "{}", c.name);
            assert_eq!(l.block, [t.threads, 1, 1], "{}", c.name);
            assert_eq!(l.grid, [t.blocks(dims.batch.iter().product(), c.sq) as u32, 1, 1], "{}", c.name);
        }
        lowered.push(a);
    }
    // Each tile on its own, through `attention_with`, for the shapes BERT-base and ViT run.
    for (name, case) in [("bert_like", &cases[1]), ("vit_like", &cases[3]), ("broadcast", &cases[4])] {
        for (i, t) in [AttnTiles::default(), MID_TILES, SMALL_TILES, AttnTiles { bq: 64, bk: 32, threads: 128 }].into_iter().enumerate() {
            let g = case.graph();
            let p = crate::backend::lowering::plan::plan(&g);
            let sym = format!("attn_{name}_t{i}");
            let mut k = kernel::Kernel::new(&g, &p, &sym);
            let n = crate::ir::NodeId(0);
            let Op::Attention(a) = &g.node(n).op else { unreachable!("the case is one Attention") };
            assert!(attention::attention_with(&mut k, n, a, t).unwrap());
            lowered.push(LoweredKernel {
                info: crate::backend::FunctionInfo { symbol: sym.clone(), inputs: vec![], outputs: vec![], scratch_bytes: 0 },
                code: postcard::to_stdvec(&CudaCode { source: k.render(&format!("{sym}_k0_0")), launches: Default::default(), entry_offsets: vec![] }).unwrap(),
            });
        }
    }
    // An empty output needs no kernel at all.
    let empty = crate::backend::attention_cases::AttnCase { name: "empty", sq: 0, ..cases[0].clone() };
    let e = CudaBackend.lower(&target(), &empty.graph(), "attn_empty").unwrap();
    assert!(postcard::from_bytes::<CudaCode>(&e.code).unwrap().launches.launches.is_empty());
    if !nvrtc_or_skip("the attention NVRTC compile test") {
        return;
    }
    let m = CudaBackend.compile_module(&target(), &lowered).unwrap_or_else(|e| panic!("{e}"));
    let c = CubinModule::decode(&m).unwrap();
    assert_eq!(&c.cubins[0][..4], b"\x7fELF");
}

#[test]
fn fp32_modules_do_not_include_the_16_bit_headers() {
    let k = CudaBackend.lower(&target(), &zoo_of_ops(), "ops").unwrap();
    assert!(!module_source(&[k]).unwrap().contains("#include"));
}

/// A graph with attention between other kernels: q from a fused group, the output into one.
#[test]
fn attention_inside_a_partition_compiles() {
    let mut g = Graph::new("attn_partition");
    let x = f32in(&mut g, "x", &[2, 4, 10, 64]);
    let q = node(&mut g, Op::Unary(UnaryOp::Tanh), &[x]);
    let kt = node(&mut g, Op::Transpose { perm: vec![0, 1, 3, 2] }, &[x]);
    let a = AttentionAttrs { scale: 0.125, k_transposed: true, mask: false, keep_fill: None, nan_to_zero: false };
    let y = node(&mut g, Op::Attention(a), &[q, kt, x]);
    let z = node(&mut g, Op::Unary(UnaryOp::Relu), &[y]);
    g.outputs = vec![z];
    let k = CudaBackend.lower(&target(), &g, "attn_partition").unwrap();
    let code: CudaCode = postcard::from_bytes(&k.code).unwrap();
    assert_eq!(code.launches.launches.len(), 4, "tanh, transpose, attention, relu");
    if !nvrtc_or_skip("the attention partition compile test") {
        return;
    }
    CudaBackend.compile_module(&target(), &[k]).unwrap_or_else(|e| panic!("{e}"));
}

/// Prints the attention kernel of the GPT-2-like case, to read: `cargo test -p tessera-stages --lib
/// dump_attention_source -- --ignored --nocapture`.
#[test]
#[ignore]
fn dump_attention_source() {
    let c = &crate::backend::attention_cases::cases()[1];
    let k = CudaBackend.lower(&target(), &c.graph(), "dump").unwrap();
    let code: CudaCode = postcard::from_bytes(&k.code).unwrap();
    println!("{}", code.source);
}

/// Every attention case in fp16 and bf16 (the precision pass's rewrite) lowers and compiles.
#[test]
fn fp16_and_bf16_attention_compiles() {
    let mut lowered = Vec::new();
    for c in crate::backend::attention_cases::cases() {
        for (dt, _) in NARROW {
            let g = crate::passes::precision::to_narrow(&c.graph(), dt).unwrap();
            let sym = format!("attn_{dt}_{}", c.name);
            lowered.push(CudaBackend.lower(&target(), &g, &sym).unwrap_or_else(|e| panic!("{} {dt}: {e}", c.name)));
        }
    }
    if !nvrtc_or_skip("the fp16/bf16 attention NVRTC compile test") {
        return;
    }
    let m = CudaBackend.compile_module(&target(), &lowered).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&CubinModule::decode(&m).unwrap().cubins[0][..4], b"\x7fELF");
}

/// CumSum, GatherND and ScatterND lower deterministically (ScatterND to a copy and an update kernel; the
/// scan for repeated tuples only where tuples are not constant) and compile, in fp32, fp16 and bf16.
#[test]
fn scan_and_nd_kernels_lower_and_compile() {
    let mut lowered = Vec::new();
    for (name, g) in crate::backend::scan_nd_cases::cases() {
        let half = crate::passes::precision::to_half(&g).unwrap();
        let bf16 = crate::passes::precision::to_narrow(&g, DType::BF16).unwrap();
        for (suffix, g) in [("", g), ("_f16", half), ("_bf16", bf16)] {
            let sym = format!("{name}{suffix}");
            let k = CudaBackend.lower(&target(), &g, &sym).unwrap_or_else(|e| panic!("{sym}: {e}"));
            assert_eq!(k, CudaBackend.lower(&target(), &g, &sym).unwrap(), "{sym}: lowering is deterministic");
            if name == "scatter_nd" {
                let code: CudaCode = postcard::from_bytes(&k.code).unwrap();
                // Distinct constant tuples need no scan for repeats; run-time (two) and repeated constant ones do.
                assert_eq!(code.source.matches("for (unsigned m = n + 1;").count(), 3, "{}", code.source);
            }
            lowered.push(k);
        }
    }
    if !nvrtc_or_skip("the CumSum/GatherND/ScatterND NVRTC compile test") {
        return;
    }
    let m = CudaBackend.compile_module(&target(), &lowered).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&CubinModule::decode(&m).unwrap().cubins[0][..4], b"\x7fELF");
}

/// Cos, Sin, ... Round, Softplus, Mish (`backend/unary_cases.rs`) lower deterministically and compile, in fp32
/// and in fp16 and bf16 (which compute in fp32 between `__half` / `__nv_bfloat16` loads and stores); the
/// emulation (`emulate.rs`) also runs them.
#[test]
fn math_unary_kernels_lower_and_compile() {
    let mut lowered = Vec::new();
    for (name, g) in crate::backend::unary_cases::cases() {
        let half = crate::passes::precision::to_half(&g).unwrap();
        let bf16 = crate::passes::precision::to_narrow(&g, DType::BF16).unwrap();
        for (suffix, g) in [("", g), ("_f16", half), ("_bf16", bf16)] {
            let sym = format!("math_{name}{suffix}");
            let k = CudaBackend.lower(&target(), &g, &sym).unwrap_or_else(|e| panic!("{sym}: {e}"));
            assert_eq!(k, CudaBackend.lower(&target(), &g, &sym).unwrap(), "{sym}: lowering is deterministic");
            lowered.push(k);
        }
    }
    let code: CudaCode = postcard::from_bytes(&lowered[0].code).unwrap();
    assert!(code.source.contains("cos((double)"), "{}", code.source);
    if !nvrtc_or_skip("the math unary NVRTC compile test") {
        return;
    }
    let m = CudaBackend.compile_module(&target(), &lowered).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&CubinModule::decode(&m).unwrap().cubins[0][..4], b"\x7fELF");
}

/// The Attention node of `g` (a case graph, perhaps rewritten to fp16 with casts around it).
fn attention_node(g: &Graph) -> (NodeId, AttentionAttrs) {
    g.nodes
        .iter()
        .enumerate()
        .find_map(|(i, n)| match &n.op {
            Op::Attention(a) => Some((NodeId(i as u32), a.clone())),
            _ => None,
        })
        .expect("the case has an Attention node")
}

/// fp16 and bf16 attention run on tensor cores (mma.sync of the type, P in registers), fp32 on the SIMT
/// kernel; every tile of the tensor-core kernel lowers and compiles for every case.
#[test]
fn fp16_and_bf16_attention_run_on_tensor_cores_in_every_tile() {
    use attention_mma::MmaTiles;
    let mut lowered = Vec::new();
    for c in crate::backend::attention_cases::cases().into_iter().filter(|c| c.sk > 0 && c.sq > 0) {
        for (dt, cty) in NARROW {
        let g32 = c.graph();
        let g16 = crate::passes::precision::to_narrow(&g32, dt).unwrap();
        let src = |g: &Graph| postcard::from_bytes::<CudaCode>(&CudaBackend.lower(&target(), g, "t").unwrap().code).unwrap().source;
        assert!(src(&g16).contains(&format!("tsr_attention::mma<{cty}, ")), "{} {dt}: on tensor cores", c.name);
        assert!(!src(&g32).contains("tsr_attention::mma<") && src(&g32).contains("tsr_attention::simt<"), "{}: fp32 stays SIMT", c.name);
        let (n, a) = attention_node(&g16);
        for (i, t) in [MmaTiles { warps: 1, bk: 16, split: 1 }, MmaTiles { warps: 2, bk: 64, split: 1 }, MmaTiles { warps: 4, bk: 128, split: 1 }, MmaTiles { warps: 1, bk: 32, split: 4 }, MmaTiles { warps: 2, bk: 16, split: 3 }].into_iter().enumerate() {
            let p = crate::backend::lowering::plan::plan(&g16);
            let sym = format!("attn_mma_{}_{dt}_t{i}", c.name);
            let mut k = kernel::Kernel::new(&g16, &p, &sym);
            attention_mma::attention(&mut k, n, &a, t).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            assert_eq!(k.block, [t.threads(), 1, 1]);
            lowered.push(LoweredKernel {
                info: crate::backend::FunctionInfo { symbol: sym.clone(), inputs: vec![], outputs: vec![], scratch_bytes: 0 },
                code: postcard::to_stdvec(&CudaCode { source: k.render(&format!("{sym}_k0_0")), launches: Default::default(), entry_offsets: vec![] }).unwrap(),
            });
        }
        }
    }
    if !nvrtc_or_skip("the tensor-core attention NVRTC compile test") {
        return;
    }
    let m = CudaBackend.compile_module(&target(), &lowered).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&CubinModule::decode(&m).unwrap().cubins[0][..4], b"\x7fELF");
}

pub(crate) use crate::backend::compare::compare_to_reference;

/// `lowered` (the default lowering of the case graph `g`) with its tensor-core attention kernel generated
/// for tile `t` instead: the same generator, so the same parameters in the same order; the kernel's source
/// and launch shape replaced.
fn with_attention_tile(mut lowered: LoweredKernel, g: &Graph, sym: &str, t: attention_mma::MmaTiles) -> LoweredKernel {
    let mut code: CudaCode = postcard::from_bytes(&lowered.code).unwrap();
    let p = crate::backend::lowering::plan::plan(g);
    let (n, a) = attention_node(g);
    let mut k = kernel::Kernel::new(g, &p, sym);
    attention_mma::attention(&mut k, n, &a, t).unwrap();
    let launch = code.launches.launches.iter_mut().find(|l| l.shared_bytes > 0).expect("the attention launch (the one with shared memory)");
    assert_eq!(launch.args.len(), k.params.len(), "same parameters");
    (launch.grid, launch.block, launch.shared_bytes) = (k.grid, k.block, k.shared_bytes);
    let name = format!(" {}(", launch.entry);
    let at = code.source.find(&name).expect("the attention kernel's source");
    let start = code.source[..at].rfind("extern \"C\"").unwrap();
    let end = at + code.source[at..].find("\n}\n").unwrap() + 3;
    code.source.replace_range(start..end, &k.render(&launch.entry));
    lowered.code = postcard::to_stdvec(&code).unwrap();
    lowered
}

/// One lowered kernel compiled into its own module, loaded and run on GPU 0; `what` names the run in a panic.
fn run_on_the_gpu(lowered: &LoweredKernel, what: &str, inputs: &[Tensor]) -> Vec<Tensor> {
    let module = CudaBackend.compile_module(&target(), std::slice::from_ref(lowered)).unwrap_or_else(|e| panic!("{what}: {e}"));
    let loaded = tessera_kernels::runtime::load_module(&module).unwrap_or_else(|e| panic!("{what}: {}", e.0));
    tessera_kernels::runtime::cuda::call::call_gpu_function(loaded.as_ref(), 0, &lowered.info, inputs).unwrap_or_else(|e| panic!("{what}: {}", e.0))
}

/// Every attention case, fp32 (SIMT kernel), fp16 and bf16 (tensor-core kernel, in each of its tile shapes),
/// run on the GPU against the fp32 reference: 1e-4 in fp32, 1e-2 in fp16 and bf16, NaN exactly where the
/// reference has it.
#[test]
#[ignore = "needs a GPU: run with TESSERA_GPU=1 and --include-ignored on the GPU machine"]
fn attention_matches_the_reference_on_the_gpu() {
    use attention_mma::MmaTiles;
    if std::env::var_os("TESSERA_GPU").is_none() {
        eprintln!("skipping: set TESSERA_GPU=1 on a machine with an NVIDIA GPU");
        return;
    }
    let mut failures = Vec::new();
    let mut report = Vec::new();
    for (ci, c) in crate::backend::attention_cases::cases().into_iter().enumerate() {
        let g32 = c.graph();
        let inputs = crate::interp::random_inputs(&g32, 100 + ci as u64);
        let want = crate::interp::run_graph(&g32, &inputs).unwrap();
        let g16 = crate::passes::precision::to_half(&g32).unwrap();
        let gbf = crate::passes::precision::to_narrow(&g32, DType::BF16).unwrap();
        // (label, graph, tile of the tensor-core kernel or the default lowering, tolerance)
        let mut runs: Vec<(String, &Graph, Option<MmaTiles>, f64)> = vec![("fp32".into(), &g32, None, 1e-4), ("fp16".into(), &g16, None, 1e-2), ("bf16".into(), &gbf, None, 1e-2)];
        if c.sk > 0 && c.sq > 0 {
            for t in [MmaTiles { warps: 1, bk: 16, split: 1 }, MmaTiles { warps: 2, bk: 32, split: 1 }, MmaTiles { warps: 2, bk: 64, split: 1 }, MmaTiles { warps: 4, bk: 64, split: 1 }, MmaTiles { warps: 4, bk: 128, split: 1 }, MmaTiles { warps: 1, bk: 32, split: 4 }, MmaTiles { warps: 1, bk: 64, split: 2 }, MmaTiles { warps: 2, bk: 16, split: 3 }] {
                runs.push((format!("fp16 {t:?}"), &g16, Some(t), 1e-2));
                runs.push((format!("bf16 {t:?}"), &gbf, Some(t), 1e-2));
            }
        }
        for (label, g, tile, tol) in runs {
            let sym = format!("gpu_attn_{ci}");
            let lowered = match tile {
                None => CudaBackend.lower(&target(), g, &sym).unwrap(),
                Some(t) => with_attention_tile(CudaBackend.lower(&target(), g, &sym).unwrap(), g, &sym, t),
            };
            let got = run_on_the_gpu(&lowered, &format!("{} {label}", c.name), &inputs);
            match compare_to_reference(&got[0], &want[0], tol) {
                Ok(err) => report.push(format!("{} {label}: {err:.2e}", c.name)),
                Err(e) => failures.push(format!("{} {label}: {e}", c.name)),
            }
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{} of {} runs differ from the reference:\n{}", failures.len(), failures.len() + report.len(), failures.join("\n"));
}

/// The attentions of [`crate::backend::attention_cases::head_chains`] on the GPU: fp16 and bf16 read their heads
/// through views of the projection and store through the output's transpose; fp32 moves them by kernels.
#[test]
#[ignore = "needs a GPU: run with TESSERA_GPU=1 and --include-ignored on the GPU machine"]
fn attention_through_views_matches_the_reference_on_the_gpu() {
    if std::env::var_os("TESSERA_GPU").is_none() {
        eprintln!("skipping: set TESSERA_GPU=1 on a machine with an NVIDIA GPU");
        return;
    }
    let mut failures = Vec::new();
    for (ci, (name, g32)) in crate::backend::attention_cases::head_chains().into_iter().enumerate() {
        let inputs = crate::interp::random_inputs(&g32, 300 + ci as u64);
        let want = crate::interp::run_graph(&g32, &inputs).unwrap();
        for (dt, tol) in [(DType::F32, 1e-4), (DType::F16, 1e-2), (DType::BF16, 1e-2)] {
            let g = if dt == DType::F32 { g32.clone() } else { crate::passes::precision::to_narrow(&g32, dt).unwrap() };
            let sym = format!("gpu_views_{ci}");
            let lowered = CudaBackend.lower(&target(), &g, &sym).unwrap();
            let got = run_on_the_gpu(&lowered, &format!("{name} {dt}"), &inputs);
            match compare_to_reference(&got[0], &want[0], tol) {
                Ok(err) => eprintln!("{name} {dt}: {err:.2e}"),
                Err(e) => failures.push(format!("{name} {dt}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_bottleneck_gathers_its_3x3_input_per_column_and_streams_its_1x1_inputs() {
    let mut g = Graph::new("bneck");
    let x = f32in(&mut g, "x", &[32, 256, 56, 56]);
    let w1 = f32in(&mut g, "w1", &[64, 256, 1, 1]);
    let b1 = f32in(&mut g, "b1", &[64]);
    let one = ConvAttrs { strides: vec![1, 1], pads: vec![0, 0, 0, 0], dilations: vec![1, 1], group: 1 };
    let c1 = node(&mut g, Op::Conv(one.clone()), &[x, w1, b1]);
    let r1 = node(&mut g, Op::Unary(UnaryOp::Relu), &[c1]);
    let w2 = f32in(&mut g, "w2", &[64, 64, 3, 3]);
    let b2 = f32in(&mut g, "b2", &[64]);
    let c2 = node(&mut g, Op::Conv(ConvAttrs { strides: vec![1, 1], pads: vec![1, 1, 1, 1], dilations: vec![1, 1], group: 1 }), &[r1, w2, b2]);
    let r2 = node(&mut g, Op::Unary(UnaryOp::Relu), &[c2]);
    let w3 = f32in(&mut g, "w3", &[256, 64, 1, 1]);
    let b3 = f32in(&mut g, "b3", &[256]);
    let c3 = node(&mut g, Op::Conv(one), &[r2, w3, b3]);
    let a = node(&mut g, Op::Binary(BinaryOp::Add), &[c3, x]);
    let r3 = node(&mut g, Op::Unary(UnaryOp::Relu), &[a]);
    g.outputs = vec![r3];
    let g = crate::passes::precision::to_half(&g).unwrap();
    let k = CudaBackend.lower(&target(), &g, "bneck").unwrap();
    let code: CudaCode = postcard::from_bytes(&k.code).unwrap();
    let src = &code.source;
    // The 1x1 convolutions read their inputs as matrices, 16 bytes at a time through the cp.async pipeline.
    assert_eq!(src.matches("tsr_gemm::tc_pipelined<").count(), 2, "{src}");
    assert_eq!(src.matches("auto b = [&](int k, int n) { return ").count(), 2, "{src}");
    // The 3x3 one gathers, staged through registers: its thread's column (image, output position, window
    // corner) is decomposed once, by the column lambda the loop calls before its K loop; each element
    // decomposes only its depth.
    assert_eq!(src.matches("tsr_gemm::tc_staged<").count(), 1, "{src}");
    let column = src.find("auto b = [&](int gn) {").unwrap_or_else(|| panic!("{src}"));
    let element = src[column..].find("return [=](int k) -> __half {").unwrap() + column;
    assert!(src[column..element].contains("const int c0 = (int)((gq / 56u) % 56u) * 1 - 1;"), "{src}");
    let body = &src[element..element + src[element..].find("auto index").unwrap()];
    assert!(body.contains("const int id = c0 + (int)(r / 3u) * 1;") && !body.contains("3136u /") && !body.contains("/ 3136u"), "{body}");
    // Its next step's loads are issued right after this step's tiles are committed, before the MMAs.
    let gemm_cuh = super::TEMPLATES.iter().find(|(ns, _)| *ns == "tsr_gemm::").unwrap().1;
    let staged = &gemm_cuh[gemm_cuh.find("void tc_staged(").unwrap()..];
    let k_loop = &staged[staged.find("for (int k0 = kbeg;").unwrap()..];
    let words = k_loop.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("commit(); __syncthreads(); if (k0 + BK < kend) fetch(k0 + BK); mma_step"), "{k_loop}");
    if nvrtc_or_skip("the bottleneck's module") {
        CudaBackend.compile_module(&target(), &[k]).unwrap();
    }
}

/// The attention settings are measured only where a tensor-core attention makes them change the code: an fp16
/// attention kernel gets both, its fp32 form (SIMT attention) and a plain GEMM kernel neither.
#[test]
fn attention_settings_are_configurations_of_tensor_core_attention_kernels_only() {
    let c = crate::backend::attention_cases::cases().into_iter().find(|c| c.sk > 0 && c.sq > 0).unwrap();
    let g32 = c.graph();
    let g16 = crate::passes::precision::to_half(&g32).unwrap();
    let has = |g: &Graph, s: &str| CudaBackend.configs_for(&target(), g).iter().any(|c| c.ends_with(s));
    assert!(has(&g16, "/attention-2warps") && has(&g16, "/attention-4warps"), "{:?}", CudaBackend.configs_for(&target(), &g16));
    let gbf = crate::passes::precision::to_narrow(&g32, DType::BF16).unwrap();
    assert!(has(&gbf, "/attention-2warps") && has(&gbf, "/attention-4warps"), "bf16 attention is tensor-core attention too");
    assert!(!has(&g32, "/attention-2warps") && !has(&g32, "/attention-4warps"), "{:?}", CudaBackend.configs_for(&target(), &g32));
    let l = CudaBackend.lower_config(&target(), &g16, "att", &format!("cuda/v{VERSION}/attention-4warps")).unwrap();
    let code: crate::backend::cuda::lower::CudaCode = postcard::from_bytes(&l.code).unwrap();
    assert!(code.launches.launches.iter().any(|l| l.block == [128, 1, 1]), "four warps a block: {:?}", code.launches.launches);
}
