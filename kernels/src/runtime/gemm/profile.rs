//! Timing the steps inside `gemm` plan functions, for `tessera bench --profile`.
//!
//! The measured-cost search can put a whole convolutional network into one plan function, and then the
//! executor's per-step profile shows one number for all of it. While profiling is switched on (off by
//! default: one relaxed atomic load per call otherwise), every call of a plan function records each of its
//! steps' wall time with the step's shape, FLOPs and bytes, and [`take`] hands the calls back in call order.
//! The clock is read only here, for reports: nothing timed is hashed or written into an artifact.

use super::schedule::{Part, Unit};
use super::plan::{EpOp, Epilogue, Step};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

static ON: AtomicBool = AtomicBool::new(false);
static CALLS: Mutex<Vec<CallTimes>> = Mutex::new(Vec::new());

/// One call of a plan function: its symbol and each step's time, in step order.
#[derive(Clone, Debug)]
pub struct CallTimes {
    pub symbol: String,
    pub steps: Vec<StepTime>,
}

/// One step of one call.
#[derive(Clone, Debug, PartialEq)]
pub struct StepTime {
    /// The step's kind and shape, e.g. `sgemm 96x12544x16 +add,clip`.
    pub what: String,
    /// Multiply-adds counted twice (epilogues not counted).
    pub flops: u64,
    /// Bytes the step must read and write at least once (operands, result, epilogue sources).
    pub bytes: u64,
    pub ns: u64,
}

/// Switches recording on or off (process-wide) and drops what was recorded.
pub fn set_enabled(on: bool) {
    CALLS.lock().unwrap_or_else(|e| e.into_inner()).clear();
    ON.store(on, Ordering::Relaxed);
}

pub(super) fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The calls recorded since the last `take` (or `set_enabled`), in call order.
pub fn take() -> Vec<CallTimes> {
    std::mem::take(&mut *CALLS.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Runs `units` of `steps` one by one through `run`, timing each, and records the call.
pub(super) fn timed(symbol: &str, steps: &[Step], units: &[Unit], mut run: impl FnMut(&Unit)) {
    let mut times = Vec::with_capacity(units.len());
    for u in units {
        let t = Instant::now();
        run(u);
        let ns = t.elapsed().as_nanos() as u64;
        let (what, flops, bytes) = describe_unit(steps, u);
        times.push(StepTime { what, flops, bytes, ns });
    }
    CALLS.lock().unwrap_or_else(|e| e.into_inner()).push(CallTimes { symbol: symbol.to_string(), steps: times });
}

/// A fused convolution (im2col at step `i`, GEMM at `i + 1`) is `conv <im2col> -> <sgemm>`, its bytes the
/// GEMM's less the column matrix it never reads from memory, plus the input it does.
fn describe_conv(steps: &[Step], i: usize) -> (String, u64, u64) {
    let (Step::Im2col(c), Step::Sgemm(g)) = (&steps[i], &steps[i + 1]) else { unreachable!("the schedule fuses an im2col with a GEMM") };
    let (im, _, _) = describe(&steps[i]);
    let (gw, flops, gb) = describe(&steps[i + 1]);
    let input: u64 = c.channels * c.input.iter().product::<u64>();
    (format!("conv {} -> {gw}", im.trim_start_matches("im2col ")), flops, gb - 4 * g.k * g.n + 4 * input)
}

/// A unit's label, FLOPs and compulsory bytes. Image lanes are labelled by image 0's layers,
/// `images x8: conv .. | depthwise ..`, with the FLOPs and bytes of all images.
fn describe_unit(steps: &[Step], u: &Unit) -> (String, u64, u64) {
    match u {
        Unit::Step(i) => describe(&steps[*i]),
        Unit::Conv(i) => describe_conv(steps, *i),
        Unit::Images { lanes, .. } => {
            let (mut flops, mut bytes) = (0, 0);
            let mut whats = Vec::new();
            for (b, lane) in lanes.iter().enumerate() {
                for &p in lane {
                    let (what, f, by) = match p {
                        Part::Conv(i) => describe_conv(steps, i),
                        // One image's share of a step split by image.
                        Part::Gemm { step, .. } | Part::Depthwise { step, .. } => {
                            let (what, f, by) = describe(&steps[step]);
                            let n = lanes.len() as u64;
                            (what, f / n, by / n)
                        }
                    };
                    flops += f;
                    bytes += by;
                    if b == 0 {
                        whats.push(what);
                    }
                }
            }
            (format!("images x{}: {}", lanes.len(), whats.join(" | ")), flops, bytes)
        }
    }
}

fn ep_names(e: &Epilogue) -> (String, u64) {
    let mut bytes = 0;
    let names: Vec<&str> = e
        .ops
        .iter()
        .map(|op| match op {
            EpOp::Add { count, .. } => {
                bytes += 4 * count;
                "add"
            }
            EpOp::Relu => "relu",
            EpOp::Clip { .. } => "clip",
            EpOp::Gelu(_) => "gelu",
            EpOp::Sigmoid => "sigmoid",
            EpOp::HardSwish => "hardswish",
        })
        .collect();
    (if names.is_empty() { String::new() } else { format!(" +{}", names.join(",")) }, bytes)
}

/// A step's label, FLOPs and compulsory bytes.
pub fn describe(s: &Step) -> (String, u64, u64) {
    match s {
        Step::Sgemm(g) => {
            let batches: u64 = g.batch.iter().product();
            let (ep, ep_bytes) = ep_names(&g.epilogue);
            // An operand whose batch strides are all 0 is read once, whatever the batch count.
            let reads = |bs: &[u64], len: u64| if bs.iter().all(|&s| s == 0) { len } else { len * batches };
            let bytes = 4 * (reads(&g.a.batch_strides, g.m * g.k) + reads(&g.b.batch_strides, g.k * g.n) + batches * g.m * g.n) + ep_bytes;
            let b = if g.batch.is_empty() { String::new() } else { format!("{batches}x ") };
            (format!("sgemm {b}{}x{}x{}{ep}", g.m, g.n, g.k), 2 * batches * g.m * g.n * g.k, bytes)
        }
        Step::Im2col(c) => {
            let taps: u64 = c.kernel.iter().product();
            let (isz, osz): (u64, u64) = (c.input.iter().product(), c.output.iter().product());
            let k = c.kernel.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x");
            (format!("im2col {k} c={} {isz}->{osz}", c.channels), 0, 4 * c.channels * (isz + taps * osz))
        }
        Step::Depthwise2d(d) => {
            let (ep, ep_bytes) = ep_names(&d.epilogue);
            let planes = d.batch * d.channels * d.multiplier;
            let (isz, osz, taps) = (d.input[0] * d.input[1], d.output[0] * d.output[1], d.kernel[0] * d.kernel[1]);
            let what = format!(
                "depthwise {}x{} s{} c={} {}x{}->{}x{}{}{ep}",
                d.kernel[0], d.kernel[1], d.strides[0], planes, d.input[0], d.input[1], d.output[0], d.output[1],
                if d.channels_last { " nhwc" } else { "" }
            );
            (what, 2 * planes * osz * taps, 4 * (d.batch * d.channels * isz + planes * (osz + taps)) + ep_bytes)
        }
    }
}
