//! GPU models run from device memory the caller owns: `tessera_model_run_device` and what it takes. Inputs
//! are copied device to device into the model's arena and outputs out of it, never through host memory.

use crate::abi::{dtype_of, model_arg, slice_arg, str_arg, TesseraModel};
use crate::guard::{guard, guard_value, invalid, Failure, TesseraStatus};
use std::ffi::c_char;
use tessera_runtime::DeviceTensor;

/// A tensor in GPU memory the caller owns, for `tessera_model_run_device`: `data` is a `CUdeviceptr` on the
/// primary context of the model's GPU (`tessera_model_gpu`; the context the CUDA runtime API uses for that
/// device: `cudaSetDevice(gpu)` then `cudaMalloc`), holding `size_bytes` bytes.
#[repr(C)]
pub struct TesseraDeviceTensor {
    pub name: *const c_char,
    /// A `TesseraDtype`.
    pub dtype: i32,
    pub rank: usize,
    pub shape: *const usize,
    /// A `CUdeviceptr`.
    pub data: u64,
    /// Elements times the element size (checked against `dtype` and `shape`).
    pub size_bytes: usize,
}

/// 1 if the model runs on the GPU (then `tessera_model_run_device` may run it), 0 if on the host or if
/// `model` is null.
///
/// # Safety
/// `model` is null or a live model.
#[no_mangle]
pub unsafe extern "C" fn tessera_model_is_gpu(model: *const TesseraModel) -> i32 {
    // SAFETY: the caller's promise.
    guard_value(0, || unsafe { model.as_ref() }.map(|m| i32::from(m.model.is_gpu())))
}

/// The GPU (CUDA device ordinal) a GPU model was loaded on and runs on: 0 from `tessera_model_load*`, the
/// one asked for from `tessera_model_load*_on_gpu`; -1 for a host model or if `model` is null.
///
/// # Safety
/// `model` is null or a live model.
#[no_mangle]
pub unsafe extern "C" fn tessera_model_gpu(model: *const TesseraModel) -> i32 {
    // SAFETY: the caller's promise.
    guard_value(-1, || unsafe { model.as_ref() }.and_then(|m| m.model.gpu()).map(|g| i32::try_from(g).unwrap_or(i32::MAX)))
}

/// Reads the tensors at `p` (`n` of them) as device tensors of `what`s ("input", "output").
///
/// # Safety
/// `p` points at `n` tensors with NUL-terminated names and `rank` dimensions at `shape`, alive for `'a`.
unsafe fn device_args<'a>(p: *const TesseraDeviceTensor, n: usize, what: &str) -> Result<Vec<(&'a str, DeviceTensor<'a>)>, Failure> {
    // SAFETY (this function): the caller's promises.
    let given = unsafe { slice_arg(p, n, &format!("{what}s")) }?;
    let mut out = Vec::with_capacity(given.len());
    for (i, t) in given.iter().enumerate() {
        let name = unsafe { str_arg(t.name, &format!("the name of {what} {i}")) }?;
        let dtype = dtype_of(t.dtype).ok_or_else(|| invalid(format!("{what} '{name}': {} is not a TesseraDtype", t.dtype)))?;
        let shape = unsafe { slice_arg(t.shape, t.rank, &format!("the shape of {what} '{name}'")) }?;
        let holds = shape.iter().try_fold(dtype.size(), |n, &d| n.checked_mul(d));
        if holds != Some(t.size_bytes) {
            return Err(invalid(format!("{what} '{name}': size_bytes is {}, but {dtype}{shape:?} holds {}", t.size_bytes, holds.map_or("more than fits in size_t".to_string(), |n| n.to_string()))));
        }
        if t.data == 0 && t.size_bytes > 0 {
            return Err(invalid(format!("the data of {what} '{name}' is a null device pointer")));
        }
        out.push((name, DeviceTensor::new(dtype, shape, t.data)));
    }
    Ok(out)
}

/// Runs a GPU model on inputs in device memory (every input once, by name, of its exact dtype and shape),
/// writing the outputs named in `outputs` into the caller's device buffers (others are not copied). Returns
/// when the outputs are written; the inputs must be complete before the call (synchronize the stream that
/// wrote them). The run executes on the model's GPU (`tessera_model_gpu`), from whichever thread calls. A host
/// model is `TESSERA_STATUS_ERROR_INPUT`; a pointer that is not device memory of the model's GPU, or whose
/// allocation is too small, is `TESSERA_STATUS_ERROR_RUN`, naming the tensor.
///
/// # Safety
/// `model` is a live model; `inputs` points at `n_inputs` tensors and `outputs` at `n_outputs`, each with a
/// NUL-terminated name and `rank` dimensions at `shape`; every `data` is device memory the caller owns,
/// holding (inputs) or receiving (outputs) the tensor, which no other work reads or writes during the call,
/// and no output overlaps another buffer of the call.
#[no_mangle]
pub unsafe extern "C" fn tessera_model_run_device(
    model: *const TesseraModel,
    inputs: *const TesseraDeviceTensor,
    n_inputs: usize,
    outputs: *const TesseraDeviceTensor,
    n_outputs: usize,
) -> TesseraStatus {
    guard(|| {
        // SAFETY (this block): the caller's promises above.
        let m = unsafe { model_arg(model) }?;
        let ins = unsafe { device_args(inputs, n_inputs, "input") }?;
        let outs = unsafe { device_args(outputs, n_outputs, "output") }?;
        Ok(unsafe { m.model.run_device(&ins, &outs) }?)
    })
}

/// `tessera_model_run_device` ordered on the caller's CUDA stream `stream` (a `CUstream` or `cudaStream_t` of the
/// primary context of the model's GPU) and asynchronous: the run waits for the work enqueued on `stream` before the call (no
/// synchronization needed after writing the inputs), returns once it is enqueued, and work enqueued on
/// `stream` afterwards sees the outputs. Errors found before enqueueing (names, dtypes, shapes, pointers) are
/// returned; a kernel failure surfaces on `stream`, as for the caller's own kernels. A plan with host steps runs
/// synchronously. A null `stream` is `TESSERA_STATUS_ERROR_INVALID_ARGUMENT` (the legacy default stream is
/// not one tessera can order against: use `tessera_model_run_device`).
///
/// # Safety
/// As `tessera_model_run_device`, with "during the call" extended to "until `stream` reaches the call"; `stream`
/// is a live stream of the primary context of the model's GPU.
#[no_mangle]
pub unsafe extern "C" fn tessera_model_run_device_async(
    model: *const TesseraModel,
    inputs: *const TesseraDeviceTensor,
    n_inputs: usize,
    outputs: *const TesseraDeviceTensor,
    n_outputs: usize,
    stream: *mut std::ffi::c_void,
) -> TesseraStatus {
    guard(|| {
        // SAFETY (this block): the caller's promises above.
        let m = unsafe { model_arg(model) }?;
        if stream.is_null() {
            return Err(invalid("stream is null: give the CUstream to order the run on (tessera_model_run_device runs synchronously)".to_string()));
        }
        let ins = unsafe { device_args(inputs, n_inputs, "input") }?;
        let outs = unsafe { device_args(outputs, n_outputs, "output") }?;
        Ok(unsafe { m.model.run_device_on(&ins, &outs, Some(stream as u64)) }?)
    })
}
