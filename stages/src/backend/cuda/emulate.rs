//! Test-only: runs lowered cuda kernels on the CPU through a small emulation of CUDA (`emulate.cpp`: a
//! cooperative fiber per thread, warp and block barriers, warp shuffles, dynamic shared memory), so kernels
//! that use only those features are checked against the reference interpreter on machines without a GPU.
//! Not a GPU model (no timing, no memory model beyond barriers), but it runs the exact generated source, so
//! indexing, masking, tail handling and numerics are tested; each case runs twice, resuming threads in
//! opposite orders, so a missing barrier tends to show.

use super::lower::CudaCode;
use crate::backend::FunctionInfo;
use crate::ir::Tensor;
use std::ffi::c_void;
use std::fmt::Write;

const HARNESS: &str = include_str!("emulate.cpp");

/// One function to emulate: its lowered code and signature, and the inputs to run it on.
pub struct Job<'a> {
    pub code: &'a CudaCode,
    pub info: &'a FunctionInfo,
    pub inputs: &'a [Tensor],
}

/// The scalar helpers of the prelude (the shared scalar math, then the GPU's float functions: sigmoid, erf,
/// GELU, softplus, integer division, ...): plain C++ once the harness defines `TSR_DEV` and the bit casts
/// they use. The rest of the prelude (its fixed-width typedefs, which clash with <cstdint>, and the warp
/// reductions) stays out.
fn float_helpers() -> &'static str {
    let p: &'static str = &super::PRELUDE;
    let start = p.find("/* What the shared scalar math").expect("the prelude's scalar helpers");
    let end = p.find("/* ---- reductions").expect("the prelude's reductions");
    &p[start..end]
}

/// The C++ driver of job `j`: `tsr_run_<j>(args, reverse)` runs its launches in order.
fn driver(j: usize, code: &CudaCode) -> String {
    let mut s = format!("extern \"C\" void tsr_run_{j}(void** args, int reverse) {{\n");
    for l in &code.launches.launches {
        let params: Vec<String> = l.args.iter().map(|a| format!("(char*)args[{}] + {}", a.index, a.offset)).collect();
        let params = if params.is_empty() { "nullptr".to_string() } else { params.join(", ") };
        writeln!(s, "{{\nvoid* p[] = {{{params}}};\ntsr_launch({}u, {}u, {}u, {}u, [&] {{ tsr_call(&{}, p); }}, reverse);\n\
            }}", l.grid[0], l.grid[1], l.grid[2], l.block[0], l.entry).unwrap();
        assert_eq!((l.block[1], l.block[2]), (1, 1), "the emulation runs 1-D blocks only");
    }
    s.push_str("}\n");
    s
}

/// Runs every job (compiled together, once) in both thread orders; per job, per order, its outputs' bytes.
pub fn run(jobs: &[Job]) -> Vec<[Vec<Vec<u8>>; 2]> {
    let mut src = String::from(HARNESS);
    src.push_str(float_helpers());
    for (_, template) in super::TEMPLATES {
        src.push_str(template);
    }
    for (j, job) in jobs.iter().enumerate() {
        // Dynamic shared memory is the harness's array (see emulate.cpp's `__shared__`).
        src.push_str(&job.code.source.replace("extern __shared__", "extern"));
        src.push_str(&driver(j, job.code));
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let (cpp, so) = (dir.path().join("emu.cpp"), dir.path().join("emu.so"));
    std::fs::write(&cpp, &src).expect("write the emulation source");
    let out = std::process::Command::new("c++")
        .args(["-std=c++17", "-O1", "-shared", "-fPIC", "-w", "-o"])
        .arg(&so)
        .arg(&cpp)
        .output()
        .expect("a C++ compiler (c++) runs");
    assert!(out.status.success(), "the emulation does not compile:\n{}", String::from_utf8_lossy(&out.stderr).lines().take(30).collect::<Vec<_>>().join("\n"));
    // SAFETY: the library was just compiled from the harness and the generated kernels; no initializers
    // beyond the C++ runtime's.
    let lib = unsafe { libloading::Library::new(&so) }.expect("load the emulation");
    jobs.iter()
        .enumerate()
        .map(|(j, job)| {
            [0, 1].map(|reverse| {
                let words = |n: usize| vec![u64::MAX; n.div_ceil(8).max(1)];
                let mut ins: Vec<Vec<u64>> = job.inputs.iter().map(|t| {
                    let mut w = words(t.bytes().len());
                    bytemuck::cast_slice_mut::<u64, u8>(&mut w)[..t.bytes().len()].copy_from_slice(t.bytes());
                    w
                }).collect();
                // Outputs and scratch start as NaN bytes: anything a kernel fails to write shows.
                let mut outs: Vec<Vec<u64>> = job.info.outputs.iter().map(|t| words(t.size_bytes())).collect();
                let mut scratch = words(job.info.scratch_bytes as usize);
                let mut args: Vec<*mut c_void> = ins.iter_mut().map(|b| b.as_mut_ptr() as *mut c_void).collect();
                args.extend(outs.iter_mut().map(|b| b.as_mut_ptr() as *mut c_void));
                args.push(scratch.as_mut_ptr() as *mut c_void);
                // SAFETY: `tsr_run_<j>` is the driver generated above; every pointer it passes on is a live buffer
                // sized from the function's signature.
                unsafe {
                    let f: libloading::Symbol<unsafe extern "C" fn(*mut *mut c_void, i32)> = lib.get(format!("tsr_run_{j}").as_bytes()).expect("driver symbol");
                    f(args.as_mut_ptr(), reverse);
                }
                outs.iter().zip(&job.info.outputs).map(|(o, t)| bytemuck::cast_slice::<u64, u8>(o)[..t.size_bytes()].to_vec()).collect()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::attention_cases::{cases, AttnCase};
    use crate::backend::Backend;
    use crate::interp::{random_inputs, run_graph};
    use crate::ir::{DType, Graph};
    use crate::target::Target;

    /// `got` against the reference: NaN exactly where it has NaN, else within 1e-4 of the element (or of the
    /// output's mean magnitude, for elements near zero), as the lead's GPU check will compare.
    fn compare(got: &[u8], want: &Tensor) -> Result<(), String> {
        // Integers and bools exactly.
        if want.dtype() != DType::F32 {
            return match got.iter().zip(want.bytes()).position(|(a, b)| a != b) {
                None if got.len() == want.bytes().len() => Ok(()),
                at => Err(format!("{} differs at byte {}", want.ty, at.unwrap_or(got.len()))),
            };
        }
        let g: Vec<f32> = got.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        let w = want.to_f32_vec();
        let finite: Vec<f32> = w.iter().copied().filter(|v| v.is_finite()).collect();
        let mean = finite.iter().map(|v| v.abs() as f64).sum::<f64>() / finite.len().max(1) as f64;
        for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
            let ok = if b.is_nan() || a.is_nan() { a.is_nan() && b.is_nan() } else { ((a - b).abs() as f64) <= 1e-4 * (b.abs() as f64).max(mean) };
            if !ok {
                return Err(format!("element {i} of {}: got {a:e}, want {b:e}", want.ty));
            }
        }
        Ok(())
    }

    /// Lowers each graph for cuda in every configuration the backend would measure for it (the GEMM knob
    /// settings that change its code), emulates each in both thread orders and compares with the reference.
    fn check(graphs: Vec<(String, Graph)>) {
        check_in(graphs, DType::F32)
    }

    /// [`check`] with the graphs rewritten to store their floats in `precision` (f16 or bf16: tensor-core
    /// GEMMs, convolutions and attention, fp32 arithmetic between 16-bit loads and stores), compared with the
    /// fp32 reference as the GPU tests compare: within 1e-2 of the largest reference magnitude, NaN exactly
    /// where it has NaN. f32 keeps the exact comparison.
    fn check_in(graphs: Vec<(String, Graph)>, precision: DType) {
        let graphs: Vec<(String, Graph, Graph)> = graphs
            .into_iter()
            .map(|(name, g)| {
                let lowered = if precision == DType::F32 { g.clone() } else { crate::passes::precision::to_narrow(&g, precision).unwrap() };
                (name, lowered, g)
            })
            .collect();
        check_lowered(graphs, precision != DType::F32);
    }

    /// Emulates each `(name, graph to lower, fp32 reference graph)` in every configuration, as [`check`] does;
    /// `reduced`: compare within 1e-2 (16-bit storage somewhere), else exactly as [`compare`] does.
    fn check_lowered(graphs: Vec<(String, Graph, Graph)>, reduced: bool) {
        let t = Target::parse("cuda -compiler=nvrtc").unwrap();
        let be = super::super::CudaBackend;
        let graphs: Vec<(String, Graph, Graph)> = graphs
            .into_iter()
            .flat_map(|(name, g, reference)| {
                let configs = be.configs_for(&t, &g);
                assert_eq!(configs[0], be.default_config(&t), "{name}: the default comes first");
                configs.into_iter().map(move |c| (format!("{name} [{c}]"), g.clone(), reference.clone()))
            })
            .collect();
        let lowered: Vec<(CudaCode, FunctionInfo, Vec<Tensor>)> = graphs
            .iter()
            .enumerate()
            .map(|(i, (name, g, _))| {
                let config = name.rsplit_once(" [").map(|(_, c)| c.trim_end_matches(']')).expect("a configuration");
                let lk = be.lower_config(&t, g, &format!("emu{i}"), config).unwrap_or_else(|e| panic!("{name}: {e}"));
                if config == be.default_config(&t) {
                    let l = super::super::lower::lower(g, &format!("emu{i}")).unwrap_or_else(|e| panic!("{name}: {e}"));
                    assert_eq!(postcard::to_stdvec(&l.code).unwrap(), lk.code);
                }
                let code: CudaCode = postcard::from_bytes(&lk.code).unwrap();
                (code, lk.info, random_inputs(g, 11 + i as u64))
            })
            .collect();
        let jobs: Vec<Job> = lowered.iter().map(|(code, info, inputs)| Job { code, info, inputs }).collect();
        let results = run(&jobs);
        let mut failures = Vec::new();
        for ((name, _, reference), (res, (_, info, inputs))) in graphs.iter().zip(results.iter().zip(&lowered)) {
            let want = run_graph(reference, inputs).unwrap();
            for (order, outs) in res.iter().enumerate() {
                for ((o, w), ty) in outs.iter().zip(&want).zip(&info.outputs) {
                    let r = if !reduced || w.dtype() != DType::F32 {
                        compare(o, w)
                    } else {
                        let got = Tensor::from_bytes(ty.clone(), o.clone()).expect("the output's bytes");
                        super::super::tests::compare_to_reference(&got, w, 1e-2).map(|_| ())
                    };
                    if let Err(e) = r {
                        failures.push(format!("{name} (thread order {order}): {e}"));
                    }
                }
            }
            assert_eq!(res[0], res[1], "{name}: the two thread orders give different bytes (a race)");
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    fn graph_of(name: &str, build: impl FnOnce(&mut Graph) -> Vec<crate::ir::ValueId>) -> (String, Graph) {
        let mut g = Graph::new(name);
        g.outputs = build(&mut g);
        (name.to_string(), g)
    }

    fn input(g: &mut Graph, name: &str, shape: &[usize]) -> crate::ir::ValueId {
        g.add_input(name, crate::ir::TensorType::f32(shape.to_vec()))
    }

    fn op(g: &mut Graph, op: crate::ir::Op, inputs: &[crate::ir::ValueId]) -> crate::ir::ValueId {
        let name = format!("n{}", g.nodes.len());
        g.add(name, op, inputs).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Two depthwise convolutions of one `[2, channels, 9, 11]` image for the row-window kernel: ConvNeXt's
    /// 7x7 with its bias and a ReLU, and a strided, dilated one with one-sided pads whose rows are not a
    /// multiple of the thread's row segment.
    fn depthwise_pair(g: &mut Graph, channels: usize) -> Vec<crate::ir::ValueId> {
        use crate::ir::{ConvAttrs, Op, UnaryOp};
        let x = input(g, "x", &[2, channels, 9, 11]);
        let w = input(g, "w", &[channels, 1, 7, 7]);
        let b = input(g, "b", &[channels]);
        let a = ConvAttrs { strides: vec![1, 1], pads: vec![3; 4], dilations: vec![1, 1], group: channels };
        let v = input(g, "v", &[channels, 1, 3, 2]);
        let c = ConvAttrs { strides: vec![2, 3], pads: vec![1, 0, 0, 2], dilations: vec![1, 2], group: channels };
        let y = op(g, Op::Conv(a), &[x, w, b]);
        vec![op(g, Op::Unary(UnaryOp::Relu), &[y]), op(g, Op::Conv(c), &[x, v])]
    }

    /// The fp32 GEMM kernel in each of its shapes: batched with a broadcast operand, a batch sharing one B
    /// (folded into one GEMM), K split across blocks (a second kernel sums the slices), and
    /// convolutions (implicit GEMM, with and without a split), each with a fused epilogue.
    #[test]
    fn gemm_kernels_match_the_reference() {
        use crate::ir::{BinaryOp, ConvAttrs, Op, UnaryOp};
        let conv = |s: usize, p: usize| Op::Conv(ConvAttrs { strides: vec![s, s], pads: vec![p; 4], dilations: vec![1, 1], group: 1 });
        let graphs = vec![
            graph_of("batched_broadcast", |g| {
                let a = input(g, "a", &[2, 3, 20, 24]);
                let b = input(g, "b", &[3, 24, 36]);
                vec![op(g, Op::MatMul, &[a, b])]
            }),
            graph_of("shared_b_folds", |g| {
                let a = input(g, "a", &[13, 1, 64]);
                let b = input(g, "b", &[64, 40]);
                let bias = input(g, "bias", &[40]);
                let mm = op(g, Op::MatMul, &[a, b]);
                let add = op(g, Op::Binary(BinaryOp::Add), &[mm, bias]);
                vec![op(g, Op::Unary(UnaryOp::Relu), &[add])]
            }),
            graph_of("split_k", |g| {
                let a = input(g, "a", &[8, 1024]);
                let b = input(g, "b", &[1024, 40]);
                let r = input(g, "r", &[8, 40]);
                let mm = op(g, Op::MatMul, &[a, b]);
                vec![op(g, Op::Binary(BinaryOp::Add), &[mm, r])]
            }),
            graph_of("conv_split_k", |g| {
                let x = input(g, "x", &[1, 64, 7, 7]);
                let w = input(g, "w", &[32, 64, 3, 3]);
                let b = input(g, "b", &[32]);
                let c = op(g, conv(1, 1), &[x, w, b]);
                vec![op(g, Op::Unary(UnaryOp::Relu), &[c])]
            }),
            // Enough GEMMs (one large tile each) to fill the GPU: the default takes the large tile.
            graph_of("batched_large_tiles", |g| {
                let a = input(g, "a", &[270, 33, 8]);
                let b = input(g, "b", &[270, 8, 33]);
                vec![op(g, Op::MatMul, &[a, b])]
            }),
            graph_of("conv_strided", |g| {
                let x = input(g, "x", &[2, 8, 11, 11]);
                let w = input(g, "w", &[16, 8, 3, 3]);
                vec![op(g, conv(2, 1), &[x, w])]
            }),
            // The gather's corners and bounds in every direction: groups, dilation, pads on one side only,
            // a kernel wider than tall; and a 1-D and a 3-D convolution.
            graph_of("conv_grouped_dilated", |g| {
                let x = input(g, "x", &[3, 16, 9, 10]);
                let w = input(g, "w", &[16, 8, 2, 3]);
                let a = ConvAttrs { strides: vec![1, 2], pads: vec![2, 0, 0, 1], dilations: vec![2, 1], group: 2 };
                vec![op(g, Op::Conv(a), &[x, w])]
            }),
            graph_of("conv_depthwise", |g| depthwise_pair(g, 6)),
            graph_of("conv_1d_and_3d", |g| {
                let x = input(g, "x", &[2, 4, 13]);
                let w = input(g, "w", &[8, 4, 5]);
                let a = ConvAttrs { strides: vec![2], pads: vec![2, 1], dilations: vec![1], group: 1 };
                let y = input(g, "y", &[1, 3, 4, 5, 6]);
                let v = input(g, "v", &[8, 3, 3, 2, 3]);
                let b = ConvAttrs { strides: vec![1, 2, 1], pads: vec![1, 0, 1, 1, 1, 0], dilations: vec![1, 1, 2], group: 1 };
                vec![op(g, Op::Conv(a), &[x, w]), op(g, Op::Conv(b), &[y, v])]
            }),
        ];
        // The shapes reach the paths they are named for.
        use super::super::gemm::Schedule;
        assert_eq!(Schedule::for_problem(13, 40, 64, 1).splits, 1);
        assert!(Schedule::for_problem(8, 40, 1024, 1).splits > 1);
        assert!(Schedule::for_problem(32, 49, 576, 1).splits > 1);
        // Every GEMM knob setting changes some of these kernels, so each is emulated (`check` runs them all); the
        // attention settings change only tensor-core (fp16) attention kernels, which the GPU tests run.
        let be = super::super::CudaBackend;
        let t = Target::parse("cuda -compiler=nvrtc").unwrap();
        let mut used: Vec<String> = graphs.iter().flat_map(|(_, g)| be.configs_for(&t, g)).collect();
        used.sort();
        used.dedup();
        let gemm_settings = super::super::gemm::KNOB_SETTINGS.iter().filter(|(n, _)| !n.starts_with("attention-")).count();
        assert_eq!(used.len(), gemm_settings, "{used:?}");
        check(graphs);
    }

    /// CumSum, GatherND and ScatterND (two kernels, repeated run-time tuples) on the shared cases, emulated.
    #[test]
    fn scan_and_nd_kernels_match_the_reference() {
        check(crate::backend::scan_nd_cases::cases().into_iter().map(|(n, g)| (n.to_string(), g)).collect());
    }

    /// Cos, Sin, ... Round, Softplus, Mish on the shared cases, emulated.
    #[test]
    fn math_unary_kernels_match_the_reference() {
        check(crate::backend::unary_cases::cases().into_iter().map(|(n, g)| (n.to_string(), g)).collect());
    }

    /// The attention kernel on every shared case (the default tile for each shape), emulated.
    #[test]
    fn attention_kernel_matches_the_reference() {
        check(cases().into_iter().map(|c| (c.name.to_string(), c.graph())).collect());
    }

    /// The GEMM shapes of [`gemm_kernels_match_the_reference`] in fp16 and bf16: WMMA tensor-core GEMMs and
    /// implicit-GEMM convolutions (staged through registers, or by the cp.async pipeline where operands are
    /// contiguous), split K, fused epilogues.
    #[test]
    fn tensor_core_gemm_kernels_match_the_reference_in_fp16_and_bf16() {
        use crate::ir::{BinaryOp, ConvAttrs, Op, UnaryOp};
        let conv = |s: usize, p: usize| Op::Conv(ConvAttrs { strides: vec![s, s], pads: vec![p; 4], dilations: vec![1, 1], group: 1 });
        let graphs = || {
            vec![
                graph_of("batched_broadcast", |g| {
                    let a = input(g, "a", &[2, 3, 20, 24]);
                    let b = input(g, "b", &[3, 24, 36]);
                    vec![op(g, Op::MatMul, &[a, b])]
                }),
                // K a multiple of 8, contiguous operands: the cp.async pipeline; K deep enough to split.
                graph_of("pipelined_split_k", |g| {
                    let a = input(g, "a", &[8, 1024]);
                    let b = input(g, "b", &[1024, 40]);
                    let r = input(g, "r", &[8, 40]);
                    let mm = op(g, Op::MatMul, &[a, b]);
                    vec![op(g, Op::Binary(BinaryOp::Add), &[mm, r])]
                }),
                graph_of("bias_relu", |g| {
                    let a = input(g, "a", &[13, 1, 64]);
                    let b = input(g, "b", &[64, 40]);
                    let bias = input(g, "bias", &[40]);
                    let mm = op(g, Op::MatMul, &[a, b]);
                    let add = op(g, Op::Binary(BinaryOp::Add), &[mm, bias]);
                    vec![op(g, Op::Unary(UnaryOp::Relu), &[add])]
                }),
                graph_of("conv", |g| {
                    let x = input(g, "x", &[1, 64, 7, 7]);
                    let w = input(g, "w", &[32, 64, 3, 3]);
                    let b = input(g, "b", &[32]);
                    let c = op(g, conv(1, 1), &[x, w, b]);
                    vec![op(g, Op::Unary(UnaryOp::Relu), &[c])]
                }),
                graph_of("conv_1x1_strided", |g| {
                    let x = input(g, "x", &[2, 16, 9, 9]);
                    let w = input(g, "w", &[24, 16, 1, 1]);
                    vec![op(g, conv(2, 0), &[x, w])]
                }),
            ]
        };
        for precision in [DType::F16, DType::BF16] {
            let gs = graphs();
            let t = Target::parse("cuda -compiler=nvrtc").unwrap();
            for (name, g) in &gs {
                let narrow = crate::passes::precision::to_narrow(g, precision).unwrap();
                let src = postcard::from_bytes::<CudaCode>(&super::super::CudaBackend.lower(&t, &narrow, "probe").unwrap().code).unwrap().source;
                assert!(src.contains("tsr_gemm::tc_"), "{name} {precision}: on tensor cores");
            }
            check_in(gs, precision);
        }
    }

    /// Every shared attention case in fp16 and bf16: the tensor-core kernel (mma.sync, ldmatrix, cp.async
    /// tiles) in its default tile, the SIMT kernel where it does not apply.
    #[test]
    fn tensor_core_attention_matches_the_reference_in_fp16_and_bf16() {
        for precision in [DType::F16, DType::BF16] {
            check_in(cases().into_iter().map(|c| (c.name.to_string(), c.graph())).collect(), precision);
        }
    }

    /// Attentions whose heads are moved into place by chains of Reshape, Transpose, Gather and Split: in fp16
    /// the tensor-core kernel reads Q, K and V through views of the projection and stores its output through the
    /// view of the Transpose after it, so the only kernels left are the projection's, the attention and the
    /// activation after it (and the casts the precision pass adds); fp32 runs the movement as kernels.
    #[test]
    fn attention_reads_its_heads_through_views() {
        use crate::backend::attention_cases::head_chains;
        for (name, g) in head_chains() {
            let g16 = crate::passes::precision::to_narrow(&g, DType::F16).unwrap();
            let p = super::super::lower::cuda_plan(&g16);
            let moves = |n: &&crate::ir::Node| matches!(n.op, crate::ir::Op::Transpose { .. } | crate::ir::Op::Gather { .. } | crate::ir::Op::Split { .. });
            let movement: Vec<_> = g16.nodes.iter().enumerate().filter(|(_, n)| moves(n)).collect();
            assert!(!movement.is_empty(), "{name}");
            for (i, n) in movement {
                assert!(!p.moves(&g16, crate::ir::NodeId(i as u32)), "{name}: {} ({}) still runs", n.name, n.op.name());
            }
            let attention = g16.nodes.iter().position(|n| matches!(n.op, crate::ir::Op::Attention(_))).unwrap();
            assert!(p.store[g16.nodes[attention].outputs[0].index()].is_some(), "{name}: the output is stored through the transpose");
            let fp32 = super::super::lower::cuda_plan(&g);
            let kept = |i: usize| {
                !matches!(g.nodes[i].op, crate::ir::Op::Reshape { .. })
                    && fp32.moves(&g, crate::ir::NodeId(i as u32))
                    && matches!(g.nodes[i].op, crate::ir::Op::Transpose { .. })
            };
            assert!((0..g.nodes.len()).any(kept), "{name}: fp32 keeps its transposes");
        }
        for precision in [DType::F16, DType::BF16] {
            check_in(head_chains().into_iter().map(|(n, g)| (n.to_string(), g)).collect(), precision);
        }
        check(head_chains().into_iter().map(|(n, g)| (n.to_string(), g)).collect());
    }

    /// The other kernel families (elementwise math, scans, gathers and scatters) in fp16 and bf16: fp32
    /// arithmetic between 16-bit loads and stores.
    #[test]
    fn other_kernels_match_the_reference_in_fp16_and_bf16() {
        for precision in [DType::F16, DType::BF16] {
            let mut graphs: Vec<(String, Graph)> = crate::backend::unary_cases::cases().into_iter().map(|(n, g)| (n.to_string(), g)).collect();
            graphs.extend(crate::backend::scan_nd_cases::cases().into_iter().map(|(n, g)| (n.to_string(), g)));
            check_in(graphs, precision);
        }
    }

    /// `-layout=nhwc`'s kernels: channels-last convolutions (implicit GEMM with its epilogue, split along K,
    /// grouped and dilated with one-sided pads, depthwise on the row-window kernel), max pool and a residual chain,
    /// in fp32 (exactly) and fp16 (tensor cores), against the channels-first reference.
    #[test]
    fn channels_last_kernels_match_the_reference() {
        use crate::ir::{BinaryOp, ConvAttrs, Op, PoolAttrs, UnaryOp};
        let conv = |s: usize, p: usize, group: usize| Op::Conv(ConvAttrs { strides: vec![s, s], pads: vec![p; 4], dilations: vec![1, 1], group });
        let graphs = || {
            vec![
                graph_of("nhwc_block", |g| {
                    let x = input(g, "x", &[2, 16, 9, 9]);
                    let w1 = input(g, "w1", &[32, 16, 3, 3]);
                    let b1 = input(g, "b1", &[32]);
                    let c1 = op(g, conv(1, 1, 1), &[x, w1, b1]);
                    let r1 = op(g, Op::Unary(UnaryOp::Relu), &[c1]);
                    let pool = PoolAttrs { kernel: vec![3, 3], strides: vec![2, 2], pads: vec![1; 4], dilations: vec![1, 1], ceil_mode: false };
                    let p = op(g, Op::MaxPool(pool), &[r1]);
                    let w2 = input(g, "w2", &[32, 32, 1, 1]);
                    let c2 = op(g, conv(1, 0, 1), &[p, w2]);
                    let sum = op(g, Op::Binary(BinaryOp::Add), &[c2, p]);
                    let r2 = op(g, Op::Unary(UnaryOp::Relu), &[sum]);
                    let dw = input(g, "dw", &[32, 1, 3, 3]);
                    let d = op(g, conv(2, 1, 32), &[r2, dw]);
                    // (No global average pool: the emulation has no block reductions.)
                    vec![d, r2]
                }),
                graph_of("nhwc_split_k", |g| {
                    let x = input(g, "x", &[1, 64, 7, 7]);
                    let w = input(g, "w", &[32, 64, 3, 3]);
                    let b = input(g, "b", &[32]);
                    let c = op(g, conv(1, 1, 1), &[x, w, b]);
                    vec![op(g, Op::Unary(UnaryOp::Relu), &[c])]
                }),
                graph_of("nhwc_depthwise", |g| depthwise_pair(g, 12)),
                graph_of("nhwc_grouped_dilated", |g| {
                    let x = input(g, "x", &[3, 16, 9, 10]);
                    let w = input(g, "w", &[16, 8, 2, 3]);
                    let a = ConvAttrs { strides: vec![1, 2], pads: vec![2, 0, 0, 1], dilations: vec![2, 1], group: 2 };
                    vec![op(g, Op::Conv(a), &[x, w])]
                }),
            ]
        };
        for precision in [DType::F32, DType::F16] {
            let t = Target::parse("cuda -compiler=nvrtc").unwrap();
            let graphs: Vec<(String, Graph, Graph)> = graphs()
                .into_iter()
                .map(|(name, g)| {
                    let narrow = if precision == DType::F32 { g.clone() } else { crate::passes::precision::to_narrow(&g, precision).unwrap() };
                    let last = crate::passes::layout::to_channels_last(&narrow).unwrap();
                    assert!(last.nodes.iter().all(|n| !matches!(n.op, Op::Conv(_) | Op::MaxPool(_))), "{name}: channels-last throughout");
                    let src = postcard::from_bytes::<CudaCode>(&super::super::CudaBackend.lower(&t, &last, "probe").unwrap().code).unwrap().source;
                    if name == "nhwc_depthwise" {
                        assert!(src.contains("tsr_conv::depthwise_row<"), "{name}: on the row-window kernel");
                    }
                    if precision != DType::F32 && name != "nhwc_grouped_dilated" && name != "nhwc_depthwise" {
                        assert!(src.contains("tsr_gemm::tc_"), "{name}: on tensor cores");
                    }
                    (format!("{name} {precision}"), last, g)
                })
                .collect();
            check_lowered(graphs, precision != DType::F32);
        }
    }

    /// `-overflow=bf16`'s graphs: an fp16 graph whose kept nodes compute in bf16, so one kernel loads and
    /// stores both 16-bit types and casts between them, and a bf16 tensor-core GEMM feeds f16 ones.
    #[test]
    fn kernels_mixing_fp16_and_bf16_match_the_reference() {
        use crate::ir::{BinaryOp, Op, UnaryOp};
        let (_, g) = graph_of("mixed", |g| {
            let x = input(g, "x", &[16, 64]);
            let w1 = input(g, "w1", &[64, 48]);
            let w2 = input(g, "w2", &[48, 32]);
            let b = input(g, "b", &[48]);
            let big = op(g, Op::MatMul, &[x, w1]); // kept: bf16 tensor cores
            let biased = op(g, Op::Binary(BinaryOp::Add), &[big, b]); // kept
            let act = op(g, Op::Unary(UnaryOp::Tanh), &[biased]); // f16 from here on
            let out = op(g, Op::MatMul, &[act, w2]);
            vec![op(g, Op::Unary(UnaryOp::Relu), &[out]), biased]
        });
        let keep = [true, true, false, false, false];
        let mixed = crate::passes::precision::to_narrow_keeping(&g, DType::F16, &keep, DType::BF16).unwrap();
        let types: Vec<DType> = mixed.nodes.iter().filter(|n| matches!(n.op, Op::MatMul)).map(|n| mixed.ty(n.outputs[0]).dtype).collect();
        assert_eq!(types, [DType::BF16, DType::F16]);
        let lowered = super::super::CudaBackend.lower(&Target::parse("cuda").unwrap(), &mixed, "probe").unwrap();
        let src = postcard::from_bytes::<CudaCode>(&lowered.code).unwrap().source;
        assert!(src.contains("__nv_bfloat16* __restrict__") || src.contains("const __nv_bfloat16*"), "{src}");
        let on_tensor_cores = |t: &str| src.contains(&format!(", {t}>(slice, a, b, index, out);"));
        assert!(on_tensor_cores("__nv_bfloat16") && on_tensor_cores("__half"), "both GEMMs on tensor cores: {src}");
        check_lowered(vec![("mixed".to_string(), mixed, g)], true);
    }

    /// Every tile on shapes with tails in both Sq and Sk, through the same lowering (forced tile).
    #[test]
    fn every_tile_matches_the_reference() {
        use super::super::attention::{AttnTiles, MID_TILES, SMALL_TILES};
        let base = AttnCase {
            name: "tiles",
            q_lead: vec![2],
            k_lead: vec![2],
            v_lead: vec![2],
            sq: 70,
            sk: 100,
            d: 36,
            dv: 33,
            scale: 0.2,
            k_transposed: false,
            mask: Some(vec![2, 70, 1]),
            keep: Some((vec![100], -5.0)),
            nan_to_zero: false,
        };
        let tiles = [AttnTiles::default(), MID_TILES, SMALL_TILES, AttnTiles { bq: 64, bk: 32, threads: 128 }, AttnTiles { bq: 8, bk: 96, threads: 64 }];
        let g = base.graph();
        let p = crate::backend::lowering::plan::plan(&g);
        let mut codes = Vec::new();
        let inputs = g.inputs.iter().map(|&v| g.ty(v).clone()).collect();
        let info = FunctionInfo { symbol: "tiles".into(), inputs, outputs: vec![g.ty(g.outputs[0]).clone()], scratch_bytes: 0 };
        for (i, tile) in tiles.iter().enumerate() {
            let sym = format!("tile{i}");
            let mut k = super::super::kernel::Kernel::new(&g, &p, &sym);
            let crate::ir::Op::Attention(a) = &g.nodes[0].op else { unreachable!("one Attention") };
            assert!(super::super::attention::attention_with(&mut k, crate::ir::NodeId(0), a, *tile).unwrap());
            let entry = format!("{sym}_k0_0");
            let args = (0..k.params.len())
                .map(|pi| match k.params[pi].0 {
                    super::super::kernel::Binding::Root(v) => {
                        let output = || g.outputs.iter().position(|&x| x == v).expect("an input or the output");
                        let at = g.inputs.iter().position(|&x| x == v).unwrap_or_else(|| g.inputs.len() + output());
                        tessera_kernels::runtime::cuda::format::LaunchArg { index: at as u32, offset: 0 }
                    }
                    other => panic!("unexpected binding {other:?}"),
                })
                .collect();
            use tessera_kernels::runtime::cuda::format::{FunctionLaunches, Launch};
            let launch = Launch { entry: entry.clone(), grid: k.grid, block: k.block, shared_bytes: k.shared_bytes, args };
            codes.push(CudaCode { source: k.render(&entry), launches: FunctionLaunches { launches: vec![launch] }, entry_offsets: vec![] });
        }
        let inputs = random_inputs(&g, 3);
        let want = run_graph(&g, &inputs).unwrap();
        let jobs: Vec<Job> = codes.iter().map(|code| Job { code, info: &info, inputs: &inputs }).collect();
        for (tile, res) in tiles.iter().zip(run(&jobs)) {
            for outs in &res {
                compare(&outs[0], &want[0]).unwrap_or_else(|e| panic!("{tile:?}: {e}"));
            }
            assert_eq!(res[0], res[1], "{tile:?}: thread orders differ");
        }
    }
}
