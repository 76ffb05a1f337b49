//! Tensors from other frameworks through DLPack (the `__dlpack__` / `__dlpack_device__` protocol that
//! PyTorch, CuPy, JAX and NumPy all implement): read in place, never copied.
//!
//! A consumer calls `x.__dlpack__(...)`, gets a capsule named `dltensor` holding a `DLManagedTensor`, renames
//! the capsule `used_dltensor` (so it is not released twice) and calls the tensor's deleter when it is done
//! with the memory. [`Borrowed`] does that on drop. Only C-contiguous tensors (strides absent or row-major) of a
//! dtype tessera models take are accepted; anything else is refused with the reason, never silently copied.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::ffi::c_void;
use tessera_runtime::DType;

use crate::Error;

/// `DLDeviceType` values tessera reads from.
pub const DL_CPU: i32 = 1;
pub const DL_CUDA: i32 = 2;
pub const DL_CUDA_HOST: i32 = 3;

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// Where a DLPack tensor lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Host,
    /// GPU `id`.
    Cuda(i32),
}

/// A DLPack tensor taken from its producer, its memory valid until this is dropped (which calls the
/// producer's deleter; drop it with the GIL held: deleters of Python producers touch Python objects).
pub struct Borrowed {
    managed: *mut DLManagedTensor,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub place: Place,
}

// SAFETY: the tensor is only read (or written, for outputs) while the call that borrowed it runs, and
// released on drop under the GIL; the pointer is not shared.
unsafe impl Send for Borrowed {}

impl Drop for Borrowed {
    fn drop(&mut self) {
        // SAFETY: `managed` came from a `dltensor` capsule we renamed, so we own its release.
        unsafe {
            if let Some(deleter) = (*self.managed).deleter {
                deleter(self.managed);
            }
        }
    }
}

impl Borrowed {
    /// The tensor's bytes' address (data plus byte offset).
    pub fn address(&self) -> u64 {
        // SAFETY: a live managed tensor (see the type's documentation).
        unsafe { ((*self.managed).dl_tensor.data as u64) + (*self.managed).dl_tensor.byte_offset }
    }

    /// The size of the tensor's bytes.
    pub fn size_bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }

    /// The host bytes of a host tensor.
    ///
    /// # Safety
    /// The producer's memory stays valid and unwritten for `'a` (while `self` lives and the run reads it).
    pub unsafe fn host_bytes<'a>(&self) -> &'a [u8] {
        let n = self.size_bytes();
        if n == 0 {
            return &[];
        }
        std::slice::from_raw_parts(self.address() as *const u8, n)
    }

    /// The host bytes of a host tensor, writable.
    ///
    /// # Safety
    /// As [`host_bytes`](Self::host_bytes), and nothing else reads or writes the memory during the run.
    pub unsafe fn host_bytes_mut<'a>(&self) -> &'a mut [u8] {
        let n = self.size_bytes();
        if n == 0 {
            return &mut [];
        }
        std::slice::from_raw_parts_mut(self.address() as *mut u8, n)
    }
}

/// Whether `value` speaks DLPack (and is not a NumPy array, which the NumPy path reads directly).
pub fn is_dlpack(value: &Bound<'_, PyAny>) -> bool {
    value.hasattr("__dlpack__").unwrap_or(false) && value.hasattr("__dlpack_device__").unwrap_or(false)
}

/// The tessera dtype of a DLPack data type.
fn dtype_of(t: DLDataType) -> Option<DType> {
    if t.lanes != 1 {
        return None;
    }
    Some(match (t.code, t.bits) {
        (2, 32) => DType::F32,
        (2, 16) => DType::F16,
        (4, 16) => DType::BF16,
        (0, 64) => DType::I64,
        (0, 32) => DType::I32,
        (6, 8) => DType::Bool,
        _ => return None,
    })
}

/// Where `value` (the tensor `what` names in errors) lives, from its `__dlpack_device__` (nothing is taken).
pub fn place_of(what: &str, value: &Bound<'_, PyAny>) -> PyResult<Place> {
    let (device_type, device_id): (i32, i32) = value.call_method0("__dlpack_device__")?.extract()?;
    match device_type {
        DL_CPU | DL_CUDA_HOST => Ok(Place::Host),
        DL_CUDA => Ok(Place::Cuda(device_id)),
        other => Err(Error::new_err(format!("{what} is on DLPack device type {other}: tessera reads host memory and CUDA GPUs"))),
    }
}

/// Takes `value` (the tensor `what` names in errors) through its `__dlpack__`.
///
/// Host tensors are asked for with no stream. CUDA tensors with the consumer's `stream` (the CUstream the run
/// is ordered on: the producer makes its pending writes visible to it), or with `stream=-1` (no
/// synchronization from the producer) when there is none: the caller then synchronizes the device before
/// reading them ([`crate`]'s run does).
pub fn borrow(py: Python<'_>, what: &str, value: &Bound<'_, PyAny>, stream: Option<u64>) -> PyResult<Borrowed> {
    let place = place_of(what, value)?;
    let capsule = if place == Place::Host {
        value.call_method0("__dlpack__")?
    } else {
        let kwargs = PyDict::new(py);
        match stream {
            Some(s) => kwargs.set_item("stream", s)?,
            None => kwargs.set_item("stream", -1)?,
        }
        value.call_method("__dlpack__", (), Some(&kwargs))?
    };
    // SAFETY: `capsule` is a live object; GetPointer checks its name and type, and fails (setting a Python
    // error) for anything that is not a `dltensor` capsule.
    let managed = unsafe { pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dltensor".as_ptr()) } as *mut DLManagedTensor;
    if managed.is_null() {
        let cause = PyErr::take(py).map(|e| e.to_string()).unwrap_or_default();
        return Err(Error::new_err(format!("{what}: __dlpack__ did not return an unused DLPack capsule ({cause})")));
    }
    // From here we own the tensor: rename the capsule so its destructor leaves it alone, and release it on drop.
    // SAFETY: a capsule we just read; the new name is a static string.
    if unsafe { pyo3::ffi::PyCapsule_SetName(capsule.as_ptr(), c"used_dltensor".as_ptr()) } != 0 {
        return Err(PyErr::take(py).unwrap_or_else(|| PyException::new_err("PyCapsule_SetName failed")));
    }
    // SAFETY: the producer's tensor, valid until its deleter runs (when `borrowed` drops).
    let t = unsafe { &(*managed).dl_tensor };
    let mut borrowed = Borrowed { managed, dtype: DType::F32, shape: Vec::new(), place };
    let ndim = usize::try_from(t.ndim).map_err(|_| Error::new_err(format!("{what}: DLPack ndim {} is negative", t.ndim)))?;
    // SAFETY: DLPack gives `ndim` shape entries (and `ndim` strides when strides is not null).
    let shape: &[i64] = if ndim == 0 { &[] } else { unsafe { std::slice::from_raw_parts(t.shape, ndim) } };
    borrowed.shape = shape.iter().map(|&d| usize::try_from(d).map_err(|_| Error::new_err(format!("{what}: DLPack dimension {d} is negative")))).collect::<PyResult<_>>()?;
    borrowed.dtype = dtype_of(t.dtype).ok_or_else(|| {
        Error::new_err(format!(
            "{what}: DLPack dtype (code {}, {} bits, {} lanes) is not one tessera models take (float32, float16, bfloat16, int64, int32, bool)",
            t.dtype.code, t.dtype.bits, t.dtype.lanes
        ))
    })?;
    if !t.strides.is_null() && ndim > 0 {
        // SAFETY: as above.
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let mut expect = 1i64;
        for (&dim, &stride) in borrowed.shape.iter().zip(strides).rev() {
            if dim > 1 && stride != expect {
                return Err(Error::new_err(format!(
                    "{what} is not C-contiguous (shape {:?}, strides {strides:?} elements): tessera reads tensors in place, so make it contiguous first (torch: .contiguous())",
                    borrowed.shape
                )));
            }
            expect *= dim as i64;
        }
    }
    // Which GPU a CUDA tensor is on is checked against the model's before it is taken (the crate's `gpu_tensor`).
    Ok(borrowed)
}
