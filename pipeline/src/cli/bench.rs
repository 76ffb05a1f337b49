//! `tessera bench ARTIFACT.tsr... [--iters N] [--warmup N] [--seed S] [--json]`: latency of compiled
//! artifacts as the runtime executes them.
//!
//! Per artifact: load once (modules, constants, arena; timed separately), draw random inputs from the seed
//! (the generator of `tessera run`: never all zeros, integer inputs inside the bounds the artifact records so
//! gathers stay valid), run `--warmup` times untimed, then `--iters` timed runs. Reported: median, p10 and
//! p90 of the per-run wall time (percentiles interpolated linearly between order statistics, as NumPy's
//! default), and the minimum. CPU runs are timed with the monotonic clock around `Executable::run`, which
//! includes copying inputs in and outputs out; GPU runs, once they exist, will be timed with CUDA events.

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tessera_kernels::artifact::Artifact;
use tessera_kernels::runtime::Executable;

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
}

/// One step of an artifact under `--profile`.
#[derive(Clone, Debug, Serialize)]
pub struct StepProfile {
    pub step: usize,
    pub backend: String,
    pub symbol: String,
    pub median_us: f64,
}

/// Times every step of one artifact: `warmup` untimed runs, then `iters` profiled runs; per-step medians.
pub fn profile_artifact(path: &Path, iters: usize, warmup: usize, seed: u64) -> anyhow::Result<Vec<StepProfile>> {
    if iters == 0 {
        bail!("--iters must be at least 1");
    }
    let artifact = Artifact::open(path)?;
    let mut exe = Executable::load(&artifact).with_context(|| format!("loading {}", path.display()))?;
    let inputs = artifact.random_inputs(seed);
    for _ in 0..warmup {
        exe.run(&inputs)?;
    }
    let mut per_step: Vec<Vec<f64>> = vec![Vec::with_capacity(iters); exe.steps().len()];
    let mut times = Vec::new();
    for _ in 0..iters {
        exe.run_profiled(&inputs, &mut times)?;
        for (s, t) in times.iter().enumerate() {
            per_step[s].push(*t);
        }
    }
    Ok(per_step
        .into_iter()
        .zip(exe.steps())
        .enumerate()
        .map(|(step, (mut v, (backend, symbol)))| {
            v.sort_by(f64::total_cmp);
            StepProfile { step, backend: backend.clone(), symbol: symbol.clone(), median_us: percentile(&v, 50.0) }
        })
        .collect())
}

fn profile_table(model: &str, steps: &[StepProfile]) -> String {
    let total: f64 = steps.iter().map(|s| s.median_us).sum();
    let mut s = format!("{model}: {} steps, {:.1} us in steps (sum of medians)\n", steps.len(), total);
    s += &format!("{:>5}  {:<8}  {:<24}  {:>12}  {:>6}\n", "step", "backend", "function", "median us", "share");
    for p in steps {
        s += &format!("{:>5}  {:<8}  {:<24}  {:>12.1}  {:>5.1}%\n", p.step, p.backend, p.symbol, p.median_us, 100.0 * p.median_us / total.max(1e-9));
    }
    s
}

/// One artifact's measurements, in milliseconds.
#[derive(Clone, Debug, Serialize)]
pub struct BenchResult {
    pub artifact: String,
    pub model: String,
    pub iters: usize,
    pub warmup: usize,
    pub load_ms: f64,
    pub median_ms: f64,
    pub p10_ms: f64,
    pub p90_ms: f64,
    pub min_ms: f64,
}

/// The `p`-th percentile (0..=100) of sorted samples, interpolated linearly between order statistics.
/// The median of samples in any order (the 50th percentile, interpolated: the mean of the middle two).
pub fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile(&sorted, 50.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let pos = p / 100.0 * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Benchmarks one artifact (see the module documentation).
pub fn bench_artifact(path: &Path, iters: usize, warmup: usize, seed: u64) -> anyhow::Result<BenchResult> {
    if iters == 0 {
        bail!("--iters must be at least 1");
    }
    let artifact = Artifact::open(path)?;
    let t0 = Instant::now();
    let mut exe = Executable::load(&artifact).with_context(|| format!("loading {}", path.display()))?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let inputs = artifact.random_inputs(seed);
    for _ in 0..warmup {
        exe.run(&inputs)?;
    }
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        let out = exe.run(&inputs)?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
        drop(out);
    }
    Ok(summarize(path.display().to_string(), artifact.body.model.clone(), iters, warmup, load_ms, samples))
}

/// The report of one artifact's timed runs (milliseconds, any order).
fn summarize(artifact: String, model: String, iters: usize, warmup: usize, load_ms: f64, mut ms: Vec<f64>) -> BenchResult {
    ms.sort_by(f64::total_cmp);
    BenchResult {
        artifact,
        model,
        iters,
        warmup,
        load_ms,
        median_ms: percentile(&ms, 50.0),
        p10_ms: percentile(&ms, 10.0),
        p90_ms: percentile(&ms, 90.0),
        min_ms: ms[0],
    }
}

/// How [`time_abba`] runs each block: `warmup` untimed runs, then timed runs until at least `min_runs` and
/// `budget_us` of timed runs, or `max_runs`.
#[derive(Clone, Copy, Debug)]
pub struct Block {
    pub warmup: usize,
    pub min_runs: usize,
    pub max_runs: usize,
    pub budget_us: f64,
}

/// Times several executables in two passes, in order then in reverse (A B C, C B A), one block of runs each
/// per pass: linear drift on the machine (clocks, neighbours) then weighs on every executable alike, and
/// each block starts warm on its own executable. Not round by round: on the 2-vCPU CI-class VM, runs
/// alternating with a 60 ms single-threaded C build left MobileNetV2's gemm build 55% slower than back to
/// back (32 vs 20.5 ms), even with an untimed run in between; a plan's cost should not include its
/// neighbour's. Returns each executable's samples in microseconds, per pass. The caller owns the machine
/// (e.g. holds [`crate::device::exclusively`]).
pub fn time_abba(runs: &mut [(Executable, Vec<tessera_stages::ir::Tensor>)], b: Block) -> anyhow::Result<Vec<[Vec<f64>; 2]>> {
    let mut samples: Vec<[Vec<f64>; 2]> = vec![[Vec::with_capacity(b.min_runs), Vec::with_capacity(b.min_runs)]; runs.len()];
    let order: Vec<(usize, usize)> = (0..runs.len()).map(|i| (0, i)).chain((0..runs.len()).rev().map(|i| (1, i))).collect();
    for (pass, i) in order {
        let (exe, inputs) = &mut runs[i];
        for _ in 0..b.warmup {
            exe.run(inputs)?;
        }
        let mut spent = 0.0;
        let mut n = 0;
        while n < b.max_runs && (n < b.min_runs || spent < b.budget_us) {
            let t = Instant::now();
            let out = exe.run(inputs)?;
            let us = t.elapsed().as_secs_f64() * 1e6;
            drop(out);
            samples[i][pass].push(us);
            spent += us;
            n += 1;
        }
    }
    Ok(samples)
}

/// Benchmarks several artifacts of one model against each other: loaded once each, timed in two passes
/// ([`time_abba`], `iters` timed runs in all, half per pass), each reported as [`bench_artifact`] reports.
pub fn bench_abba(paths: &[PathBuf], iters: usize, warmup: usize, seed: u64) -> anyhow::Result<Vec<BenchResult>> {
    if iters == 0 {
        bail!("--iters must be at least 1");
    }
    let mut runs = Vec::with_capacity(paths.len());
    let mut meta = Vec::with_capacity(paths.len());
    for path in paths {
        let artifact = Artifact::open(path)?;
        let t0 = Instant::now();
        let exe = Executable::load(&artifact).with_context(|| format!("loading {}", path.display()))?;
        meta.push((path.display().to_string(), artifact.body.model.clone(), t0.elapsed().as_secs_f64() * 1e3));
        runs.push((exe, artifact.random_inputs(seed)));
    }
    let per_block = iters.div_ceil(2);
    let samples = time_abba(&mut runs, Block { warmup, min_runs: per_block, max_runs: per_block, budget_us: 0.0 })?;
    Ok(meta
        .into_iter()
        .zip(samples)
        .map(|((artifact, model, load_ms), [first, second])| {
            let ms: Vec<f64> = first.iter().chain(&second).map(|us| us / 1e3).collect();
            summarize(artifact, model, iters, warmup, load_ms, ms)
        })
        .collect())
}

fn table(results: &[BenchResult]) -> String {
    let w = results.iter().map(|r| r.model.len()).max().unwrap_or(0).max("model".len());
    let mut s = format!("{:<w$}  {:>10}  {:>10}  {:>10}  {:>10}  {:>10}  {:>6}\n", "model", "median ms", "p10 ms", "p90 ms", "min ms", "load ms", "iters");
    for r in results {
        s += &format!(
            "{:<w$}  {:>10.4}  {:>10.4}  {:>10.4}  {:>10.4}  {:>10.2}  {:>6}\n",
            r.model, r.median_ms, r.p10_ms, r.p90_ms, r.min_ms, r.load_ms, r.iters
        );
    }
    s
}

/// Runs `tessera bench`: every artifact in order, then a table (or JSON: `{"results": [...]}`).
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
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
    use tessera_kernels::link::{link, LinkInput, LinkStep, ValueRef};
    use tessera_stages::backend::{FunctionInfo, Module, ModuleFormat};
    use tessera_stages::ir::TensorType;

    #[test]
    fn percentiles_interpolate() {
        let s = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile(&s, 50.0), 3.0);
        assert!((percentile(&s, 10.0) - 1.4).abs() < 1e-12);
        assert!((percentile(&s, 90.0) - 4.6).abs() < 1e-12);
        assert_eq!(percentile(&[7.0], 90.0), 7.0);
        assert_eq!(percentile(&[1.0, 2.0], 50.0), 1.5);
    }

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
                format: ModuleFormat::SharedObject,
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
    fn errors_name_the_artifact() {
        let d = tempfile::tempdir().unwrap();
        let e = bench_artifact(&d.path().join("nope.tsr"), 5, 0, 0).unwrap_err().to_string();
        assert!(e.contains("nope.tsr"), "{e}");
        let path = artifact(d.path());
        assert!(bench_artifact(&path, 0, 0, 0).unwrap_err().to_string().contains("--iters"));
    }
}
