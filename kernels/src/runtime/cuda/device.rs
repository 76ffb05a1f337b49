//! The process's GPUs: one CUDA context per GPU (the device's primary context), made when first used, and
//! their descriptions.
//!
//! Which GPU a thread works on is that thread's current GPU: 0, or the one [`on`] sets around a call.
//! Everything that opens device state (loading a module, making an engine, measuring a function, copying
//! a tensor) does it in the current GPU's context and keeps that context, so an engine made on GPU 1 runs
//! on GPU 1 from whichever thread calls it. This is the CUDA runtime's `cudaSetDevice` model, scoped.

use super::libs;
use super::CudaError;
use cudarc::driver::{result, sys, CudaContext};
use std::cell::Cell;
use std::sync::{Arc, OnceLock};

/// What a GPU is, for reports and tune keys (the stages' GPU device fingerprint).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    /// `sm_90` for compute capability 9.0.
    pub arch: String,
    pub sm_count: i32,
    pub memory_bytes: usize,
    pub l2_bytes: i32,
    /// Peak SM clock in kHz (parts of one name can be clocked differently, e.g. by power caps).
    pub clock_khz: i32,
    /// The driver's CUDA version, `major.minor`.
    pub driver_cuda: String,
}

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// This thread's current GPU (0 unless inside [`on`]).
pub fn current() -> usize {
    CURRENT.with(|c| c.get())
}

/// Runs `f` with GPU `ordinal` as this thread's current GPU, and restores the one before afterwards (also
/// when `f` panics). Whether that GPU exists is checked by what `f` opens on it.
pub fn on<R>(ordinal: usize, f: impl FnOnce() -> R) -> R {
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(ordinal)));
    f()
}

/// How many GPUs the CUDA driver sees, or why it sees none (no driver, a driver too old...).
pub fn count() -> Result<usize, CudaError> {
    static COUNT: OnceLock<Result<usize, CudaError>> = OnceLock::new();
    COUNT
        .get_or_init(|| {
            libs::driver()?;
            match CudaContext::device_count() {
                Ok(n) if n > 0 => Ok(n as usize),
                Ok(_) => Err(CudaError::Unavailable("the CUDA driver sees no GPU".to_string())),
                Err(e) => Err(CudaError::Unavailable(format!("the CUDA driver cannot list GPUs: {e}"))),
            }
        })
        .clone()
}

/// The context of GPU `ordinal`, or why there is none (no driver, no such device...).
pub fn context_of(ordinal: usize) -> Result<Arc<CudaContext>, CudaError> {
    static CONTEXTS: OnceLock<Vec<OnceLock<Result<Arc<CudaContext>, CudaError>>>> = OnceLock::new();
    let n = count()?;
    if ordinal >= n {
        return Err(CudaError::NoSuchGpu { ordinal, count: n });
    }
    let slots = CONTEXTS.get_or_init(|| (0..n).map(|_| OnceLock::new()).collect());
    slots[ordinal].get_or_init(|| CudaContext::new(ordinal).map_err(|e| CudaError::Driver(format!("cannot open GPU {ordinal}: {e}")))).clone()
}

/// The context of this thread's current GPU ([`current`]).
pub fn context() -> Result<Arc<CudaContext>, CudaError> {
    context_of(current())
}

/// Runs `f` and then makes the CUDA context that was current on this thread before it current again (none, if
/// none was). Loads and runs bind their GPU's context to the calling thread as they go; an application's own
/// CUDA work (the CUDA runtime API's current device, PyTorch's `torch.cuda.current_device()`) must find its
/// own context after a call into tessera, not the context of the GPU the model is on.
pub fn keeping_callers_context<R>(f: impl FnOnce() -> R) -> R {
    if count().is_err() {
        return f();
    }
    struct Restore(sys::CUcontext);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: the context was current on this thread before (or null: none); primary contexts stay
            // alive for the process (tessera never releases them).
            unsafe {
                let _ = sys::cuCtxSetCurrent(self.0);
            }
        }
    }
    let mut before: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: an out-parameter; the driver is loaded (`count` succeeded).
    let _restore = (unsafe { sys::cuCtxGetCurrent(&mut before) } == sys::CUresult::CUDA_SUCCESS).then_some(Restore(before));
    f()
}

/// A driver error as text naming the GPU it happened on: the one whose context is bound to this thread
/// (every caller binds its context first), else the current GPU.
pub fn error(e: cudarc::driver::DriverError) -> String {
    let mut device: sys::CUdevice = 0;
    // SAFETY: an out-parameter; the driver is loaded (it returned `e`).
    let bound = unsafe { sys::cuCtxGetDevice(&mut device) } == sys::CUresult::CUDA_SUCCESS;
    format!("GPU {}: {e}", if bound { device as usize } else { current() })
}

/// [`error`] as a [`CudaError::Driver`].
pub fn driver(e: cudarc::driver::DriverError) -> CudaError {
    CudaError::Driver(error(e))
}

/// The description of this thread's current GPU.
pub fn info() -> Result<DeviceInfo, CudaError> {
    info_of(current())
}

/// The description of GPU `ordinal`, from the driver's device queries alone: no context is made (making one
/// took about 0.4 s of a warm rebuild's 0.6 s on an H200, and a warm rebuild needs the description only to
/// key its measured stages; bench/compile_times.md).
pub fn info_of(ordinal: usize) -> Result<DeviceInfo, CudaError> {
    let n = count()?;
    if ordinal >= n {
        return Err(CudaError::NoSuchGpu { ordinal, count: n });
    }
    let e = |e: cudarc::driver::DriverError| CudaError::Driver(format!("GPU {ordinal}: {e}"));
    let dev = result::device::get(ordinal as i32).map_err(e)?;
    // SAFETY: `dev` is a device handle the driver (initialised by `count`) just returned.
    let attr = |a| unsafe { result::device::get_attribute(dev, a) }.map_err(e);
    let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let sm_count = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let l2_bytes = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?;
    let clock_khz = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)?;
    let mut version = 0;
    // SAFETY: an out-parameter; the driver is loaded and initialised (`count`).
    unsafe { sys::cuDriverGetVersion(&mut version) }.result().map_err(e)?;
    Ok(DeviceInfo {
        name: result::device::get_name(dev).map_err(e)?,
        arch: format!("sm_{major}{minor}"),
        sm_count,
        // SAFETY: as above.
        memory_bytes: unsafe { result::device::total_mem(dev) }.map_err(e)?,
        l2_bytes,
        clock_khz,
        driver_cuda: format!("{}.{}", version / 1000, (version % 1000) / 10),
    })
}

/// Waits for all work on this thread's current GPU (every stream of its context, the caller's included):
/// what a caller that hands tessera device memory written on a stream tessera does not know does before the
/// run reads it.
pub fn synchronize() -> Result<(), CudaError> {
    let ctx = context()?;
    ctx.bind_to_thread().map_err(driver)?;
    ctx.synchronize().map_err(driver)
}

/// `n` rounded up to 256 bytes, the alignment of every device buffer tessera lays out.
pub fn align256(n: u64) -> u64 {
    n.div_ceil(256) * 256
}

/// Device memory of one GPU, freed on drop.
pub struct DeviceAlloc {
    ctx: Arc<CudaContext>,
    pub ptr: sys::CUdeviceptr,
}

impl DeviceAlloc {
    /// `bytes` (at least 1) of device memory, uninitialized.
    pub fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceAlloc, CudaError> {
        ctx.bind_to_thread().map_err(|e| CudaError::Driver(format!("GPU {}: {e}", ctx.ordinal())))?;
        // SAFETY: a plain allocation, freed by `drop`.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(|e| CudaError::Driver(format!("cannot allocate {bytes} bytes on the GPU: {e}")))?;
        Ok(DeviceAlloc { ctx: ctx.clone(), ptr })
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by `malloc_sync` and freed once; its users synchronized their streams.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}
