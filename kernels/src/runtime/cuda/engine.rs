//! A GPU artifact made ready to run: one device allocation holding the arena, the constants and the
//! scratch (laid out from the artifact's static memory plan, so nothing is allocated per run); constants
//! uploaded once at load; every launch of every step captured once into a CUDA graph that each run replays;
//! inputs and outputs staged through pinned host buffers.

use super::device;
use super::module::PreparedLaunch;
use crate::artifact::{Body, Buf};
use crate::runtime::{LoadedModule, RuntimeError};
use crate::tensor::{Tensor, TensorType};
use cudarc::driver::{result, sys, CudaContext, CudaGraph, CudaStream};
use std::sync::Arc;

fn align256(n: u64) -> u64 {
    n.div_ceil(256) * 256
}

/// Device memory freed on drop.
struct DeviceAlloc {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by `malloc_sync` below and freed once; the stream that used it was synchronized.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Page-locked host memory freed on drop.
struct Pinned {
    ctx: Arc<CudaContext>,
    ptr: *mut u8,
    len: usize,
}

impl Pinned {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Pinned, RuntimeError> {
        ctx.bind_to_thread().map_err(|e| RuntimeError(format!("GPU 0: {e}")))?;
        // SAFETY: a plain allocation; at least one byte so the pointer is real.
        let ptr = unsafe { result::malloc_host(len.max(1), 0) }.map_err(|e| RuntimeError(format!("cannot pin {len} bytes of host memory: {e}")))?;
        Ok(Pinned { ctx: ctx.clone(), ptr: ptr as *mut u8, len })
    }

    fn slice(&mut self, offset: usize, len: usize) -> &mut [u8] {
        assert!(offset + len <= self.len);
        // SAFETY: in bounds (checked above); the buffer is ours.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset), len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by `malloc_host` and freed once.
            let _ = unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) };
        }
    }
}

/// Where one input or output lives: device address, bytes, offset in its pinned buffer.
struct Staged {
    device: u64,
    bytes: usize,
    pinned: usize,
}

/// One kernel's time under [`DeviceEngine::kernel_times_us`].
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    pub step: usize,
    pub entry: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub median_us: f64,
}

/// A loaded GPU artifact (see the module documentation).
pub struct DeviceEngine {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Per step, its launches.
    steps: Vec<Vec<PreparedLaunch>>,
    graph: Option<CudaGraph>,
    inputs: Vec<Staged>,
    outputs: Vec<(Staged, TensorType)>,
    pinned_in: Pinned,
    pinned_out: Pinned,
    // Dropped last: everything above points into it.
    _memory: DeviceAlloc,
}

// SAFETY: the raw pointers are ours (pinned buffers); `run` takes `&mut self`; CUDA handles may be used from
// any thread once the context is bound, which every call does first.
unsafe impl Send for DeviceEngine {}
unsafe impl Sync for DeviceEngine {}

fn gpu(e: cudarc::driver::DriverError) -> RuntimeError {
    RuntimeError(format!("GPU 0: {e}"))
}

impl DeviceEngine {
    /// Prepares `body` (whose modules are all loaded cubins, in `modules`) with constants `data`.
    pub fn new(body: &Body, data: &[u8], modules: &[Box<dyn LoadedModule>]) -> Result<DeviceEngine, RuntimeError> {
        let ctx = device::context().map_err(|e| RuntimeError(format!("model '{}' is compiled for the GPU: {e}", body.model)))?;
        ctx.bind_to_thread().map_err(gpu)?;
        let stream = ctx.new_stream().map_err(gpu)?;
        let arena_at = 0u64;
        let const_at = align256(body.arena_bytes);
        let scratch_at = align256(const_at + data.len() as u64);
        let total = align256(scratch_at + body.scratch_bytes).max(256);
        // SAFETY: a plain allocation, freed by `DeviceAlloc`'s drop.
        let base = unsafe { result::malloc_sync(total as usize) }.map_err(|e| RuntimeError(format!("model '{}': cannot allocate {total} bytes on the GPU: {e}", body.model)))?;
        let memory = DeviceAlloc { ctx: ctx.clone(), ptr: base };
        // SAFETY: `data` fits at `const_at` (sized above); synchronous copy.
        unsafe {
            result::memset_d8_sync(base, 0, total as usize).map_err(gpu)?;
            if !data.is_empty() {
                result::memcpy_htod_sync(base + const_at, data).map_err(gpu)?;
            }
        }
        // Offsets were bounds-checked when the artifact was read.
        let addr = |b: Buf| -> u64 {
            match b {
                Buf::Input(i) => base + arena_at + body.inputs[i as usize].offset,
                Buf::Value(i) => base + arena_at + body.values[i as usize].offset,
                Buf::Const(i) => base + const_at + body.constants[i as usize].offset,
                Buf::Scratch => base + scratch_at,
            }
        };
        let mut steps = Vec::with_capacity(body.steps.len());
        for (s, step) in body.steps.iter().enumerate() {
            let m = modules[step.module as usize].cuda().ok_or_else(|| {
                RuntimeError(format!("model '{}': step {s} runs module {} of backend {} on the host; mixing host and GPU modules in one artifact is not supported yet", body.model, step.module, body.modules[step.module as usize].backend))
            })?;
            let args: Vec<u64> = step.args.iter().map(|&b| addr(b)).collect();
            steps.push(m.launches(step.function as usize, &args).map_err(|e| RuntimeError(format!("model '{}': step {s}: {}", body.model, e.0)))?);
        }
        let mut at = 0;
        let inputs: Vec<Staged> = body
            .inputs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let st = Staged { device: addr(Buf::Input(i as u32)), bytes: d.ty.size_bytes(), pinned: at };
                at += d.ty.size_bytes();
                st
            })
            .collect();
        let pinned_in = Pinned::new(&ctx, at)?;
        let mut at = 0;
        let outputs: Vec<(Staged, TensorType)> = body
            .outputs
            .iter()
            .map(|o| {
                let st = Staged { device: addr(o.source), bytes: o.ty.size_bytes(), pinned: at };
                at += o.ty.size_bytes();
                (st, o.ty.clone())
            })
            .collect();
        let pinned_out = Pinned::new(&ctx, at)?;
        let mut engine = DeviceEngine { ctx, stream, steps, graph: None, inputs, outputs, pinned_in, pinned_out, _memory: memory };
        engine.graph = engine.capture().map_err(|e| RuntimeError(format!("model '{}': capturing its CUDA graph: {}", body.model, e.0)))?;
        Ok(engine)
    }

    /// Enqueues every launch of every step on the stream.
    fn enqueue_all(&self) -> Result<(), RuntimeError> {
        for (s, launches) in self.steps.iter().enumerate() {
            for (k, l) in launches.iter().enumerate() {
                // SAFETY: the parameters point into our device allocation, typed by the checked artifact.
                unsafe { l.enqueue(self.stream.cu_stream()) }.map_err(|e| RuntimeError(format!("step {s}, launch {k}: {e}")))?;
            }
        }
        Ok(())
    }

    fn capture(&self) -> Result<Option<CudaGraph>, RuntimeError> {
        if self.steps.iter().all(|l| l.is_empty()) {
            return Ok(None);
        }
        self.stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(gpu)?;
        let enqueued = self.enqueue_all();
        let graph = self.stream.end_capture(sys::CUgraphInstantiate_flags(0)).map_err(gpu)?;
        enqueued?;
        if let Some(g) = &graph {
            g.upload().map_err(gpu)?;
        }
        Ok(graph)
    }

    /// Number of kernel launches per run.
    pub fn kernel_count(&self) -> usize {
        self.steps.iter().map(Vec::len).sum()
    }

    /// Copies `inputs` (already checked against the artifact's types) to the device, asynchronously.
    fn upload(&mut self, inputs: &[Tensor]) -> Result<(), RuntimeError> {
        self.ctx.bind_to_thread().map_err(gpu)?;
        for (st, t) in self.inputs.iter().zip(inputs) {
            let dst = self.pinned_in.slice(st.pinned, st.bytes);
            dst.copy_from_slice(t.bytes());
            // SAFETY: the pinned slice stays alive and untouched until the stream is synchronized.
            unsafe { result::memcpy_htod_async(st.device, &*dst, self.stream.cu_stream()) }.map_err(gpu)?;
        }
        Ok(())
    }

    fn replay(&self) -> Result<(), RuntimeError> {
        match &self.graph {
            Some(g) => g.launch().map_err(gpu),
            None => Ok(()),
        }
    }

    fn download(&mut self) -> Result<Vec<Tensor>, RuntimeError> {
        for (st, _) in &self.outputs {
            let dst = self.pinned_out.slice(st.pinned, st.bytes);
            // SAFETY: as in `upload`.
            unsafe { result::memcpy_dtoh_async(dst, st.device, self.stream.cu_stream()) }.map_err(gpu)?;
        }
        self.stream.synchronize().map_err(|e| RuntimeError(format!("GPU 0: a kernel failed: {e}")))?;
        let mut out = Vec::with_capacity(self.outputs.len());
        for i in 0..self.outputs.len() {
            let (pinned, bytes, ty) = (self.outputs[i].0.pinned, self.outputs[i].0.bytes, self.outputs[i].1.clone());
            let b = self.pinned_out.slice(pinned, bytes).to_vec();
            out.push(Tensor::from_bytes(ty, b).map_err(|e| RuntimeError(e.to_string()))?);
        }
        Ok(out)
    }

    /// One run: inputs in, graph replay, outputs out.
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        self.upload(inputs)?;
        self.replay()?;
        self.download()
    }

    /// One run with every step launched on its own between timing events: `step_us[s]` is step `s`'s GPU
    /// time in microseconds.
    pub fn run_profiled(&mut self, inputs: &[Tensor], step_us: &mut Vec<f64>) -> Result<Vec<Tensor>, RuntimeError> {
        self.upload(inputs)?;
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let events = (0..=self.steps.len()).map(|_| self.ctx.new_event(timing)).collect::<Result<Vec<_>, _>>().map_err(gpu)?;
        events[0].record(&self.stream).map_err(gpu)?;
        for (s, launches) in self.steps.iter().enumerate() {
            for l in launches {
                // SAFETY: as in `enqueue_all`.
                unsafe { l.enqueue(self.stream.cu_stream()) }.map_err(|e| RuntimeError(format!("step {s}: {e}")))?;
            }
            events[s + 1].record(&self.stream).map_err(gpu)?;
        }
        let out = self.download()?;
        step_us.clear();
        for w in events.windows(2) {
            step_us.push(w[0].elapsed_ms(&w[1]).map_err(gpu)? as f64 * 1e3);
        }
        Ok(out)
    }

    /// Every kernel timed on its own: `iters` runs (after `warmup`), each launch between two CUDA events,
    /// the median per launch. The launches are enqueued directly (the driver does not time events recorded
    /// inside a graph: CUDA_ERROR_INVALID_VALUE on the H100, 2026-11-24), so a kernel shorter than a host
    /// launch also counts the gap before the next launch; the graph replay time is the whole model's.
    pub fn kernel_times_us(&mut self, inputs: &[Tensor], warmup: usize, iters: usize) -> Result<Vec<KernelTime>, RuntimeError> {
        self.upload(inputs)?;
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let n = self.kernel_count();
        let events = (0..=n).map(|_| self.ctx.new_event(timing)).collect::<Result<Vec<_>, _>>().map_err(gpu)?;
        let enqueue_timed = |this: &Self| -> Result<(), RuntimeError> {
            events[0].record(&this.stream).map_err(gpu)?;
            let mut i = 0;
            for (s, launches) in this.steps.iter().enumerate() {
                for l in launches {
                    // SAFETY: as in `enqueue_all`.
                    unsafe { l.enqueue(this.stream.cu_stream()) }.map_err(|e| RuntimeError(format!("step {s}: {e}")))?;
                    i += 1;
                    events[i].record(&this.stream).map_err(gpu)?;
                }
            }
            Ok(())
        };
        let mut per: Vec<Vec<f64>> = vec![Vec::with_capacity(iters); n];
        for it in 0..warmup + iters {
            enqueue_timed(self)?;
            self.stream.synchronize().map_err(|e| RuntimeError(format!("GPU 0: a kernel failed: {e}")))?;
            if it >= warmup {
                for (k, w) in events.windows(2).enumerate() {
                    per[k].push(w[0].elapsed_ms(&w[1]).map_err(gpu)? as f64 * 1e3);
                }
            }
        }
        let mut out = Vec::with_capacity(n);
        let mut k = 0;
        for (s, launches) in self.steps.iter().enumerate() {
            for l in launches {
                let v = &mut per[k];
                v.sort_by(f64::total_cmp);
                out.push(KernelTime { step: s, entry: l.entry.clone(), grid: l.grid, block: l.block, median_us: v[v.len() / 2] });
                k += 1;
            }
        }
        Ok(out)
    }

    /// GPU time of `iters` graph replays on `inputs` (uploaded once), each between two CUDA events, after
    /// `warmup` untimed replays: microseconds per replay, in order.
    pub fn replay_times_us(&mut self, inputs: &[Tensor], warmup: usize, iters: usize) -> Result<Vec<f64>, RuntimeError> {
        self.upload(inputs)?;
        for _ in 0..warmup {
            self.replay()?;
        }
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (start, end) = (self.ctx.new_event(timing).map_err(gpu)?, self.ctx.new_event(timing).map_err(gpu)?);
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            start.record(&self.stream).map_err(gpu)?;
            self.replay()?;
            end.record(&self.stream).map_err(gpu)?;
            times.push(start.elapsed_ms(&end).map_err(gpu)? as f64 * 1e3);
        }
        self.stream.synchronize().map_err(gpu)?;
        Ok(times)
    }
}
