//! Timing one function of a loaded GPU module: the tune stage's cost of a GPU candidate.
//!
//! A candidate's cost should add up the way the model spends it. In a model, kernels run back to back from
//! one captured CUDA graph: no host launch overhead between them, and a kernel's weights come from device
//! memory (the rest of the model evicted them from L2). So here:
//! - the function's launches are captured into one CUDA graph [`MIN_CALLS`] or more times in a row, each
//!   call on its own copy of the buffers (inputs, outputs, scratch), with as many copies as make twice the
//!   L2 cache (at most [`MAX_COPIES`]): no call finds its operands in L2 from the call before (pessimistic
//!   for activations a producer just wrote, right for weights);
//! - a sample is one replay of that graph between two CUDA events, divided by the calls in it, so the
//!   graph launch's own latency (a few microseconds) is spread over many calls;
//! - the schedule is the CPU's ([`MeasureOptions`]): warm-up replays, then samples until `min_runs` and
//!   `budget_us` of them, at most `max_runs`; the median is the cost.
//!
//! Inputs are the caller's random non-zero values (checked as on the CPU), uploaded to every copy.
//! Exclusive use of the GPU is the caller's job (the tune stage measures under its device lock).

use super::device::{self, align256, DeviceAlloc};
use super::module::PreparedLaunch;
use crate::module::FunctionInfo;
use crate::runtime::measure::{check_request, MeasureOptions, Measurement};
use crate::runtime::{LoadedModule, RuntimeError};
use crate::tensor::Tensor;
use cudarc::driver::{result, sys};

/// At least this many calls per timed graph.
pub const MIN_CALLS: u64 = 16;

/// At most this many copies of the buffers (a function with tiny buffers would otherwise need thousands
/// to fill twice the L2; beyond a few dozen the rotation no longer changes what it measures).
pub const MAX_COPIES: u64 = 64;

/// Where this process's GPU measurements spent their time, summed over every thread that measured: the
/// tune stage reports it per call (a profile of cold compiles, so it is kept here and not guessed at).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MeasureProfile {
    /// Functions measured.
    pub functions: u64,
    /// Allocating the buffer copies, zeroing them, uploading the inputs (microseconds).
    pub setup_us: u64,
    /// Resolving the function's launches against each copy (library calls prepare descriptors here).
    pub launches_us: u64,
    /// Capturing the calls into a CUDA graph, instantiating and uploading it.
    pub capture_us: u64,
    /// The warm-up and timed replays.
    pub timing_us: u64,
}

impl MeasureProfile {
    /// What was spent since `earlier` (a profile taken before).
    pub fn since(&self, earlier: &MeasureProfile) -> MeasureProfile {
        MeasureProfile {
            functions: self.functions - earlier.functions,
            setup_us: self.setup_us - earlier.setup_us,
            launches_us: self.launches_us - earlier.launches_us,
            capture_us: self.capture_us - earlier.capture_us,
            timing_us: self.timing_us - earlier.timing_us,
        }
    }
}

static PROFILE: [std::sync::atomic::AtomicU64; 5] = [const { std::sync::atomic::AtomicU64::new(0) }; 5];

/// The GPU measurements of this process so far (see [`MeasureProfile`]).
pub fn profile() -> MeasureProfile {
    let at = |i: usize| PROFILE[i].load(std::sync::atomic::Ordering::Relaxed);
    MeasureProfile { functions: at(0), setup_us: at(1), launches_us: at(2), capture_us: at(3), timing_us: at(4) }
}

fn add_to_profile(i: usize, since: &mut std::time::Instant) {
    let now = std::time::Instant::now();
    PROFILE[i].fetch_add((now - *since).as_micros() as u64, std::sync::atomic::Ordering::Relaxed);
    *since = now;
}

/// Why a GPU function has no measurement.
#[derive(Debug)]
pub enum GpuMeasureError {
    /// The module cannot run the function on these buffers, found before anything ran on the GPU: a
    /// library call whose algorithm needs more workspace than the function declares, say. The candidate is
    /// unsupported; the GPU is untouched.
    Refused(String),
    /// Anything else (no GPU, bad inputs, a driver error while running).
    Failed(RuntimeError),
}

impl From<RuntimeError> for GpuMeasureError {
    fn from(e: RuntimeError) -> Self {
        GpuMeasureError::Failed(e)
    }
}

impl std::fmt::Display for GpuMeasureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuMeasureError::Refused(why) => write!(f, "{why}"),
            GpuMeasureError::Failed(e) => write!(f, "{}", e.0),
        }
    }
}

/// Times function `index` of the GPU module `module` (signature `info`) on `inputs` (see the module
/// documentation): microseconds per call.
pub fn measure_gpu_function(
    module: &dyn LoadedModule,
    index: usize,
    info: &FunctionInfo,
    inputs: &[Tensor],
    opts: &MeasureOptions,
) -> Result<Measurement, GpuMeasureError> {
    let fail = |msg: String| RuntimeError(format!("measuring GPU function '{}': {msg}", info.symbol));
    let g = |e: cudarc::driver::DriverError| fail(device::error(e));
    check_request(info, inputs, opts).map_err(fail)?;
    let mut phase = std::time::Instant::now();
    let gpu = module.gpu().ok_or_else(|| fail("its module is not a GPU module".to_string()))?;
    let ctx = device::context().map_err(|e| fail(e.to_string()))?;
    ctx.bind_to_thread().map_err(g)?;

    // One copy of the buffers: the inputs, the outputs and the scratch, each 256-byte aligned.
    let sizes: Vec<u64> = inputs
        .iter()
        .map(|t| t.bytes().len() as u64)
        .chain(info.outputs.iter().map(|t| t.size_bytes() as u64))
        .chain((info.scratch_bytes > 0).then_some(info.scratch_bytes))
        .collect();
    let offsets: Vec<u64> = sizes.iter().scan(0, |at, &s| { let o = *at; *at += align256(s.max(1)); Some(o) }).collect();
    let set = offsets.last().zip(sizes.last()).map_or(256, |(o, s)| o + align256((*s).max(1)));
    let l2 = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE).map_err(g)?.max(0) as u64;
    let copies = (2 * l2).div_ceil(set).clamp(1, MAX_COPIES);
    let calls = copies * MIN_CALLS.div_ceil(copies);
    let memory = DeviceAlloc::new(&ctx, (copies * set) as usize).map_err(|e| fail(e.to_string()))?;
    // The inputs go up once, into the first copy; the other copies are that one's bytes copied on the device
    // (an upload of twice the L2 from pageable memory for every function measured cost more than timing it).
    // SAFETY: every copy lies inside the allocation (sized above); synchronous copies.
    unsafe {
        result::memset_d8_sync(memory.ptr, 0, (copies * set) as usize).map_err(g)?;
        for (t, off) in inputs.iter().zip(&offsets) {
            if !t.bytes().is_empty() {
                result::memcpy_htod_sync(memory.ptr + off, t.bytes()).map_err(g)?;
            }
        }
        for c in 1..copies {
            result::memcpy_dtod_sync(memory.ptr + c * set, memory.ptr, set as usize).map_err(g)?;
        }
    }
    add_to_profile(1, &mut phase);
    let launches: Vec<Vec<PreparedLaunch>> = (0..copies)
        .map(|c| {
            let args: Vec<u64> = offsets.iter().map(|o| memory.ptr + c * set + o).collect();
            gpu.launches(index, &args)
        })
        .collect::<Result<_, _>>()
        .map_err(|e| GpuMeasureError::Refused(format!("measuring GPU function '{}': {}", info.symbol, e.0)))?;
    add_to_profile(2, &mut phase);

    let stream = ctx.new_stream().map_err(g)?;
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(g)?;
    let enqueued = (0..calls).try_for_each(|call| {
        launches[(call % copies) as usize].iter().try_for_each(|l| {
            // SAFETY: the parameters point into `memory`, laid out from `info` as the module expects.
            unsafe { l.enqueue(stream.cu_stream()) }
        })
    });
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0)).map_err(g)?;
    enqueued.map_err(|e| fail(format!("capturing its launches: {e}")))?;
    let graph = graph.ok_or_else(|| fail("the function enqueues no work".to_string()))?;
    graph.upload().map_err(g)?;
    add_to_profile(3, &mut phase);

    let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let (start, end) = (ctx.new_event(timing).map_err(g)?, ctx.new_event(timing).map_err(g)?);
    let time_one = || -> Result<f64, RuntimeError> {
        start.record(&stream).map_err(g)?;
        graph.launch().map_err(g)?;
        end.record(&stream).map_err(g)?;
        Ok(start.elapsed_ms(&end).map_err(g)? as f64 * 1e3 / calls as f64)
    };
    let mut warm_us = 0.0;
    let mut warmups = 0;
    while warmups < opts.warmup.max(1) {
        warm_us += time_one()? * calls as f64;
        warmups += 1;
        if warm_us >= opts.budget_us as f64 {
            break;
        }
    }
    let mut samples = Vec::with_capacity(opts.min_runs as usize);
    let mut total_us = 0.0;
    while samples.len() < opts.max_runs as usize && (samples.len() < opts.min_runs as usize || total_us < opts.budget_us as f64) {
        let us = time_one()?;
        total_us += us * calls as f64;
        samples.push(us);
    }
    stream.synchronize().map_err(g)?;
    drop(graph);
    drop(memory);
    add_to_profile(4, &mut phase);
    PROFILE[0].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(Measurement::from_samples(&samples, warmups).expect("at least min_runs >= 1 samples"))
}
