//! Code generation tests of the `cuda` backend that need no GPU: every op family lowers, the module compiles
//! to a cubin with NVRTC (when the toolkit is present; `TESSERA_REQUIRE_NVRTC=1`, as the test script sets,
//! makes its absence a failure instead of a skip), and lowering is deterministic.

use super::*;
use crate::ir::*;

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
        assert!(code.source.contains(&format!("void __launch_bounds__({}) {}(", l.block.iter().product::<u32>(), l.entry)), "{}", l.entry);
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
    assert_eq!(m.format, ModuleFormat::Cubin);
    let c = CubinModule::decode(&m).unwrap();
    assert_eq!(c.arch, "sm_90");
    assert_eq!(&c.cubin[..4], b"\x7fELF");
}

#[test]
fn nvrtc_errors_name_the_kernel() {
    if !nvrtc_or_skip("the NVRTC error test") {
        return;
    }
    let code = CudaCode { source: "extern \"C\" __global__ void bad_k0_0() { undefined_thing(); }\n".into(), launches: Default::default() };
    let k = LoweredKernel {
        info: crate::backend::FunctionInfo { symbol: "bad".into(), inputs: vec![], outputs: vec![], scratch_bytes: 0 },
        code: postcard::to_stdvec(&code).unwrap(),
    };
    let e = CudaBackend.compile_module(&target(), &[k]).unwrap_err().to_string();
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

/// `zoo_of_ops` in fp16 (the precision pass's rewrite), plus a GEMM deep enough to split K.
fn zoo_of_ops_f16() -> Graph {
    let mut g = zoo_of_ops();
    let a = f32in(&mut g, "a", &[4, 512]);
    let bw = f32in(&mut g, "bw", &[512, 96]);
    let mm = node(&mut g, Op::MatMul, &[a, bw]);
    let pad = node(&mut g, Op::Pad { pads: vec![0, 1, 0, 1], mode: PadMode::Constant, value: 0.5 }, &[mm]);
    g.outputs.push(pad);
    crate::passes::precision::to_half(&g).unwrap()
}

#[test]
fn fp16_graphs_lower_to_tensor_core_gemms_and_fp32_accumulation() {
    let g = zoo_of_ops_f16();
    assert!(g.nodes.iter().any(|n| matches!(n.op, Op::MatMul) && g.ty(n.outputs[0]).dtype == DType::F16));
    let k = CudaBackend.lower(&target(), &g, "ops16").unwrap();
    let code: CudaCode = postcard::from_bytes(&k.code).unwrap();
    // Tensor cores for both GEMMs and the conv, fp32 accumulators, f16 buffers.
    assert!(code.source.matches("nvcuda::wmma::mma_sync").count() >= 3, "{}", code.source);
    assert!(code.source.contains("nvcuda::wmma::accumulator, 16, 16, 16, float"));
    assert!(code.source.contains("__half* __restrict__"));
    // The deep GEMM splits K: its slices are summed by a second kernel.
    assert!(code.source.contains("slice * "), "{}", code.source);
    assert_eq!(gemm::TcSchedule::for_problem(4, 96, 512, 1).tiles, gemm::SMALL_TC_TILES);
    assert!(gemm::TcSchedule::for_problem(4, 96, 512, 1).splits > 1);
    assert!(module_source(&[k]).unwrap().starts_with("/* tessera cuda module */\n#include <cuda_fp16.h>"));
}

#[test]
fn an_fp16_module_compiles_to_an_sm90_cubin() {
    if !nvrtc_or_skip("the fp16 NVRTC compile test") {
        return;
    }
    let g = zoo_of_ops_f16();
    let k = CudaBackend.lower(&target(), &g, "ops16").unwrap();
    let m = CudaBackend.compile_module(&target(), &[k]).unwrap_or_else(|e| panic!("{e}"));
    let c = CubinModule::decode(&m).unwrap();
    assert_eq!(&c.cubin[..4], b"\x7fELF");
}

#[test]
fn fp32_modules_do_not_include_the_fp16_headers() {
    let k = CudaBackend.lower(&target(), &zoo_of_ops(), "ops").unwrap();
    assert!(!module_source(&[k]).unwrap().contains("#include"));
}
