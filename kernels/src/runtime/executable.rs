//! An artifact made ready to run: modules loaded once, constants uploaded once, the arena and scratch
//! allocated once, and every step's argument pointers computed once. A run copies the inputs in, replays the
//! steps, and copies the outputs out: no compiling, no tuning, no allocation per step. Host runs execute on
//! the runtime's thread pool ([`super::on_runtime_pool`]); an artifact of GPU modules runs on the
//! [`DeviceEngine`] instead (same interface, its memory and steps on the GPU; the host steps of a plan mixing
//! host and GPU partitions run there too, between its graphs).

use super::buffer::HostBuffer;
use super::cuda::DeviceEngine;
use super::{LoadedModule, Registry, RuntimeError};
use crate::artifact::{Artifact, Buf};
use std::ops::Range;
use crate::tensor::{Tensor, TensorType};

struct PreparedStep {
    module: usize,
    function: usize,
    /// Range of this step's pointers in `Executable::args`.
    args: Range<usize>,
}

/// A loaded artifact, ready to [`run`](Executable::run).
pub struct Executable {
    model: String,
    inputs: Vec<(String, TensorType, *mut u8)>,
    outputs: Vec<(String, TensorType, *const u8)>,
    steps: Vec<PreparedStep>,
    args: Vec<*mut u8>,
    /// For errors: (backend, symbol) of each step.
    names: Vec<(String, String)>,
    /// Set for an artifact of GPU modules: then it runs every step and the host fields stay empty.
    device: Option<DeviceEngine>,
    modules: Vec<Box<dyn LoadedModule>>,
    // The memory every pointer above points into; declared after the modules only by taste (nothing in a
    // module's drop reads it).
    _arena: HostBuffer,
    _constants: HostBuffer,
    _scratch: HostBuffer,
}

// SAFETY: the raw pointers point into the buffers the executable owns; `run` takes `&mut self`, so no two
// threads ever use them at once, and the loaded modules are `Send + Sync`.
unsafe impl Send for Executable {}
unsafe impl Sync for Executable {}

impl Executable {
    /// Loads every module of `a` once (through the built-in [`Registry`]), uploads its constants, allocates
    /// its arena and scratch.
    pub fn load(a: &Artifact) -> Result<Executable, RuntimeError> {
        Self::load_with(a, Registry::builtin())
    }

    /// [`load`](Self::load), loading modules through `registry` (one holding loaders added from outside this
    /// crate, say).
    pub fn load_with(a: &Artifact, registry: &Registry) -> Result<Executable, RuntimeError> {
        let b = &a.body;
        let mut modules = Vec::with_capacity(b.modules.len());
        for (i, m) in b.modules.iter().enumerate() {
            modules.push(registry.load(m).map_err(|e| RuntimeError(format!("artifact {}: module {i}: {}", a.file, e.0)))?);
        }
        let names: Vec<(String, String)> = b.steps.iter().map(|s| {
            let m = &b.modules[s.module as usize];
            (m.backend.clone(), m.functions[s.function as usize].symbol.clone())
        }).collect();
        if modules.iter().any(|m| m.gpu().is_some()) {
            // The engine owns the modules: its launches and host calls refer to them.
            let device = DeviceEngine::new(b, a.data(), modules).map_err(|e| RuntimeError(format!("artifact {}: {}", a.file, e.0)))?;
            let empty = || HostBuffer::zeroed(0, "unused host memory of a GPU artifact");
            return Ok(Executable {
                model: b.model.clone(),
                inputs: b.inputs.iter().map(|d| (d.name.clone(), d.ty.clone(), std::ptr::null_mut())).collect(),
                outputs: b.outputs.iter().map(|o| (o.name.clone(), o.ty.clone(), std::ptr::null())).collect(),
                steps: Vec::new(),
                args: Vec::new(),
                names,
                device: Some(device),
                modules: Vec::new(),
                _arena: empty()?,
                _constants: empty()?,
                _scratch: empty()?,
            });
        }
        let arena = HostBuffer::zeroed(b.arena_bytes, &format!("arena of model '{}'", b.model))?;
        let constants = HostBuffer::from_bytes(a.data(), &format!("constants of model '{}'", b.model))?;
        let scratch = HostBuffer::zeroed(b.scratch_bytes, &format!("scratch of model '{}'", b.model))?;
        // Offsets were bounds-checked when the artifact was read, so every pointer below stays inside its buffer.
        let ptr = |buf: Buf| -> *mut u8 {
            let (base, offset) = match buf {
                Buf::Input(i) => (arena.as_ptr(), b.inputs[i as usize].offset),
                Buf::Value(i) => (arena.as_ptr(), b.values[i as usize].offset),
                Buf::Const(i) => (constants.as_ptr(), b.constants[i as usize].offset),
                Buf::Scratch => (scratch.as_ptr(), 0),
            };
            // SAFETY: in bounds (see above).
            unsafe { base.add(offset as usize) }
        };
        let mut args = Vec::new();
        let mut steps = Vec::with_capacity(b.steps.len());
        for s in &b.steps {
            let start = args.len();
            args.extend(s.args.iter().map(|&x| ptr(x)));
            steps.push(PreparedStep { module: s.module as usize, function: s.function as usize, args: start..args.len() });
        }
        Ok(Executable {
            model: b.model.clone(),
            inputs: b.inputs.iter().enumerate().map(|(i, d)| (d.name.clone(), d.ty.clone(), ptr(Buf::Input(i as u32)))).collect(),
            outputs: b.outputs.iter().map(|o| (o.name.clone(), o.ty.clone(), ptr(o.source) as *const u8)).collect(),
            steps,
            args,
            names,
            device: None,
            modules,
            _arena: arena,
            _constants: constants,
            _scratch: scratch,
        })
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// Input names and types, in order.
    pub fn inputs(&self) -> impl Iterator<Item = (&str, &TensorType)> {
        self.inputs.iter().map(|(n, t, _)| (n.as_str(), t))
    }

    /// Output names and types, in order.
    pub fn outputs(&self) -> impl Iterator<Item = (&str, &TensorType)> {
        self.outputs.iter().map(|(n, t, _)| (n.as_str(), t))
    }

    /// Runs the model on `inputs` (in the artifact's input order) and returns its outputs in order.
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        self.check_inputs(inputs)?;
        if let Some(d) = &mut self.device {
            return d.run(inputs).map_err(|e| RuntimeError(format!("model '{}': {}", self.model, e.0)));
        }
        super::on_runtime_pool(|| self.run_inner(inputs, None))
    }

    /// Whether the artifact runs on the GPU.
    pub fn is_gpu(&self) -> bool {
        self.device.is_some()
    }

    /// Kernel launches per run of a GPU artifact (`None` on the host).
    pub fn kernel_count(&self) -> Option<usize> {
        self.device.as_ref().map(DeviceEngine::kernel_count)
    }

    /// For a GPU artifact: host steps and host-GPU transfers per run (both 0 unless its plan mixes host and
    /// GPU partitions). `None` on the host.
    pub fn host_steps_and_transfers(&self) -> Option<(usize, usize)> {
        self.device.as_ref().map(|d| (d.host_step_count(), d.transfer_count()))
    }

    /// For a GPU artifact: the GPU time of `iters` replays of the model's CUDA graph on `inputs` (uploaded
    /// once, so host copies are not timed), each between CUDA events, after `warmup` replays; microseconds.
    /// `None` for a host artifact.
    pub fn gpu_replay_times_us(&mut self, inputs: &[Tensor], warmup: usize, iters: usize) -> Option<Result<Vec<f64>, RuntimeError>> {
        if let Err(e) = self.check_inputs(inputs) {
            return Some(Err(e));
        }
        let model = self.model.clone();
        self.device.as_mut().map(|d| d.replay_times_us(inputs, warmup, iters).map_err(|e| RuntimeError(format!("model '{model}': {}", e.0))))
    }

    /// For a GPU artifact, every kernel timed on its own (see
    /// [`DeviceEngine::kernel_times_us`](super::cuda::engine::DeviceEngine::kernel_times_us)); `None` for a
    /// host artifact.
    pub fn gpu_kernel_times_us(&mut self, inputs: &[Tensor], warmup: usize, iters: usize) -> Option<Result<Vec<super::cuda::engine::KernelTime>, RuntimeError>> {
        if iters == 0 {
            return Some(Err(RuntimeError("at least one timed run is needed".into())));
        }
        if let Err(e) = self.check_inputs(inputs) {
            return Some(Err(e));
        }
        let model = self.model.clone();
        self.device.as_mut().map(|d| d.kernel_times_us(inputs, warmup, iters).map_err(|e| RuntimeError(format!("model '{model}': {}", e.0))))
    }

    /// [`run`](Self::run), also timing every step: `step_us[s]` receives step `s`'s wall time in
    /// microseconds (the clock is read between steps only, so the total matches an unprofiled run closely).
    pub fn run_profiled(&mut self, inputs: &[Tensor], step_us: &mut Vec<f64>) -> Result<Vec<Tensor>, RuntimeError> {
        self.check_inputs(inputs)?;
        if let Some(d) = &mut self.device {
            return d.run_profiled(inputs, step_us).map_err(|e| RuntimeError(format!("model '{}': {}", self.model, e.0)));
        }
        step_us.clear();
        step_us.reserve(self.steps.len());
        super::on_runtime_pool(|| self.run_inner(inputs, Some(step_us)))
    }

    /// The steps in run order: (backend, function symbol).
    pub fn steps(&self) -> &[(String, String)] {
        &self.names
    }

    fn check_inputs(&self, inputs: &[Tensor]) -> Result<(), RuntimeError> {
        if inputs.len() != self.inputs.len() {
            let names: Vec<&str> = self.inputs.iter().map(|(n, _, _)| n.as_str()).collect();
            return Err(RuntimeError(format!(
                "model '{}' takes {} inputs ({}), got {}",
                self.model,
                self.inputs.len(),
                names.join(", "),
                inputs.len()
            )));
        }
        for (i, ((name, ty, _), t)) in self.inputs.iter().zip(inputs).enumerate() {
            if &t.ty != ty {
                return Err(RuntimeError(format!("model '{}': input {i} ('{name}') must be {ty}, got {}", self.model, t.ty)));
            }
        }
        Ok(())
    }

    fn run_inner(&mut self, inputs: &[Tensor], mut step_us: Option<&mut Vec<f64>>) -> Result<Vec<Tensor>, RuntimeError> {
        for ((_, _, dst), t) in self.inputs.iter().zip(inputs) {
            // SAFETY: the slot holds `ty.size_bytes()` bytes (checked at read), the types are equal, and a
            // caller's tensor never lives in our arena.
            unsafe { std::ptr::copy_nonoverlapping(t.bytes().as_ptr(), *dst, t.bytes().len()) };
        }
        let mut clock = step_us.is_some().then(std::time::Instant::now);
        for (s, step) in self.steps.iter().enumerate() {
            // SAFETY: every pointer points into a live buffer of the type the function's signature lists
            // (checked when the artifact was read), outputs never alias live inputs (the memory plan was
            // checked), and scratch has the largest size any step declares.
            unsafe { self.modules[step.module].call(step.function, &self.args[step.args.clone()]) }.map_err(|e| {
                let (backend, symbol) = &self.names[s];
                RuntimeError(format!("model '{}': step {s} (backend {backend}, function '{symbol}'): {}", self.model, e.0))
            })?;
            if let (Some(times), Some(start)) = (step_us.as_deref_mut(), clock.as_mut()) {
                let now = std::time::Instant::now();
                times.push((now - *start).as_secs_f64() * 1e6);
                *start = now;
            }
        }
        self.outputs
            .iter()
            .map(|(name, ty, src)| {
                // SAFETY: the source buffer holds `ty.size_bytes()` bytes (checked at read).
                let bytes = unsafe { std::slice::from_raw_parts(*src, ty.size_bytes()) }.to_vec();
                Tensor::from_bytes(ty.clone(), bytes).map_err(|e| RuntimeError(format!("model '{}': output '{name}': {e}", self.model)))
            })
            .collect()
    }
}
