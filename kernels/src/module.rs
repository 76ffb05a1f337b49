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

/// How a module's bytes are to be loaded by the runtime: the key of the runtime's loader
/// [`Registry`](crate::runtime::registry::Registry). A format of this crate is one variant here and one line
/// there; variants are only ever appended (artifacts encode the variant's index).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ModuleFormat {
    /// An ELF shared object exporting each function as `void symbol(void* const* args)` (the `c` backend's;
    /// loaded by `runtime::c`).
    SharedObject,
    /// A postcard-encoded [`gemm`-backend plan](crate::runtime::gemm::plan) executed by the runtime's built-in
    /// GEMM kernels (loaded by `runtime::gemm`).
    GemmPlan,
    /// A format known by name to a loader added to a registry at run time by code outside this crate (a
    /// backend developed out of tree, or a test's); the built-in registry has none.
    Named(String),
    /// A [`cubin module`](crate::runtime::cuda::format::CubinModule): one cubin and each function's kernel
    /// launches (the `cuda` backend's; loaded by `runtime::cuda`, run on the GPU).
    Cubin,
    /// A [`cublaslt module`](crate::runtime::cuda::blas::BlasModule): each function's cuBLASLt matmuls (the
    /// `cublas` backend's; loaded by `runtime::cuda::blas`, run on the GPU).
    CublasLt,
    /// A [`cudnn module`](crate::runtime::cuda::dnn::DnnModule): each function's fused cuDNN convolutions (the
    /// `cudnn` backend's; loaded by `runtime::cuda::dnn`, run on the GPU).
    Cudnn,
}

/// Where a module's functions run, and so where the buffers they read and write must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Place {
    /// Host memory, called through [`LoadedModule::call`](crate::runtime::LoadedModule::call).
    Host,
    /// The GPU's memory, launched by the GPU engine on its stream.
    Gpu,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Place::Host => "host",
            Place::Gpu => "GPU",
        })
    }
}

impl ModuleFormat {
    /// Where functions of this format run. Formats loaded from outside this crate are host code.
    pub fn place(&self) -> Place {
        match self {
            ModuleFormat::SharedObject | ModuleFormat::GemmPlan | ModuleFormat::Named(_) => Place::Host,
            ModuleFormat::Cubin | ModuleFormat::CublasLt | ModuleFormat::Cudnn => Place::Gpu,
        }
    }
}

impl std::fmt::Display for ModuleFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModuleFormat::SharedObject => f.write_str("shared-object"),
            ModuleFormat::GemmPlan => f.write_str("gemm-plan"),
            ModuleFormat::Named(name) => write!(f, "named '{name}'"),
            ModuleFormat::Cubin => f.write_str("cubin"),
            ModuleFormat::CublasLt => f.write_str("cublaslt"),
            ModuleFormat::Cudnn => f.write_str("cudnn"),
        }
    }
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

