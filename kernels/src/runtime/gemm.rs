//! The runtime of the `gemm` backend: loads a [`FORMAT`] module and runs its functions with
//! `matrixmultiply`'s packed SIMD GEMM, this crate's im2col and direct depthwise loops, and fused epilogues.
//!
//! Loading decodes the plan, checks its version and validates every function against its `FunctionInfo`
//! ([`validate`]): a corrupt or mismatched plan is an error naming the module
//! and function, never undefined behaviour at call time. A call then checks only its argument array (count,
//! null or misaligned pointers) and runs the steps; nothing is allocated per call but `matrixmultiply`'s
//! packing buffers.

mod depthwise;
mod depthwise_nhwc;
mod gemv;
mod small_k;
mod epilogue;
pub mod fmath;
mod exec;
mod im2col;
pub mod plan;
pub mod profile;
mod schedule;
pub mod validate;

use super::{LoadedModule, RuntimeError};
use plan::{Plan, PlanFunction};
use validate::{validate, BufferLens};
use crate::module::{FunctionInfo, Module, ModuleFormat};
use std::sync::OnceLock;

struct Function {
    plan: PlanFunction,
    lens: BufferLens,
    info: FunctionInfo,
    /// The units of the function's steps, worked out on its first call for the thread count of that call
    /// (a process runs on one pool; another thread count works them out again each call).
    schedule: OnceLock<(usize, Vec<schedule::Unit>)>,
}

/// A loaded, validated `gemm` module.
pub struct GemmModule {
    backend: String,
    functions: Vec<Function>,
}

/// Decodes and validates a `gemm` module.
pub fn load(m: &Module) -> Result<GemmModule, RuntimeError> {
    let fail = |msg: String| RuntimeError(format!("module of backend {}: {msg}", m.backend));
    if m.format != FORMAT {
        return Err(fail(format!("format {} is not a gemm plan", m.format)));
    }
    let plan = Plan::decode(&m.bytes).map_err(|e| fail(e.0))?;
    if plan.functions.len() != m.functions.len() {
        return Err(fail(format!("the plan has {} functions, the module lists {}", plan.functions.len(), m.functions.len())));
    }
    let mut functions = Vec::with_capacity(plan.functions.len());
    for (f, info) in plan.functions.into_iter().zip(&m.functions) {
        let lens = validate(&f, info).map_err(|e| fail(e.0))?;
        functions.push(Function { plan: f, lens, info: info.clone(), schedule: OnceLock::new() });
    }
    Ok(GemmModule { backend: m.backend.clone(), functions })
}

/// The `gemm` backend's module format: a postcard-encoded [`plan`] run by the runtime's GEMM kernels.
pub const FORMAT: ModuleFormat = ModuleFormat::host("gemm-plan");


/// The registry's loader of [`FORMAT`] modules.
pub fn loader(m: &Module) -> Result<Box<dyn LoadedModule>, RuntimeError> {
    Ok(Box::new(load(m)?))
}

impl GemmModule {
    /// The signatures of the module's functions, in call-index order.
    pub fn functions(&self) -> impl Iterator<Item = &FunctionInfo> {
        self.functions.iter().map(|f| &f.info)
    }
}

impl LoadedModule for GemmModule {
    unsafe fn call(&self, index: usize, args: &[*mut u8]) -> Result<(), RuntimeError> {
        let Some(f) = self.functions.get(index) else {
            return Err(RuntimeError(format!("module of backend {}: no function {index} (it has {})", self.backend, self.functions.len())));
        };
        let fail = |msg: String| RuntimeError(format!("module of backend {}, function '{}': {msg}", self.backend, f.info.symbol));
        let with_scratch = f.lens.scratch > 0;
        let want = f.lens.args.len() + with_scratch as usize;
        if args.len() != want {
            return Err(fail(format!("{} arguments given, it takes {want} ({} inputs, {} outputs{})", args.len(), f.info.inputs.len(), f.info.outputs.len(), if with_scratch { ", scratch" } else { "" })));
        }
        let lens = f.lens.args.iter().copied().chain(with_scratch.then_some(f.lens.scratch));
        for (i, (&p, len)) in args.iter().zip(lens).enumerate() {
            if len > 0 && (p.is_null() || !p.cast::<f32>().is_aligned()) {
                return Err(fail(format!("argument {i} is a null or misaligned pointer")));
            }
        }
        let mem = exec::Mem {
            args: &args[..f.lens.args.len()],
            scratch: if with_scratch { args[want - 1] as *mut f32 } else { std::ptr::null_mut() },
            consts: &f.plan.consts,
        };
        // SAFETY: the plan was validated against `f.info` at load; the caller guarantees (this trait's
        // contract) that the buffers are live, of the listed types, outputs not aliasing inputs.
        let threads = rayon::current_num_threads().max(1);
        let (cached, units) = f.schedule.get_or_init(|| (threads, schedule::schedule(&f.plan.steps, threads)));
        if *cached == threads {
            exec::run(&f.plan, units, &mem);
        } else {
            exec::run(&f.plan, &schedule::schedule(&f.plan.steps, threads), &mem);
        }
        Ok(())
    }
}
