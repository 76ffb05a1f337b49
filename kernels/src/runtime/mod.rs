//! The runtime: loads modules and artifacts and executes them. No compiler, no tuning, no initialization work
//! beyond loading.

use tessera_stages::backend::{Module, ModuleFormat};

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
        ModuleFormat::SharedObject => Err(RuntimeError(format!("module of backend {}: shared objects are not loadable yet", m.backend))),
        ModuleFormat::GemmPlan => Err(RuntimeError(format!("module of backend {}: gemm plans are not loadable yet", m.backend))),
    }
}
