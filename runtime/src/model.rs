//! A loaded model: the shared program (loaded modules, constants) and a pool of sessions (one run's memory
//! each), so that any number of threads run it at once without copying weights.

use crate::error::{Error, ErrorKind};
use crate::view::{TensorView, TensorViewMut};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use tessera_kernels::artifact::{Artifact, Provenance};
use std::borrow::Cow;
use tessera_kernels::batch;
use tessera_kernels::runtime::cuda::device;
use tessera_kernels::runtime::{Program, Registry, RuntimeError, Session};
use tessera_kernels::{DType, Tensor, TensorType};

/// A model input or output: name, element type and shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorInfo {
    fn new(name: &str, ty: &TensorType) -> TensorInfo {
        TensorInfo { name: name.to_string(), dtype: ty.dtype, shape: ty.shape.clone() }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    pub(crate) fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, self.shape.clone())
    }
}

/// A loaded artifact, ready to run from any number of threads (see the crate documentation). A batched
/// artifact (compiled with `--batch 1,8`) runs inputs of any batch up to its largest plan's, each run on the
/// smallest plan that fits ([`batch_sizes`](Self::batch_sizes)). A GPU artifact runs on the GPU it was loaded
/// on ([`gpu`](Self::gpu)), from whichever thread calls it.
pub struct Model {
    /// One per plan (one for an artifact of one plan), batch sizes ascending.
    plans: Vec<Plan>,
    /// A batched artifact's batch sizes; empty for one plan.
    batches: Vec<usize>,
    provenance: Option<Provenance>,
    /// The GPU (CUDA device ordinal) a GPU model's engines, memory and CUDA graphs are on; `None` on the host.
    gpu: Option<usize>,
}

/// One plan: its program (sharing one copy of the weights with the others) and its pool of sessions.
struct Plan {
    program: Arc<Program>,
    inputs: Vec<TensorInfo>,
    outputs: Vec<TensorInfo>,
    /// Sessions not running now. A run takes one (or makes one when none is idle) and puts it back.
    idle: Mutex<Vec<Session>>,
}

impl Plan {
    fn idle(&self) -> MutexGuard<'_, Vec<Session>> {
        // A panic while the lock is held cannot leave the vector half-changed (push and pop only).
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Model {
    /// Freeing a GPU model's device memory binds its GPU's context to this thread: the caller keeps its own.
    fn drop(&mut self) {
        let plans = std::mem::take(&mut self.plans);
        device::keeping_callers_context(|| drop(plans));
    }
}

impl Model {
    /// Reads, checks and loads the artifact at `path`: a host artifact on the host, a GPU artifact on GPU 0
    /// ([`load_on_gpu`](Self::load_on_gpu) picks another). Errors name the file.
    pub fn load(path: impl AsRef<Path>) -> Result<Model, Error> {
        Self::place(&Self::open(path.as_ref())?, None)
    }

    /// Reads, checks and loads an artifact held in memory, as [`load`](Self::load) does. Errors name it
    /// `<memory>`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Model, Error> {
        Self::place(&Self::read(bytes)?, None)
    }

    /// [`load`](Self::load) of a GPU artifact onto GPU `gpu` (a CUDA device ordinal, as `cudaSetDevice` takes
    /// and `CUDA_VISIBLE_DEVICES` renumbers): its modules, weights, memory and CUDA graphs go to that GPU, and
    /// every run of the model executes there, from any thread. A GPU the driver does not see is an
    /// [`ErrorKind::Load`] error naming it; so is a host artifact, which runs on no GPU (load it with
    /// [`load`](Self::load), which takes artifacts of either kind).
    pub fn load_on_gpu(path: impl AsRef<Path>, gpu: usize) -> Result<Model, Error> {
        Self::place(&Self::open(path.as_ref())?, Some(gpu))
    }

    /// [`load_on_gpu`](Self::load_on_gpu) of an artifact held in memory. Errors name it `<memory>`.
    pub fn from_bytes_on_gpu(bytes: &[u8], gpu: usize) -> Result<Model, Error> {
        Self::place(&Self::read(bytes)?, Some(gpu))
    }

    fn open(path: &Path) -> Result<Artifact, Error> {
        Artifact::open(path).map_err(|e| Error::new(ErrorKind::Artifact, e.to_string()))
    }

    fn read(bytes: &[u8]) -> Result<Artifact, Error> {
        Artifact::read(bytes).map_err(|e| Error::new(ErrorKind::Artifact, e.to_string()))
    }

    /// Loads a checked artifact: on GPU `gpu` when given (a GPU artifact only, on a GPU that exists: both
    /// checked before any module loads), else a GPU artifact on GPU 0.
    fn place(a: &Artifact, gpu: Option<usize>) -> Result<Model, Error> {
        // Opening a GPU's context (the first time, below) and loading bind it to this thread: the caller keeps
        // its own.
        device::keeping_callers_context(|| Self::place_here(a, gpu))
    }

    fn place_here(a: &Artifact, gpu: Option<usize>) -> Result<Model, Error> {
        if let Some(g) = gpu {
            if !a.runs_on_gpu() {
                return Err(Error::new(
                    ErrorKind::Load,
                    format!("artifact {}: model '{}' runs on the host; it cannot be placed on GPU {g} (load it without a GPU index)", a.file, a.body.model),
                ));
            }
            device::context_of(g).map_err(|e| Error::new(ErrorKind::Load, format!("artifact {}: model '{}' cannot be placed on GPU {g}: {e}", a.file, a.body.model)))?;
        }
        let g = gpu.unwrap_or(0);
        // Everything the load opens on the device (modules, engines, weights, sessions) is made on, and keeps,
        // GPU `g`'s context.
        device::on(g, || Self::from_artifact(a, g))
    }

    fn from_artifact(a: &Artifact, gpu: usize) -> Result<Model, Error> {
        // Each plan loads as an artifact of its own (modules, memory plan, sessions), all of them sharing one copy
        // of the weights (one host copy; GPU plans one device upload), as the file holds them once.
        let programs = Program::load_plans(a, Registry::builtin()).map_err(|e| Error::new(ErrorKind::Load, e.0))?;
        let mut plans = Vec::with_capacity(programs.len());
        for program in programs {
            let inputs = program.inputs().map(|(n, t)| TensorInfo::new(n, t)).collect();
            let outputs = program.outputs().map(|(n, t)| TensorInfo::new(n, t)).collect();
            // One session per plan up front: allocation failures show at load, and a first run allocates nothing.
            let first = Session::new(program.clone()).map_err(|e| Error::new(ErrorKind::Load, e.0))?;
            plans.push(Plan { program, inputs, outputs, idle: Mutex::new(vec![first]) });
        }
        let gpu = plans.iter().any(|p| p.program.is_gpu()).then_some(gpu);
        Ok(Model { plans, batches: a.batches().iter().map(|&b| b as usize).collect(), provenance: a.provenance.clone(), gpu })
    }

    /// The largest plan (the only one of an artifact of one plan).
    fn largest(&self) -> &Plan {
        self.plans.last().expect("a model has a plan")
    }

    /// The model's name (as compiled).
    pub fn name(&self) -> &str {
        self.largest().program.model()
    }

    /// The inputs, in model order. A batched model's are its largest plan's: a run may give any batch (leading
    /// dimension) from 1 up to that plan's.
    pub fn inputs(&self) -> &[TensorInfo] {
        &self.largest().inputs
    }

    /// The outputs, in model order (the order [`run`](Self::run) returns them in); a batched model's are its
    /// largest plan's, and a run's have the run's batch.
    pub fn outputs(&self) -> &[TensorInfo] {
        &self.largest().outputs
    }

    /// The outputs a run of `batch` rows gives: a batched model's outputs with that leading dimension (whether
    /// or not a plan serves it: a run says), the outputs of a model of one plan as they are.
    pub fn outputs_at(&self, batch: usize) -> Vec<TensorInfo> {
        let mut outs = self.outputs().to_vec();
        if !self.batches.is_empty() {
            for o in &mut outs {
                o.shape[0] = batch;
            }
        }
        outs
    }

    /// The batch sizes of a batched model's plans, ascending (a run of batch `b` uses the smallest `>= b`,
    /// its inputs zero-padded to it); empty for a model of one plan, whose inputs have fixed shapes.
    pub fn batch_sizes(&self) -> &[usize] {
        &self.batches
    }

    /// How the artifact was built, as it records it: the tessera version and source revision, the source
    /// model and its digest, the canonical targets, the precision, the costs and the build options that reached
    /// a key. `None` for an artifact written before tessera recorded provenance.
    pub fn provenance(&self) -> Option<&Provenance> {
        self.provenance.as_ref()
    }

    /// [`provenance`](Self::provenance) as one JSON object (digests as hex), the form the C and Python APIs
    /// give and `tessera inspect --json` prints under `"provenance"`.
    pub fn provenance_json(&self) -> Option<String> {
        self.provenance.as_ref().map(|p| serde_json::to_string(p).expect("provenance encodes as JSON"))
    }

    /// Whether the model runs on the GPU (then its runs take turns; see the crate documentation).
    pub fn is_gpu(&self) -> bool {
        self.largest().program.is_gpu()
    }

    /// The GPU (CUDA device ordinal) a GPU model was loaded on and runs on: 0 from [`load`](Self::load) and
    /// [`from_bytes`](Self::from_bytes), the one asked for from [`load_on_gpu`](Self::load_on_gpu) and
    /// [`from_bytes_on_gpu`](Self::from_bytes_on_gpu); `None` for a host model.
    pub fn gpu(&self) -> Option<usize> {
        self.gpu
    }

    /// Host memory of one session (activations and scratch), allocated once per concurrent run; for a batched
    /// model, its largest plan's (each plan has its own sessions).
    pub fn session_bytes(&self) -> u64 {
        self.plans.iter().map(|p| p.program.session_bytes()).max().unwrap_or(0)
    }

    /// Host memory of the weights, shared by every run. A batched model's plans share one copy (the file holds
    /// them once), counted once.
    pub fn weight_bytes(&self) -> usize {
        let plans = &self.plans;
        let first_of_its_copy = |i: usize| !plans[..i].iter().any(|q| q.program.shares_constants_with(&plans[i].program));
        (0..plans.len()).filter(|&i| first_of_its_copy(i)).map(|i| plans[i].program.constant_bytes()).sum()
    }

    /// Whether every plan of a batched model uses one copy of the weights (host memory, or for GPU plans device
    /// memory); true for a model of one plan.
    pub fn plans_share_weights(&self) -> bool {
        self.plans.iter().all(|p| p.program.shares_constants_with(&self.plans[0].program))
    }

    /// Sessions allocated so far (at least 1 per plan): the largest number of runs that were in flight at
    /// once, or more after [`reserve_sessions`](Self::reserve_sessions), summed over a batched model's plans.
    /// Counts only idle sessions while runs are in flight.
    pub fn session_count(&self) -> usize {
        self.plans.iter().map(|p| p.idle().len()).sum()
    }

    /// Allocates sessions up front until there are `n` (per plan, for a batched model), so that up to `n`
    /// simultaneous runs allocate no activation memory (a server sizing its pool to its worker threads, say).
    pub fn reserve_sessions(&self, n: usize) -> Result<(), Error> {
        for p in &self.plans {
            while p.idle().len() < n {
                let s = Session::new(p.program.clone()).map_err(|e| Error::new(ErrorKind::Load, e.0))?;
                p.idle().push(s);
            }
        }
        Ok(())
    }

    /// Runs the model on `inputs` (every input by name, once) and returns every output, in
    /// [`outputs`](Self::outputs) order. A batched model takes any batch up to its largest plan's and returns
    /// outputs of that batch.
    pub fn run(&self, inputs: &[(&str, TensorView<'_>)]) -> Result<Vec<Tensor>, Error> {
        let (d, inputs) = self.bind_inputs(inputs)?;
        let Some(d) = d else {
            return self.with_session(0, |s| s.run_bytes(&inputs));
        };
        let plan = &self.plans[d.plan];
        let padded: Vec<Cow<'_, [u8]>> = inputs.iter().zip(&plan.inputs).map(|(b, info)| batch::pad(&d, b, info.size_bytes())).collect();
        let refs: Vec<&[u8]> = padded.iter().map(|c| c.as_ref()).collect();
        let out = self.with_session(d.plan, |s| s.run_bytes(&refs))?;
        Ok(out.into_iter().map(|t| batch::slice(&d, t)).collect())
    }

    /// Runs the model on `inputs` (every input by name, once), writing the outputs named in `outputs` into
    /// the caller's buffers (each of its output's exact dtype and shape, a batched model's with the run's
    /// batch); outputs not named are computed but not copied.
    pub fn run_into(&self, inputs: &[(&str, TensorView<'_>)], outputs: &mut [(&str, TensorViewMut<'_>)]) -> Result<(), Error> {
        let (d, inputs) = self.bind_inputs(inputs)?;
        let mut outs = self.bind_outputs(outputs, d.as_ref())?;
        let Some(d) = d.filter(|d| d.pads()) else {
            return self.with_session(d.map_or(0, |d| d.plan), |s| s.run_into(&inputs, &mut outs));
        };
        // The plan is larger than the run: padded inputs in, the plan's whole outputs into buffers of ours,
        // then the run's rows out of them.
        let plan = &self.plans[d.plan];
        let padded: Vec<Cow<'_, [u8]>> = inputs.iter().zip(&plan.inputs).map(|(b, info)| batch::pad(&d, b, info.size_bytes())).collect();
        let refs: Vec<&[u8]> = padded.iter().map(|c| c.as_ref()).collect();
        let mut full: Vec<Option<Vec<u8>>> = outs.iter().zip(&plan.outputs).map(|(o, info)| o.as_ref().map(|_| vec![0u8; info.size_bytes()])).collect();
        let mut full_refs: Vec<Option<&mut [u8]>> = full.iter_mut().map(|f| f.as_deref_mut()).collect();
        self.with_session(d.plan, |s| s.run_into(&refs, &mut full_refs))?;
        for (dst, src) in outs.iter_mut().zip(&full) {
            if let (Some(dst), Some(src)) = (dst, src) {
                dst.copy_from_slice(&src[..dst.len()]);
            }
        }
        Ok(())
    }

    /// Runs `f` on an idle session of plan `plan` (a new one when none is idle), then returns the session to
    /// the pool. A session whose run panicked is dropped, not reused.
    pub(crate) fn with_session<R>(&self, plan: usize, f: impl FnOnce(&mut Session) -> Result<R, RuntimeError>) -> Result<R, Error> {
        let p = &self.plans[plan];
        let taken = p.idle().pop();
        let mut session = match taken {
            Some(s) => s,
            None => Session::new(p.program.clone()).map_err(|e| Error::new(ErrorKind::Load, e.0))?,
        };
        // A GPU run binds its GPU's context to this thread as it goes; the caller keeps its own.
        let result = device::keeping_callers_context(|| f(&mut session));
        p.idle().push(session);
        result.map_err(|e| Error::new(ErrorKind::Run, e.0))
    }

    /// The inputs' bytes in model order, after checking names, dtypes, shapes and lengths; for a batched model
    /// also the plan that serves them ([`batch::dispatch`]).
    fn bind_inputs<'a>(&self, given: &[(&str, TensorView<'a>)]) -> Result<(Option<batch::Dispatch>, Vec<&'a [u8]>), Error> {
        let fail = |msg: String| Error::new(ErrorKind::Input, format!("model '{}': {msg}", self.name()));
        let inputs = self.inputs();
        let mut bound: Vec<Option<(&'a [u8], DType, &[usize])>> = vec![None; inputs.len()];
        for (name, view) in given {
            let Some(i) = inputs.iter().position(|d| d.name == *name) else {
                return Err(fail(format!("no input '{name}' (inputs: {})", names(inputs))));
            };
            if bound[i].is_some() {
                return Err(fail(format!("input '{name}' is given twice")));
            }
            if self.batches.is_empty() {
                check(&inputs[i], view.dtype, view.shape, view.data.len()).map_err(|m| fail(format!("input '{name}' {m}")))?;
            } else if view.data.len() != view.shape.iter().product::<usize>() * view.dtype.size() {
                let ty = TensorType::new(view.dtype, view.shape.to_vec());
                return Err(fail(format!("input '{name}' ({ty}) needs {} bytes, got {}", ty.size_bytes(), view.data.len())));
            }
            bound[i] = Some((view.data, view.dtype, view.shape));
        }
        let missing: Vec<String> = inputs.iter().zip(&bound).filter(|(_, b)| b.is_none()).map(|(d, _)| format!("'{}' ({})", d.name, d.ty())).collect();
        if !missing.is_empty() {
            return Err(fail(format!("missing input{} {}", if missing.len() > 1 { "s" } else { "" }, missing.join(", "))));
        }
        let bound: Vec<(&'a [u8], DType, &[usize])> = bound.into_iter().flatten().collect();
        if self.batches.is_empty() {
            return Ok((None, bound.into_iter().map(|(b, _, _)| b).collect()));
        }
        let plan_names: Vec<&str> = inputs.iter().map(|d| d.name.as_str()).collect();
        let types: Vec<TensorType> = inputs.iter().map(TensorInfo::ty).collect();
        let shapes: Vec<(DType, &[usize])> = bound.iter().map(|&(_, d, s)| (d, s)).collect();
        let d = batch::dispatch(&self.batches, &plan_names, &types, &shapes).map_err(fail)?;
        Ok((Some(d), bound.into_iter().map(|(b, _, _)| b).collect()))
    }

    /// The outputs a run of `d` (a batched model's) or of the model produces: their infos with the run's batch.
    fn run_outputs(&self, d: Option<&batch::Dispatch>) -> Vec<TensorInfo> {
        match d {
            None => self.outputs().to_vec(),
            Some(d) => self.plans[d.plan]
                .outputs
                .iter()
                .map(|o| {
                    let mut o = o.clone();
                    o.shape[0] = d.batch;
                    o
                })
                .collect(),
        }
    }

    /// One slot per model output: the caller's buffer for those named in `given`, after checking them (for a
    /// batched model, against the run's batch `d`).
    fn bind_outputs<'b>(&self, given: &'b mut [(&str, TensorViewMut<'_>)], d: Option<&batch::Dispatch>) -> Result<Vec<Option<&'b mut [u8]>>, Error> {
        let fail = |msg: String| Error::new(ErrorKind::Output, format!("model '{}': {msg}", self.name()));
        let outputs = self.run_outputs(d);
        let mut bound: Vec<Option<&'b mut [u8]>> = (0..outputs.len()).map(|_| None).collect();
        for (name, view) in given.iter_mut() {
            let Some(o) = outputs.iter().position(|d| d.name == *name) else {
                return Err(fail(format!("no output '{name}' (outputs: {})", names(&outputs))));
            };
            if bound[o].is_some() {
                return Err(fail(format!("output '{name}' is given twice")));
            }
            check(&outputs[o], view.dtype, view.shape, view.data.len()).map_err(|m| fail(format!("output '{name}' {m}")))?;
            bound[o] = Some(&mut *view.data);
        }
        Ok(bound)
    }

    /// The plan a device run uses: a batched model's plan whose batch size is exactly the inputs' (device
    /// memory is not padded here), else the one plan; with that plan's inputs and outputs.
    pub(crate) fn device_plan(&self, given: &[(&str, &[usize])]) -> Result<(usize, &[TensorInfo], &[TensorInfo]), Error> {
        if self.batches.is_empty() {
            return Ok((0, &self.plans[0].inputs, &self.plans[0].outputs));
        }
        let lead = given.first().and_then(|(_, s)| s.first().copied()).unwrap_or(0);
        let Some(p) = self.batches.iter().position(|&b| b == lead) else {
            return Err(Error::new(
                ErrorKind::Input,
                format!(
                    "model '{}': a device run of a batched model takes one of its planned batch sizes ({}) exactly, got {lead} (pad on the device, or run from host memory)",
                    self.name(),
                    tessera_kernels::artifact::batched::list(&self.batches)
                ),
            ));
        };
        Ok((p, &self.plans[p].inputs, &self.plans[p].outputs))
    }
}

/// Why a buffer of `dtype`, `shape` and `len` bytes cannot stand for `want`, if it cannot.
pub(crate) fn check(want: &TensorInfo, dtype: DType, shape: &[usize], len: usize) -> Result<(), String> {
    let ty = want.ty();
    if dtype != want.dtype || shape != want.shape.as_slice() {
        return Err(format!("must be {ty}, got {}", TensorType::new(dtype, shape.to_vec())));
    }
    if len != want.size_bytes() {
        return Err(format!("({ty}) needs {} bytes, got {len}", want.size_bytes()));
    }
    Ok(())
}

pub(crate) fn names(list: &[TensorInfo]) -> String {
    list.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", ")
}
