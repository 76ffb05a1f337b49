//! What a backend's compile side hands the runtime: compiled modules and the signatures of their functions.
//!
//! Calling convention shared by every module format: a function takes one array of pointers,
//! `[input_0, .., input_n, output_0, .., output_m, scratch?]`, each pointing at a dense row-major buffer of the
//! type listed in its [`FunctionInfo`]; inputs are boundary activations and lifted constants in the kernel's
//! canonical input order. Functions never allocate per call beyond their declared scratch.

use crate::tensor::TensorType;
use serde::{Deserialize, Serialize};

/// The signature of one compiled function.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionInfo {
    pub symbol: String,
    pub inputs: Vec<TensorType>,
    pub outputs: Vec<TensorType>,
    /// Bytes of scratch memory passed as the last argument (absent when 0).
    pub scratch_bytes: u64,
}

/// How a module's bytes are to be loaded by the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ModuleFormat {
    /// An ELF shared object exporting each function as `void symbol(void* const* args)`.
    SharedObject,
    /// A postcard-encoded [`gemm`-backend plan](crate::runtime::gemm::plan) executed by the runtime's built-in GEMM kernels.
    GemmPlan,
}

/// A compiled module: what one backend made of all of one model's partitions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Module {
    pub backend: String,
    /// Canonical target string it was compiled for.
    pub target: String,
    pub format: ModuleFormat,
    pub functions: Vec<FunctionInfo>,
    pub bytes: Vec<u8>,
}

