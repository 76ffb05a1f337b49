//! Timing compiled artifacts as the runtime executes them: what `tessera bench` reports, and what
//! validation and `tessera baselines` use to compare whole plans.
//!
//! Per artifact: load once (modules, constants, arena; timed separately), draw random inputs from the seed
//! (the generator of `tessera run`: never all zeros, integer inputs inside the bounds the artifact records so
//! gathers stay valid), run `warmup` times untimed, then `iters` timed runs. Reported: median, p10 and
//! p90 of the per-run wall time ([`percentile`]: interpolated linearly between order statistics, as NumPy's
//! default; the one quantile definition of the project), and the minimum. CPU runs are timed with the
//! monotonic clock around `Executable::run`, which includes copying inputs in and outputs out.

use anyhow::{bail, Context};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tessera_kernels::artifact::Artifact;
use tessera_kernels::runtime::gemm::profile::{self as gemm_profile, StepTime};
use tessera_kernels::runtime::measure::percentile;
pub use tessera_kernels::runtime::measure::{median, time_abba, Block};
use tessera_kernels::runtime::Executable;

/// One step of an artifact under `--profile`.
#[derive(Clone, Debug, Serialize)]
pub struct StepProfile {
    pub step: usize,
    pub backend: String,
    pub symbol: String,
    pub median_us: f64,
    /// For a GPU kernel, its launch shape (`grid XxYxZ, block N`).
    pub launch: Option<String>,
    /// For a `gemm` plan function, each of its steps (a GEMM, an im2col, a depthwise convolution) in order:
    /// a whole network can be one plan function.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<PartProfile>,
}

/// One step inside a `gemm` plan function under `--profile`.
#[derive(Clone, Debug, Serialize)]
pub struct PartProfile {
    pub index: usize,
    /// Kind and shape, e.g. `sgemm 96x12544x16 +add,clip`.
    pub what: String,
    pub flops: u64,
    /// Bytes read and written at least once.
    pub bytes: u64,
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
    // A GPU artifact is one step of many kernels: each kernel is profiled.
    if let Some(kernels) = exe.gpu_kernel_times_us(&inputs, warmup, iters) {
        let names = exe.steps().to_vec();
        return Ok(kernels?
            .into_iter()
            .map(|k| StepProfile {
                step: k.step,
                backend: names.get(k.step).map(|n| n.0.clone()).unwrap_or_default(),
                symbol: k.entry,
                median_us: k.median_us,
                launch: Some(format!("grid {}x{}x{}, block {}", k.grid[0], k.grid[1], k.grid[2], k.block.iter().product::<u32>())),
                parts: Vec::new(),
            })
            .collect());
    }
    for _ in 0..warmup {
        exe.run(&inputs)?;
    }
    let mut per_step: Vec<Vec<f64>> = vec![Vec::with_capacity(iters); exe.steps().len()];
    // The steps that call `gemm` plan functions, in run order: each call's inner steps are recorded in it.
    let gemm_steps: Vec<usize> = (0..exe.steps().len()).filter(|&s| exe.steps()[s].0 == "gemm").collect();
    let mut parts: Vec<Vec<(StepTime, Vec<f64>)>> = vec![Vec::new(); exe.steps().len()];
    let mut times = Vec::new();
    gemm_profile::set_enabled(true);
    let runs = (|| {
        for _ in 0..iters {
            exe.run_profiled(&inputs, &mut times)?;
            for (s, t) in times.iter().enumerate() {
                per_step[s].push(*t);
            }
            let calls = gemm_profile::take();
            if calls.len() != gemm_steps.len() {
                bail!("{} gemm plan functions ran, the artifact has {} gemm steps", calls.len(), gemm_steps.len());
            }
            for (call, &s) in calls.into_iter().zip(&gemm_steps) {
                if call.symbol != exe.steps()[s].1 {
                    bail!("step {s} is gemm function '{}' but '{}' ran", exe.steps()[s].1, call.symbol);
                }
                if parts[s].is_empty() {
                    parts[s] = call.steps.iter().map(|t| (t.clone(), Vec::with_capacity(iters))).collect();
                }
                for (p, t) in parts[s].iter_mut().zip(&call.steps) {
                    p.1.push(t.ns as f64 / 1e3);
                }
            }
        }
        Ok(())
    })();
    gemm_profile::set_enabled(false);
    runs?;
    Ok(per_step
        .into_iter()
        .zip(exe.steps())
        .zip(parts)
        .enumerate()
        .map(|(step, ((mut v, (backend, symbol)), parts))| {
            v.sort_by(f64::total_cmp);
            let parts = parts
                .into_iter()
                .enumerate()
                .map(|(index, (t, mut us))| {
                    us.sort_by(f64::total_cmp);
                    PartProfile { index, what: t.what, flops: t.flops, bytes: t.bytes, median_us: percentile(&us, 50.0) }
                })
                .collect();
            StepProfile { step, backend: backend.clone(), symbol: symbol.clone(), median_us: percentile(&v, 50.0), launch: None, parts }
        })
        .collect())
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
    /// `gpu` (CUDA-event times of graph replays, inputs already on the device) or `host` (wall clock around
    /// a whole run, copies included).
    pub timing: &'static str,
    /// Kernel launches per run, for GPU artifacts.
    pub kernels: Option<usize>,
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
    if let Some(times) = exe.gpu_replay_times_us(&inputs, warmup, iters) {
        let ms = times.with_context(|| format!("timing {}", path.display()))?.iter().map(|us| us / 1e3).collect();
        let mut r = summarize(path.display().to_string(), artifact.body.model.clone(), iters, warmup, load_ms, ms);
        r.timing = "gpu";
        r.kernels = exe.kernel_count();
        return Ok(r);
    }
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
        timing: "host",
        kernels: None,
    }
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

