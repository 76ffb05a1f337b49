//! Timing one function of a loaded module: what the tune stage records as a candidate's cost.
//!
//! Buffers (inputs, outputs, scratch) are allocated once, 64-byte aligned as the calling convention asks,
//! and the inputs copied in before any run, so a measurement times the kernel and nothing else. The caller
//! supplies the input values; they must be non-degenerate (random, never all zeros: a kernel fed zeros can
//! take paths real data never takes, and denormal-free zeros flatter every float unit), and float inputs that
//! are entirely zero are refused.
//!
//! The schedule: `warmup` untimed runs (fewer if they alone exceed the time budget, at least one), then timed
//! runs, each timed on its own with [`Instant`], until at least `min_runs` runs were made *and* `budget_us`
//! has elapsed, or `max_runs` is reached. The median is the figure to use (robust to the odd preemption);
//! p10/p90 show the spread, min the best case.
//!
//! Exclusive use of the device during a measurement is the caller's job (the tune stage serializes
//! measurements under a process-wide lock).

use super::{HostBuffer, LoadedModule, RuntimeError};
use serde::{Deserialize, Serialize};
use std::time::Instant;
use crate::module::FunctionInfo;
use crate::{dtype::DType, tensor::Tensor};

/// How long and how often to run a function. Part of the tune key: a different schedule is a different
/// measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MeasureOptions {
    /// Untimed runs first (caches, page faults, thread pools woken).
    pub warmup: u32,
    /// At least this many timed runs.
    pub min_runs: u32,
    /// Keep running until this much time (microseconds) went into timed runs...
    pub budget_us: u64,
    /// ...but never more than this many timed runs.
    pub max_runs: u32,
}

impl Default for MeasureOptions {
    /// 3 warm-ups, then at least 5 timed runs and at least 20 ms of them, at most 1000 runs.
    fn default() -> Self {
        MeasureOptions { warmup: 3, min_runs: 5, budget_us: 20_000, max_runs: 1000 }
    }
}

impl MeasureOptions {
    /// The schedule for a device kind (`cpu`, `cuda`): the default on the CPU; on the GPU, where a sample
    /// is a captured graph of many calls and run-to-run spread is small (a timed CUDA event pair, no
    /// preemption of a host thread), 2 warm-ups and at least 5 samples and 2 ms of them, at most 100.
    pub fn for_device(device: &str) -> MeasureOptions {
        match device {
            "cpu" => MeasureOptions::default(),
            _ => MeasureOptions { warmup: 2, min_runs: 5, budget_us: 2_000, max_runs: 100 },
        }
    }
}

/// The result of timing one function, in microseconds per call.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    pub median_us: f64,
    pub p10_us: f64,
    pub p90_us: f64,
    pub min_us: f64,
    /// Timed runs made.
    pub runs: u32,
    /// Untimed warm-up runs made.
    pub warmups: u32,
}

impl Measurement {
    /// Summarizes per-run times (microseconds); `None` when there are none.
    pub fn from_samples(samples: &[f64], warmups: u32) -> Option<Measurement> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let q = |p| percentile(&s, p);
        Some(Measurement { median_us: q(50.0), p10_us: q(10.0), p90_us: q(90.0), min_us: s[0], runs: s.len() as u32, warmups })
    }
}

/// The `p`-th percentile (0..=100) of sorted, non-empty samples, interpolated linearly between order
/// statistics (NumPy's default). The project's one quantile definition: tune records and `tessera bench`
/// report the same figure for the same samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let pos = p / 100.0 * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// The median of non-empty samples in any order (the 50th [`percentile`]: the mean of the middle two).
pub fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile(&sorted, 50.0)
}

/// Times function `index` of `module`, whose signature is `info`, on `inputs` (see the module docs), on the
/// runtime's thread pool, where models run.
pub fn measure_function(
    module: &dyn LoadedModule,
    index: usize,
    info: &FunctionInfo,
    inputs: &[Tensor],
    opts: &MeasureOptions,
) -> Result<Measurement, RuntimeError> {
    super::on_runtime_pool(|| measure_in_place(module, index, info, inputs, opts))
}

fn measure_in_place(
    module: &dyn LoadedModule,
    index: usize,
    info: &FunctionInfo,
    inputs: &[Tensor],
    opts: &MeasureOptions,
) -> Result<Measurement, RuntimeError> {
    check_request(info, inputs, opts).map_err(|msg| RuntimeError(format!("measuring function '{}': {msg}", info.symbol)))?;
    let mut buffers = Vec::with_capacity(info.inputs.len() + info.outputs.len() + 1);
    for (i, t) in inputs.iter().enumerate() {
        buffers.push(HostBuffer::from_bytes(t.bytes(), &format!("input {i} of {}", info.symbol))?);
    }
    for (i, ty) in info.outputs.iter().enumerate() {
        buffers.push(HostBuffer::zeroed(ty.size_bytes() as u64, &format!("output {i} of {}", info.symbol))?);
    }
    if info.scratch_bytes > 0 {
        buffers.push(HostBuffer::zeroed(info.scratch_bytes, &format!("scratch of {}", info.symbol))?);
    }
    let args: Vec<*mut u8> = buffers.iter().map(|b| b.as_ptr()).collect();
    // SAFETY: every buffer is live for the whole function, 64-byte aligned, sized and typed from `info`
    // (inputs checked above), outputs and scratch are separate allocations from the inputs.
    let run = || unsafe { module.call(index, &args) };

    let started = Instant::now();
    let mut warmups = 0;
    while warmups < opts.warmup.max(1) {
        run()?;
        warmups += 1;
        if started.elapsed().as_micros() as u64 >= opts.budget_us {
            break;
        }
    }
    let mut samples = Vec::with_capacity(opts.min_runs as usize);
    let mut total_us = 0.0;
    while samples.len() < opts.max_runs as usize && (samples.len() < opts.min_runs as usize || total_us < opts.budget_us as f64) {
        let t = Instant::now();
        run()?;
        let us = t.elapsed().as_secs_f64() * 1e6;
        total_us += us;
        samples.push(us);
    }
    drop(buffers);
    Ok(Measurement::from_samples(&samples, warmups).expect("at least min_runs >= 1 samples"))
}

/// What every measurement checks first, on any device: a valid schedule, and inputs of the function's types
/// that are not degenerate (see the module documentation).
pub(crate) fn check_request(info: &FunctionInfo, inputs: &[Tensor], opts: &MeasureOptions) -> Result<(), String> {
    if opts.min_runs == 0 || opts.max_runs < opts.min_runs {
        return Err(format!("invalid options: min_runs {} must be at least 1 and at most max_runs {}", opts.min_runs, opts.max_runs));
    }
    if inputs.len() != info.inputs.len() {
        return Err(format!("{} inputs given, the function takes {}", inputs.len(), info.inputs.len()));
    }
    for (i, (t, ty)) in inputs.iter().zip(&info.inputs).enumerate() {
        if &t.ty != ty {
            return Err(format!("input {i} is {:?} {:?}, the function takes {:?} {:?}", t.ty.dtype, t.ty.shape, ty.dtype, ty.shape));
        }
        let float = matches!(ty.dtype, DType::F32 | DType::F16 | DType::BF16);
        if float && !t.bytes().is_empty() && t.bytes().iter().all(|&b| b == 0) {
            return Err(format!("input {i} is all zeros: measurements must run on non-degenerate data"));
        }
    }
    Ok(())
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
/// (e.g. holds the compiler's `device::exclusively`).
pub fn time_abba(runs: &mut [(super::Executable, Vec<crate::tensor::Tensor>)], b: Block) -> Result<Vec<[Vec<f64>; 2]>, RuntimeError> {
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
            // A GPU plan: replays each between CUDA events (as `tessera bench` times it), so the host's copies
            // and synchronization, the same for every plan, add no noise; the inputs go up once per batch of
            // replays (first `min_runs`, then as many as the budget still wants at the mean so far), not once
            // per replay: uploading a batch-32 image per sample was most of a ResNet-50 b32 validation's 3.6 s.
            // A host plan: one run on the wall clock.
            let wanted = if n < b.min_runs { b.min_runs - n } else { ((b.budget_us - spent) / (spent / n as f64)).ceil() as usize };
            let times = match exe.gpu_replay_times_us(inputs, 0, wanted.clamp(1, b.max_runs - n)) {
                Some(times) => times?,
                None => {
                    let t = Instant::now();
                    let out = exe.run(inputs)?;
                    let us = t.elapsed().as_secs_f64() * 1e6;
                    drop(out);
                    vec![us]
                }
            };
            for us in times {
                samples[i][pass].push(us);
                spent += us;
                n += 1;
            }
        }
    }
    Ok(samples)
}


#[cfg(test)]
#[path = "measure_tests.rs"]
mod tests;
