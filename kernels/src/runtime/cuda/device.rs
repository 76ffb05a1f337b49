//! The process's GPU: one CUDA context (device 0's primary context), made once, and its description.

use super::libs;
use cudarc::driver::{sys, CudaContext};
use std::sync::{Arc, OnceLock};

/// What a GPU is, for reports and (later) tune keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    /// `sm_90` for compute capability 9.0.
    pub arch: String,
    pub sm_count: i32,
    pub memory_bytes: usize,
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
    let sm_count = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).map_err(e)?;
    let mut version = 0;
    // SAFETY: an out-parameter; the driver is loaded (the context exists).
    unsafe { sys::cuDriverGetVersion(&mut version) }.result().map_err(e)?;
    Ok(DeviceInfo {
        name: ctx.name().map_err(e)?,
        arch: format!("sm_{major}{minor}"),
        sm_count,
        memory_bytes: ctx.total_mem().map_err(e)?,
        driver_cuda: format!("{}.{}", version / 1000, (version % 1000) / 10),
    })
}
