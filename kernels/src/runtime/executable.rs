//! An artifact made ready to run, in two parts so that one loaded model can serve many threads:
//!
//! - a [`Program`]: what every run shares and nothing writes: modules loaded once, constants uploaded once,
//!   every step's argument buffers. Shared behind an `Arc`.
//! - a [`Session`]: what one run writes: its own arena (inputs and activations) and scratch, and every
//!   step's argument pointers resolved once into them (constants point into the program). A run copies the
//!   inputs in, replays the steps and copies the outputs out: no compiling, no tuning, no allocation per
//!   step, nothing else copied. Sessions of one program run at the same time on different threads.
//!
//! [`Executable`] is one program with one session, for callers that run one model from one thread
//! (`tessera run`, `tessera bench`, the compiler's measurements).
//!
//! Host runs execute on the runtime's thread pool ([`super::on_runtime_pool`]). An artifact of GPU modules
//! runs on the [`DeviceEngine`] instead (its memory and steps on the GPU; the host steps of a plan mixing
//! host and GPU partitions run there too, between its graphs). The engine has one device arena and one set
//! of captured graphs, so its runs take turns behind a mutex: sessions of a GPU program are empty and
//! serialize on it.
//!
//! The plans of a batched artifact load as programs of their own ([`Program::load_plans`]), each with its own
//! modules, engine and sessions, but one set of constants: the data section, which holds each constant once
//! for every plan, is copied to host memory once (and, for GPU plans, uploaded once) and shared through a
//! [`SharedConstants`].

use super::buffer::HostBuffer;
use super::cuda::{DeviceEngine, SharedConstants};
use super::{LoadedModule, Registry, RuntimeError};
use crate::artifact::{Artifact, Buf};
use crate::tensor::{Tensor, TensorType};
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

struct PreparedStep {
    module: usize,
    function: usize,
    /// Range of this step's arguments in `Program::args` and `Session::args`.
    args: Range<usize>,
}

/// A loaded artifact's shared, read-only part (see the module documentation). Make sessions of it with
/// [`Session::new`].
pub struct Program {
    model: String,
    /// Name, type and arena offset of each input.
    inputs: Vec<(String, TensorType, u64)>,
    outputs: Vec<(String, TensorType, Buf)>,
    steps: Vec<PreparedStep>,
    /// Every step's argument buffers, concatenated (see `PreparedStep::args`).
    args: Vec<Buf>,
    /// Arena offset of each value.
    value_offsets: Vec<u64>,
    /// Data-section offset of each constant.
    const_offsets: Vec<u64>,
    arena_bytes: u64,
    scratch_bytes: u64,
    /// For errors: (backend, symbol) of each step.
    names: Vec<(String, String)>,
    /// Set for an artifact of GPU modules: then it runs every step, one run at a time, and the host fields
    /// above are not used.
    device: Option<Mutex<DeviceEngine>>,
    /// The device address of a GPU program's constants (its engine's), for [`Program::shares_constants_with`].
    device_constants: Option<u64>,
    modules: Vec<Box<dyn LoadedModule>>,
    /// The constants every session's pointers point into; never written after load. Shared with the other
    /// plans of a batched artifact ([`load_plans`](Self::load_plans)).
    constants: Arc<HostBuffer>,
}

impl Program {
    /// Loads every module of `a` once (through the built-in [`Registry`]) and uploads its constants.
    pub fn load(a: &Artifact) -> Result<Arc<Program>, RuntimeError> {
        Self::load_with(a, Registry::builtin())
    }

    /// [`load`](Self::load), loading modules through `registry` (one holding loaders added from outside this
    /// crate, say).
    pub fn load_with(a: &Artifact, registry: &Registry) -> Result<Arc<Program>, RuntimeError> {
        Self::load_from(a, registry, None)
    }

    /// Every plan of `a` (one for an artifact of one plan, which loads as [`load_with`](Self::load_with)
    /// loads it), in order, batch sizes ascending: each plan a program of its own (modules, memory plan,
    /// sessions), all of them sharing one host copy of the constants (and, for GPU plans, one device copy; see
    /// [`SharedConstants`]).
    pub fn load_plans(a: &Artifact, registry: &Registry) -> Result<Vec<Arc<Program>>, RuntimeError> {
        if a.plan_count() == 1 {
            return Ok(vec![Self::load_with(a, registry)?]);
        }
        let mut shared = SharedConstants::new();
        (0..a.plan_count()).map(|i| Self::load_from(&a.plan_artifact(i), registry, Some(&mut shared))).collect()
    }

    /// Loads `a`, its constants from `shared` when given (made there by the first program that needs them).
    fn load_from(a: &Artifact, registry: &Registry, shared: Option<&mut SharedConstants>) -> Result<Arc<Program>, RuntimeError> {
        let b = &a.body;
        let mut modules = Vec::with_capacity(b.modules.len());
        for (i, m) in b.modules.iter().enumerate() {
            modules.push(registry.load(m).map_err(|e| RuntimeError(format!("artifact {}: module {i}: {}", a.file, e.0)))?);
        }
        let names: Vec<(String, String)> = b
            .steps
            .iter()
            .map(|s| {
                let m = &b.modules[s.module as usize];
                (m.backend.clone(), m.functions[s.function as usize].symbol.clone())
            })
            .collect();
        let mut program = Program {
            model: b.model.clone(),
            inputs: b.inputs.iter().map(|d| (d.name.clone(), d.ty.clone(), d.offset)).collect(),
            outputs: b.outputs.iter().map(|o| (o.name.clone(), o.ty.clone(), o.source)).collect(),
            steps: Vec::new(),
            args: Vec::new(),
            value_offsets: b.values.iter().map(|v| v.offset).collect(),
            const_offsets: b.constants.iter().map(|c| c.offset).collect(),
            arena_bytes: b.arena_bytes,
            scratch_bytes: b.scratch_bytes,
            names,
            device: None,
            device_constants: None,
            modules: Vec::new(),
            constants: Arc::new(HostBuffer::zeroed(0, "unused host constants of a GPU artifact")?),
        };
        if modules.iter().any(|m| m.gpu().is_some()) {
            // The engine owns the modules: its launches and host calls refer to them.
            let device = match shared {
                Some(shared) => DeviceEngine::new_shared(b, a.data(), shared, modules),
                None => DeviceEngine::new(b, a.data(), modules),
            };
            let device = device.map_err(|e| RuntimeError(format!("artifact {}: {}", a.file, e.0)))?;
            program.device_constants = Some(device.constants_address());
            program.device = Some(Mutex::new(device));
            return Ok(Arc::new(program));
        }
        program.constants = match shared {
            Some(shared) => shared.host(a.data(), &b.model)?,
            None => Arc::new(HostBuffer::from_bytes(a.data(), &format!("constants of model '{}'", b.model))?),
        };
        for s in &b.steps {
            let start = program.args.len();
            program.args.extend_from_slice(&s.args);
            program.steps.push(PreparedStep { module: s.module as usize, function: s.function as usize, args: start..program.args.len() });
        }
        program.modules = modules;
        Ok(Arc::new(program))
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// Input names and types, in order.
    pub fn inputs(&self) -> impl ExactSizeIterator<Item = (&str, &TensorType)> {
        self.inputs.iter().map(|(n, t, _)| (n.as_str(), t))
    }

    /// Output names and types, in order.
    pub fn outputs(&self) -> impl ExactSizeIterator<Item = (&str, &TensorType)> {
        self.outputs.iter().map(|(n, t, _)| (n.as_str(), t))
    }

    /// Whether the artifact runs on the GPU.
    pub fn is_gpu(&self) -> bool {
        self.device.is_some()
    }

    /// Bytes of host memory each session allocates: its arena and scratch (0 for a GPU artifact, whose
    /// memory is the engine's).
    pub fn session_bytes(&self) -> u64 {
        if self.is_gpu() {
            0
        } else {
            self.arena_bytes + self.scratch_bytes
        }
    }

    /// Bytes of constants (weights) shared by every session on the host (0 for a GPU artifact). The plans of
    /// a batched artifact share them ([`shares_constants_with`](Self::shares_constants_with)): each reports
    /// the one copy.
    pub fn constant_bytes(&self) -> usize {
        self.constants.len()
    }

    /// Whether this program and `other` use one copy of their constants (both plans of one batched artifact
    /// loaded by [`load_plans`](Self::load_plans)): the same host buffer, or for GPU programs the same device
    /// memory. A program shares its constants with itself.
    pub fn shares_constants_with(&self, other: &Program) -> bool {
        match (self.device_constants, other.device_constants) {
            (Some(a), Some(b)) => a == b,
            (None, None) => Arc::ptr_eq(&self.constants, &other.constants),
            _ => false,
        }
    }

    /// The steps in run order: (backend, function symbol).
    pub fn steps(&self) -> &[(String, String)] {
        &self.names
    }

    /// The GPU engine, for one run at a time (`None` on the host). A run that panicked while holding it
    /// leaves it usable: every run uploads all of its inputs again.
    fn engine(&self) -> Option<MutexGuard<'_, DeviceEngine>> {
        self.device.as_ref().map(|d| d.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    /// An error unless `inputs` are of the model's input types, in order.
    pub fn check_inputs(&self, inputs: &[Tensor]) -> Result<(), RuntimeError> {
        self.check_count(inputs.len())?;
        for (i, ((name, ty, _), t)) in self.inputs.iter().zip(inputs).enumerate() {
            if &t.ty != ty {
                return Err(RuntimeError(format!("model '{}': input {i} ('{name}') must be {ty}, got {}", self.model, t.ty)));
            }
        }
        Ok(())
    }

    fn check_count(&self, n: usize) -> Result<(), RuntimeError> {
        if n != self.inputs.len() {
            let names: Vec<&str> = self.inputs.iter().map(|(n, _, _)| n.as_str()).collect();
            return Err(RuntimeError(format!("model '{}' takes {} inputs ({}), got {}", self.model, self.inputs.len(), names.join(", "), n)));
        }
        Ok(())
    }

    /// An error unless every input and output buffer has exactly its type's size in bytes: what keeps the
    /// copies in and out inside their buffers whatever the caller passes.
    fn check_sizes(&self, inputs: &[&[u8]], outputs: &[Option<&mut [u8]>]) -> Result<(), RuntimeError> {
        self.check_count(inputs.len())?;
        for ((name, ty, _), b) in self.inputs.iter().zip(inputs) {
            if b.len() != ty.size_bytes() {
                return Err(RuntimeError(format!("model '{}': input '{name}' ({ty}) needs {} bytes, got {}", self.model, ty.size_bytes(), b.len())));
            }
        }
        if outputs.len() != self.outputs.len() {
            return Err(RuntimeError(format!("model '{}' has {} outputs, {} output buffers given", self.model, self.outputs.len(), outputs.len())));
        }
        for ((name, ty, _), b) in self.outputs.iter().zip(outputs) {
            if let Some(b) = b {
                if b.len() != ty.size_bytes() {
                    return Err(RuntimeError(format!("model '{}': output '{name}' ({ty}) needs {} bytes, got {}", self.model, ty.size_bytes(), b.len())));
                }
            }
        }
        Ok(())
    }
}

/// One run's memory for a [`Program`] (see the module documentation): its arena and scratch, and every
/// step's argument pointers into them and into the program's constants. A session runs one model run at a
/// time; make one per concurrent run.
pub struct Session {
    program: Arc<Program>,
    /// Per step argument, the pointer it passes (see `PreparedStep::args`).
    args: Vec<*mut u8>,
    input_ptrs: Vec<*mut u8>,
    output_ptrs: Vec<*const u8>,
    // The memory the pointers above point into (with the program's constants, which the `Arc` keeps).
    _arena: HostBuffer,
    _scratch: HostBuffer,
}

// SAFETY: the raw pointers point into the buffers this session owns and into the constants of the program
// it holds; runs take `&mut self`, so no two threads use one session's memory at once, and the program's
// constants are never written. Moving a session to another thread moves that exclusive ownership.
unsafe impl Send for Session {}
unsafe impl Sync for Session {}

impl Session {
    /// Allocates a run's memory for `program` (nothing for a GPU program, whose memory is its engine's).
    pub fn new(program: Arc<Program>) -> Result<Session, RuntimeError> {
        let p = &program;
        let bytes = if p.is_gpu() { (0, 0) } else { (p.arena_bytes, p.scratch_bytes) };
        let arena = HostBuffer::zeroed(bytes.0, &format!("arena of model '{}'", p.model))?;
        let scratch = HostBuffer::zeroed(bytes.1, &format!("scratch of model '{}'", p.model))?;
        let (mut args, mut input_ptrs, mut output_ptrs) = (Vec::new(), Vec::new(), Vec::new());
        if !p.is_gpu() {
            // Offsets were bounds-checked when the artifact was read, so every pointer stays inside its buffer.
            let ptr = |buf: Buf| -> *mut u8 {
                let (base, offset) = match buf {
                    Buf::Input(i) => (arena.as_ptr(), p.inputs[i as usize].2),
                    Buf::Value(i) => (arena.as_ptr(), p.value_offsets[i as usize]),
                    Buf::Const(i) => (p.constants.as_ptr(), p.const_offsets[i as usize]),
                    Buf::Scratch => (scratch.as_ptr(), 0),
                };
                // SAFETY: in bounds (see above).
                unsafe { base.add(offset as usize) }
            };
            args = p.args.iter().map(|&b| ptr(b)).collect();
            input_ptrs = (0..p.inputs.len()).map(|i| ptr(Buf::Input(i as u32))).collect();
            output_ptrs = p.outputs.iter().map(|o| ptr(o.2) as *const u8).collect();
        }
        Ok(Session { program, args, input_ptrs, output_ptrs, _arena: arena, _scratch: scratch })
    }

    pub fn program(&self) -> &Arc<Program> {
        &self.program
    }

    /// Runs the model: `inputs[i]` holds input `i`'s bytes (little-endian, exactly its type's size), and
    /// each `outputs[o]` given receives output `o`'s bytes (outputs left `None` are not copied). Checks only
    /// sizes: the caller checked the types.
    pub fn run_into(&mut self, inputs: &[&[u8]], outputs: &mut [Option<&mut [u8]>]) -> Result<(), RuntimeError> {
        self.program.check_sizes(inputs, outputs)?;
        if let Some(mut d) = self.program.engine() {
            return d.run_into(inputs, outputs).map_err(|e| RuntimeError(format!("model '{}': {}", self.program.model, e.0)));
        }
        super::on_runtime_pool(|| self.run_host(inputs, outputs, None))
    }

    /// Runs a GPU model from device memory the caller owns: `inputs[i]` is input `i`'s CUdeviceptr (on GPU
    /// 0's primary context, holding exactly its type's size), and each `outputs[o]` given receives output `o`
    /// (`None`: not copied); see [`DeviceEngine::run_device`]. A host model is an error: its runs read host
    /// memory.
    ///
    /// # Safety
    /// As [`DeviceEngine::run_device`]: the pointers are the caller's device memory, holding or receiving the
    /// tensors, untouched by other work during the call, outputs overlapping nothing else.
    pub unsafe fn run_device(&mut self, inputs: &[u64], outputs: &[Option<u64>]) -> Result<(), RuntimeError> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.run_device_on(inputs, outputs, None) }
    }

    /// [`run_device`](Self::run_device) ordered on the caller's `CUstream` `stream` and asynchronous (`None`:
    /// synchronous); see [`DeviceEngine::run_device`].
    ///
    /// # Safety
    /// As [`run_device`](Self::run_device), until the caller's stream reaches the call; `stream` is a live
    /// stream of GPU 0's primary context.
    pub unsafe fn run_device_on(&mut self, inputs: &[u64], outputs: &[Option<u64>], stream: Option<u64>) -> Result<(), RuntimeError> {
        let p = &*self.program;
        p.check_count(inputs.len())?;
        if outputs.len() != p.outputs.len() {
            return Err(RuntimeError(format!("model '{}' has {} outputs, got {}", p.model, p.outputs.len(), outputs.len())));
        }
        let Some(mut d) = p.engine() else {
            return Err(RuntimeError(format!("model '{}' runs on the host: device pointers are for GPU artifacts (give host memory)", p.model)));
        };
        let ins: Vec<(&str, u64)> = p.inputs.iter().zip(inputs).map(|((n, _, _), &ptr)| (n.as_str(), ptr)).collect();
        let outs: Vec<Option<(&str, u64)>> = p.outputs.iter().zip(outputs).map(|((n, _, _), ptr)| ptr.map(|ptr| (n.as_str(), ptr))).collect();
        // SAFETY: the caller's promise, passed on.
        unsafe { d.run_device(&ins, &outs, stream.map(|s| s as cudarc::driver::sys::CUstream)) }.map_err(|e| RuntimeError(format!("model '{}': {}", p.model, e.0)))
    }

    /// Runs the model on `inputs` (tensors of its input types, in order) and returns its outputs in order.
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        self.program.check_inputs(inputs)?;
        let bytes: Vec<&[u8]> = inputs.iter().map(Tensor::bytes).collect();
        self.run_returning(&bytes, None)
    }

    /// [`run`](Self::run), also timing every step: `step_us[s]` receives step `s`'s wall time in
    /// microseconds (the clock is read between steps only, so the total matches an unprofiled run closely).
    pub fn run_profiled(&mut self, inputs: &[Tensor], step_us: &mut Vec<f64>) -> Result<Vec<Tensor>, RuntimeError> {
        self.program.check_inputs(inputs)?;
        if let Some(mut d) = self.program.engine() {
            return d.run_profiled(inputs, step_us).map_err(|e| RuntimeError(format!("model '{}': {}", self.program.model, e.0)));
        }
        step_us.clear();
        step_us.reserve(self.program.steps.len());
        let bytes: Vec<&[u8]> = inputs.iter().map(Tensor::bytes).collect();
        self.run_returning(&bytes, Some(step_us))
    }

    /// Runs the model from borrowed input bytes (as [`run_into`](Self::run_into) takes them) and returns its
    /// outputs in order, each allocated once and written once.
    pub fn run_bytes(&mut self, inputs: &[&[u8]]) -> Result<Vec<Tensor>, RuntimeError> {
        self.run_returning(inputs, None)
    }

    /// A run into freshly allocated outputs (each written once: allocated zeroed, then copied into).
    fn run_returning(&mut self, inputs: &[&[u8]], step_us: Option<&mut Vec<f64>>) -> Result<Vec<Tensor>, RuntimeError> {
        let mut bufs: Vec<Arc<[u8]>> = self.program.outputs.iter().map(|(_, ty, _)| zeroed_shared(ty.size_bytes())).collect();
        {
            let mut outs: Vec<Option<&mut [u8]>> = bufs.iter_mut().map(|b| Arc::get_mut(b)).collect();
            self.program.check_sizes(inputs, &outs)?;
            if self.program.is_gpu() {
                let program = self.program.clone();
                let mut d = program.engine().expect("a GPU program has an engine");
                d.run_into(inputs, &mut outs).map_err(|e| RuntimeError(format!("model '{}': {}", program.model, e.0)))?;
            } else {
                super::on_runtime_pool(|| self.run_host(inputs, &mut outs, step_us))?;
            }
        }
        self.program
            .outputs
            .iter()
            .zip(bufs)
            .map(|((name, ty, _), b)| Tensor::from_bytes(ty.clone(), b).map_err(|e| RuntimeError(format!("model '{}': output '{name}': {e}", self.program.model))))
            .collect()
    }

    /// A host run; the sizes were checked.
    fn run_host(&mut self, inputs: &[&[u8]], outputs: &mut [Option<&mut [u8]>], mut step_us: Option<&mut Vec<f64>>) -> Result<(), RuntimeError> {
        let p = &*self.program;
        for (dst, src) in self.input_ptrs.iter().zip(inputs) {
            // SAFETY: the slot holds the input type's size (checked at read), which is `src.len()` (checked
            // by the caller), and a caller's buffer never lives in our arena.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), *dst, src.len()) };
        }
        let mut clock = step_us.is_some().then(std::time::Instant::now);
        for (s, step) in p.steps.iter().enumerate() {
            // SAFETY: every pointer points into a live buffer of the type the function's signature lists
            // (checked when the artifact was read), outputs never alias live inputs (the memory plan was
            // checked), scratch has the largest size any step declares, and this session's arena and
            // scratch are used by this run alone (`&mut self`); constants are only read.
            unsafe { p.modules[step.module].call(step.function, &self.args[step.args.clone()]) }.map_err(|e| {
                let (backend, symbol) = &p.names[s];
                RuntimeError(format!("model '{}': step {s} (backend {backend}, function '{symbol}'): {}", p.model, e.0))
            })?;
            if let (Some(times), Some(start)) = (step_us.as_deref_mut(), clock.as_mut()) {
                let now = std::time::Instant::now();
                times.push((now - *start).as_secs_f64() * 1e6);
                *start = now;
            }
        }
        for (src, dst) in self.output_ptrs.iter().zip(outputs.iter_mut()) {
            if let Some(dst) = dst {
                // SAFETY: the source buffer holds the output type's size (checked at read), which is
                // `dst.len()` (checked by the caller).
                unsafe { std::ptr::copy_nonoverlapping(*src, dst.as_mut_ptr(), dst.len()) };
            }
        }
        Ok(())
    }
}

/// `len` zero bytes in an `Arc`, allocated once (a `Vec` turned into an `Arc<[u8]>` would be copied).
fn zeroed_shared(len: usize) -> Arc<[u8]> {
    // SAFETY: zeroed bytes are initialized `u8`s.
    unsafe { Arc::<[u8]>::new_zeroed_slice(len).assume_init() }
}

/// A loaded artifact with one session: ready to [`run`](Executable::run) from one thread at a time.
pub struct Executable {
    session: Session,
}

impl Executable {
    /// Loads every module of `a` once (through the built-in [`Registry`]), uploads its constants, allocates
    /// its arena and scratch.
    pub fn load(a: &Artifact) -> Result<Executable, RuntimeError> {
        Self::load_with(a, Registry::builtin())
    }

    /// [`load`](Self::load), loading modules through `registry` (one holding loaders added from outside this
    /// crate, say).
    pub fn load_with(a: &Artifact, registry: &Registry) -> Result<Executable, RuntimeError> {
        Self::from_program(Program::load_with(a, registry)?)
    }

    /// A program (say one of [`Program::load_plans`]) with one session of its own.
    pub fn from_program(program: Arc<Program>) -> Result<Executable, RuntimeError> {
        Ok(Executable { session: Session::new(program)? })
    }

    /// The program this runs (shared with nothing else unless it was given to
    /// [`from_program`](Self::from_program)).
    pub fn shared_program(&self) -> &Arc<Program> {
        &self.session.program
    }

    fn program(&self) -> &Program {
        &self.session.program
    }

    pub fn model(&self) -> &str {
        self.program().model()
    }

    /// Input names and types, in order.
    pub fn inputs(&self) -> impl Iterator<Item = (&str, &TensorType)> {
        self.program().inputs()
    }

    /// Output names and types, in order.
    pub fn outputs(&self) -> impl Iterator<Item = (&str, &TensorType)> {
        self.program().outputs()
    }

    /// Runs the model on `inputs` (in the artifact's input order) and returns its outputs in order.
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        self.session.run(inputs)
    }

    /// Whether the artifact runs on the GPU.
    pub fn is_gpu(&self) -> bool {
        self.program().is_gpu()
    }

    /// Kernel launches per run of a GPU artifact (`None` on the host).
    pub fn kernel_count(&self) -> Option<usize> {
        self.program().engine().map(|d| d.kernel_count())
    }

    /// For a GPU artifact: host steps and host-GPU transfers per run (both 0 unless its plan mixes host and
    /// GPU partitions). `None` on the host.
    pub fn host_steps_and_transfers(&self) -> Option<(usize, usize)> {
        self.program().engine().map(|d| (d.host_step_count(), d.transfer_count()))
    }

    /// For a GPU artifact: the GPU time of `iters` replays of the model's CUDA graph on `inputs` (uploaded
    /// once, so host copies are not timed), each between CUDA events, after `warmup` replays; microseconds.
    /// `None` for a host artifact.
    pub fn gpu_replay_times_us(&mut self, inputs: &[Tensor], warmup: usize, iters: usize) -> Option<Result<Vec<f64>, RuntimeError>> {
        let p = self.program();
        let mut d = p.engine()?;
        Some(p.check_inputs(inputs).and_then(|_| d.replay_times_us(inputs, warmup, iters).map_err(|e| RuntimeError(format!("model '{}': {}", p.model, e.0)))))
    }

    /// For a GPU artifact, every kernel timed on its own (see
    /// [`DeviceEngine::kernel_times_us`](super::cuda::engine::DeviceEngine::kernel_times_us)); `None` for a
    /// host artifact.
    pub fn gpu_kernel_times_us(&mut self, inputs: &[Tensor], warmup: usize, iters: usize) -> Option<Result<Vec<super::cuda::engine::KernelTime>, RuntimeError>> {
        let p = self.program();
        let mut d = p.engine()?;
        if iters == 0 {
            return Some(Err(RuntimeError("at least one timed run is needed".into())));
        }
        Some(p.check_inputs(inputs).and_then(|_| d.kernel_times_us(inputs, warmup, iters).map_err(|e| RuntimeError(format!("model '{}': {}", p.model, e.0)))))
    }

    /// [`run`](Self::run), also timing every step: `step_us[s]` receives step `s`'s wall time in
    /// microseconds (the clock is read between steps only, so the total matches an unprofiled run closely).
    pub fn run_profiled(&mut self, inputs: &[Tensor], step_us: &mut Vec<f64>) -> Result<Vec<Tensor>, RuntimeError> {
        self.session.run_profiled(inputs, step_us)
    }

    /// The steps in run order: (backend, function symbol).
    pub fn steps(&self) -> &[(String, String)] {
        self.program().steps()
    }
}
