//! The `cudnn` backend (`cuda -compiler=cudnn`): 2-D convolutions (groups, stride, dilation, symmetric pads)
//! with their bias, a residual add and ReLU fused, as cuDNN's `cudnnConvolutionBiasActivationForward`, fp32 (FMA
//! kernels, no TF32) and fp16 with fp32 arithmetic.
//!
//! The split follows the other backends': [`support`] (which nodes and chains), [`lower`] (kernel graph to
//! convolution descriptions), [`cost`] (the analytical estimate). As for `cublas` there is no toolchain: a
//! module is the list of each function's convolutions ([`DnnModule`]), so compiling needs no GPU and no library.
//! The runtime (`kernels/src/runtime/cuda/dnn.rs`) creates the descriptors and picks cuDNN's heuristic
//! algorithm once, at load, then captures the calls into the model's CUDA graph.
//!
//! Tuning space: which of the heuristic's fitting algorithms every convolution of a kernel runs, its first
//! [`RANKS`] (`cudnn/v2/default` is rank 0). Only kernels whose convolutions all end in ReLU have a choice
//! (without ReLU cuDNN runs the implicit precomputed GEMM alone).

pub mod cost;
pub mod lower;
pub mod support;

use crate::backend::library::Ranks;
use crate::backend::{Backend, BackendError, LoweredKernel, Module, TunableSet};
use crate::ir::{Graph, NodeId};
use crate::rules::Rule;
use crate::target::{BackendSpec, Target};
use tessera_kernels::runtime::cuda::dnn::Conv;

/// The backend's name, as `cuda -compiler=cudnn` selects it.
pub const NAME: &str = "cudnn";

/// Bump whenever lowering or the module format changes. (2: convolutions carry the heuristic rank they run;
/// 3: and the workspace they may use, grown with their tensors.)
pub const VERSION: u32 = 3;

/// The tuning space: the heuristic's first four fitting algorithms for every convolution of a kernel.
pub const RANKS: Ranks = Ranks { backend: NAME, version: VERSION, ranks: 4 };


/// The backend's description: its `-compiler` value and its own options.
pub static SPEC: BackendSpec = BackendSpec {
    name: NAME,
    device: "cuda",
    compiler: "cudnn",
    doc: "cuDNN convolutions with fused bias, residual and activation",
    options: &[crate::backend::TUNE_CONFIGS],
    order: 4,
};

crate::backend::registry::register_builtin!(SPEC, CudnnBackend);

/// The `cudnn` backend (stateless).
#[derive(Clone, Copy, Debug, Default)]
pub struct CudnnBackend;

fn unsupported(why: impl Into<String>) -> BackendError {
    BackendError::unsupported(NAME, why)
}

fn check_target(target: &Target) -> Result<(), BackendError> {
    if target.backend_name() != NAME {
        return Err(BackendError::invalid(NAME, format!("target '{target}' selects backend '{}', not '{NAME}'", target.backend_name())));
    }
    Ok(())
}

impl Backend for CudnnBackend {
    fn spec(&self) -> &'static BackendSpec {
        &SPEC
    }

    fn version(&self) -> crate::code::CodeVersion {
        crate::code::CodeVersion::new(VERSION, &[crate::code::digests::BACKEND_CUDNN, crate::code::runtime_digests::RUNTIME_CUDA])
    }

    /// Compiling writes descriptions only; running needs a GPU with cuDNN (the runtime says so).
    fn available(&self) -> Result<(), String> {
        Ok(())
    }

    fn supports(&self, g: &Graph, n: NodeId, target: &Target) -> bool {
        target.backend_name() == NAME && support::supports(g, n)
    }

    /// Convolutions alone and with their epilogue chains.
    fn rules(&self) -> Rule {
        Rule::anchors_with_epilogues()
    }

    fn colors(&self) -> (&'static str, &'static str) {
        ("#fcbba1", "#cb181d")
    }

    fn estimate_us(&self, g: &Graph, nodes: &[NodeId], _target: &Target) -> f64 {
        cost::estimate_us(g, nodes)
    }

    /// Every constant is an argument: library calls read operands from device memory, never from code.
    fn inline_const_max(&self) -> usize {
        0
    }
    /// cuDNN's 16-bit tensor-core convolutions transform NCHW operands to NHWC and back inside every call.
    fn native_channels_last_half(&self) -> bool {
        true
    }

    fn configs(&self, _target: &Target) -> TunableSet {
        RANKS.all().into_iter().collect()
    }

    fn default_config(&self, _target: &Target) -> String {
        RANKS.name(0)
    }

    /// Every rank where all the kernel's convolutions end in ReLU, else the default alone.
    fn configs_for(&self, _target: &Target, kernel: &Graph) -> Vec<String> {
        match lower::lower_kernel(kernel, "configs") {
            Ok((calls, _)) if calls.iter().all(|c| c.relu) => RANKS.all(),
            _ => vec![RANKS.name(0)],
        }
    }

    fn lower(&self, target: &Target, kernel: &Graph, symbol: &str) -> Result<LoweredKernel, BackendError> {
        self.lower_config(target, kernel, symbol, &RANKS.name(0))
    }

    fn lower_config(&self, target: &Target, kernel: &Graph, symbol: &str, config: &str) -> Result<LoweredKernel, BackendError> {
        check_target(target)?;
        let rank = RANKS.rank(config)?;
        let (mut calls, info) = lower::lower_kernel(kernel, symbol).map_err(|e| unsupported(format!("kernel '{symbol}' ({}): {e}", kernel.name)))?;
        for c in &mut calls {
            if rank > 0 && !c.relu {
                return Err(unsupported(format!("kernel '{symbol}': configuration '{config}': a convolution without ReLU has one cuDNN algorithm only")));
            }
            c.rank = rank;
        }
        Ok(LoweredKernel { info, code: postcard::to_stdvec(&calls).expect("convolutions encode") })
    }

    fn compile_module(&self, target: &Target, kernels: &[LoweredKernel]) -> Result<Module, BackendError> {
        check_target(target)?;
        crate::backend::library::compile_module::<Conv>(NAME, target, tessera_kernels::runtime::cuda::dnn::FORMAT, kernels)
    }
}

#[cfg(test)]
mod tests;
