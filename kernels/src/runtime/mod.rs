//! The runtime: loads modules and artifacts and executes them. No compiler, no tuning, no initialization work
//! beyond loading.
//!
//! Two seams keep it open to a GPU runtime: module formats dispatch through [`load_module`] (a cubin or a
//! CUDA-graph plan becomes one more arm and one more file beside `so.rs`), and every buffer is allocated in
//! `buffer.rs` (device memory becomes one more buffer type there). [`Executable`] only sees loaded modules and
//! pointers.

mod buffer;
mod executable;
mod pool;
mod so;

pub use buffer::HostBuffer;
pub use executable::Executable;
pub use pool::on_runtime_pool;
pub use so::SharedObject;

pub mod gemm;
pub mod measure;

use crate::module::{Module, ModuleFormat};

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

/// Loads a module by its format.
pub fn load_module(m: &Module) -> Result<Box<dyn LoadedModule>, RuntimeError> {
    match m.format {
        ModuleFormat::SharedObject => Ok(Box::new(so::SharedObject::load(m)?)),
        ModuleFormat::GemmPlan => Ok(Box::new(gemm::load(m)?)),
    }
}
