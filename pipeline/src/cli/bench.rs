//! `tessera bench ARTIFACT.tsr... [--iters N] [--warmup N] [--seed S] [--json]`: latency of compiled
//! artifacts as the runtime executes them.
//!
//! Per artifact: load once (modules, constants, arena; timed separately), draw random inputs from the seed
//! (the generator of `tessera run`: never all zeros, integer inputs inside the bounds the artifact records so
//! gathers stay valid), run `--warmup` times untimed, then `--iters` timed runs. Reported: median, p10 and
//! p90 of the per-run wall time (percentiles interpolated linearly between order statistics, as NumPy's
//! default), and the minimum. CPU runs are timed with the monotonic clock around `Executable::run`, which
//! includes copying inputs in and outputs out. GPU artifacts are timed on the GPU: CUDA events around each
//! replay of the model's CUDA graph, inputs uploaded once (so host copies are not timed), after the warm-up
//! replays; `--profile` times each kernel on its own between events (launched directly, not replayed).
//! GPU artifacts load and run on GPU 0, or on the GPU `--gpu N` names (every artifact of the call; a host
//! artifact among them is then an error, before anything is timed).

use crate::bench::{bench_abba, bench_artifact, profile_artifact, BenchResult, StepProfile};
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;
use tessera_kernels::artifact::Artifact;
use tessera_kernels::runtime::cuda::device;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Artifacts (.tsr) to benchmark.
    #[arg(required = true, value_name = "ARTIFACT.tsr")]
    pub artifacts: Vec<PathBuf>,
    /// Timed runs per artifact.
    #[arg(long, default_value_t = 100)]
    pub iters: usize,
    /// Untimed runs before timing starts.
    #[arg(long, default_value_t = 10)]
    pub warmup: usize,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also time every step (kernel call) of each artifact, in separate runs, and list the medians: where a
    /// model's time goes, to set against the plan's per-partition costs (`tessera explain`).
    #[arg(long)]
    pub profile: bool,
    /// Time the artifacts in two passes, in order then in reverse, half the runs each, instead of one after
    /// another: for comparing builds of one model, so drift on the machine hits each alike.
    #[arg(long)]
    pub abba: bool,
    /// Threads of the CPU kernels (GEMMs, convolutions, epilogues); default: the cores this process may run
    /// on, or $TESSERA_THREADS.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// GPU artifacts: the GPU to load and time them on, a CUDA device index (as CUDA_VISIBLE_DEVICES numbers
    /// them); default 0. An error for a host artifact.
    #[arg(long, value_name = "N")]
    pub gpu: Option<usize>,
}

fn profile_table(model: &str, steps: &[StepProfile]) -> String {
    let total: f64 = steps.iter().map(|s| s.median_us).sum();
    let mut s = format!("{model}: {} steps, {:.1} us in steps (sum of medians)\n", steps.len(), total);
    let w = steps.iter().map(|p| p.symbol.len()).max().unwrap_or(0).max(24);
    s += &format!("{:>5}  {:<8}  {:<w$}  {:>12}  {:>6}\n", "step", "backend", "function", "median us", "share");
    for p in steps {
        s += &format!("{:>5}  {:<8}  {:<w$}  {:>12.1}  {:>5.1}%", p.step, p.backend, p.symbol, p.median_us, 100.0 * p.median_us / total.max(1e-9));
        if let Some(l) = &p.launch {
            s += &format!("  {l}");
        }
        s.push('\n');
        // Inside a gemm plan function: its steps, with their rates against their FLOPs and bytes.
        for q in &p.parts {
            let t = q.median_us.max(1e-9);
            s += &format!(
                "{:>5}  {:<8}  {:<w$}  {:>12.1}  {:>5.1}%  {:>7.1} GFLOP/s {:>6.1} GB/s\n",
                format!(".{}", q.index),
                "",
                q.what,
                q.median_us,
                100.0 * q.median_us / total.max(1e-9),
                q.flops as f64 / t / 1e3,
                q.bytes as f64 / t / 1e3
            );
        }
    }
    s
}

fn table(results: &[BenchResult]) -> String {
    let w = results.iter().map(|r| r.model.len()).max().unwrap_or(0).max("model".len());
    let mut s = format!("{:<w$}  {:>10}  {:>10}  {:>10}  {:>10}  {:>10}  {:>6}  {:>6}  {:>7}\n", "model", "median ms", "p10 ms", "p90 ms", "min ms", "load ms", "iters", "timing", "kernels");
    for r in results {
        s += &format!(
            "{:<w$}  {:>10.4}  {:>10.4}  {:>10.4}  {:>10.4}  {:>10.2}  {:>6}  {:>6}  {:>7}\n",
            r.model,
            r.median_ms,
            r.p10_ms,
            r.p90_ms,
            r.min_ms,
            r.load_ms,
            r.iters,
            r.timing,
            r.kernels.map(|k| k.to_string()).unwrap_or_else(|| "-".into())
        );
    }
    s
}

/// Every artifact's results (and profiles, with `--profile`), in order.
fn measure(args: &BenchArgs) -> anyhow::Result<(Vec<BenchResult>, Vec<Vec<StepProfile>>)> {
    let mut results = Vec::with_capacity(args.artifacts.len());
    let mut profiles = Vec::new();
    if args.abba {
        results = bench_abba(&args.artifacts, args.iters, args.warmup, args.seed)?;
    }
    for a in &args.artifacts {
        if !args.abba {
            results.push(bench_artifact(a, args.iters, args.warmup, args.seed)?);
        }
        if args.profile {
            profiles.push(profile_artifact(a, args.iters, args.warmup, args.seed)?);
        }
    }
    Ok((results, profiles))
}

/// Runs `tessera bench`: every artifact in order, then a table (or JSON: `{"results": [...]}`).
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(n) = args.threads {
        tessera_kernels::runtime::set_threads(n).map_err(|e| anyhow::anyhow!("--threads {n}: {e}"))?;
    }
    if let Some(g) = args.gpu {
        // Checked up front (each artifact read once more), so that a host artifact late in the list fails
        // before the others are timed.
        for a in &args.artifacts {
            super::run_artifact::check_gpu(&Artifact::open(a)?, a, g)?;
        }
    }
    // Everything the benches open on the device (modules, engines, events) is made on the current GPU.
    let (results, profiles) = device::on(args.gpu.unwrap_or(0), || measure(&args))?;
    if args.json {
        #[derive(Serialize)]
        struct Report<'a> {
            results: &'a [BenchResult],
            #[serde(skip_serializing_if = "<[_]>::is_empty")]
            profiles: &'a [Vec<StepProfile>],
        }
        println!("{}", serde_json::to_string_pretty(&Report { results: &results, profiles: &profiles })?);
    } else {
        print!("{}", table(&results));
        for (r, p) in results.iter().zip(&profiles) {
            print!("\n{}", profile_table(&r.model, p));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use tessera_stages::stages::link::{link, LinkInput, LinkStep, ValueRef};
    use tessera_stages::backend::{FunctionInfo, Module};
    use tessera_stages::ir::TensorType;

    /// An artifact whose one step spins for about `n` iterations per element, so timings are non-trivial.
    fn artifact(dir: &Path) -> PathBuf {
        let c = dir.join("k.c");
        let so = dir.join("k.so");
        std::fs::write(
            &c,
            "void spin(void* const* a) { const float* x = a[0]; float* y = a[1];\n\
             for (int i = 0; i < 256; i++) { float v = x[i]; for (int k = 0; k < 200; k++) v = v * 0.999f + 0.001f; y[i] = v; } }\n",
        )
        .unwrap();
        let status = std::process::Command::new("cc").args(["-shared", "-fPIC", "-O1", "-o"]).arg(&so).arg(&c).status().expect("cc runs");
        assert!(status.success());
        let t = TensorType::f32([256]);
        let input = LinkInput {
            model: "spin".into(),
            inputs: vec![("x".into(), t.clone())],
            outputs: vec![("y".into(), ValueRef::Value(0))],
            values: vec![t.clone()],
            modules: vec![Module {
                backend: "c".into(),
                target: "llvm".into(),
                format: tessera_kernels::runtime::c::FORMAT,
                functions: vec![FunctionInfo { symbol: "spin".into(), inputs: vec![t.clone()], outputs: vec![t], scratch_bytes: 0 }],
                bytes: std::fs::read(&so).unwrap(),
            }],
            steps: vec![LinkStep { module: 0, function: 0, args: vec![ValueRef::Input(0), ValueRef::Value(0)] }],
            ..Default::default()
        };
        let path = dir.join("spin.tsr");
        std::fs::write(&path, link(&input).unwrap()).unwrap();
        path
    }

    #[test]
    fn measures_and_orders_percentiles() {
        let d = tempfile::tempdir().unwrap();
        let path = artifact(d.path());
        let r = bench_artifact(&path, 21, 2, 0).unwrap();
        assert_eq!((r.model.as_str(), r.iters, r.warmup), ("spin", 21, 2));
        assert!(r.min_ms > 0.0 && r.min_ms <= r.p10_ms && r.p10_ms <= r.median_ms && r.median_ms <= r.p90_ms, "{r:?}");
        let t = table(std::slice::from_ref(&r));
        assert!(t.lines().count() == 2 && t.contains("spin") && t.contains("median ms"), "{t}");
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["model"], "spin");
        assert!(j["p90_ms"].as_f64().unwrap() >= j["p10_ms"].as_f64().unwrap());
    }

    #[test]
    fn gpu_index_of_a_host_artifact_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let path = artifact(d.path());
        let args = BenchArgs {
            artifacts: vec![path],
            iters: 1,
            warmup: 0,
            seed: 0,
            json: true,
            profile: false,
            abba: false,
            threads: None,
            gpu: Some(2),
        };
        let e = format!("{:#}", run(args).unwrap_err());
        assert!(e.contains("spin.tsr") && e.contains("--gpu 2: model 'spin' runs on the host; it cannot be placed on GPU 2"), "{e}");
    }

    #[test]
    fn errors_name_the_artifact() {
        let d = tempfile::tempdir().unwrap();
        let e = bench_artifact(&d.path().join("nope.tsr"), 5, 0, 0).unwrap_err().to_string();
        assert!(e.contains("nope.tsr"), "{e}");
        let path = artifact(d.path());
        assert!(bench_artifact(&path, 0, 0, 0).unwrap_err().to_string().contains("--iters"));
    }
}
