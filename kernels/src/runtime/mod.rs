//! The runtime: loads modules and artifacts and executes them. No compiler, no tuning, no initialization work
//! beyond loading.
//!
//! Each backend's run side is one module here, named after the backend: [`c`] (shared objects) and [`gemm`]
//! (GEMM plans). Two seams keep it open to a GPU runtime: modules load through the format -> loader
//! [`registry`] (a cubin or a CUDA-graph plan becomes one more module here and one more registry line), and
//! every buffer is allocated in `buffer.rs` (device memory becomes one more buffer type there). [`Executable`]
//! only sees loaded modules and pointers.

mod buffer;
mod executable;
mod pool;

pub use buffer::HostBuffer;
pub use c::SharedObject;
pub use executable::Executable;
pub use pool::on_runtime_pool;
pub use registry::{ModuleLoader, Registry};

pub mod c;
pub mod gemm;
pub mod measure;
pub mod registry;

use crate::module::Module;

/// A module failed to load or a call failed; the message names the module, function or file.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RuntimeError(pub String);

/// A module ready to call, whatever its format.
pub trait LoadedModule: Send + Sync {
    /// Calls function `index` (position in the module's `functions`) with the argument pointer array
    /// `[inputs.., outputs.., scratch?]` of the backend calling convention.
    ///
    /// # Safety
    /// Every pointer must point at a live, suitably aligned (64 bytes) buffer of the type the function's
    /// `FunctionInfo` lists, outputs must not alias inputs, and the scratch buffer must have the declared size.
    unsafe fn call(&self, index: usize, args: &[*mut u8]) -> Result<(), RuntimeError>;
}

/// Loads a module by its format, through the built-in [`Registry`].
pub fn load_module(m: &Module) -> Result<Box<dyn LoadedModule>, RuntimeError> {
    Registry::builtin().load(m)
}
