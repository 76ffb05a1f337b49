//! Runs of GPU models from device memory the caller owns (a tensor already on the GPU, written by the
//! caller's own kernels, say): inputs are copied device to device into the model's arena and outputs out
//! of it, on the engine's stream; nothing passes through host memory. Everything is on the model's GPU
//! ([`Model::gpu`]): the caller's memory and streams belong to that GPU's primary context.

use crate::error::{Error, ErrorKind};
use crate::model::{check, names, Model, TensorInfo};
use tessera_kernels::DType;

/// A tensor in GPU memory the caller owns: dtype, shape and a `CUdeviceptr` on the primary context of the
/// model's GPU ([`Model::gpu`]: the context the CUDA runtime API uses for that device, and the one tessera
/// runs the model in; `cudaSetDevice(gpu)` then `cudaMalloc` gives such memory). Nothing is checked when it
/// is made; a run checks the dtype and shape against the model, and the pointer against the driver's record
/// of its allocation.
#[derive(Clone, Copy, Debug)]
pub struct DeviceTensor<'a> {
    dtype: DType,
    shape: &'a [usize],
    ptr: u64,
}

impl<'a> DeviceTensor<'a> {
    pub fn new(dtype: DType, shape: &'a [usize], ptr: u64) -> DeviceTensor<'a> {
        DeviceTensor { dtype, shape, ptr }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &[usize] {
        self.shape
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Model {
    /// Runs a GPU model on inputs in device memory (every input by name, once, of its exact dtype and
    /// shape), writing the outputs named in `outputs` into the caller's device buffers (others are not
    /// copied). The call returns when the outputs are written; the caller must have finished writing the
    /// inputs before calling (synchronize the stream that wrote them: the model's stream does not wait for
    /// it). Runs of one GPU model take turns, as [`run`](Model::run)s do, and execute on the model's GPU
    /// ([`Model::gpu`]), whichever thread calls. A host model is an [`ErrorKind::Input`] error; a pointer that
    /// is not device memory of the model's GPU, or whose allocation is too small for its tensor, is an
    /// [`ErrorKind::Run`] error naming the input or output.
    ///
    /// # Safety
    /// Every pointer is device memory the caller owns, holding (inputs) or receiving (outputs) its tensor,
    /// which no other work reads or writes during the call; no output overlaps another buffer of the call.
    pub unsafe fn run_device(&self, inputs: &[(&str, DeviceTensor<'_>)], outputs: &[(&str, DeviceTensor<'_>)]) -> Result<(), Error> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.run_device_on(inputs, outputs, None) }
    }

    /// [`run_device`](Model::run_device) on the caller's CUDA stream (a `CUstream`, or a `cudaStream_t`: the
    /// same handle, of the primary context of the model's GPU), asynchronously: the run waits for the work the caller
    /// enqueued on `stream` before the call (no synchronization needed after writing the inputs), the call
    /// returns once the run is enqueued, and work the caller enqueues on `stream` afterwards sees the outputs.
    /// `None` is `run_device`. The session's device memory is as for every run (runs of one session queue
    /// behind each other on its stream); a plan with host steps (a mixed host/GPU plan) runs synchronously.
    ///
    /// # Safety
    /// As [`run_device`](Model::run_device), with "during the call" extended to "until `stream` reaches the
    /// point of the call"; `stream` is a live stream of the primary context of the model's GPU
    /// ([`Model::gpu`]).
    pub unsafe fn run_device_on(&self, inputs: &[(&str, DeviceTensor<'_>)], outputs: &[(&str, DeviceTensor<'_>)], stream: Option<u64>) -> Result<(), Error> {
        if !self.is_gpu() {
            return Err(Error::new(ErrorKind::Input, format!("model '{}' runs on the host: device pointers are for GPU artifacts (give host memory to run or run_into)", self.name())));
        }
        let shapes: Vec<(&str, &[usize])> = inputs.iter().map(|(n, t)| (*n, t.shape())).collect();
        let (plan, plan_inputs, plan_outputs) = self.device_plan(&shapes)?;
        let ins = self.bind_device(inputs, plan_inputs, true)?.into_iter().collect::<Option<Vec<u64>>>();
        let Some(ins) = ins else {
            let missing: Vec<String> = plan_inputs.iter().filter(|d| !inputs.iter().any(|(n, _)| *n == d.name)).map(|d| format!("'{}'", d.name)).collect();
            return Err(Error::new(ErrorKind::Input, format!("model '{}': missing input{} {}", self.name(), if missing.len() > 1 { "s" } else { "" }, missing.join(", "))));
        };
        let outs = self.bind_device(outputs, plan_outputs, false)?;
        // SAFETY: the caller's promise, passed on.
        self.with_session(plan, |s| unsafe { s.run_device_on(&ins, &outs, stream) })
    }

    /// Per model input (or output) of `list` (the plan's), the pointer given for it, after checking names,
    /// dtypes and shapes.
    fn bind_device(&self, given: &[(&str, DeviceTensor<'_>)], list: &[TensorInfo], inputs: bool) -> Result<Vec<Option<u64>>, Error> {
        let (kind, what) = if inputs { (ErrorKind::Input, "input") } else { (ErrorKind::Output, "output") };
        let fail = |msg: String| Error::new(kind, format!("model '{}': {msg}", self.name()));
        let mut bound: Vec<Option<u64>> = vec![None; list.len()];
        for (name, t) in given {
            let Some(i) = list.iter().position(|d| d.name == *name) else {
                return Err(fail(format!("no {what} '{name}' ({what}s: {})", names(list))));
            };
            if bound[i].is_some() {
                return Err(fail(format!("{what} '{name}' is given twice")));
            }
            // A device tensor's size is its type's: only dtype and shape can disagree.
            check(&list[i], t.dtype, t.shape, list[i].size_bytes()).map_err(|m| fail(format!("{what} '{name}' {m}")))?;
            bound[i] = Some(t.ptr);
        }
        Ok(bound)
    }
}

/// Makes GPU `gpu`'s primary context the calling thread's current CUDA context: what `cudaSetDevice(gpu)`
/// does for the CUDA runtime API (and so for PyTorch's `torch.cuda.current_device()`). For bindings that hand
/// tessera tensors through an API reading the current device: PyTorch exports a CUDA tensor through DLPack
/// only while its GPU is the current one (Python's run makes the model's GPU current first, inside
/// [`keeping_callers_gpu`]). An [`ErrorKind::Run`] error where there is no usable GPU, or no GPU `gpu` (the
/// message names it).
pub fn make_gpu_current(gpu: usize) -> Result<(), Error> {
    let ctx = tessera_kernels::runtime::cuda::device::context_of(gpu).map_err(|e| Error::new(ErrorKind::Run, e))?;
    ctx.bind_to_thread().map_err(|e| Error::new(ErrorKind::Run, format!("GPU {gpu}: {e}")))
}

/// Runs `f`, then gives the calling thread back the CUDA context that was current before (none, if none
/// was). Every load and run of a [`Model`] does this itself, so the caller's current device (the CUDA
/// runtime's, PyTorch's) is the same after a call into tessera as before; bindings that make a GPU current
/// themselves ([`make_gpu_current`]) wrap that and the run in it.
pub fn keeping_callers_gpu<R>(f: impl FnOnce() -> R) -> R {
    tessera_kernels::runtime::cuda::device::keeping_callers_context(f)
}

/// Waits for all work on GPU 0, every stream included: [`synchronize_gpu_of`]`(0)`, kept for callers of
/// models loaded on GPU 0 ([`Model::load`]).
pub fn synchronize_gpu() -> Result<(), Error> {
    synchronize_gpu_of(0)
}

/// Waits for all work on GPU `gpu` (a CUDA device ordinal, as [`Model::gpu`] gives), every stream of its
/// primary context included: for callers whose device inputs were written on a stream they cannot hand
/// tessera (Python's DLPack path synchronizes the model's GPU so before a device run). An
/// [`ErrorKind::Run`] error where there is no usable GPU, or no GPU `gpu` (the message names it).
pub fn synchronize_gpu_of(gpu: usize) -> Result<(), Error> {
    use tessera_kernels::runtime::cuda::device;
    device::keeping_callers_context(|| {
        device::context_of(gpu)?;
        device::on(gpu, device::synchronize)
    })
    .map_err(|e| Error::new(ErrorKind::Run, e))
}
