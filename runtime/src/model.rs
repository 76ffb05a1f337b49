//! A loaded model: the shared program (loaded modules, constants) and a pool of sessions (one run's memory
//! each), so that any number of threads run it at once without copying weights.

use crate::error::{Error, ErrorKind};
use crate::view::{TensorView, TensorViewMut};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use tessera_kernels::artifact::{Artifact, Provenance};
use tessera_kernels::runtime::{Program, RuntimeError, Session};
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

    fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, self.shape.clone())
    }
}

/// A loaded artifact, ready to run from any number of threads (see the crate documentation).
pub struct Model {
    program: Arc<Program>,
    inputs: Vec<TensorInfo>,
    outputs: Vec<TensorInfo>,
    provenance: Option<Provenance>,
    /// Sessions not running now. A run takes one (or makes one when none is idle) and puts it back.
    idle: Mutex<Vec<Session>>,
}

impl Model {
    /// Reads, checks and loads the artifact at `path`. Errors name the file.
    pub fn load(path: impl AsRef<Path>) -> Result<Model, Error> {
        let artifact = Artifact::open(path.as_ref()).map_err(|e| Error::new(ErrorKind::Artifact, e.to_string()))?;
        Self::from_artifact(&artifact)
    }

    /// Reads, checks and loads an artifact held in memory. Errors name it `<memory>`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Model, Error> {
        let artifact = Artifact::read(bytes).map_err(|e| Error::new(ErrorKind::Artifact, e.to_string()))?;
        Self::from_artifact(&artifact)
    }

    fn from_artifact(a: &Artifact) -> Result<Model, Error> {
        let program = Program::load(a).map_err(|e| Error::new(ErrorKind::Load, e.0))?;
        let inputs = program.inputs().map(|(n, t)| TensorInfo::new(n, t)).collect();
        let outputs = program.outputs().map(|(n, t)| TensorInfo::new(n, t)).collect();
        // One session up front: allocation failures show at load, and a first run allocates nothing.
        let first = Session::new(program.clone()).map_err(|e| Error::new(ErrorKind::Load, e.0))?;
        Ok(Model { program, inputs, outputs, provenance: a.provenance.clone(), idle: Mutex::new(vec![first]) })
    }

    /// The model's name (as compiled).
    pub fn name(&self) -> &str {
        self.program.model()
    }

    /// The inputs, in model order.
    pub fn inputs(&self) -> &[TensorInfo] {
        &self.inputs
    }

    /// The outputs, in model order (the order [`run`](Self::run) returns them in).
    pub fn outputs(&self) -> &[TensorInfo] {
        &self.outputs
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
        self.program.is_gpu()
    }

    /// Host memory of one session (activations and scratch), allocated once per concurrent run.
    pub fn session_bytes(&self) -> u64 {
        self.program.session_bytes()
    }

    /// Host memory of the weights, shared by every run.
    pub fn weight_bytes(&self) -> usize {
        self.program.constant_bytes()
    }

    /// Sessions allocated so far (at least 1): the largest number of runs that were in flight at once, or
    /// more after [`reserve_sessions`](Self::reserve_sessions). Counts only idle sessions while runs are in
    /// flight.
    pub fn session_count(&self) -> usize {
        self.idle().len()
    }

    /// Allocates sessions up front until there are `n`, so that up to `n` simultaneous runs allocate no
    /// activation memory (a server sizing its pool to its worker threads, say).
    pub fn reserve_sessions(&self, n: usize) -> Result<(), Error> {
        while self.session_count() < n {
            let s = Session::new(self.program.clone()).map_err(|e| Error::new(ErrorKind::Load, e.0))?;
            self.idle().push(s);
        }
        Ok(())
    }

    /// Runs the model on `inputs` (every input by name, once) and returns every output, in
    /// [`outputs`](Self::outputs) order.
    pub fn run(&self, inputs: &[(&str, TensorView<'_>)]) -> Result<Vec<Tensor>, Error> {
        let inputs = self.bind_inputs(inputs)?;
        self.with_session(|s| s.run_bytes(&inputs))
    }

    /// Runs the model on `inputs` (every input by name, once), writing the outputs named in `outputs` into
    /// the caller's buffers (each of its output's exact dtype and shape); outputs not named are computed
    /// but not copied.
    pub fn run_into(&self, inputs: &[(&str, TensorView<'_>)], outputs: &mut [(&str, TensorViewMut<'_>)]) -> Result<(), Error> {
        let inputs = self.bind_inputs(inputs)?;
        let mut outs = self.bind_outputs(outputs)?;
        self.with_session(|s| s.run_into(&inputs, &mut outs))
    }

    fn idle(&self) -> MutexGuard<'_, Vec<Session>> {
        // A panic while the lock is held cannot leave the vector half-changed (push and pop only).
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on an idle session (a new one when none is idle), then returns the session to the pool. A
    /// session whose run panicked is dropped, not reused.
    pub(crate) fn with_session<R>(&self, f: impl FnOnce(&mut Session) -> Result<R, RuntimeError>) -> Result<R, Error> {
        let taken = self.idle().pop();
        let mut session = match taken {
            Some(s) => s,
            None => Session::new(self.program.clone()).map_err(|e| Error::new(ErrorKind::Load, e.0))?,
        };
        let result = f(&mut session);
        self.idle().push(session);
        result.map_err(|e| Error::new(ErrorKind::Run, e.0))
    }

    /// The inputs' bytes in model order, after checking names, dtypes, shapes and lengths.
    fn bind_inputs<'a>(&self, given: &[(&str, TensorView<'a>)]) -> Result<Vec<&'a [u8]>, Error> {
        let fail = |msg: String| Error::new(ErrorKind::Input, format!("model '{}': {msg}", self.name()));
        let mut bound: Vec<Option<&'a [u8]>> = vec![None; self.inputs.len()];
        for (name, view) in given {
            let Some(i) = self.inputs.iter().position(|d| d.name == *name) else {
                return Err(fail(format!("no input '{name}' (inputs: {})", names(&self.inputs))));
            };
            if bound[i].is_some() {
                return Err(fail(format!("input '{name}' is given twice")));
            }
            check(&self.inputs[i], view.dtype, view.shape, view.data.len()).map_err(|m| fail(format!("input '{name}' {m}")))?;
            bound[i] = Some(view.data);
        }
        let missing: Vec<String> = self.inputs.iter().zip(&bound).filter(|(_, b)| b.is_none()).map(|(d, _)| format!("'{}' ({})", d.name, d.ty())).collect();
        if !missing.is_empty() {
            return Err(fail(format!("missing input{} {}", if missing.len() > 1 { "s" } else { "" }, missing.join(", "))));
        }
        Ok(bound.into_iter().flatten().collect())
    }

    /// One slot per model output: the caller's buffer for those named in `given`, after checking them.
    fn bind_outputs<'b>(&self, given: &'b mut [(&str, TensorViewMut<'_>)]) -> Result<Vec<Option<&'b mut [u8]>>, Error> {
        let fail = |msg: String| Error::new(ErrorKind::Output, format!("model '{}': {msg}", self.name()));
        let mut bound: Vec<Option<&'b mut [u8]>> = (0..self.outputs.len()).map(|_| None).collect();
        for (name, view) in given.iter_mut() {
            let Some(o) = self.outputs.iter().position(|d| d.name == *name) else {
                return Err(fail(format!("no output '{name}' (outputs: {})", names(&self.outputs))));
            };
            if bound[o].is_some() {
                return Err(fail(format!("output '{name}' is given twice")));
            }
            check(&self.outputs[o], view.dtype, view.shape, view.data.len()).map_err(|m| fail(format!("output '{name}' {m}")))?;
            bound[o] = Some(&mut *view.data);
        }
        Ok(bound)
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
