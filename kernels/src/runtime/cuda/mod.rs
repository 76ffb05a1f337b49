//! The `cuda` run side: cubin modules on an NVIDIA GPU through the CUDA driver API (cudarc, loaded at run
//! time, so this builds and runs on machines without CUDA and says so instead of crashing).
//!
//! - [`libs`]: finding the driver and NVRTC before cudarc opens them.
//! - [`format`]: the cubin module format (a cubin and each function's launches).
//! - [`error`]: [`CudaError`], what goes wrong, by kind.
//! - [`device`]: the process's GPUs: a context per GPU, each thread's current GPU, their descriptions.
//! - [`module`]: a loaded cubin, and what every GPU module gives the engine (launches).
//! - [`blas`]: the cuBLASLt module format and its loader (the `cublas` backend's matmuls).
//! - [`dnn`]: the cuDNN module format and its loader (the `cudnn` backend's fused convolutions).
//! - [`measure`]: timing one function of a GPU module (the tune stage's GPU costs).
//! - [`engine`]: a loaded GPU artifact: device arena, constants uploaded once, a captured CUDA graph replayed
//!   per run, pinned staging buffers.

pub mod blas;
pub mod call;
pub mod library;
pub mod device;
pub mod dnn;
pub mod engine;
pub mod error;
pub mod format;
pub mod libs;
pub mod measure;
pub mod module;

pub use engine::{DeviceEngine, SharedConstants};
pub use error::CudaError;
pub use module::LoadedCubin;

use crate::module::Module;
use crate::runtime::{LoadedModule, RuntimeError};

/// The `cuda` backend's module format: a [`format::CubinModule`], cubins and each function's launches.
pub const FORMAT: crate::module::ModuleFormat = crate::module::ModuleFormat::gpu("cubins");

/// [`FORMAT`] with launches that pass parameter blocks ([`format::ParamBlock`]).
pub const PARAMS_FORMAT: crate::module::ModuleFormat = crate::module::ModuleFormat::gpu("cubins-params");

/// The format before [`FORMAT`], one cubin per module; artifacts that hold it still load.
pub const LEGACY_FORMAT: crate::module::ModuleFormat = crate::module::ModuleFormat::gpu("cubin");


/// The loader of [`FORMAT`], [`PARAMS_FORMAT`] and [`LEGACY_FORMAT`] modules.
pub fn loader(m: &Module) -> Result<Box<dyn LoadedModule>, RuntimeError> {
    Ok(Box::new(LoadedCubin::load(m)?))
}

/// Whether this machine can run GPU artifacts (a driver that sees a GPU); why not, if not. No context is made:
/// making GPU 0's took about 0.4 s on an H200, which a build that only keys its stages by the GPU has no use
/// for (bench/compile_times.md); what opens device state makes its context then.
pub fn available() -> Result<(), CudaError> {
    device::count().map(|_| ())
}
