//! The `cublas` backend (`cuda -compiler=cublas`): MatMuls (batched, broadcast batch) with their bias,
//! residual and ReLU epilogues as cuBLASLt calls, fp32 (no TF32) and fp16 with fp32 accumulation.
//!
//! The split follows the other backends': [`support`] (which nodes and chains), [`lower`] (kernel graph to
//! matmul descriptions), [`cost`] (the analytical estimate). There is no toolchain: a module is the list of each
//! function's matmuls ([`BlasModule`]), so compiling needs no GPU and no library, and the artifact's bytes do
//! not depend on the machine that built them. The runtime (`kernels/src/runtime/cuda/blas.rs`) creates the
//! descriptors and asks cuBLASLt's heuristic for an algorithm once, at load, then captures the calls into the
//! model's CUDA graph with the `cuda` backend's kernels.
//!
//! Tuning space: which of the heuristic's answers every matmul of a kernel runs, its first ([`RANKS`] of them:
//! `cublas/v2/default` is rank 0, `cublas/v2/algo1` rank 1, ...). The tune stage measures each on the GPU and
//! the plan records the fastest, so the artifact says which algorithm to run and loading searches nothing.

pub mod cost;
pub mod lower;
pub mod support;

use crate::backend::library::Ranks;
use crate::backend::{Backend, BackendError, LoweredKernel, Module, TunableSet};
use crate::ir::{Graph, NodeId};
use crate::rules::Rule;
use crate::target::{BackendSpec, Target};
use tessera_kernels::runtime::cuda::blas::Matmul;

/// The backend's name, as `cuda -compiler=cublas` selects it.
pub const NAME: &str = "cublas";

/// Bump whenever lowering or the module format changes. (2: matmuls carry the heuristic rank they run.)
pub const VERSION: u32 = 2;

/// The tuning space: the heuristic's first four answers for every matmul of a kernel.
pub const RANKS: Ranks = Ranks { backend: NAME, version: VERSION, ranks: 4 };


/// The backend's description: its `-compiler` value and its own options.
pub static SPEC: BackendSpec = BackendSpec {
    name: NAME,
    device: "cuda",
    compiler: "cublas",
    doc: "cuBLASLt matmuls with fused bias and activation epilogues",
    options: &[crate::backend::TUNE_CONFIGS],
    order: 3,
};

crate::backend::registry::register_builtin!(SPEC, CublasBackend);

/// The `cublas` backend (stateless).
#[derive(Clone, Copy, Debug, Default)]
pub struct CublasBackend;

fn unsupported(why: impl Into<String>) -> BackendError {
    BackendError::unsupported(NAME, why)
}

fn check_target(target: &Target) -> Result<(), BackendError> {
    if target.backend_name() != NAME {
        return Err(BackendError::invalid(NAME, format!("target '{target}' selects backend '{}', not '{NAME}'", target.backend_name())));
    }
    Ok(())
}

impl Backend for CublasBackend {
    fn spec(&self) -> &'static BackendSpec {
        &SPEC
    }

    fn version(&self) -> crate::code::CodeVersion {
        crate::code::CodeVersion::new(VERSION, &[crate::code::digests::BACKEND_CUBLAS, crate::code::runtime_digests::RUNTIME_CUDA])
    }

    /// Compiling writes descriptions only; running needs a GPU with cuBLASLt (the runtime says so).
    fn available(&self) -> Result<(), String> {
        Ok(())
    }

    fn supports(&self, g: &Graph, n: NodeId, target: &Target) -> bool {
        target.backend_name() == NAME && support::supports(g, n)
    }

    /// MatMuls alone and with their epilogue chains.
    fn rules(&self) -> Rule {
        Rule::anchors_with_epilogues()
    }

    fn colors(&self) -> (&'static str, &'static str) {
        ("#dadaeb", "#756bb1")
    }

    fn estimate_us(&self, g: &Graph, nodes: &[NodeId], _target: &Target) -> f64 {
        cost::estimate_us(g, nodes)
    }

    /// Every constant is an argument: library calls read operands from device memory, never from code.
    fn inline_const_max(&self) -> usize {
        0
    }

    fn configs(&self, _target: &Target) -> TunableSet {
        RANKS.all().into_iter().collect()
    }

    fn default_config(&self, _target: &Target) -> String {
        RANKS.name(0)
    }

    fn configs_for(&self, _target: &Target, _kernel: &Graph) -> Vec<String> {
        RANKS.all()
    }

    fn lower(&self, target: &Target, kernel: &Graph, symbol: &str) -> Result<LoweredKernel, BackendError> {
        self.lower_config(target, kernel, symbol, &RANKS.name(0))
    }

    fn lower_config(&self, target: &Target, kernel: &Graph, symbol: &str, config: &str) -> Result<LoweredKernel, BackendError> {
        check_target(target)?;
        let rank = RANKS.rank(config)?;
        let (mut calls, info) = lower::lower_kernel(kernel, symbol).map_err(|e| unsupported(format!("kernel '{symbol}' ({}): {e}", kernel.name)))?;
        for c in &mut calls {
            c.rank = rank;
        }
        Ok(LoweredKernel { info, code: postcard::to_stdvec(&calls).expect("matmuls encode") })
    }

    fn compile_module(&self, target: &Target, kernels: &[LoweredKernel]) -> Result<Module, BackendError> {
        check_target(target)?;
        crate::backend::library::compile_module::<Matmul>(NAME, target, tessera_kernels::runtime::cuda::blas::FORMAT, kernels)
    }
}

#[cfg(test)]
mod tests;
