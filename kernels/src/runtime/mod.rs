//! The runtime: loads modules and artifacts and executes them. No compiler, no tuning, no initialization work
//! beyond loading.
//!
//! Each backend's run side is one module here, named after the backend: [`c`] (shared objects), [`gemm`]
//! (GEMM plans) and [`cuda`] (cubins). Modules load through the format -> loader [`registry`]. An
//! [`Executable`] runs an artifact on one of two engines: host modules are called in turn on host memory;
//! an artifact of GPU modules runs on [`cuda::DeviceEngine`] (device arena, one CUDA graph per model).
//! An executable is a shared [`Program`] (modules, constants) and one [`Session`] (a run's memory): several
//! sessions of one program run one model from several threads at once.

mod buffer;
mod executable;
mod isa;
mod pool;

pub use buffer::HostBuffer;
pub use c::SharedObject;
pub use executable::{Executable, Program, Session};
pub use pool::{on_runtime_pool, set_threads, threads};
pub use registry::{ModuleLoader, Registry};

pub mod c;
pub mod cuda;
pub mod gemm;
pub mod measure;
pub mod registry;

use crate::module::Module;

/// A module failed to load or a call failed; the message names the module, function or file.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RuntimeError(pub String);

/// A module ready to call, whatever its format.
///
/// Calls may come from several threads at once (sessions of one program, each with its own arena and
/// scratch): a module must keep no state that a call writes. The built-in ones keep none (generated C
/// writes only through its arguments; gemm plans read their constants).
pub trait LoadedModule: Send + Sync {
    /// Calls function `index` (position in the module's `functions`) with the argument pointer array
    /// `[inputs.., outputs.., scratch?]` of the backend calling convention.
    ///
    /// # Safety
    /// Every pointer must point at a live, suitably aligned (64 bytes) buffer of the type the function's
    /// `FunctionInfo` lists, outputs must not alias inputs, and the scratch buffer must have the declared size.
    unsafe fn call(&self, index: usize, args: &[*mut u8]) -> Result<(), RuntimeError>;

    /// The module as a GPU module, if it is one (a cubin, a cuBLASLt plan): GPU modules are not called through [`call`](Self::call)
    /// but launched by the GPU engine on its stream.
    fn gpu(&self) -> Option<&dyn cuda::module::GpuModule> {
        None
    }
}

/// Loads a module by its format, through the built-in [`Registry`].
pub fn load_module(m: &Module) -> Result<Box<dyn LoadedModule>, RuntimeError> {
    Registry::builtin().load(m)
}
