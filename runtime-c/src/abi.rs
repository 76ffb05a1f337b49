//! The exported functions and the types they take. Each body runs in `guard`, which reports failures and
//! panics as a status; pointers from the caller are checked for null before use.

use crate::guard::{guard, guard_value, invalid, last_error, Failure, TesseraStatus};
use std::ffi::{c_char, c_void, CStr, CString};
use tessera_runtime::{DType, Model, TensorInfo, TensorView, TensorViewMut};

/// Element types, as the `dtype` fields hold them (`int32_t`, so that any value a caller passes is defined
/// behaviour: an unknown one is an error).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TesseraDtype {
    F32 = 0,
    F16 = 1,
    Bf16 = 2,
    I64 = 3,
    I32 = 4,
    /// One byte per element, 0 or 1.
    Bool = 5,
}

const DTYPES: [(TesseraDtype, DType); 6] = [
    (TesseraDtype::F32, DType::F32),
    (TesseraDtype::F16, DType::F16),
    (TesseraDtype::Bf16, DType::BF16),
    (TesseraDtype::I64, DType::I64),
    (TesseraDtype::I32, DType::I32),
    (TesseraDtype::Bool, DType::Bool),
];

fn dtype_code(d: DType) -> i32 {
    DTYPES.iter().find(|(_, x)| *x == d).map(|(c, _)| *c as i32).expect("every dtype has a code")
}

pub(crate) fn dtype_of(code: i32) -> Option<DType> {
    DTYPES.iter().find(|(c, _)| *c as i32 == code).map(|(_, d)| *d)
}

/// An input or output of a model: strings and shape live as long as the model.
#[repr(C)]
pub struct TesseraTensorInfo {
    pub name: *const c_char,
    /// A `TesseraDtype`.
    pub dtype: i32,
    pub rank: usize,
    /// `rank` dimensions.
    pub shape: *const usize,
    /// Elements times the element size: the bytes a buffer for it holds.
    pub size_bytes: usize,
}

/// An input of a run: the caller's bytes (little-endian, row-major), borrowed for the call.
#[repr(C)]
pub struct TesseraTensor {
    pub name: *const c_char,
    /// A `TesseraDtype`.
    pub dtype: i32,
    pub rank: usize,
    pub shape: *const usize,
    pub data: *const c_void,
    pub size_bytes: usize,
}

/// An output of a run: the caller's buffer, written by the call.
#[repr(C)]
pub struct TesseraTensorMut {
    pub name: *const c_char,
    /// A `TesseraDtype`.
    pub dtype: i32,
    pub rank: usize,
    pub shape: *const usize,
    pub data: *mut c_void,
    pub size_bytes: usize,
}

/// What an input or output's `TesseraTensorInfo` points into.
struct Info {
    name: CString,
    dtype: i32,
    shape: Vec<usize>,
    size_bytes: usize,
}

impl Info {
    fn new(d: &TensorInfo) -> Info {
        // Names come from an ONNX graph or a fixture and hold no NUL; one that did would show as a space.
        Info { name: CString::new(d.name.replace('\0', " ")).unwrap_or_default(), dtype: dtype_code(d.dtype), shape: d.shape.clone(), size_bytes: d.size_bytes() }
    }

    fn c(&self) -> TesseraTensorInfo {
        TesseraTensorInfo { name: self.name.as_ptr(), dtype: self.dtype, rank: self.shape.len(), shape: self.shape.as_ptr(), size_bytes: self.size_bytes }
    }
}

/// A loaded model (opaque). Free it with `tessera_model_free`.
pub struct TesseraModel {
    pub(crate) model: Model,
    name: CString,
    inputs: Vec<Info>,
    outputs: Vec<Info>,
    /// The provenance as JSON, made once at load so the pointer handed out lives as long as the model.
    provenance: Option<CString>,
}

impl TesseraModel {
    fn new(model: Model) -> TesseraModel {
        let name = CString::new(model.name().replace('\0', " ")).unwrap_or_default();
        let inputs = model.inputs().iter().map(Info::new).collect();
        let outputs = model.outputs().iter().map(Info::new).collect();
        // JSON escapes control characters, NUL included: the text holds none.
        let provenance = model.provenance_json().map(|j| CString::new(j).unwrap_or_default());
        TesseraModel { model, name, inputs, outputs, provenance }
    }
}

/// # Safety
/// `p` is null or points at a NUL-terminated string that outlives `'a`.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    // SAFETY: non-null, NUL-terminated (the caller's promise).
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| invalid(format!("{what} is not UTF-8")))
}

/// # Safety
/// `p` is null or points at `len` readable `T`s that outlive `'a`.
pub(crate) unsafe fn slice_arg<'a, T>(p: *const T, len: usize, what: &str) -> Result<&'a [T], Failure> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid(format!("{what} is null but its length is {len}")));
    }
    // SAFETY: non-null, `len` elements (the caller's promise).
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// # Safety
/// `m` is null or a model from `tessera_model_load*` not yet freed.
pub(crate) unsafe fn model_arg<'a>(m: *const TesseraModel) -> Result<&'a TesseraModel, Failure> {
    // SAFETY: the caller's promise.
    unsafe { m.as_ref() }.ok_or_else(|| invalid("model is null"))
}

fn store_model(out: *mut *mut TesseraModel, load: impl FnOnce() -> Result<Model, Failure>) -> Result<(), Failure> {
    if out.is_null() {
        return Err(invalid("out (where the model goes) is null"));
    }
    let model = load()?;
    // SAFETY: `out` is non-null and writable (the caller's promise).
    unsafe { *out = Box::into_raw(Box::new(TesseraModel::new(model))) };
    Ok(())
}

/// The library's version, e.g. "0.1.0" (a static string).
#[no_mangle]
pub extern "C" fn tessera_version() -> *const c_char {
    static VERSION: &CStr = match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => c"unknown",
    };
    VERSION.as_ptr()
}

/// The message of this thread's last failed call (an empty string before any): valid until this thread's
/// next failing call. Names the file, model, input or output at fault.
#[no_mangle]
pub extern "C" fn tessera_last_error() -> *const c_char {
    guard_value(c"".as_ptr(), || Some(last_error()))
}

/// Reads, checks (format, blake3 digest, every index and bound) and loads the artifact at `path` into
/// `*out`. No code of the artifact is loaded before the checks pass. A GPU artifact loads on GPU 0
/// (`tessera_model_load_on_gpu` picks another).
///
/// # Safety
/// `path` is a NUL-terminated string; `out` points at writable memory for one pointer.
#[no_mangle]
pub unsafe extern "C" fn tessera_model_load(path: *const c_char, out: *mut *mut TesseraModel) -> TesseraStatus {
    guard(|| {
        // SAFETY: the caller's promise.
        let path = unsafe { str_arg(path, "path") }?;
        store_model(out, || Ok(Model::load(path)?))
    })
}

/// `tessera_model_load` from `len` bytes in memory (copied; the caller may free them after the call).
///
/// # Safety
/// `bytes` points at `len` readable bytes; `out` points at writable memory for one pointer.
#[no_mangle]
pub unsafe extern "C" fn tessera_model_load_bytes(bytes: *const u8, len: usize, out: *mut *mut TesseraModel) -> TesseraStatus {
    guard(|| {
        // SAFETY: the caller's promise.
        let bytes = unsafe { slice_arg(bytes, len, "bytes") }?;
        store_model(out, || Ok(Model::from_bytes(bytes)?))
    })
}

/// The GPU index `gpu` of a `*_on_gpu` call, refused when negative.
pub(crate) fn gpu_arg(gpu: i32) -> Result<usize, Failure> {
    usize::try_from(gpu).map_err(|_| invalid(format!("gpu is {gpu}: a GPU index (CUDA device ordinal) is 0 or more")))
}

/// `tessera_model_load` of a GPU artifact onto GPU `gpu` (a CUDA device ordinal, as `cudaSetDevice` takes and
/// `CUDA_VISIBLE_DEVICES` renumbers): its weights, memory and CUDA graphs go to that GPU and every run of the
/// model executes there, from any thread. A negative `gpu` is `TESSERA_STATUS_ERROR_INVALID_ARGUMENT`; a GPU
/// the driver does not see, or a host artifact (which runs on no GPU: load it with `tessera_model_load`), is
/// `TESSERA_STATUS_ERROR_LOAD`, the message naming the GPU.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` points at writable memory for one pointer.
#[no_mangle]
pub unsafe extern "C" fn tessera_model_load_on_gpu(path: *const c_char, gpu: i32, out: *mut *mut TesseraModel) -> TesseraStatus {
    guard(|| {
        // SAFETY: the caller's promise.
        let path = unsafe { str_arg(path, "path") }?;
        let gpu = gpu_arg(gpu)?;
        store_model(out, || Ok(Model::load_on_gpu(path, gpu)?))
    })
}

/// `tessera_model_load_on_gpu` from `len` bytes in memory (copied; the caller may free them after the call).
///
/// # Safety
/// `bytes` points at `len` readable bytes; `out` points at writable memory for one pointer.
#[no_mangle]
pub unsafe extern "C" fn tessera_model_load_bytes_on_gpu(bytes: *const u8, len: usize, gpu: i32, out: *mut *mut TesseraModel) -> TesseraStatus {
    guard(|| {
        // SAFETY: the caller's promise.
        let bytes = unsafe { slice_arg(bytes, len, "bytes") }?;
        let gpu = gpu_arg(gpu)?;
        store_model(out, || Ok(Model::from_bytes_on_gpu(bytes, gpu)?))
    })
}

/// Frees a model (null is allowed and does nothing). No run of it may be in flight.
///
/// # Safety
/// `model` is null or a model from `tessera_model_load*` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tessera_model_free(model: *mut TesseraModel) {
    let _ = guard(|| {
        if !model.is_null() {
            // SAFETY: made by `Box::into_raw` in `store_model`, freed once (the caller's promise).
            drop(unsafe { Box::from_raw(model) });
        }
        Ok(())
    });
}

/// The model's name (lives as long as the model); null if `model` is null.
///
/// # Safety
/// `model` is null or a live model.
#[no_mangle]
pub unsafe extern "C" fn tessera_model_name(model: *const TesseraModel) -> *const c_char {
    // SAFETY: the caller's promise.
    guard_value(std::ptr::null(), || unsafe { model.as_ref() }.map(|m| m.name.as_ptr()))
}

/// How the artifact was built, as one JSON object (lives as long as the model): `tessera_version`,
/// `source_revision`, `source` (`kind`, `name`, `digest` as hex), `targets`, `precision`, `costs`, `options`,
/// as `tessera inspect --json` prints under "provenance". Null if `model` is null or the artifact records no
/// provenance (written before tessera recorded it).
///
/// # Safety
/// `model` is null or a live model.
#[no_mangle]
pub unsafe extern "C" fn tessera_model_provenance_json(model: *const TesseraModel) -> *const c_char {
    // SAFETY: the caller's promise.
    guard_value(std::ptr::null(), || unsafe { model.as_ref() }.and_then(|m| m.provenance.as_ref()).map(|p| p.as_ptr()))
}

/// Number of inputs (0 if `model` is null).
///
/// # Safety
/// `model` is null or a live model.
#[no_mangle]
pub unsafe extern "C" fn tessera_model_input_count(model: *const TesseraModel) -> usize {
    // SAFETY: the caller's promise.
    guard_value(0, || unsafe { model.as_ref() }.map(|m| m.inputs.len()))
}

/// Number of outputs (0 if `model` is null).
///
/// # Safety
/// `model` is null or a live model.
#[no_mangle]
pub unsafe extern "C" fn tessera_model_output_count(model: *const TesseraModel) -> usize {
    // SAFETY: the caller's promise.
    guard_value(0, || unsafe { model.as_ref() }.map(|m| m.outputs.len()))
}

fn describe(list: &[Info], index: usize, out: *mut TesseraTensorInfo, what: &str) -> Result<(), Failure> {
    let info = list.get(index).ok_or_else(|| invalid(format!("{what} {index} does not exist (there are {})", list.len())))?;
    if out.is_null() {
        return Err(invalid("out (where the description goes) is null"));
    }
    // SAFETY: non-null and writable (the caller's promise).
    unsafe { *out = info.c() };
    Ok(())
}

/// Describes input `index` (model order) into `*out`.
///
/// # Safety
/// `model` is a live model; `out` points at a writable `TesseraTensorInfo`.
#[no_mangle]
pub unsafe extern "C" fn tessera_model_input(model: *const TesseraModel, index: usize, out: *mut TesseraTensorInfo) -> TesseraStatus {
    // SAFETY: the caller's promise.
    guard(|| describe(&unsafe { model_arg(model) }?.inputs, index, out, "input"))
}

/// Describes output `index` (model order) into `*out`.
///
/// # Safety
/// `model` is a live model; `out` points at a writable `TesseraTensorInfo`.
#[no_mangle]
pub unsafe extern "C" fn tessera_model_output(model: *const TesseraModel, index: usize, out: *mut TesseraTensorInfo) -> TesseraStatus {
    // SAFETY: the caller's promise.
    guard(|| describe(&unsafe { model_arg(model) }?.outputs, index, out, "output"))
}

/// Number of plans of a batched model (compiled with `--batch 1,8`), one per batch size; 0 for a model of one
/// plan (whose inputs have fixed shapes) or if `model` is null. A batched model runs inputs of any batch
/// (leading dimension) up to its largest plan's, on the smallest plan that fits.
///
/// # Safety
/// `model` is null or a live model.
#[no_mangle]
pub unsafe extern "C" fn tessera_model_batch_count(model: *const TesseraModel) -> usize {
    // SAFETY: the caller's promise.
    guard_value(0, || unsafe { model.as_ref() }.map(|m| m.model.batch_sizes().len()))
}

/// The batch size of plan `index` of a batched model (ascending in `index`); 0 for an index out of range, a
/// model of one plan, or a null `model`.
///
/// # Safety
/// `model` is null or a live model.
#[no_mangle]
pub unsafe extern "C" fn tessera_model_batch_size(model: *const TesseraModel, index: usize) -> usize {
    // SAFETY: the caller's promise.
    guard_value(0, || unsafe { model.as_ref() }.and_then(|m| m.model.batch_sizes().get(index).copied()))
}

/// Runs the model: every input once, by name, of its exact dtype and shape (a batched model's with any batch
/// up to its largest plan's, outputs then of that batch); the outputs named in
/// `outputs` are written into their buffers (others are not copied). Callable from many threads at once
/// on one model: each run has its own activation memory, the weights are shared.
///
/// # Safety
/// `model` is a live model; `inputs` points at `n_inputs` tensors and `outputs` at `n_outputs`, each with
/// a NUL-terminated name, `rank` dimensions at `shape` and `size_bytes` bytes at `data` (readable for
/// inputs, writable for outputs, not overlapping any input).
#[no_mangle]
pub unsafe extern "C" fn tessera_model_run(
    model: *const TesseraModel,
    inputs: *const TesseraTensor,
    n_inputs: usize,
    outputs: *mut TesseraTensorMut,
    n_outputs: usize,
) -> TesseraStatus {
    guard(|| {
        // SAFETY (this block): the caller's promises above.
        let m = unsafe { model_arg(model) }?;
        let given = unsafe { slice_arg(inputs, n_inputs, "inputs") }?;
        let mut views = Vec::with_capacity(given.len());
        for (i, t) in given.iter().enumerate() {
            let name = unsafe { str_arg(t.name, &format!("the name of input {i}")) }?;
            let dtype = dtype_of(t.dtype).ok_or_else(|| invalid(format!("input '{name}': {} is not a TesseraDtype", t.dtype)))?;
            let shape = unsafe { slice_arg(t.shape, t.rank, &format!("the shape of input '{name}'")) }?;
            let data = unsafe { slice_arg(t.data.cast::<u8>(), t.size_bytes, &format!("the data of input '{name}'")) }?;
            views.push((name, TensorView::from_bytes(dtype, shape, data)));
        }
        let wanted = unsafe { slice_arg(outputs.cast_const(), n_outputs, "outputs") }?;
        let mut outs = Vec::with_capacity(wanted.len());
        for (i, t) in wanted.iter().enumerate() {
            let name = unsafe { str_arg(t.name, &format!("the name of output {i}")) }?;
            let dtype = dtype_of(t.dtype).ok_or_else(|| invalid(format!("output '{name}': {} is not a TesseraDtype", t.dtype)))?;
            let shape = unsafe { slice_arg(t.shape, t.rank, &format!("the shape of output '{name}'")) }?;
            if t.size_bytes > 0 && t.data.is_null() {
                return Err(invalid(format!("the data of output '{name}' is null but its size is {}", t.size_bytes)));
            }
            let data: &mut [u8] = if t.size_bytes == 0 { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(t.data.cast::<u8>(), t.size_bytes) } };
            outs.push((name, TensorViewMut::from_bytes(dtype, shape, data)));
        }
        Ok(m.model.run_into(&views, &mut outs)?)
    })
}

/// Bytes per element of a `TesseraDtype` (0 for an unknown code).
#[no_mangle]
pub extern "C" fn tessera_dtype_size(dtype: i32) -> usize {
    dtype_of(dtype).map_or(0, DType::size)
}

/// The name of a `TesseraDtype` ("f32", "i64", ...; "?" for an unknown code), a static string.
#[no_mangle]
pub extern "C" fn tessera_dtype_name(dtype: i32) -> *const c_char {
    match dtype_of(dtype) {
        Some(DType::F32) => c"f32",
        Some(DType::F16) => c"f16",
        Some(DType::BF16) => c"bf16",
        Some(DType::I64) => c"i64",
        Some(DType::I32) => c"i32",
        Some(DType::Bool) => c"bool",
        None => c"?",
    }
    .as_ptr()
}
