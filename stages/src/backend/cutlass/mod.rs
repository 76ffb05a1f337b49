//! The `cutlass` backend (`cuda -compiler=cutlass`): MatMuls (batched, broadcast batch) with their fused
//! epilogues (a bias or a residual, then ReLU, GELU, Sigmoid or HardSwish) as CUTLASS kernels, fp16 and bf16 on
//! tensor cores with fp32 accumulation and fp32 on the SIMT cores, compiled by nvcc, a program per kernel; with
//! the target's `-convs`, channels-last 2-D convolutions too ([`conv`], fp16 and bf16).
//!
//! CUTLASS is used as a template library: [`lower`] writes, per chain, an `extern "C" __global__` function for
//! its fixed problem, in one of two families. The sm80 one instantiates the prelude's `tessera::gemm` template
//! (`gemm.cuh`; [`instance::Gemm`]: element, tile configuration, alignments, activation), which builds its
//! parameters on the device from the launch's pointers. The Hopper one ([`hopper`]) runs CUTLASS 3.x's TMA
//! kernels, whose parameters a probe program builds at compile time and the launch carries as a parameter
//! block. [`toolchain`] runs nvcc with the CUTLASS headers (on any machine: the PyPI wheels of nvcc and CUTLASS
//! serve a machine without a GPU). The module is a cubin module like the `cuda` backend's, so the runtime loads
//! and launches it with no code of its own.
//!
//! Tuning space: the tile configurations of the target's precision and architecture
//! ([`instance::tiles`]: threadblock and warp tiles, stages; on sm_90 also [`hopper::HOPPER_TILES`]: schedule
//! and tile), `cutlass/v<version>/<tile>`; the tune stage measures each on the GPU and the plan records the
//! fastest.

pub mod conv;
pub mod cost;
pub mod hopper;
pub mod instance;
pub mod lower;
pub mod support;
pub mod toolchain;

#[cfg(test)]
mod tests;

use crate::backend::{Backend, BackendError, LoweredKernel, Module, ToolError, TunableSet};
use crate::ir::{Graph, NodeId};
use crate::rules::Rule;
use crate::target::{AttrValue, BackendSpec, Target};
use hopper::{HopperTile, HOPPER_TILES};
use instance::{tiles, Element, Tile};
use lower::{Config, CutlassCode};
use tessera_kernels::runtime::cuda::format::CubinModule;

/// The backend's name, as `cuda -compiler=cutlass` selects it.
pub const NAME: &str = "cutlass";

/// Bump whenever the meaning of generated code changes (it names configurations).
pub const VERSION: u32 = 1;

/// The GEMM template every module starts with.
pub const PRELUDE: &str = include_str!("gemm.cuh");

/// The conv2d template, in modules with a convolution (after [`PRELUDE`]).
pub const CONV_PRELUDE: &str = include_str!("conv.cuh");

/// The Hopper family's headers, in modules with a Hopper launch (and in their probes).
pub const HOPPER_PRELUDE: &str = include_str!("gemm_sm90.cuh");

/// Without NDEBUG, CUTLASS 3.x's device asserts put the absolute path of their header into the cubin: the
/// same module would differ byte for byte between machines that keep the headers in different folders.
/// (The sm80 template has none, and its modules keep the bytes they had.)
const HOPPER_DEFINES: &str = "#define NDEBUG\n";

/// The backend's description: its `-compiler` value and its own options.
/// Why default builds leave `cutlass` out ([`Backend::opt_in`]). Measured on one H200 (2026-11-28,
/// bench/compile_times.md): each CUTLASS 3.x program is 20 s of nvcc front end (template instantiation) before a
/// single kernel is timed, and tuning compiles two or three per GEMM chain, so BERT-base b8 compiled cold in
/// 69 s with `cutlass` against 13-18 s without, GPT-2 s256 in 64 s. What it bought: 2.7% of BERT-base b8's
/// latency, 0.3% of GPT-2's, nothing on CNNs (cuDNN takes their convolutions and cuBLASLt their classifiers).
pub const OPT_IN: &str = "each kernel is an nvcc program of about 20 s: a transformer's cold compile takes 4-5x longer for 0-3% of its latency (bench/compile_times.md); name it with --target to use it";

pub static SPEC: BackendSpec = BackendSpec {
    name: NAME,
    device: "cuda",
    compiler: "cutlass",
    doc: "CUTLASS GEMM (and, with -convs, channels-last conv) templates with fused bias, residual and activation epilogues, compiled by nvcc",
    options: &[
        crate::target::AttrSpec {
            name: "convs",
            ty: crate::target::AttrType::Bool,
            default: "false",
            doc: "also run channels-last 2-D convolutions (implicit GEMM on the sm80 tiles); off by default: on an H200 they measured at about half cuDNN's speed on ResNet-50 and MobileNetV2 and added about a minute of nvcc to a CNN's cold compile (bench/gpu_cutlass.md)",
        },
        crate::backend::TUNE_CONFIGS,
    ],
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

fn hopper_config_name(tile: &HopperTile) -> String {
    format!("{NAME}/v{VERSION}/{}", tile.name())
}

/// Whether a target's kernels may use the Hopper family: the 16-bit types on sm_90.
fn hopper_target(target: &Target, element: Element) -> bool {
    element.is_half() && toolchain::arch(target) == "sm_90"
}

/// Every configuration of `element` on `target`: the sm80 tiles, then the Hopper ones where they run.
fn all_configs(target: &Target, element: Element) -> Vec<(String, Config)> {
    let mut out: Vec<(String, Config)> = tiles(element).iter().map(|t| (config_name(t), Config::Sm80(*t))).collect();
    if hopper_target(target, element) {
        out.extend(HOPPER_TILES.iter().map(|t| (hopper_config_name(t), Config::Hopper(*t))));
    }
    out
}

/// The configuration a name names, among those of `element` on `target`.
fn config_of(target: &Target, element: Element, config: &str) -> Result<Config, BackendError> {
    let all = all_configs(target, element);
    all.iter().find(|(n, _)| n == config).map(|(_, c)| *c).ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
        unsupported(format!("no {element:?} configuration '{config}' on {} (it has {})", toolchain::arch(target), names.join(", ")))
    })
}

fn decode(k: &LoweredKernel) -> Result<CutlassCode, BackendError> {
    postcard::from_bytes(&k.code).map_err(|e| invalid(format!("kernel '{}': undecodable lowered code ({e})", k.info.symbol)))
}

/// The whole CUDA C++ source of a module: the prelude (and the Hopper one where a kernel needs it), each
/// instantiation's type once, then each kernel's functions, in order.
pub fn module_source(kernels: &[LoweredKernel]) -> Result<String, BackendError> {
    let codes = kernels.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
    module_source_of(kernels, &codes)
}

fn is_hopper(codes: &[CutlassCode]) -> bool {
    codes.iter().any(|c| c.problems.iter().any(Option::is_some))
}

/// Whether a kernel instantiates the conv2d template (its types are [`conv::Conv`]s).
fn has_conv(codes: &[CutlassCode]) -> bool {
    codes.iter().any(|c| c.types.iter().any(|(name, _)| name.starts_with(conv::TYPE_PREFIX)))
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
    let hopper = is_hopper(codes);
    let mut src = String::from("/* tessera cutlass module */\n");
    if hopper {
        src.push_str(HOPPER_DEFINES);
    }
    src.push_str(PRELUDE);
    src.push('\n');
    if has_conv(codes) {
        src.push_str(CONV_PRELUDE);
        src.push('\n');
    }
    if hopper {
        src.push_str(HOPPER_PRELUDE);
        src.push('\n');
    }
    for decl in types.values() {
        src.push_str(decl);
    }
    src.push_str(&body);
    Ok(src)
}

/// The probe of a module's Hopper launches (see [`hopper`]): their types and a `main` building each
/// launch's parameters; with the launches it covers, as (kernel, launch) indices.
fn probe_of(codes: &[CutlassCode]) -> (String, Vec<(usize, usize)>) {
    let mut types: std::collections::BTreeMap<&str, &str> = std::collections::BTreeMap::new();
    let mut problems = Vec::new();
    let mut at = Vec::new();
    for (ki, code) in codes.iter().enumerate() {
        for (li, p) in code.problems.iter().enumerate() {
            if let Some(p) = p {
                if let Some((name, decl)) = code.types.iter().find(|(n, _)| *n == p.type_name) {
                    types.entry(name).or_insert(decl);
                }
                problems.push(p.clone());
                at.push((ki, li));
            }
        }
    }
    let mut src = String::from("/* tessera cutlass probe */\n");
    src.push_str(HOPPER_DEFINES);
    src.push_str("#define CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL 1\n");
    src.push_str(HOPPER_PRELUDE);
    for decl in types.values() {
        src.push_str(decl);
    }
    src.push_str(&hopper::probe_source(&problems));
    (src, at)
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
        toolchain::toolchain().map(|_| ()).map_err(|e| e.to_string())
    }

    fn opt_in(&self) -> Option<&'static str> {
        Some(OPT_IN)
    }

    fn environment(&self, target: &Target) -> Vec<(String, String)> {
        match toolchain::toolchain() {
            Ok(t) => t.environment(target),
            Err(why) => vec![("cutlass.toolchain".into(), format!("unavailable: {why}"))],
        }
    }

    fn supports(&self, g: &Graph, n: NodeId, target: &Target) -> bool {
        target.backend_name() == NAME && support::offered(g, n, target.bool_attr("convs"))
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
        all_configs(target, target_element(target)).into_iter().map(|(n, _)| n).collect()
    }

    fn default_config(&self, target: &Target) -> String {
        config_name(&tiles(target_element(target))[0])
    }


    /// On sm_90 where a Hopper tile has work enough (see below), the default and those Hopper tiles. Otherwise
    /// the default tile, then the other tiles of the kernel's element type whose grids fill at least half the
    /// GPU ([`cost::SMS`]) for every GEMM (and convolution's implicit GEMM) of the kernel: a tile that leaves most SMs idle loses to a smaller
    /// one, and each configuration measured is one more nvcc compile. When none fills it, the tile with the
    /// most threadblocks (the smallest of those) is measured beside the default.
    fn configs_for(&self, target: &Target, kernel: &Graph) -> Vec<String> {
        let e = match lower::element_of(kernel) {
            Ok(e) if e == target_element(target) => e,
            _ => return vec![self.default_config(target)],
        };
        let shapes: Vec<(u64, u64, u64, u64, u64, u64)> = kernel
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.op == crate::ir::Op::MatMul)
            .filter_map(|(i, _)| crate::backend::library::matmul_shape(kernel, NodeId(i as u32)).ok())
            .collect();
        let convs: Vec<conv::ConvProblem> = (0..kernel.nodes.len() as u32).filter_map(|i| conv::problem(kernel, NodeId(i)).ok()).collect();
        // Each GEMM's and each convolution's implicit GEMM, as (batch, M, N).
        let mut problems: Vec<(u64, u64, u64)> = shapes.iter().map(|&(batch, m, n, _, _, _)| (batch, m, n)).collect();
        problems.extend(convs.iter().map(|p| (1, p.gemm().0, p.gemm().1)));
        let ctas = |t: &Tile| problems.iter().map(|&(b, m, n)| b * m.div_ceil(t.threadblock[0] as u64) * n.div_ceil(t.threadblock[1] as u64)).min().unwrap_or(0);
        let work = |t: &HopperTile| problems.iter().map(|&(b, m, n)| b * m.div_ceil(t.threadblock[0] as u64) * n.div_ceil(t.threadblock[1] as u64)).min().unwrap_or(0);
        let hopper_runs = hopper_target(target, e) && !shapes.is_empty() && !conv::has_conv(kernel) && shapes.iter().all(|&(b, _, n, k, sa, sb)| lower::hopper_runs(e, b, n, k, sa, sb).is_ok());
        // The Hopper tiles with enough work: pingpong 64x128, the fastest Hopper tile on every BERT-base b8 and
        // GPT-2 GEMM measured (bench/gpu_cutlass.md), where it has work for half the SMs; the larger tiles
        // only where they have full waves of it (pingpong 128x128 one, the cooperative tiles two), as each is an
        // nvcc program of 20-60 s that a cold compile waits for.
        let waves = |t: &HopperTile| match (t.schedule, t.threadblock[0]) {
            (hopper::Schedule::Pingpong, 64) => 0.5,
            (hopper::Schedule::Pingpong, _) => 1.0,
            (hopper::Schedule::Cooperative, _) => 2.0,
        };
        let hopper: Vec<&HopperTile> = if hopper_runs { HOPPER_TILES.iter().filter(|t| work(t) as f64 >= waves(t) * cost::SMS).collect() } else { Vec::new() };
        let all = tiles(e);
        let mut out = vec![all[0]];
        if !convs.is_empty() {
            // A convolution's program is the slowest to compile (the conv iterators' headers): one tile beside
            // the default, the smallest where the default leaves SMs idle, the widest where it fills the GPU.
            let alt = if (ctas(&all[0]) as f64) < cost::SMS { all.iter().min_by_key(|t| t.threadblock[0] * t.threadblock[1]) } else { all.iter().max_by_key(|t| (t.threadblock[0] * t.threadblock[1], t.threadblock[1])) };
            out.extend(alt.filter(|t| **t != all[0]));
            return out.iter().map(config_name).collect();
        }
        // Where those exist, the best of them beat every sm80 tile on every GEMM of BERT-base b8 and GPT-2
        // measured (H200, bench/gpu_cutlass.md): the sm80 tiles besides the default are not measured, each
        // one an nvcc compile saved.
        if hopper.is_empty() {
            out.extend(all[1..].iter().filter(|t| ctas(t) as f64 >= cost::SMS / 2.0));
            if out.len() == 1 {
                // Most threadblocks, then the least padding (the smallest tile).
                if let Some(best) = all[1..].iter().min_by_key(|t| (std::cmp::Reverse(ctas(t)), t.threadblock[0] * t.threadblock[1])) {
                    out.push(*best);
                }
            }
        }
        let mut names: Vec<String> = out.iter().map(config_name).collect();
        names.extend(hopper.iter().map(|t| hopper_config_name(t)));
        // Where no Hopper tile fills half the GPU, the one with the most tiles.
        if hopper_runs && hopper.is_empty() {
            names.extend(HOPPER_TILES.iter().max_by_key(|t| (work(t), std::cmp::Reverse(t.threadblock[0] * t.threadblock[1]))).map(hopper_config_name));
        }
        names
    }

    fn lower(&self, target: &Target, kernel: &Graph, symbol: &str) -> Result<LoweredKernel, BackendError> {
        self.lower_config(target, kernel, symbol, &self.default_config(target))
    }

    fn lower_config(&self, target: &Target, kernel: &Graph, symbol: &str, config: &str) -> Result<LoweredKernel, BackendError> {
        check_target(target)?;
        let fail = |e: crate::backend::Refusal| unsupported(format!("kernel '{symbol}' ({}): {e}", kernel.name));
        let config = config_of(target, lower::element_of(kernel).map_err(fail)?, config)?;
        let (code, info) = lower::lower_kernel(kernel, symbol, config).map_err(fail)?;
        Ok(LoweredKernel { info, code: postcard::to_stdvec(&code).expect("cutlass code encodes") })
    }

    fn compile_module(&self, target: &Target, kernels: &[LoweredKernel]) -> Result<Module, BackendError> {
        check_target(target)?;
        let tools = toolchain::toolchain().map_err(|why| BackendError::toolchain(NAME, "nvcc with the CUTLASS headers", why.to_string()))?;
        let codes = kernels.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
        // Names are unique across the module (checked on its whole source).
        module_source_of(kernels, &codes)?;
        // One nvcc program per kernel (and one probe per Hopper kernel), compiled in parallel and kept for the
        // process by their text ([`toolchain::Toolchain::compile_for`]): a plan's module takes the cubins the
        // tune stage compiled for the same kernels, and no program waits for another's instantiations.
        let compiled: Vec<Result<(Vec<u8>, Vec<(usize, hopper::Probed)>), ToolError>> = std::thread::scope(|s| {
            let handles: Vec<_> = kernels
                .iter()
                .zip(&codes)
                .map(|(k, code)| {
                    s.spawn(move || {
                        let one = std::slice::from_ref(code);
                        let src = module_source_of(std::slice::from_ref(k), one).map_err(|e| ToolError::Failed(e.to_string()))?;
                        if !is_hopper(one) {
                            return Ok((tools.compile_for(&toolchain::arch(target), &src)?, Vec::new()));
                        }
                        // Hopper's wgmma and TMA are sm_90a's; the probe compiles beside the cubin.
                        let (cubin, probed) = std::thread::scope(|s| {
                            let probe = s.spawn(|| {
                                let (probe_src, at) = probe_of(one);
                                let output = tools.probe(&probe_src)?;
                                let args: Vec<Vec<_>> = at.iter().map(|&(_, l)| code.launches.launches[l].args.clone()).collect();
                                hopper::read_probe(&output, &args).map(|p| at.into_iter().map(|(_, l)| l).zip(p).collect::<Vec<_>>())
                            });
                            (tools.compile_for("sm_90a", &src), probe.join().expect("the probe thread does not panic"))
                        });
                        Ok((cubin?, probed?))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a compile thread does not panic")).collect()
        });
        let compiled = compiled.into_iter().collect::<Result<Vec<_>, ToolError>>().map_err(|log| BackendError::compile(NAME, "nvcc", kernels, log.to_string()))?;
        let hopper = is_hopper(&codes);
        let arch = if hopper { "sm_90a".to_string() } else { toolchain::arch(target) };
        let mut module = CubinModule { arch, cubins: Vec::new(), functions: Vec::new(), launch_cubins: Vec::new(), launch_params: Vec::new() };
        let mut functions: Vec<_> = codes.iter().map(|c| c.launches.clone()).collect();
        module.launch_params = functions.iter().map(|f| vec![None; f.launches.len()]).collect();
        module.launch_cubins = functions.iter().enumerate().map(|(k, f)| vec![k as u32; f.launches.len()]).collect();
        for (k, (cubin, probed)) in compiled.into_iter().enumerate() {
            module.cubins.push(cubin);
            for (l, p) in probed {
                let launch = &mut functions[k].launches[l];
                launch.grid = p.grid;
                launch.block = p.block;
                launch.shared_bytes = p.shared_bytes;
                launch.args.clear();
                module.launch_params[k][l] = Some(p.params);
            }
        }
        module.functions = functions;
        let module = Module { backend: NAME.into(), target: target.canonical(), format: module.format(), functions: kernels.iter().map(|k| k.info.clone()).collect(), bytes: module.encode() };
        CubinModule::decode(&module).map_err(invalid)?;
        Ok(module)
    }
}
