//! A GPU artifact made ready to run: one device allocation holding the arena, the constants and the
//! scratch (laid out from the artifact's static memory plan, so nothing is allocated per run); constants
//! uploaded once at load; every launch of every step captured once into a CUDA graph that each run replays;
//! inputs and outputs staged through pinned host buffers.
//!
//! An artifact may also hold host steps (a plan mixing host and GPU partitions). Then the steps split into
//! segments that alternate between the places: each GPU segment is one captured graph (the uploads of the
//! host-written values it reads, then its launches); each host segment downloads the GPU-written values it
//! reads, waits for the stream, and calls its host functions on the runtime pool. The host side has its own
//! copy of the arena, laid out by the same plan (pinned, so the copies are asynchronous and capturable), a
//! copy of the constants and its own scratch. Which values move, and before which step, is the artifact's
//! explicit list of transfers.
//!
//! The plans of a batched artifact share one data section: engines made by [`DeviceEngine::new_shared`] take
//! their constants from a [`SharedConstants`] (one device upload, and one host copy for host steps, for every
//! plan), in a device allocation of their own beside the engine's (arena and scratch). An engine of a
//! single-plan artifact ([`DeviceEngine::new`]) keeps them in its one allocation, between the two.

use super::device::{self, align256, DeviceAlloc};
use super::module::PreparedLaunch;
use crate::artifact::{Body, Buf};
use crate::module::Place;
use crate::runtime::{on_runtime_pool, HostBuffer, LoadedModule, RuntimeError};
use std::ops::Range;
use crate::tensor::{Tensor, TensorType};
use cudarc::driver::{result, sys, CudaContext, CudaGraph, CudaStream};
use std::sync::Arc;

/// The constants of one data section, loaded once and shared by the programs (and engines) of every plan of
/// a batched artifact: a host copy ([`HostBuffer`], aligned as kernels need it) and a device copy, each made
/// on first use (a plan of host modules needs no device copy, an artifact of GPU plans without host steps no
/// host copy). Every plan's constant offsets point into the one data section, so one copy serves them all.
#[derive(Default)]
pub struct SharedConstants {
    host: Option<Arc<HostBuffer>>,
    device: Option<Arc<DeviceAlloc>>,
    /// The data section the copies were made of (address and length), which every later use must pass.
    source: Option<(usize, usize)>,
}

impl SharedConstants {
    /// An empty table: no copy made yet.
    pub fn new() -> SharedConstants {
        SharedConstants::default()
    }

    fn check_source(&mut self, data: &[u8]) {
        let source = (data.as_ptr() as usize, data.len());
        assert_eq!(*self.source.get_or_insert(source), source, "shared constants are of one data section");
    }

    /// The host copy of `data` (the data section every user passes), made on the first call.
    pub(crate) fn host(&mut self, data: &[u8], model: &str) -> Result<Arc<HostBuffer>, RuntimeError> {
        self.check_source(data);
        if self.host.is_none() {
            self.host = Some(Arc::new(HostBuffer::from_bytes(data, &format!("constants of model '{model}'"))?));
        }
        Ok(self.host.clone().expect("made above"))
    }

    /// The device copy of `data` on `ctx`, uploaded on the first call.
    fn device(&mut self, ctx: &Arc<CudaContext>, data: &[u8], model: &str) -> Result<Arc<DeviceAlloc>, RuntimeError> {
        self.check_source(data);
        if self.device.is_none() {
            let memory = DeviceAlloc::new(ctx, data.len()).map_err(|e| RuntimeError(format!("model '{model}': constants: {e}")))?;
            if !data.is_empty() {
                // SAFETY: the allocation holds `data.len()` bytes; synchronous copy.
                unsafe { result::memcpy_htod_sync(memory.ptr, data) }.map_err(gpu)?;
            }
            self.device = Some(Arc::new(memory));
        }
        Ok(self.device.clone().expect("made above"))
    }

    /// Bytes of the host copy (0 until one is made).
    pub fn host_bytes(&self) -> usize {
        self.host.as_ref().map_or(0, |h| h.len())
    }

    /// Whether a device copy was made.
    pub fn on_device(&self) -> bool {
        self.device.is_some()
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
        ctx.bind_to_thread().map_err(|e| RuntimeError(device::error(e)))?;
        // SAFETY: a plain allocation; at least one byte so the pointer is real.
        let ptr = unsafe { result::malloc_host(len.max(1), 0) }.map_err(|e| RuntimeError(format!("cannot pin {len} bytes of host memory: {e}")))?;
        Ok(Pinned { ctx: ctx.clone(), ptr: ptr as *mut u8, len })
    }

    fn at(&self, offset: usize) -> *mut u8 {
        assert!(offset <= self.len);
        // SAFETY: in bounds (checked above).
        unsafe { self.ptr.add(offset) }
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

/// Where one input or output lives: device address, bytes, offset in its pinned staging buffer, offset in
/// the arena.
struct Staged {
    device: u64,
    bytes: usize,
    pinned: usize,
    /// Offset in the arena (of either place), for an input or value.
    arena: usize,
}

/// One copy between the places: the same bytes at `device` and at offset `host` of the host arena.
struct Copy {
    device: u64,
    host: usize,
    bytes: usize,
}

/// A step ready to go: its launches on the GPU, or a host call with its argument pointers.
enum Work {
    Gpu(Vec<PreparedLaunch>),
    Host { module: usize, function: usize, args: Range<usize> },
}

/// Consecutive steps at one place (see the module documentation).
enum Segment {
    Gpu { uploads: Vec<Copy>, steps: Range<usize>, graph: Option<CudaGraph> },
    Host { downloads: Vec<Copy>, steps: Range<usize> },
}

/// The host side of a mixed artifact: the host arena, constants, scratch and every host step's arguments.
struct HostSide {
    arena: Pinned,
    args: Vec<*mut u8>,
    /// Shared with the other plans of a batched artifact (see [`SharedConstants`]).
    _constants: Arc<HostBuffer>,
    _scratch: HostBuffer,
}

// SAFETY: the pointers point into the buffers this side owns (and the pinned arena); the engine uses them
// from one run at a time (its run methods take `&mut self` or run while no other does).
unsafe impl Send for HostSide {}
unsafe impl Sync for HostSide {}

/// A point of a run that profiling marks with an event.
enum Mark {
    BeforeLaunch,
    AfterLaunch,
    BeforeStep,
    AfterStep,
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
    /// Per step, what it does.
    work: Vec<Work>,
    segments: Vec<Segment>,
    inputs: Vec<Staged>,
    /// Outputs, each with its type and whether a host step wrote it (then it is read from the host arena).
    outputs: Vec<(Staged, TensorType, bool)>,
    pinned_in: Pinned,
    pinned_out: Pinned,
    host: Option<HostSide>,
    /// The loaded modules: the cubins every launch above refers to, and the host modules host steps call.
    modules: Vec<Box<dyn LoadedModule>>,
    /// Device address of the constants: inside `_memory`, or in `_shared` for an engine made by
    /// [`new_shared`](Self::new_shared).
    const_base: u64,
    // Dropped last: everything above points into them.
    _shared: Option<Arc<DeviceAlloc>>,
    _memory: DeviceAlloc,
}

// SAFETY: the raw pointers are ours (pinned and host buffers); `run` takes `&mut self`; CUDA handles may be
// used from any thread once the context is bound, which every call does first; modules are `Send + Sync`.
unsafe impl Send for DeviceEngine {}
unsafe impl Sync for DeviceEngine {}

fn gpu(e: cudarc::driver::DriverError) -> RuntimeError {
    RuntimeError(device::error(e))
}

impl DeviceEngine {
    /// Prepares `body` with constants `data`; `modules` are its modules, loaded (cubins, and host modules
    /// for the host steps of a mixed plan).
    pub fn new(body: &Body, data: &[u8], modules: Vec<Box<dyn LoadedModule>>) -> Result<DeviceEngine, RuntimeError> {
        Self::make(body, data, None, modules)
    }

    /// [`new`](Self::new) for one plan of a batched artifact: its constants (`data`, the artifact's whole data
    /// section) taken from `shared`, uploaded by the first engine that needs them and used by every other,
    /// in their own device allocation (and, for host steps, one host copy). Panics if `data` is not the data
    /// section `shared` was first used with.
    pub fn new_shared(body: &Body, data: &[u8], shared: &mut SharedConstants, modules: Vec<Box<dyn LoadedModule>>) -> Result<DeviceEngine, RuntimeError> {
        Self::make(body, data, Some(shared), modules)
    }

    fn make(body: &Body, data: &[u8], mut shared: Option<&mut SharedConstants>, modules: Vec<Box<dyn LoadedModule>>) -> Result<DeviceEngine, RuntimeError> {
        let ctx = device::context().map_err(|e| RuntimeError(format!("model '{}' is compiled for the GPU: {e}", body.model)))?;
        ctx.bind_to_thread().map_err(gpu)?;
        let stream = ctx.new_stream().map_err(gpu)?;
        let shared_device = match shared.as_deref_mut() {
            Some(s) => Some(s.device(&ctx, data, &body.model)?),
            None => None,
        };
        // Constants shared with other engines are not in this engine's allocation.
        let own_data = if shared_device.is_some() { 0 } else { data.len() as u64 };
        let arena_at = 0u64;
        let const_at = align256(body.arena_bytes);
        let scratch_at = align256(const_at + own_data);
        let total = align256(scratch_at + body.scratch_bytes).max(256);
        let memory = DeviceAlloc::new(&ctx, total as usize).map_err(|e| RuntimeError(format!("model '{}': {e}", body.model)))?;
        let base = memory.ptr;
        // SAFETY: `data` fits at `const_at` when copied there (sized above); synchronous copy.
        unsafe {
            result::memset_d8_sync(base, 0, total as usize).map_err(gpu)?;
            if own_data > 0 {
                result::memcpy_htod_sync(base + const_at, data).map_err(gpu)?;
            }
        }
        let const_base = shared_device.as_ref().map_or(base + const_at, |d| d.ptr);
        // Offsets were bounds-checked when the artifact was read.
        let addr = |b: Buf| -> u64 {
            match b {
                Buf::Input(i) => base + arena_at + body.inputs[i as usize].offset,
                Buf::Value(i) => base + arena_at + body.values[i as usize].offset,
                Buf::Const(i) => const_base + body.constants[i as usize].offset,
                Buf::Scratch => base + scratch_at,
            }
        };
        let places: Vec<Place> = (0..body.steps.len()).map(|s| body.step_place(s)).collect();
        let mut host = if places.contains(&Place::Host) {
            let arena = Pinned::new(&ctx, body.arena_bytes as usize)?;
            // SAFETY: a fresh allocation of `len` bytes.
            unsafe { std::ptr::write_bytes(arena.ptr, 0, arena.len) };
            Some(HostSide {
                arena,
                args: Vec::new(),
                _constants: match shared.as_deref_mut() {
                    Some(s) => s.host(data, &body.model)?,
                    None => Arc::new(HostBuffer::from_bytes(data, &format!("host constants of model '{}'", body.model))?),
                },
                _scratch: HostBuffer::zeroed(body.scratch_bytes, &format!("host scratch of model '{}'", body.model))?,
            })
        } else {
            None
        };
        let mut work = Vec::with_capacity(body.steps.len());
        for (s, step) in body.steps.iter().enumerate() {
            let m = &modules[step.module as usize];
            match (m.gpu(), host.as_mut()) {
                (Some(cubin), _) => {
                    let args: Vec<u64> = step.args.iter().map(|&b| addr(b)).collect();
                    work.push(Work::Gpu(cubin.launches(step.function as usize, &args).map_err(|e| RuntimeError(format!("model '{}': step {s}: {}", body.model, e.0)))?));
                }
                (None, Some(h)) => {
                    let start = h.args.len();
                    for &b in &step.args {
                        let p = match b {
                            Buf::Input(i) => h.arena.at(body.inputs[i as usize].offset as usize),
                            Buf::Value(i) => h.arena.at(body.values[i as usize].offset as usize),
                            // SAFETY: constant offsets lie inside the data section (checked at read).
                            Buf::Const(i) => unsafe { h._constants.as_ptr().add(body.constants[i as usize].offset as usize) },
                            Buf::Scratch => h._scratch.as_ptr(),
                        };
                        h.args.push(p);
                    }
                    work.push(Work::Host { module: step.module as usize, function: step.function as usize, args: start..h.args.len() });
                }
                (None, None) => unreachable!("a host step makes a host side"),
            }
        }
        // Segments: maximal runs of steps at one place, each with the transfers into it.
        let copy = |v: u32| {
            let slot = &body.values[v as usize];
            Copy { device: addr(Buf::Value(v)), host: slot.offset as usize, bytes: slot.ty.size_bytes() }
        };
        let mut segments = Vec::new();
        let mut s = 0;
        while s < places.len() {
            let place = places[s];
            let end = (s..places.len()).find(|&e| places[e] != place).unwrap_or(places.len());
            let copies: Vec<Copy> = body.transfers.iter().filter(|t| (s..end).contains(&(t.before as usize))).map(|t| copy(t.value)).collect();
            segments.push(match place {
                Place::Gpu => Segment::Gpu { uploads: copies, steps: s..end, graph: None },
                Place::Host => Segment::Host { downloads: copies, steps: s..end },
            });
            s = end;
        }
        let mut at = 0;
        let inputs: Vec<Staged> = body
            .inputs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let st = Staged { device: addr(Buf::Input(i as u32)), bytes: d.ty.size_bytes(), pinned: at, arena: d.offset as usize };
                at += d.ty.size_bytes();
                st
            })
            .collect();
        let pinned_in = Pinned::new(&ctx, at)?;
        // The place of the step writing each value: an output a host step wrote is read from the host arena.
        let mut writer: Vec<Option<Place>> = vec![None; body.values.len()];
        for (st, &place) in body.steps.iter().zip(&places) {
            let f = &body.modules[st.module as usize].functions[st.function as usize];
            for b in &st.args[f.inputs.len()..f.inputs.len() + f.outputs.len()] {
                if let Buf::Value(v) = *b {
                    writer[v as usize] = Some(place);
                }
            }
        }
        let mut at = 0;
        let outputs: Vec<(Staged, TensorType, bool)> = body
            .outputs
            .iter()
            .map(|o| {
                let on_host = matches!(o.source, Buf::Value(v) if writer[v as usize] == Some(Place::Host));
                let arena = match o.source {
                    Buf::Value(v) => body.values[v as usize].offset as usize,
                    _ => 0,
                };
                let st = Staged { device: addr(o.source), bytes: o.ty.size_bytes(), pinned: at, arena };
                if !on_host {
                    at += o.ty.size_bytes();
                }
                (st, o.ty.clone(), on_host)
            })
            .collect();
        let pinned_out = Pinned::new(&ctx, at)?;
        let mut engine =
            DeviceEngine { ctx, stream, work, segments, inputs, outputs, pinned_in, pinned_out, host, modules, const_base, _shared: shared_device, _memory: memory };
        engine.capture().map_err(|e| RuntimeError(format!("model '{}': capturing its CUDA graphs: {}", body.model, e.0)))?;
        Ok(engine)
    }

    /// Enqueues the copies of `copies`, host to device (`up`) or back, on the stream.
    fn enqueue_copies(&self, copies: &[Copy], up: bool) -> Result<(), RuntimeError> {
        let Some(h) = &self.host else { return Ok(()) };
        for c in copies {
            // SAFETY: both ranges lie inside their arenas (the plan was checked at read) and stay alive and
            // untouched by the host until the stream is synchronized.
            let host = unsafe { std::slice::from_raw_parts_mut(h.arena.at(c.host), c.bytes) };
            unsafe {
                if up {
                    result::memcpy_htod_async(c.device, &*host, self.stream.cu_stream())
                } else {
                    result::memcpy_dtoh_async(host, c.device, self.stream.cu_stream())
                }
            }
            .map_err(gpu)?;
        }
        Ok(())
    }

    /// Enqueues a GPU segment's uploads and launches on the stream.
    fn enqueue_segment(&self, uploads: &[Copy], steps: &Range<usize>) -> Result<(), RuntimeError> {
        self.enqueue_copies(uploads, true)?;
        for s in steps.clone() {
            let Work::Gpu(launches) = &self.work[s] else { continue };
            for (k, l) in launches.iter().enumerate() {
                // SAFETY: the parameters point into our device allocation, typed by the checked artifact.
                unsafe { l.enqueue(self.stream.cu_stream()) }.map_err(|e| RuntimeError(format!("step {s}, launch {k}: {e}")))?;
            }
        }
        Ok(())
    }

    /// Captures every GPU segment as a graph.
    fn capture(&mut self) -> Result<(), RuntimeError> {
        let mut graphs = Vec::new();
        for seg in &self.segments {
            let Segment::Gpu { uploads, steps, .. } = seg else {
                graphs.push(None);
                continue;
            };
            if uploads.is_empty() && steps.clone().all(|s| matches!(&self.work[s], Work::Gpu(l) if l.is_empty())) {
                graphs.push(None);
                continue;
            }
            self.stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(gpu)?;
            let enqueued = self.enqueue_segment(uploads, steps);
            let graph = self.stream.end_capture(sys::CUgraphInstantiate_flags(0)).map_err(gpu)?;
            enqueued?;
            if let Some(g) = &graph {
                g.upload().map_err(gpu)?;
            }
            graphs.push(graph);
        }
        for (seg, g) in self.segments.iter_mut().zip(graphs) {
            if let Segment::Gpu { graph, .. } = seg {
                *graph = g;
            }
        }
        Ok(())
    }

    /// The device address of the constants (the same for engines sharing them).
    pub fn constants_address(&self) -> u64 {
        self.const_base
    }

    /// Number of kernel launches per run.
    pub fn kernel_count(&self) -> usize {
        self.work.iter().map(|w| if let Work::Gpu(l) = w { l.len() } else { 0 }).sum()
    }

    /// Number of host steps per run (0 unless the plan mixes host and GPU partitions).
    pub fn host_step_count(&self) -> usize {
        self.work.iter().filter(|w| matches!(w, Work::Host { .. })).count()
    }

    /// Number of transfers between host and GPU per run.
    pub fn transfer_count(&self) -> usize {
        self.segments.iter().map(|s| match s { Segment::Gpu { uploads: c, .. } | Segment::Host { downloads: c, .. } => c.len() }).sum()
    }

    /// Copies `inputs` (already checked against the artifact's types) to the device, asynchronously, and
    /// into the host arena when host steps may read them.
    fn upload(&mut self, inputs: &[&[u8]]) -> Result<(), RuntimeError> {
        self.ctx.bind_to_thread().map_err(gpu)?;
        for (st, t) in self.inputs.iter().zip(inputs) {
            let dst = self.pinned_in.slice(st.pinned, st.bytes);
            dst.copy_from_slice(t);
            // SAFETY: the pinned slice stays alive and untouched until the stream is synchronized.
            unsafe { result::memcpy_htod_async(st.device, &*dst, self.stream.cu_stream()) }.map_err(gpu)?;
        }
        if let Some(h) = &mut self.host {
            // The stream may still be running the previous run's copies out of the host arena: wait first.
            self.stream.synchronize().map_err(gpu)?;
            for (st, t) in self.inputs.iter().zip(inputs) {
                h.arena.slice(st.arena, st.bytes).copy_from_slice(t);
            }
        }
        Ok(())
    }

    /// Calls host step `s` (a host `Work`).
    fn call_host(&self, s: usize) -> Result<(), RuntimeError> {
        let (Work::Host { module, function, args }, Some(h)) = (&self.work[s], &self.host) else { return Ok(()) };
        let m = &self.modules[*module];
        // SAFETY: every pointer points into the host arena, constants or scratch, typed and planned by the
        // checked artifact; the transfers put every value it reads in place before it runs.
        on_runtime_pool(|| unsafe { m.call(*function, &h.args[args.clone()]) }).map_err(|e| RuntimeError(format!("step {s} (host): {}", e.0)))
    }

    /// Runs a host segment: downloads what it reads, waits for the stream, calls its steps (each between
    /// `mark`s).
    fn run_host_segment(&self, downloads: &[Copy], steps: &Range<usize>, mark: &mut dyn FnMut(usize, Mark) -> Result<(), RuntimeError>) -> Result<(), RuntimeError> {
        self.enqueue_copies(downloads, false)?;
        self.stream.synchronize().map_err(|e| RuntimeError(format!("a kernel failed: {}", device::error(e))))?;
        for s in steps.clone() {
            mark(s, Mark::BeforeStep)?;
            self.call_host(s)?;
            mark(s, Mark::AfterStep)?;
        }
        Ok(())
    }

    /// Replays every segment: graphs on the GPU, host segments in between.
    fn replay(&self) -> Result<(), RuntimeError> {
        for seg in &self.segments {
            match seg {
                Segment::Gpu { graph: Some(g), .. } => g.launch().map_err(gpu)?,
                Segment::Gpu { graph: None, .. } => {}
                Segment::Host { downloads, steps } => self.run_host_segment(downloads, steps, &mut |_, _| Ok(()))?,
            }
        }
        Ok(())
    }

    /// Runs every segment without graphs, every launch and step enqueued on its own between `mark`s (for
    /// profiles: the marks record timing events).
    fn run_direct(&self, mark: &mut dyn FnMut(usize, Mark) -> Result<(), RuntimeError>) -> Result<(), RuntimeError> {
        for seg in &self.segments {
            match seg {
                Segment::Gpu { uploads, steps, .. } => {
                    self.enqueue_copies(uploads, true)?;
                    for s in steps.clone() {
                        mark(s, Mark::BeforeStep)?;
                        if let Work::Gpu(launches) = &self.work[s] {
                            for l in launches {
                                mark(s, Mark::BeforeLaunch)?;
                                // SAFETY: as in `enqueue_segment`.
                                unsafe { l.enqueue(self.stream.cu_stream()) }.map_err(|e| RuntimeError(format!("step {s}: {e}")))?;
                                mark(s, Mark::AfterLaunch)?;
                            }
                        }
                        mark(s, Mark::AfterStep)?;
                    }
                }
                Segment::Host { downloads, steps } => self.run_host_segment(downloads, steps, mark)?,
            }
        }
        Ok(())
    }

    /// Copies the outputs given in `outputs` (each exactly its type's size) out of the device (or the host
    /// arena, for an output a host step wrote).
    fn download_into(&mut self, outputs: &mut [Option<&mut [u8]>]) -> Result<(), RuntimeError> {
        for ((st, _, on_host), want) in self.outputs.iter().zip(outputs.iter()) {
            if *on_host || want.is_none() {
                continue;
            }
            let dst = self.pinned_out.slice(st.pinned, st.bytes);
            // SAFETY: as in `upload`.
            unsafe { result::memcpy_dtoh_async(dst, st.device, self.stream.cu_stream()) }.map_err(gpu)?;
        }
        self.stream.synchronize().map_err(|e| RuntimeError(format!("a kernel failed: {}", device::error(e))))?;
        for (i, dst) in outputs.iter_mut().enumerate() {
            let Some(dst) = dst else { continue };
            let (st, _, on_host) = &self.outputs[i];
            let (pinned, arena, bytes, on_host) = (st.pinned, st.arena, st.bytes, *on_host);
            let src = match (&mut self.host, on_host) {
                (Some(h), true) => h.arena.slice(arena, bytes),
                _ => self.pinned_out.slice(pinned, bytes),
            };
            dst.copy_from_slice(src);
        }
        Ok(())
    }

    /// Every output, in a tensor of its own.
    fn download(&mut self) -> Result<Vec<Tensor>, RuntimeError> {
        let mut bufs: Vec<Vec<u8>> = self.outputs.iter().map(|(st, _, _)| vec![0; st.bytes]).collect();
        let mut outs: Vec<Option<&mut [u8]>> = bufs.iter_mut().map(|b| Some(b.as_mut_slice())).collect();
        self.download_into(&mut outs)?;
        self.outputs.iter().zip(bufs).map(|((_, ty, _), b)| Tensor::from_bytes(ty.clone(), b).map_err(|e| RuntimeError(e.to_string()))).collect()
    }

    fn bytes(inputs: &[Tensor]) -> Vec<&[u8]> {
        inputs.iter().map(Tensor::bytes).collect()
    }

    /// One run: inputs in, graph replay, outputs out.
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        self.upload(&Self::bytes(inputs))?;
        self.replay()?;
        self.download()
    }

    /// One run from borrowed input bytes into the caller's output buffers (`None`: not copied); every
    /// buffer holds exactly its type's size (the caller checked).
    pub fn run_into(&mut self, inputs: &[&[u8]], outputs: &mut [Option<&mut [u8]>]) -> Result<(), RuntimeError> {
        self.upload(inputs)?;
        self.replay()?;
        self.download_into(outputs)
    }

    /// One run with every step launched on its own between timing events: `step_us[s]` is step `s`'s time
    /// in microseconds (a host step's is its host call's, the stream being idle around it).
    pub fn run_profiled(&mut self, inputs: &[Tensor], step_us: &mut Vec<f64>) -> Result<Vec<Tensor>, RuntimeError> {
        self.upload(&Self::bytes(inputs))?;
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let n = self.work.len();
        let events = (0..2 * n).map(|_| self.ctx.new_event(timing)).collect::<Result<Vec<_>, _>>().map_err(gpu)?;
        let stream = self.stream.clone();
        self.run_direct(&mut |s, m| match m {
            Mark::BeforeStep => events[2 * s].record(&stream).map_err(gpu),
            Mark::AfterStep => events[2 * s + 1].record(&stream).map_err(gpu),
            _ => Ok(()),
        })?;
        let out = self.download()?;
        step_us.clear();
        for s in 0..n {
            step_us.push(events[2 * s].elapsed_ms(&events[2 * s + 1]).map_err(gpu)? as f64 * 1e3);
        }
        Ok(out)
    }

    /// Every kernel timed on its own: `iters` runs (after `warmup`), each launch between two CUDA events,
    /// the median per launch. The launches are enqueued directly (the driver does not time events recorded
    /// inside a graph: CUDA_ERROR_INVALID_VALUE on the H100, 2026-11-24), so a kernel shorter than a host
    /// launch also counts the host's launch gap; the graph replay time is the whole model's. Host steps of a
    /// mixed plan run but are not listed.
    pub fn kernel_times_us(&mut self, inputs: &[Tensor], warmup: usize, iters: usize) -> Result<Vec<KernelTime>, RuntimeError> {
        self.upload(&Self::bytes(inputs))?;
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let n = self.kernel_count();
        let events = (0..2 * n).map(|_| self.ctx.new_event(timing)).collect::<Result<Vec<_>, _>>().map_err(gpu)?;
        let mut per: Vec<Vec<f64>> = vec![Vec::with_capacity(iters); n];
        let stream = self.stream.clone();
        for it in 0..warmup + iters {
            let mut k = 0;
            self.run_direct(&mut |_, m| match m {
                Mark::BeforeLaunch => events[2 * k].record(&stream).map_err(gpu),
                Mark::AfterLaunch => {
                    k += 1;
                    events[2 * k - 1].record(&stream).map_err(gpu)
                }
                _ => Ok(()),
            })?;
            self.stream.synchronize().map_err(|e| RuntimeError(format!("a kernel failed: {}", device::error(e))))?;
            if it >= warmup {
                for (k, v) in per.iter_mut().enumerate() {
                    v.push(events[2 * k].elapsed_ms(&events[2 * k + 1]).map_err(gpu)? as f64 * 1e3);
                }
            }
        }
        let mut out = Vec::with_capacity(n);
        let mut k = 0;
        for (s, w) in self.work.iter().enumerate() {
            let Work::Gpu(launches) = w else { continue };
            for l in launches {
                let v = &mut per[k];
                v.sort_by(f64::total_cmp);
                out.push(KernelTime { step: s, entry: l.entry.clone(), grid: l.grid, block: l.block, median_us: v[v.len() / 2] });
                k += 1;
            }
        }
        Ok(out)
    }

    /// Time of `iters` replays on `inputs` (uploaded once), each between two CUDA events, after `warmup`
    /// untimed replays: microseconds per replay, in order. For a mixed plan a replay includes its host
    /// segments and transfers.
    pub fn replay_times_us(&mut self, inputs: &[Tensor], warmup: usize, iters: usize) -> Result<Vec<f64>, RuntimeError> {
        self.upload(&Self::bytes(inputs))?;
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

// Runs from device memory the caller owns: a child module, so it reaches the staging tables above.
mod device_io;
