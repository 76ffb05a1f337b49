//! The process's GPU: one CUDA context (device 0's primary context), made once, and its description.

use super::libs;
use cudarc::driver::{result, sys, CudaContext};
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

/// The context of GPU 0, or why there is none here (no driver, no device, a driver too old...).
pub fn context() -> Result<Arc<CudaContext>, String> {
    static CTX: OnceLock<Result<Arc<CudaContext>, String>> = OnceLock::new();
    CTX.get_or_init(|| {
        libs::driver()?;
        match CudaContext::device_count() {
            Ok(n) if n > 0 => {}
            Ok(_) => return Err("the CUDA driver sees no GPU".to_string()),
            Err(e) => return Err(format!("the CUDA driver cannot list GPUs: {e}")),
        }
        CudaContext::new(0).map_err(|e| format!("cannot open GPU 0: {e}"))
    })
    .clone()
}

/// The description of GPU 0.
pub fn info() -> Result<DeviceInfo, String> {
    let ctx = context()?;
    let e = |e: cudarc::driver::DriverError| format!("GPU 0: {e}");
    let (major, minor) = ctx.compute_capability().map_err(e)?;
    let attr = |a| ctx.attribute(a).map_err(e);
    let sm_count = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let l2_bytes = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?;
    let clock_khz = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)?;
    let mut version = 0;
    // SAFETY: an out-parameter; the driver is loaded (the context exists).
    unsafe { sys::cuDriverGetVersion(&mut version) }.result().map_err(e)?;
    Ok(DeviceInfo {
        name: ctx.name().map_err(e)?,
        arch: format!("sm_{major}{minor}"),
        sm_count,
        memory_bytes: ctx.total_mem().map_err(e)?,
        l2_bytes,
        clock_khz,
        driver_cuda: format!("{}.{}", version / 1000, (version % 1000) / 10),
    })
}

/// Waits for all work on GPU 0 (every stream of its context, the caller's included): what a caller that
/// hands tessera device memory written on a stream tessera does not know does before the run reads it.
pub fn synchronize() -> Result<(), String> {
    let ctx = context()?;
    ctx.bind_to_thread().map_err(|e| format!("GPU 0: {e}"))?;
    ctx.synchronize().map_err(|e| format!("GPU 0: {e}"))
}

/// `n` rounded up to 256 bytes, the alignment of every device buffer tessera lays out.
pub fn align256(n: u64) -> u64 {
    n.div_ceil(256) * 256
}

/// Device memory of GPU 0, freed on drop.
pub struct DeviceAlloc {
    ctx: Arc<CudaContext>,
    pub ptr: sys::CUdeviceptr,
}

impl DeviceAlloc {
    /// `bytes` (at least 1) of device memory, uninitialized.
    pub fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceAlloc, String> {
        ctx.bind_to_thread().map_err(|e| format!("GPU 0: {e}"))?;
        // SAFETY: a plain allocation, freed by `drop`.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(|e| format!("cannot allocate {bytes} bytes on the GPU: {e}"))?;
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
