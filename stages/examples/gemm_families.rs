//! Times every configuration of the GPU backends that run GEMM chains, `cutlass` (its tile configurations),
//! `cublas` (cuBLASLt's algorithms) and `cuda` (our own kernels), on the GEMM chains of BERT-base at batch 8 and GPT-2
//! at 256 tokens, fp16, one chain per kernel as the search places them; checks each result against the
//! reference interpreter first (fp16 within 1e-2) and prints, per problem, each configuration's median and
//! the best of each backend. A benchmark, not a test: it needs an NVIDIA GPU.
//!
//! `cargo run --release -p tessera-stages --example gemm_families [-- --json OUT.json]`
//! (on the GPU machine: build here, carry the binary; nvcc and the CUTLASS headers must be found there).

use tessera_kernels::runtime::cuda::call::call_gpu_function;
use tessera_kernels::runtime::cuda::measure::measure_gpu_function;
use tessera_kernels::runtime::measure::MeasureOptions;
use tessera_stages::backend::registry;
use tessera_stages::interp::{random_inputs, run_graph};
use tessera_stages::ir::*;
use tessera_stages::target::Target;

/// One GEMM chain: rows x cols x depth, with a bias, then an optional residual or activation.
struct Problem {
    name: &'static str,
    m: usize,
    n: usize,
    k: usize,
    epilogue: Epilogue,
}

#[derive(Clone, Copy)]
enum Epilogue {
    Bias,
    BiasResidual,
    BiasGelu(GeluApprox),
}

const PROBLEMS: &[Problem] = &[
    Problem { name: "bert-b8 qkv", m: 1024, n: 2304, k: 768, epilogue: Epilogue::Bias },
    Problem { name: "bert-b8 attn-out", m: 1024, n: 768, k: 768, epilogue: Epilogue::BiasResidual },
    Problem { name: "bert-b8 ffn1", m: 1024, n: 3072, k: 768, epilogue: Epilogue::BiasGelu(GeluApprox::Erf) },
    Problem { name: "bert-b8 ffn2", m: 1024, n: 768, k: 3072, epilogue: Epilogue::BiasResidual },
    Problem { name: "gpt2-s256 qkv", m: 256, n: 2304, k: 768, epilogue: Epilogue::Bias },
    Problem { name: "gpt2-s256 attn-out", m: 256, n: 768, k: 768, epilogue: Epilogue::BiasResidual },
    Problem { name: "gpt2-s256 ffn1", m: 256, n: 3072, k: 768, epilogue: Epilogue::BiasGelu(GeluApprox::Tanh) },
    Problem { name: "gpt2-s256 ffn2", m: 256, n: 768, k: 3072, epilogue: Epilogue::BiasResidual },
];

fn graph(p: &Problem) -> Graph {
    let t = |s: &[usize]| TensorType::new(DType::F16, s.to_vec());
    let mut g = Graph::new(p.name.replace(' ', "_"));
    let x = g.add_input("x", t(&[p.m, p.k]));
    let w = g.add_input("w", t(&[p.k, p.n]));
    let b = g.add_input("b", t(&[p.n]));
    let mm = g.add("mm", Op::MatMul, &[x, w]).unwrap();
    let mut y = g.add("bias", Op::Binary(BinaryOp::Add), &[mm, b]).unwrap();
    match p.epilogue {
        Epilogue::Bias => {}
        Epilogue::BiasResidual => {
            let r = g.add_input("r", t(&[p.m, p.n]));
            y = g.add("residual", Op::Binary(BinaryOp::Add), &[y, r]).unwrap();
        }
        Epilogue::BiasGelu(approximate) => y = g.add("gelu", Op::Gelu { approximate }, &[y]).unwrap(),
    }
    g.outputs.push(y);
    g
}

fn widened(t: &Tensor) -> Tensor {
    let v: Vec<f32> = t.to_f64_vec().into_iter().map(|x| x as f32).collect();
    Tensor::from_f32(t.ty.shape.clone(), &v)
}

/// Largest |got - want| over the largest |want|, NaN never passing.
fn relative_error(got: &Tensor, want: &Tensor) -> f64 {
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let scale = w.iter().fold(0.0f64, |a, x| a.max(x.abs())).max(1e-30);
    g.iter().zip(&w).map(|(a, b)| if a.is_nan() { f64::INFINITY } else { (a - b).abs() / scale }).fold(0.0, f64::max)
}

struct Row {
    problem: &'static str,
    backend: String,
    config: String,
    median_us: f64,
    tflops: f64,
    error: f64,
}

fn main() {
    let json_out = std::env::args().skip_while(|a| a != "--json").nth(1);
    let opts = MeasureOptions { warmup: 10, min_runs: 50, budget_us: 50_000, max_runs: 2000 };
    // Every (problem, backend, configuration) lowered, then compiled in parallel (nvcc takes seconds a
    // module), then run and timed one after the other.
    let mut jobs = Vec::new();
    for (pi, p) in PROBLEMS.iter().enumerate() {
        let g = graph(p);
        for name in ["cutlass", "cublas", "nvrtc"] {
            let target = Target::parse(&format!("cuda -compiler={name} -precision=fp16")).unwrap();
            let backend = registry::all().into_iter().find(|b| b.spec().compiler == name).expect("a built-in backend");
            for config in backend.configs(&target).names() {
                match backend.lower_config(&target, &g, "k", config) {
                    Ok(l) => jobs.push((pi, name, target.clone(), config.to_string(), l)),
                    Err(e) => eprintln!("{} {config}: not lowered: {e}", p.name),
                }
            }
        }
    }
    use rayon::prelude::*;
    let modules: Vec<_> = jobs
        .par_iter()
        .map(|(pi, name, target, config, l)| {
            let backend = registry::all().into_iter().find(|b| b.spec().compiler == *name).unwrap();
            backend.compile_module(target, std::slice::from_ref(l)).unwrap_or_else(|e| panic!("{} {config}: {e}", PROBLEMS[*pi].name))
        })
        .collect();
    let mut rows: Vec<Row> = Vec::new();
    for (pi, p) in PROBLEMS.iter().enumerate() {
        let g = graph(p);
        let inputs = random_inputs(&g, 7);
        let g32 = {
            let mut h = g.clone();
            for v in h.values.iter_mut() {
                v.ty.dtype = DType::F32;
            }
            h
        };
        let want = run_graph(&g32, &inputs.iter().map(widened).collect::<Vec<_>>()).expect("reference");
        let flops = 2.0 * (p.m * p.n * p.k) as f64;
        for ((_, name, _, config, lowered), module) in jobs.iter().zip(&modules).filter(|((i, ..), _)| *i == pi) {
            let loaded = tessera_kernels::runtime::load_module(module).unwrap_or_else(|e| panic!("{} {config}: {}", p.name, e.0));
            let got = call_gpu_function(loaded.as_ref(), 0, &lowered.info, &inputs).unwrap_or_else(|e| panic!("{} {config}: {}", p.name, e.0));
            let error = relative_error(&widened(&got[0]), &want[0]);
            let m = match measure_gpu_function(loaded.as_ref(), 0, &lowered.info, &inputs, &opts) {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("{} {config}: not measured: {e:?}", p.name);
                    continue;
                }
            };
            let row = Row { problem: p.name, backend: name.to_string(), config: config.clone(), median_us: m.median_us, tflops: flops / m.median_us / 1e6, error };
            println!("{:20} {:8} {:40} {:8.2} us {:6.1} TFLOP/s  err {:.1e}{}", row.problem, row.backend, row.config, row.median_us, row.tflops, row.error, if error < 1e-2 { "" } else { "  WRONG" });
            rows.push(row);
        }
    }
    println!("\nbest per problem and backend (median us, TFLOP/s, configuration):");
    println!("| problem | cutlass | cuBLASLt | cuda (ours) | time, cutlass / cuBLASLt | time, cuda / cuBLASLt |");
    println!("|---|---|---|---|---|---|");
    let mut wrong = 0;
    for p in PROBLEMS {
        let best = |f: &dyn Fn(&Row) -> bool| rows.iter().filter(|r| r.problem == p.name && f(r)).min_by(|a, b| a.median_us.total_cmp(&b.median_us));
        let cutlass = best(&|r| r.backend == "cutlass");
        let lt = best(&|r| r.backend == "cublas");
        let ours = best(&|r| r.backend == "nvrtc");
        let cell = |r: Option<&Row>| r.map(|r| format!("{:.2} ({:.0}, {})", r.median_us, r.tflops, r.config.rsplit('/').next().unwrap_or(""))).unwrap_or_else(|| "-".into());
        let ratio = |a: Option<&Row>, b: Option<&Row>| match (a, b) {
            (Some(a), Some(b)) => format!("{:.2}", b.median_us / a.median_us),
            _ => "-".into(),
        };
        println!("| {} ({}x{}x{}) | {} | {} | {} | {} | {} |", p.name, p.m, p.n, p.k, cell(cutlass), cell(lt), cell(ours), ratio(lt, cutlass), ratio(lt, ours));
    }
    for r in &rows {
        if !(r.error < 1e-2) {
            wrong += 1;
            eprintln!("WRONG: {} {} {}: relative error {:.3e}", r.problem, r.backend, r.config, r.error);
        }
    }
    if let Some(path) = json_out {
        let items: Vec<String> = rows
            .iter()
            .map(|r| format!("{{\"problem\":\"{}\",\"backend\":\"{}\",\"config\":\"{}\",\"median_us\":{:.3},\"tflops\":{:.1},\"rel_error\":{:.3e}}}", r.problem, r.backend, r.config, r.median_us, r.tflops, r.error))
            .collect();
        std::fs::write(&path, format!("[\n{}\n]\n", items.join(",\n"))).expect("write the JSON");
    }
    if wrong > 0 {
        std::process::exit(1);
    }
}
