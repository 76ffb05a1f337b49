//! The `cuda` backend (`cuda -compiler=nvrtc`): tessera's own CUDA code generation, compiled by NVRTC into
//! one cubin per model. It is the least specialized GPU backend, so it runs every op of the IR (fp32, and
//! the integer/bool ops that survive constant folding); the library backends (cuBLASLt, cuDNN) will take
//! the partitions they run faster.
//!
//! The split follows the `c` backend's: [`lower`] (plan items to kernels; the fusion plan itself is the
//! `c` backend's, shared), [`kernel`] (one `__global__` function and its launch), [`ew`], [`gemm`],
//! [`attention`] (SIMT) and [`attention_mma`] (tensor cores, fp16), [`reduce`], [`movement`], [`pool`] (the kernel families), [`cost`] (the analytical estimate) and
//! [`toolchain`] (NVRTC). The prelude (`prelude.cuh`) holds the device helpers every module starts with.
//!
//! Semantics follow the reference interpreter; where it reports a data-dependent error (integer division by
//! zero, a Gather index out of range), compiled code produces 0 instead, as the `c` backend does.

pub mod attention;
pub mod attention_mma;
pub mod cost;
#[cfg(test)]
mod emulate;
mod ew;
pub mod gemm;
pub mod index;
pub mod kernel;
pub mod knobs;
pub mod lower;
mod movement;
mod nd;
mod pool;
mod reduce;
mod scan;
pub mod toolchain;

#[cfg(test)]
pub(crate) mod tests;

use crate::backend::{Backend, BackendError, LoweredKernel, Module, TunableSet};
use crate::ir::{DType, Graph, NodeId};
use crate::rules::Rule;
use crate::target::{AttrSpec, AttrType, BackendSpec, Target};
use lower::CudaCode;
use tessera_kernels::runtime::cuda::format::CubinModule;
use tessera_kernels::runtime::cuda::libs;

/// Bump whenever the generated code (or the prelude, or the NVRTC options) changes.
pub const VERSION: u32 = 11;

/// The backend's name, as `cuda -compiler=nvrtc` selects it.
pub const NAME: &str = "cuda";

/// The configuration of GEMM knob setting `setting` (`cuda/v<version>/default` is the default's).
fn config_name(setting: &str) -> String {
    format!("{NAME}/v{VERSION}/{setting}")
}

/// The device helpers every module starts with.
pub static PRELUDE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| crate::backend::lowering::text::with_scalar(include_str!("prelude.cuh")));

/// What modules with f16 or bf16 tensors start with (before [`PRELUDE`]): the toolkit's WMMA header (which
/// brings cuda_fp16.h and cuda_bf16.h) and the tensor-core helpers, one definition for both types.
pub const HALF_PRELUDE: &str = include_str!("prelude_half.cuh");

/// The kernel templates (the `.cuh` files beside this one): each main loop written once as CUDA C++, its tile
/// shapes, stages and layouts template parameters, what a partition fuses (operand loaders, epilogues) passed
/// in as lambdas by the generated kernel. A module includes a file, after the preludes, when one of its
/// kernels calls into the file's namespace (the first of each pair).
pub const TEMPLATES: &[(&str, &str)] =
    &[("tsr_gemm::", include_str!("gemm.cuh")), ("tsr_conv::", include_str!("conv.cuh")), ("tsr_attention::", include_str!("attention.cuh"))];


/// The backend's description: its `-compiler` value and its own options.
pub static SPEC: BackendSpec = BackendSpec {
    name: NAME,
    device: "cuda",
    compiler: "nvrtc",
    doc: "tessera's CUDA codegen, compiled to cubins by NVRTC (runs everything on the GPU)",
    options: &[
        AttrSpec { name: "fast-math", ty: AttrType::Bool, default: "false", doc: "fast math intrinsics in generated kernels" },
        crate::backend::TUNE_CONFIGS,
    ],
    order: 2,
};

crate::backend::registry::register_builtin!(SPEC, CudaBackend);

/// The `cuda` backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaBackend;

fn invalid(why: impl Into<String>) -> BackendError {
    BackendError::invalid("cuda", why)
}

fn unsupported(why: impl Into<String>) -> BackendError {
    BackendError::unsupported("cuda", why)
}

fn check_target(target: &Target) -> Result<(), BackendError> {
    if target.backend_name() != "cuda" {
        return Err(invalid(format!("target '{target}' does not select the cuda backend")));
    }
    Ok(())
}

fn decode(k: &LoweredKernel) -> Result<CudaCode, BackendError> {
    postcard::from_bytes(&k.code).map_err(|e| invalid(format!("kernel '{}': undecodable lowered code ({e})", k.info.symbol)))
}

/// The whole CUDA source of a module: the prelude, then each kernel's source, in order.
pub fn module_source(kernels: &[LoweredKernel]) -> Result<String, BackendError> {
    check_symbols(kernels)?;
    let mut body = String::new();
    for k in kernels {
        body.push('\n');
        body.push_str(&decode(k)?.source);
    }
    Ok(source_with_prelude(&body))
}

/// A program's whole source: the preludes its kernels use, then their text.
fn source_with_prelude(body: &str) -> String {
    let mut src = String::from("/* tessera cuda module */\n");
    // fp16 / bf16 storage and tensor cores need the toolkit's headers; fp32 modules compile without them
    // (faster).
    if body.contains("__half") || body.contains("__nv_bfloat16") {
        src.push_str(HALF_PRELUDE);
    }
    src.push_str(&PRELUDE);
    for (namespace, template) in TEMPLATES {
        if body.contains(namespace) {
            src.push_str(template);
        }
    }
    src.push_str(body);
    src
}

/// Launches whose kernels one NVRTC program of a large module holds, about. Each program pays NVRTC's fixed
/// cost (the prelude; in fp16 the toolkit's `mma.h` and the templates: 65-90 ms on the 2-core build
/// machine), so a program per launch would cost more than it balances.
pub const LAUNCHES_PER_PROGRAM: usize = 6;

/// Modules of at most this many launches are one program. The tune stage already compiles its candidates
/// as a module per core, side by side: splitting those too only adds programs' fixed costs and threads
/// beyond the cores. The rule depends on the kernels only, never on the machine: a module's bytes are the
/// same wherever it is built.
pub const ONE_PROGRAM_MAX: usize = 2 * LAUNCHES_PER_PROGRAM;

/// Launches `launches` of kernel `kernel`: a piece of a program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    pub kernel: usize,
    pub launches: std::ops::Range<usize>,
}

/// How a module's kernels are cut into programs: the whole module when it has at most [`ONE_PROGRAM_MAX`]
/// launches; otherwise consecutive launches, [`LAUNCHES_PER_PROGRAM`] to a program, a kernel whose source is
/// one piece (no entry offsets) kept whole.
pub fn programs(codes: &[CudaCode]) -> Vec<Vec<Unit>> {
    let whole = |k: usize| Unit { kernel: k, launches: 0..codes[k].launches.launches.len() };
    let total: usize = codes.iter().map(|c| c.launches.launches.len()).sum();
    if total <= ONE_PROGRAM_MAX {
        return vec![(0..codes.len()).map(whole).collect()];
    }
    let mut out: Vec<Vec<Unit>> = Vec::new();
    let mut current: Vec<Unit> = Vec::new();
    let mut count = 0;
    for (k, c) in codes.iter().enumerate() {
        let n = c.launches.launches.len();
        let pieces: Vec<Unit> = if c.entry_offsets.len() == n { (0..n).map(|l| Unit { kernel: k, launches: l..l + 1 }).collect() } else { vec![whole(k)] };
        for u in pieces {
            if count > 0 && count + u.launches.len() > LAUNCHES_PER_PROGRAM {
                out.push(std::mem::take(&mut current));
                count = 0;
            }
            count += u.launches.len();
            match current.last_mut() {
                Some(last) if last.kernel == u.kernel && last.launches.end == u.launches.start => last.launches.end = u.launches.end,
                _ => current.push(u),
            }
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// The text of a unit: the kernel's shared part (its constant arrays) with the unit's launches, or the
/// whole source.
fn unit_source<'a>(code: &'a CudaCode, u: &Unit) -> (&'a str, &'a str) {
    let n = code.launches.launches.len();
    if code.entry_offsets.len() != n || u.launches == (0..n) {
        return ("", &code.source);
    }
    let at = |l: usize| if l < n { code.entry_offsets[l] as usize } else { code.source.len() };
    (&code.source[..at(0)], &code.source[at(u.launches.start)..at(u.launches.end)])
}

/// Two kernels of one module with one name would be one symbol of the module's functions.
fn check_symbols(kernels: &[LoweredKernel]) -> Result<(), BackendError> {
    let mut seen = std::collections::BTreeSet::new();
    match kernels.iter().find(|k| !seen.insert(k.info.symbol.as_str())) {
        Some(k) => Err(invalid(format!("two kernels of one module are named '{}'", k.info.symbol))),
        None => Ok(()),
    }
}

/// Each program's source compiled by NVRTC on its own thread (at most one per core), its cubin in program
/// order. Plain threads, not rayon's: a module is compiled inside memoized stages that rayon tasks wait on,
/// and a rayon worker waiting here must not take one of those tasks.
fn compile_programs(target: &Target, kernels: &[LoweredKernel], codes: &[CudaCode], programs: &[Vec<Unit>]) -> Result<Vec<Vec<u8>>, BackendError> {
    let compile = |units: &[Unit]| -> Result<Vec<u8>, BackendError> {
        let mut body = String::new();
        for (i, u) in units.iter().enumerate() {
            let (shared, text) = unit_source(&codes[u.kernel], u);
            if !units[..i].iter().any(|v| v.kernel == u.kernel) {
                body.push('\n');
                body.push_str(shared);
            }
            body.push_str(text);
        }
        let in_program: Vec<LoweredKernel> = kernels.iter().enumerate().filter(|(k, _)| units.iter().any(|u| u.kernel == *k)).map(|(_, k)| k.clone()).collect();
        toolchain::compile(target, "module.cu", &source_with_prelude(&body)).map_err(|log| compile_error(&in_program, &log.to_string()))
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(programs.len());
    if threads <= 1 {
        return programs.iter().map(|p| compile(p)).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, Result<Vec<u8>, BackendError>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(p) = programs.get(i) else { return out };
                        out.push((i, compile(p)));
                    }
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("an NVRTC compile thread panicked")).collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// A readable NVRTC failure: the first lines of its log and the kernels they point into.
fn compile_error(kernels: &[LoweredKernel], log: &str) -> BackendError {
    let lines: Vec<&str> = log.lines().take(15).collect();
    let mut culprits: Vec<String> = Vec::new();
    for k in kernels {
        if log.contains(&format!("{}_k", k.info.symbol)) && !culprits.contains(&k.info.symbol) {
            culprits.push(k.info.symbol.clone());
        }
    }
    if culprits.is_empty() {
        BackendError::compile("cuda", "NVRTC", kernels, lines.join("\n"))
    } else {
        BackendError::Compile { backend: "cuda".into(), tool: "NVRTC", kernels: culprits, located: true, log: lines.join("\n") }
    }
}

impl Backend for CudaBackend {
    fn spec(&self) -> &'static BackendSpec {
        &SPEC
    }

    fn version(&self) -> crate::code::CodeVersion {
        crate::code::CodeVersion::new(VERSION, &[crate::code::digests::BACKEND_CUDA, crate::code::runtime_digests::RUNTIME_CUDA])
    }

    /// Compiling needs NVRTC only; running needs a GPU (the runtime says so when there is none).
    fn available(&self) -> Result<(), String> {
        libs::toolkit().map(|_| ()).map_err(|e| e.to_string())
    }

    fn environment(&self, target: &Target) -> Vec<(String, String)> {
        let nvrtc = match libs::toolkit() {
            Ok(t) => t.nvrtc_version.clone(),
            Err(why) => format!("unavailable: {why}"),
        };
        vec![("nvrtc.options".into(), toolchain::options(target).join(" ")), ("nvrtc.version".into(), nvrtc)]
    }

    fn supports(&self, g: &Graph, n: NodeId, _target: &Target) -> bool {
        let node = g.node(n);
        node.inputs.iter().chain(&node.outputs).all(|&v| matches!(g.ty(v).dtype, DType::F32 | DType::F16 | DType::BF16 | DType::I64 | DType::I32 | DType::Bool))
    }

    /// Everything, with elementwise, injective and reduction fusion (the fallback's rules, as `c`).
    fn rules(&self) -> Rule {
        Rule::fusing_fallback()
    }

    fn colors(&self) -> (&'static str, &'static str) {
        ("#c7e9c0", "#31a354")
    }

    fn estimate_us(&self, g: &Graph, nodes: &[NodeId], _target: &Target) -> f64 {
        cost::estimate_us(g, nodes)
    }

    /// The GEMM knob settings ([`gemm::KNOB_SETTINGS`]), `cuda/v<version>/<setting>`.
    fn configs(&self, _target: &Target) -> TunableSet {
        gemm::KNOB_SETTINGS.iter().map(|(name, _)| config_name(name)).collect()
    }

    /// The settings that change this kernel's code: none for a kernel without a tiled GEMM, and a setting
    /// that schedules every GEMM as another one does is measured once.
    fn configs_for(&self, target: &Target, kernel: &Graph) -> Vec<String> {
        let mut seen: Vec<Vec<u8>> = Vec::new();
        let mut out = Vec::new();
        for (name, knobs) in gemm::KNOB_SETTINGS {
            let Ok(l) = lower::lower_with(kernel, "configs", knobs) else { continue };
            let code = postcard::to_stdvec(&l.code).expect("cuda code encodes");
            if !seen.contains(&code) {
                seen.push(code);
                out.push(config_name(name));
            }
        }
        if out.first() != Some(&self.default_config(target)) {
            // The default does not lower (the lowering will say why): measure nothing else.
            return vec![self.default_config(target)];
        }
        out
    }

    fn lower(&self, target: &Target, kernel: &Graph, symbol: &str) -> Result<LoweredKernel, BackendError> {
        self.lower_config(target, kernel, symbol, &self.default_config(target))
    }

    fn lower_config(&self, target: &Target, kernel: &Graph, symbol: &str, config: &str) -> Result<LoweredKernel, BackendError> {
        check_target(target)?;
        let knobs = gemm::KNOB_SETTINGS.iter().find(|(name, _)| config_name(name) == config).map(|(_, k)| *k).ok_or_else(|| {
            let names: Vec<String> = gemm::KNOB_SETTINGS.iter().map(|(n, _)| config_name(n)).collect();
            unsupported(format!("no configuration '{config}' (it has {})", names.join(", ")))
        })?;
        let l = lower::lower_with(kernel, symbol, knobs).map_err(|e| unsupported(format!("kernel '{symbol}' ({}): {e}", kernel.name)))?;
        Ok(LoweredKernel { info: l.info, code: postcard::to_stdvec(&l.code).expect("cuda code encodes") })
    }

    /// A module of more than [`ONE_PROGRAM_MAX`] launches is compiled as programs of about
    /// [`LAUNCHES_PER_PROGRAM`] launches' kernels, in parallel, a cubin each ([`programs`]): NVRTC compiles one
    /// program on one core, and a plan's module as one program took 8.9 and 6.7 s, one after the other, of
    /// ResNet-50 b1's 43 s cold compile on an H200 host while its other 15 cores sat idle.
    fn compile_module(&self, target: &Target, kernels: &[LoweredKernel]) -> Result<Module, BackendError> {
        check_target(target)?;
        libs::toolkit().map_err(|why| BackendError::toolchain("cuda", "NVRTC", why))?;
        check_symbols(kernels)?;
        let codes = kernels.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
        let programs = programs(&codes);
        let cubins = compile_programs(target, kernels, &codes, &programs)?;
        let mut launch_cubins: Vec<Vec<u32>> = codes.iter().map(|c| vec![0; c.launches.launches.len()]).collect();
        for (p, units) in programs.iter().enumerate() {
            for u in units {
                for l in u.launches.clone() {
                    launch_cubins[u.kernel][l] = p as u32;
                }
            }
        }
        let functions = codes.into_iter().map(|c| c.launches).collect();
        let bytes = CubinModule { arch: toolchain::arch(target), cubins, functions, launch_cubins, launch_params: Vec::new() }.encode();
        let functions = kernels.iter().map(|k| k.info.clone()).collect();
        Ok(Module { backend: "cuda".into(), target: target.canonical(), format: tessera_kernels::runtime::cuda::FORMAT, functions, bytes })
    }
}
