//! `gemm`: the second CPU backend (`cpu -compiler=gemm`). It runs f32 MatMul and Conv through
//! `matrixmultiply::sgemm` (the packed SIMD GEMM the reference interpreter uses too), with bias, residual and
//! activation epilogues fused into them, so the partitioner has a real choice on a machine without a GPU.
//!
//! A partition lowers to a [plan] function: a list of GEMM, im2col and direct depthwise steps over the
//! function's arguments and scratch, every shape static; a model's functions make one plan, postcard-encoded
//! into one [`Module`] of format [`tessera_kernels::runtime::gemm::FORMAT`]. The runtime (kernels/src/runtime/gemm.rs)
//! validates a plan with [`validate::validate`] when loading it and then executes it. There is no code
//! generation, so the backend is always available and ignores the C-compiler attributes of the `cpu` target
//! (`-opt-level`, `-fast-math`, `-march`).
//!
//! Files: `support` (pattern rules and the epilogue rule), `lower` (kernel graph to plan function), `arena`
//! (static scratch allocation), `plan` (the format), `validate` (the load-time safety check), `cost` (the
//! analytical estimate).

pub mod arena;
mod chain;
pub mod cost;
mod layout;
pub mod lower;
pub mod support;
// The plan format and its validation are the runtime's (it executes plans); lowering writes them.
pub use tessera_kernels::runtime::gemm::{plan, validate};

use super::{Backend, BackendError, FunctionInfo, LoweredKernel, Module};
use crate::ir::{Graph, NodeId};
use crate::rules::Rule;
use crate::target::{BackendSpec, Target};
use plan::{Plan, PlanFunction, PLAN_VERSION};
use std::collections::BTreeSet;

/// The backend's name, as `cpu -compiler=gemm` selects it.
pub const NAME: &str = "gemm";

/// Code version: part of every key of this backend's work. Bump when lowering, the plan format, or what the
/// runtime computes for a plan changes (2: GELU at a data-independent cost).
pub const VERSION: u32 = 2;


/// The backend's description: its `-compiler` value and its own options.
pub static SPEC: BackendSpec = BackendSpec {
    name: NAME,
    device: "cpu",
    compiler: "gemm",
    doc: "matmul and convolution through the matrixmultiply crate (plans run by the runtime's GEMM kernels)",
    options: &[],
    order: 1,
};

crate::backend::registry::register_builtin!(SPEC, GemmBackend);

/// The `gemm` backend (stateless).
#[derive(Clone, Copy, Debug, Default)]
pub struct GemmBackend;

fn invalid(why: impl Into<String>) -> BackendError {
    BackendError::invalid(NAME, why)
}

fn check_target(target: &Target) -> Result<(), BackendError> {
    if target.backend_name() != NAME {
        return Err(invalid(format!("target '{target}' selects backend '{}', not '{NAME}'", target.backend_name())));
    }
    Ok(())
}

impl Backend for GemmBackend {
    fn spec(&self) -> &'static BackendSpec {
        &SPEC
    }

    fn version(&self) -> crate::code::CodeVersion {
        crate::code::CodeVersion::new(VERSION, &[crate::code::digests::BACKEND_GEMM, crate::code::runtime_digests::RUNTIME_GEMM])
    }

    fn available(&self) -> Result<(), String> {
        Ok(())
    }

    fn supports(&self, g: &Graph, n: NodeId, target: &Target) -> bool {
        target.backend_name() == NAME && support::supports(g, n)
    }

    /// Anchors alone and with their fused epilogue chains.
    fn rules(&self) -> Rule {
        Rule::anchors_with_epilogues()
    }

    fn colors(&self) -> (&'static str, &'static str) {
        ("#fdd0a2", "#e6550d")
    }

    fn estimate_us(&self, g: &Graph, nodes: &[NodeId], _target: &Target) -> f64 {
        cost::estimate_us(g, nodes)
    }

    fn lower(&self, target: &Target, kernel: &Graph, symbol: &str) -> Result<LoweredKernel, BackendError> {
        check_target(target)?;
        let (f, info) = lower::lower_kernel(kernel, symbol).map_err(|m| BackendError::unsupported(NAME, format!("kernel '{}' ({symbol}): {m}", kernel.name)))?;
        // A lowering bug surfaces here, at compile time, rather than as a refused module at load time.
        validate::validate(&f, &info).map_err(|e| invalid(format!("kernel '{}': internal error: {e}", kernel.name)))?;
        Ok(LoweredKernel { info, code: f.encode() })
    }

    fn compile_module(&self, target: &Target, kernels: &[LoweredKernel]) -> Result<Module, BackendError> {
        check_target(target)?;
        let mut symbols = BTreeSet::new();
        let mut functions: Vec<PlanFunction> = Vec::with_capacity(kernels.len());
        for k in kernels {
            if !symbols.insert(k.info.symbol.as_str()) {
                return Err(invalid(format!("two kernels are named '{}'", k.info.symbol)));
            }
            let f = PlanFunction::decode(&k.code).map_err(|e| invalid(format!("kernel '{}': {e}", k.info.symbol)))?;
            validate::validate(&f, &k.info).map_err(|e| invalid(e.0))?;
            functions.push(f);
        }
        let plan = Plan { version: PLAN_VERSION, functions };
        Ok(Module {
            backend: NAME.to_string(),
            target: target.canonical(),
            format: tessera_kernels::runtime::gemm::FORMAT,
            functions: kernels.iter().map(|k| k.info.clone()).collect::<Vec<FunctionInfo>>(),
            bytes: plan.encode(),
        })
    }
}

#[cfg(test)]
mod tests;
