//! Backends: one module per backend behind one small trait.
//!
//! A backend says which nodes it can run (pattern rules), estimates what a partition costs, lowers each
//! partition (a standalone kernel graph, see [`crate::ir::extract_subgraph`]) to code or a plan fragment, and
//! compiles all of one model's lowered partitions at once into one [`Module`] (module-at-a-time: one source,
//! one compile). Lowering is memoized per kernel signature by the pipeline; module compiles per model.
//!
//! Calling convention shared by every module format: a function takes one array of pointers,
//! `[input_0, .., input_n, output_0, .., output_m, scratch?]`, each pointing at a dense row-major buffer of the
//! type listed in its [`FunctionInfo`]; inputs are boundary activations and lifted constants in the kernel's
//! canonical input order. Functions never allocate per call beyond their declared scratch.

pub mod gemm;
pub mod registry;

pub mod c;

use crate::ir::{Graph, NodeId};
pub use tessera_kernels::module::{FunctionInfo, Module, ModuleFormat};
use crate::target::Target;
use serde::{Deserialize, Serialize};

/// Constants with at most this many elements stay inside kernels (a backend may inline them into code);
/// larger ones are lifted to kernel inputs, so compiled code never depends on weight values.
pub const INLINE_CONST_MAX: usize = 64;

/// One partition lowered by a backend, before its module is compiled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoweredKernel {
    pub info: FunctionInfo,
    /// Backend-specific: C source of one function for `c`, a postcard-encoded plan for `gemm`.
    pub code: Vec<u8>,
}

/// A backend failed; the message names the partition, node or op at fault.
#[derive(Debug, Clone, thiserror::Error)]
#[error("backend {backend}: {msg}")]
pub struct BackendError {
    pub backend: String,
    pub msg: String,
}

pub trait Backend: Send + Sync {
    /// The backend's name as targets select it (`Target::backend_name`).
    fn name(&self) -> &'static str;
    /// Code version: part of every key of this backend's work; bump when generated code changes.
    fn version(&self) -> u32;
    /// Whether this machine can compile for the backend (e.g. a C compiler is present); the reason if not.
    fn available(&self) -> Result<(), String>;
    /// The facts of this machine that the backend's compiled output depends on (compiler and its version,
    /// flags it picked up, toolkit and device versions), as sorted name/value pairs. They are part of the
    /// compile key, so a different toolchain never serves a stale module.
    fn environment(&self, _target: &Target) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Pattern rule: can this backend run node `n` of `g`?
    fn supports(&self, g: &Graph, n: NodeId, target: &Target) -> bool;
    /// Analytical cost estimate of running these nodes as one partition, in microseconds.
    fn estimate_us(&self, g: &Graph, nodes: &[NodeId], target: &Target) -> f64;
    /// Lowers one partition, given as a standalone kernel graph, to a function named `symbol`.
    fn lower(&self, target: &Target, kernel: &Graph, symbol: &str) -> Result<LoweredKernel, BackendError>;
    /// Compiles all of one model's lowered partitions into one module.
    fn compile_module(&self, target: &Target, kernels: &[LoweredKernel]) -> Result<Module, BackendError>;
}
