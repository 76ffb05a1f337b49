//! Micro-benchmark of the `gemm` backend against the reference interpreter on the shapes that dominate real
//! models: ResNet-50 3x3 convs (stage 2 and stage 4), MobileNetV2's stem and depthwise convs (large and small planes), and BERT-base's
//! 768 -> 3072 feed-forward MatMul (alone, and with its bias + GELU epilogue, which the interpreter runs as
//! three ops). Each case goes the real way (signature, extract, lower, compile, load) and is then timed
//! call by call with preallocated buffers; the interpreter is timed on the same graph with `run_graph`.
//!
//! Run: `cargo bench -p tessera-kernels --bench gemm_conv` (optionally `-- ITERS` and words a case's name must
//! contain, e.g. `-- 200 depthwise`). Prints, per case, the
//! median and minimum milliseconds of each side, the gemm side's GFLOP/s and the speed-up.

use std::time::Instant;
use tessera_kernels::runtime::{load_module, on_runtime_pool, HostBuffer};
use tessera_stages::backend::gemm::GemmBackend;
use tessera_stages::backend::{Backend, INLINE_CONST_MAX};
use tessera_stages::interp::{random_inputs, random_tensor, run_graph};
use tessera_stages::ir::*;
use tessera_stages::target::Target;

struct Case {
    name: &'static str,
    graph: Graph,
    flops: f64,
}

fn weight(g: &mut Graph, shape: &[usize]) -> ValueId {
    let stream = g.values.len() as u64;
    g.add_const(format!("w{stream}"), random_tensor(&TensorType::f32(shape.to_vec()), 7, stream, 0))
}

fn conv_case(name: &'static str, x: [usize; 4], w: [usize; 4], group: usize, stride: usize) -> Case {
    let mut g = Graph::new(name);
    let xi = g.add_input("x", TensorType::f32(x));
    let wi = weight(&mut g, &w);
    let pad = w[2] / 2;
    let a = ConvAttrs { strides: vec![stride; 2], pads: vec![pad; 4], dilations: vec![1; 2], group };
    let y = g.add("conv", Op::Conv(a), &[xi, wi]).unwrap();
    g.outputs.push(y);
    let out = g.ty(y).shape.clone();
    let flops = 2.0 * out.iter().product::<usize>() as f64 * (w[1] * w[2] * w[3]) as f64;
    Case { name, graph: g, flops }
}

fn matmul_case(name: &'static str, m: usize, k: usize, n: usize, epilogue: bool) -> Case {
    let mut g = Graph::new(name);
    let x = g.add_input("x", TensorType::f32([m, k]));
    let w = weight(&mut g, &[k, n]);
    let mut y = g.add("mm", Op::MatMul, &[x, w]).unwrap();
    if epilogue {
        let b = weight(&mut g, &[n]);
        y = g.add("bias", Op::Binary(BinaryOp::Add), &[y, b]).unwrap();
        y = g.add("gelu", Op::Gelu { approximate: GeluApprox::Erf }, &[y]).unwrap();
    }
    g.outputs.push(y);
    Case { name, graph: g, flops: 2.0 * (m * k * n) as f64 }
}

/// The call's buffer pointers, sent to the runtime pool's thread (the buffers outlive every call).
struct Args(Vec<*mut u8>);
// SAFETY: the pointers are only dereferenced by the call, while the buffers they point into are alive.
unsafe impl Send for Args {}
unsafe impl Sync for Args {}

impl Args {
    fn get(&self) -> &[*mut u8] {
        &self.0
    }
}

fn median_min(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 2], v[0])
}

fn time(iters: usize, mut f: impl FnMut()) -> (f64, f64) {
    for _ in 0..2 {
        f();
    }
    let v = (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    median_min(v)
}

fn main() {
    let iters: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(20);
    let words: Vec<String> = std::env::args().skip(1).filter(|a| a.parse::<usize>().is_err() && !a.starts_with("--")).collect();
    let target = Target::parse("cpu -compiler=gemm").unwrap();
    let cases = vec![
        conv_case("resnet50 conv2 3x3 64->64 @56x56", [1, 64, 56, 56], [64, 64, 3, 3], 1, 1),
        conv_case("resnet50 conv4 3x3 256->256 @14x14", [1, 256, 14, 14], [256, 256, 3, 3], 1, 1),
        conv_case("mobilenetv2 depthwise 3x3 144 @56x56", [1, 144, 56, 56], [144, 1, 3, 3], 144, 1),
        conv_case("mobilenetv2 depthwise 3x3 s2 96 @112", [1, 96, 112, 112], [96, 1, 3, 3], 96, 2),
        conv_case("mobilenetv2 depthwise 3x3 384 @14x14", [1, 384, 14, 14], [384, 1, 3, 3], 384, 1),
        conv_case("mobilenetv2 depthwise 3x3 960 @7x7", [1, 960, 7, 7], [960, 1, 3, 3], 960, 1),
        conv_case("mobilenetv2 depthwise 3x3 s2 192 @28x28", [1, 192, 28, 28], [192, 1, 3, 3], 192, 2),
        conv_case("mobilenetv2 depthwise 3x3 s2 576 @14x14", [1, 576, 14, 14], [576, 1, 3, 3], 576, 2),
        conv_case("mobilenetv2 stem 3x3 s2 3->32 @224", [1, 3, 224, 224], [32, 3, 3, 3], 1, 2),
        matmul_case("mobilenetv2 classifier 1x1280x1000", 1, 1280, 1000, false),
        matmul_case("bert-base ffn matmul 128x768x3072", 128, 768, 3072, false),
        matmul_case("bert-base ffn matmul+bias+gelu", 128, 768, 3072, true),
    ];
    println!("{iters} timed iterations after 2 warm-ups; milliseconds (median / min)");
    println!("{:<40} {:>17} {:>17} {:>9} {:>8}", "case", "interpreter", "gemm backend", "GFLOP/s", "speedup");
    for c in cases.into_iter().filter(|c| words.iter().all(|w| c.name.contains(w.as_str()))) {
        let g = &c.graph;
        let nodes: Vec<NodeId> = (0..g.nodes.len() as u32).map(NodeId).collect();
        let sig = subgraph_signature(g, &nodes, ConstMode::LiftLarge(INLINE_CONST_MAX));
        let kernel = extract_subgraph(g, &sig);
        let lowered = GemmBackend.lower(&target, &kernel, "f").expect("lowers");
        let module = GemmBackend.compile_module(&target, &[lowered]).expect("compiles");
        let loaded = load_module(&module).expect("loads");
        let info = &module.functions[0];
        let inputs = random_inputs(g, 1);
        let mut bufs: Vec<HostBuffer> = sig
            .inputs
            .iter()
            .map(|&v| match &g.value(v).def {
                ValueDef::Input(i) => HostBuffer::from_bytes(inputs[*i].bytes(), "input").unwrap(),
                ValueDef::Const(t) => HostBuffer::from_bytes(t.bytes(), "weight").unwrap(),
                ValueDef::Node { .. } => unreachable!("whole graph is the partition"),
            })
            .collect();
        for t in &info.outputs {
            bufs.push(HostBuffer::zeroed(t.size_bytes() as u64, "output").unwrap());
        }
        if info.scratch_bytes > 0 {
            bufs.push(HostBuffer::zeroed(info.scratch_bytes, "scratch").unwrap());
        }
        let args: Vec<*mut u8> = bufs.iter().map(|b| b.as_ptr()).collect();
        // On the runtime pool, as runs are (its size: the cores, or TESSERA_THREADS).
        let args = Args(args);
        // SAFETY: buffers of the signature's types and scratch size, 64-byte aligned, outputs distinct.
        let gemm = time(iters, || on_runtime_pool(|| unsafe { loaded.call(0, args.get()).expect("runs") }));
        let interp = time(iters, || {
            run_graph(g, &inputs).expect("interprets");
        });
        println!(
            "{:<40} {:>8.3} / {:>6.3} {:>8.3} / {:>6.3} {:>9.1} {:>7.2}x",
            c.name,
            interp.0,
            interp.1,
            gemm.0,
            gemm.1,
            c.flops / (gemm.0 * 1e6),
            interp.0 / gemm.0
        );
    }
}
