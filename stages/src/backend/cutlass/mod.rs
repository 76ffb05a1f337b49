//! The `cutlass` backend (`cuda -compiler=cutlass`): MatMuls (batched, broadcast batch) with their fused
//! epilogues (a bias or a residual, then ReLU, GELU, Sigmoid or HardSwish) as CUTLASS kernels, fp16 and bf16 on
//! tensor cores with fp32 accumulation and fp32 on the SIMT cores, compiled by nvcc, a program per kernel.
//!
//! CUTLASS is used as a template library: [`lower`] writes, per chain, an `extern "C" __global__` function that
//! instantiates the prelude's `tessera::gemm` template (`gemm.cuh`) for its fixed problem, with the
//! instantiation's type ([`instance::Gemm`]: element, tile configuration, alignments, activation) declared
//! once per module; [`toolchain`] runs nvcc with the CUTLASS headers (on any machine: the PyPI wheels of
//! nvcc and CUTLASS serve a machine without a GPU). The module is a `cubin` module like the `cuda`
//! backend's, so the runtime loads and launches it with no code of its own.
//!
//! Tuning space: the tile configuration ([`instance::tiles`]: threadblock and warp tiles, stages) of the
//! target's precision, `cutlass/v<version>/<tile>`; the tune stage measures each on the GPU and the plan
//! records the fastest.

pub mod cost;
pub mod instance;
pub mod lower;
pub mod support;
pub mod toolchain;

#[cfg(test)]
mod tests;

use crate::backend::{Backend, BackendError, LoweredKernel, Module, TunableSet};
use crate::ir::{Graph, NodeId};
use crate::partition::collage::rules::Rule;
use crate::target::{AttrValue, BackendSpec, Target};
use instance::{tiles, Element, Tile};
use lower::CutlassCode;
use tessera_kernels::runtime::cuda::format::CubinModule;

/// The backend's name, as `cuda -compiler=cutlass` selects it.
pub const NAME: &str = "cutlass";

/// Bump whenever the meaning of generated code changes (it names configurations).
pub const VERSION: u32 = 1;

/// The GEMM template every module starts with.
pub const PRELUDE: &str = include_str!("gemm.cuh");

/// The backend's description: its `-compiler` value and its own options.
pub static SPEC: BackendSpec = BackendSpec {
    name: NAME,
    device: "cuda",
    compiler: "cutlass",
    doc: "CUTLASS GEMM templates with fused bias, residual and activation epilogues, compiled by nvcc",
    options: &[crate::backend::TUNE_CONFIGS],
    order: 5,
};

crate::backend::registry::register_builtin!(SPEC, CutlassBackend);

/// The `cutlass` backend (stateless).
#[derive(Clone, Copy, Debug, Default)]
pub struct CutlassBackend;

fn invalid(why: impl Into<String>) -> BackendError {
    BackendError::invalid(NAME, why)
}

fn unsupported(why: impl Into<String>) -> BackendError {
    BackendError::unsupported(NAME, why)
}

fn check_target(target: &Target) -> Result<(), BackendError> {
    crate::backend::check_target(&SPEC, target)
}

/// The element type a target's kernels compute in.
fn target_element(target: &Target) -> Element {
    match target.attrs.get("precision") {
        Some(AttrValue::Str(p)) if p == "fp16" => Element::F16,
        Some(AttrValue::Str(p)) if p == "bf16" => Element::Bf16,
        _ => Element::F32,
    }
}

fn config_name(tile: &Tile) -> String {
    format!("{NAME}/v{VERSION}/{}", tile.name())
}

/// The tile a configuration names, among those of `element`.
fn tile_of(element: Element, config: &str) -> Result<Tile, BackendError> {
    tiles(element).iter().find(|t| config_name(t) == config).copied().ok_or_else(|| {
        let names: Vec<String> = tiles(element).iter().map(config_name).collect();
        unsupported(format!("no {element:?} configuration '{config}' (it has {})", names.join(", ")))
    })
}

fn decode(k: &LoweredKernel) -> Result<CutlassCode, BackendError> {
    postcard::from_bytes(&k.code).map_err(|e| invalid(format!("kernel '{}': undecodable lowered code ({e})", k.info.symbol)))
}

/// The whole CUDA C++ source of a module: the prelude, each instantiation's type once, then each kernel's
/// functions, in order.
pub fn module_source(kernels: &[LoweredKernel]) -> Result<String, BackendError> {
    let codes = kernels.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
    module_source_of(kernels, &codes)
}

fn module_source_of(kernels: &[LoweredKernel], codes: &[CutlassCode]) -> Result<String, BackendError> {
    let mut types: std::collections::BTreeMap<&str, &str> = std::collections::BTreeMap::new();
    let mut body = String::new();
    let mut seen = std::collections::BTreeSet::new();
    for (k, code) in kernels.iter().zip(codes) {
        if !seen.insert(k.info.symbol.as_str()) {
            return Err(invalid(format!("two kernels of one module are named '{}'", k.info.symbol)));
        }
        for (name, decl) in &code.types {
            types.entry(name).or_insert(decl);
        }
        body.push('\n');
        body.push_str(&code.source);
    }
    let mut src = String::from("/* tessera cutlass module */\n");
    src.push_str(PRELUDE);
    src.push('\n');
    for decl in types.values() {
        src.push_str(decl);
    }
    src.push_str(&body);
    Ok(src)
}

impl Backend for CutlassBackend {
    fn spec(&self) -> &'static BackendSpec {
        &SPEC
    }

    fn version(&self) -> crate::code::CodeVersion {
        crate::code::CodeVersion::new(VERSION, &[crate::code::digests::BACKEND_CUTLASS, crate::code::runtime_digests::RUNTIME_CUDA])
    }

    /// Compiling needs nvcc and the CUTLASS headers; running needs a GPU (the runtime says so).
    fn available(&self) -> Result<(), String> {
        toolchain::toolchain().map(|_| ())
    }

    fn environment(&self, target: &Target) -> Vec<(String, String)> {
        match toolchain::toolchain() {
            Ok(t) => t.environment(target),
            Err(why) => vec![("cutlass.toolchain".into(), format!("unavailable: {why}"))],
        }
    }

    fn supports(&self, g: &Graph, n: NodeId, target: &Target) -> bool {
        target.backend_name() == NAME && support::supports(g, n)
    }

    /// MatMuls alone and with their epilogue chains.
    fn rules(&self) -> Rule {
        Rule::anchors_with_epilogues()
    }

    fn colors(&self) -> (&'static str, &'static str) {
        ("#fde0ef", "#c51b7d")
    }

    fn estimate_us(&self, g: &Graph, nodes: &[NodeId], _target: &Target) -> f64 {
        cost::estimate_us(g, nodes)
    }

    /// Every constant is an argument: the kernels read operands from device memory.
    fn inline_const_max(&self) -> usize {
        0
    }

    fn configs(&self, target: &Target) -> TunableSet {
        tiles(target_element(target)).iter().map(config_name).collect()
    }

    fn default_config(&self, target: &Target) -> String {
        config_name(&tiles(target_element(target))[0])
    }

    /// The default tile, then the other tiles of the kernel's element type whose grids fill at least half the
    /// GPU ([`cost::SMS`]) for every GEMM of the kernel: a tile that leaves most SMs idle loses to a smaller
    /// one, and each configuration measured is one more nvcc compile. When none fills it, the tile with the
    /// most threadblocks (the smallest of those) is measured beside the default.
    fn configs_for(&self, target: &Target, kernel: &Graph) -> Vec<String> {
        let e = match lower::element_of(kernel) {
            Ok(e) if e == target_element(target) => e,
            _ => return vec![self.default_config(target)],
        };
        let problems: Vec<(u64, u64, u64)> = kernel
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.op == crate::ir::Op::MatMul)
            .filter_map(|(i, _)| crate::backend::library::matmul_shape(kernel, NodeId(i as u32)).ok())
            .map(|(batch, m, n, _, _, _)| (batch, m, n))
            .collect();
        let ctas = |t: &Tile| problems.iter().map(|&(b, m, n)| b * m.div_ceil(t.threadblock[0] as u64) * n.div_ceil(t.threadblock[1] as u64)).min().unwrap_or(0);
        let all = tiles(e);
        let mut out = vec![all[0]];
        out.extend(all[1..].iter().filter(|t| ctas(t) as f64 >= cost::SMS / 2.0));
        if out.len() == 1 {
            // Most threadblocks, then the least padding (the smallest tile).
            if let Some(best) = all[1..].iter().min_by_key(|t| (std::cmp::Reverse(ctas(t)), t.threadblock[0] * t.threadblock[1])) {
                out.push(*best);
            }
        }
        out.iter().map(config_name).collect()
    }

    fn lower(&self, target: &Target, kernel: &Graph, symbol: &str) -> Result<LoweredKernel, BackendError> {
        self.lower_config(target, kernel, symbol, &self.default_config(target))
    }

    fn lower_config(&self, target: &Target, kernel: &Graph, symbol: &str, config: &str) -> Result<LoweredKernel, BackendError> {
        check_target(target)?;
        let fail = |e: String| unsupported(format!("kernel '{symbol}' ({}): {e}", kernel.name));
        let tile = tile_of(lower::element_of(kernel).map_err(fail)?, config)?;
        let (code, info) = lower::lower_kernel(kernel, symbol, tile).map_err(fail)?;
        Ok(LoweredKernel { info, code: postcard::to_stdvec(&code).expect("cutlass code encodes") })
    }

    fn compile_module(&self, target: &Target, kernels: &[LoweredKernel]) -> Result<Module, BackendError> {
        check_target(target)?;
        let tools = toolchain::toolchain().map_err(|why| BackendError::toolchain(NAME, "nvcc with the CUTLASS headers", why))?;
        let codes = kernels.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
        // Names are unique across the module (checked on its whole source).
        module_source_of(kernels, &codes)?;
        // One nvcc program per kernel, compiled in parallel and kept for the process by its text
        // ([`toolchain::Toolchain::compile_for`]): a plan's module takes the cubins the tune stage compiled for
        // the same kernels, and no program waits for another's instantiations.
        let arch = toolchain::arch(target);
        let cubins: Vec<Result<Vec<u8>, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = kernels
                .iter()
                .zip(&codes)
                .map(|(k, code)| {
                    let arch = &arch;
                    s.spawn(move || {
                        let src = module_source_of(std::slice::from_ref(k), std::slice::from_ref(code)).map_err(|e| e.to_string())?;
                        tools.compile_for(arch, &src)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a compile thread does not panic")).collect()
        });
        let cubins = cubins.into_iter().collect::<Result<Vec<_>, String>>().map_err(|log| BackendError::compile(NAME, "nvcc", kernels, log))?;
        let functions: Vec<_> = codes.into_iter().map(|c| c.launches).collect();
        let launch_cubins = functions.iter().enumerate().map(|(k, f)| vec![k as u32; f.launches.len()]).collect();
        let bytes = CubinModule { arch, cubins, functions, launch_cubins }.encode();
        let module = Module { backend: NAME.into(), target: target.canonical(), format: tessera_kernels::runtime::cuda::FORMAT, functions: kernels.iter().map(|k| k.info.clone()).collect(), bytes };
        CubinModule::decode(&module).map_err(invalid)?;
        Ok(module)
    }
}
