//! The `c` backend (`cpu -compiler=c`): generated C compiled into one shared object per module.
//!
//! It is the CPU fallback, so it runs every op of the IR on f32, and the integer/bool ops that survive
//! constant folding on i64/i32/bool; f16/bf16 are refused (no fp16 arithmetic on the CPU).
//!
//! - [`lower`](CBackend::lower) turns one kernel graph into one C function `void <symbol>(void* const* args)`
//!   (see [`lower`] for the structure: fused elementwise loops, GEMM with fused epilogues, dedicated
//!   reduction/normalization loops, index loops for data movement, a liveness-planned scratch buffer).
//! - [`compile_module`](CBackend::compile_module) concatenates the prelude (`prelude.h` beside it, embedded)
//!   and every kernel's function into one C file and compiles it once (see [`toolchain`]).
//!
//! Semantics follow the reference interpreter (`crate::interp`), with one documented difference: where the
//! reference reports a data-dependent error (integer division by zero, a Gather index out of range), compiled
//! code cannot report anything and produces 0 instead of trapping.

mod attention;
pub mod cost;
mod ew;
pub(crate) mod func;
mod linalg;
pub mod lower;
mod movement;
mod nd;
mod pool;
mod reduce;
mod scan;
pub mod toolchain;

#[cfg(test)]
mod math_tests;
#[cfg(test)]
mod tests;

use crate::backend::{Backend, BackendError, LoweredKernel, Module};
use crate::ir::{DType, Graph, NodeId, Op};
use crate::rules::Rule;
use crate::target::{AttrSpec, AttrType, BackendSpec, Target};

/// Bump whenever the generated code (or the prelude, or the compile flags) changes.
pub const VERSION: u32 = 6;

pub use crate::backend::lowering::text::{with_scalar, SCALAR};

/// The C helpers every module starts with (`prelude.h`, the shared scalar math spliced in).
pub static PRELUDE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| with_scalar(include_str!("prelude.h")));



/// The backend's description: its `-compiler` value and its own options.
pub static SPEC: BackendSpec = BackendSpec {
    name: "c",
    device: "cpu",
    compiler: "c",
    doc: "tessera's C codegen: generated C compiled to one shared object per module (runs everything on the host)",
    options: &[
        AttrSpec { name: "opt-level", ty: AttrType::Int { min: 0, max: 3 }, default: "2", doc: "C compiler optimization level (-O)" },
        AttrSpec { name: "fast-math", ty: AttrType::Bool, default: "false", doc: "let the C compiler reassociate floating point (-ffast-math); results may differ in the last bits" },
        AttrSpec { name: "march", ty: AttrType::Enum(&["generic", "x86-64-v2", "x86-64-v3", "native"]), default: "generic", doc: "instruction set for generated code; native ties artifacts to the build machine" },
    ],
    order: 0,
};

crate::backend::registry::register_builtin!(SPEC, CBackend);

/// The `c` backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct CBackend;

fn invalid(why: impl Into<String>) -> BackendError {
    BackendError::invalid("c", why)
}

fn check_target(target: &Target) -> Result<(), BackendError> {
    if target.backend_name() != "c" {
        return Err(invalid(format!("target '{target}' does not select the c backend")));
    }
    Ok(())
}

/// The whole C source of a module: prelude, then each kernel, in the given order.
pub fn module_source(kernels: &[LoweredKernel]) -> Result<String, BackendError> {
    let mut src = String::from("/* tessera c module */\n");
    src.push_str(&PRELUDE);
    let mut seen = std::collections::BTreeSet::new();
    for k in kernels {
        if !seen.insert(k.info.symbol.as_str()) {
            return Err(invalid(format!("two kernels of one module are named '{}'", k.info.symbol)));
        }
        let code = std::str::from_utf8(&k.code).map_err(|_| invalid(format!("kernel '{}': code is not UTF-8 C source", k.info.symbol)))?;
        src.push('\n');
        src.push_str(code);
    }
    Ok(src)
}

/// Names the kernel whose source holds `line` (1-based) of the module source.
fn symbol_at_line(kernels: &[LoweredKernel], line: usize) -> Option<&str> {
    let mut at = 1 + PRELUDE.lines().count() + 1;
    for k in kernels {
        let n = String::from_utf8_lossy(&k.code).lines().count();
        if line > at && line <= at + n {
            return Some(&k.info.symbol);
        }
        at += n + 1;
    }
    None
}

/// A readable compiler failure: the first lines of its output and the kernels they point into.
fn compile_error(kernels: &[LoweredKernel], output: &str) -> BackendError {
    let lines: Vec<&str> = output.lines().take(15).collect();
    let mut culprits: Vec<String> = Vec::new();
    for l in output.lines() {
        if let Some(rest) = l.strip_prefix("module.c:") {
            if let Some(n) = rest.split(':').next().and_then(|n| n.parse::<usize>().ok()) {
                if let Some(s) = symbol_at_line(kernels, n) {
                    if !culprits.iter().any(|c| c == s) {
                        culprits.push(s.to_string());
                    }
                }
            }
        }
    }
    if culprits.is_empty() {
        BackendError::compile("c", "C", kernels, lines.join("\n"))
    } else {
        BackendError::Compile { backend: "c".into(), tool: "C", kernels: culprits, located: true, log: lines.join("\n") }
    }
}

impl Backend for CBackend {
    fn spec(&self) -> &'static BackendSpec {
        &SPEC
    }

    fn version(&self) -> crate::code::CodeVersion {
        crate::code::CodeVersion::new(VERSION, &[crate::code::digests::BACKEND_C, crate::code::runtime_digests::RUNTIME_C])
    }

    fn available(&self) -> Result<(), String> {
        toolchain::toolchain().map(|_| ()).map_err(|e| e.to_string())
    }

    /// The compiler, its version, every flag it will be given (cc's base flags include `CFLAGS` from the
    /// environment) and the environment cc sets for it: a different toolchain is a different module.
    fn environment(&self, target: &Target) -> Vec<(String, String)> {
        match toolchain::toolchain() {
            Err(why) => vec![("cc".into(), format!("unavailable: {why}"))],
            Ok(tc) => {
                let show = |v: &[std::ffi::OsString]| v.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ");
                let mut env: Vec<String> = tc.env.iter().map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy())).collect();
                env.sort();
                vec![
                    ("cc.path".into(), tc.path.display().to_string()),
                    ("cc.version".into(), tc.version.clone()),
                    ("cc.base_args".into(), show(&tc.base_args)),
                    ("cc.env".into(), env.join(" ")),
                    ("cc.target_flags".into(), toolchain::target_flags(target).join(" ")),
                ]
            }
        }
    }

    /// Every op but the channels-last ones (`-layout=nhwc` exists on GPU targets only).
    fn supports(&self, g: &Graph, n: NodeId, _target: &Target) -> bool {
        let node = g.node(n);
        !matches!(node.op, Op::NhwcConv(_) | Op::NhwcMaxPool(_))
            && node.inputs.iter().chain(&node.outputs).all(|&v| matches!(g.ty(v).dtype, DType::F32 | DType::I64 | DType::I32 | DType::Bool))
    }

    /// The fallback's rule set: everything, with elementwise, injective and reduction fusion.
    fn rules(&self) -> Rule {
        Rule::fusing_fallback()
    }

    fn colors(&self) -> (&'static str, &'static str) {
        ("#c6dbef", "#3182bd")
    }

    fn estimate_us(&self, g: &Graph, nodes: &[NodeId], _target: &Target) -> f64 {
        cost::estimate_us(g, nodes)
    }

    fn lower(&self, target: &Target, kernel: &Graph, symbol: &str) -> Result<LoweredKernel, BackendError> {
        check_target(target)?;
        let l = lower::lower(kernel, symbol).map_err(|e| BackendError::unsupported("c", format!("kernel '{symbol}' ({}): {e}", kernel.name)))?;
        Ok(LoweredKernel { info: l.info, code: l.source.into_bytes() })
    }

    fn compile_module(&self, target: &Target, kernels: &[LoweredKernel]) -> Result<Module, BackendError> {
        check_target(target)?;
        toolchain::toolchain().map_err(|why| BackendError::toolchain("c", "a C compiler", why.to_string()))?;
        let src = module_source(kernels)?;
        let bytes = toolchain::compile(target, &src).map_err(|out| compile_error(kernels, &out.to_string()))?;
        Ok(Module {
            backend: "c".into(),
            target: target.canonical(),
            format: tessera_kernels::runtime::c::FORMAT,
            functions: kernels.iter().map(|k| k.info.clone()).collect(),
            bytes,
        })
    }
}
