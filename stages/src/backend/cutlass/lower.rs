//! Lowering of one kernel graph (a partition) to CUTLASS kernels: one `extern "C" __global__` function per
//! chain (a MatMul or a channels-last Conv and the epilogue fused into it, by the rule of [`super::support`]),
//! each instantiating the prelude's `tessera::gemm` template (or `tessera::conv2d`, [`super::conv`]) for its
//! problem, with the instantiation's type declared once per module.
//! Chains are placed by [`crate::backend::library::Places`] (arguments, or scratch for a chain result that
//! feeds the next chain of a merged partition), so a function is a list of launches as the `cuda` backend's.

use crate::backend::{refuse, Refusal};
use super::conv;
use super::hopper::{self, HopperGemm, HopperTile, Problem, Source};
use super::instance::{alignment, Element, Gemm, Tile};
use super::support::{self, Addend};
use crate::backend::library::{chain_ends, Places};
use tessera_kernels::runtime::cuda::library::Operand;
use crate::backend::FunctionInfo;
use crate::ir::{Graph, NodeId, Op, ValueId};
use serde::{Deserialize, Serialize};
use std::fmt::Write;
use tessera_kernels::runtime::cuda::format::{FunctionLaunches, Launch, LaunchArg};

/// A lowered kernel: the C++ type declarations it needs, its functions' source, and its launches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CutlassCode {
    /// `(type name, declaration)` of each instantiation, declared once per module.
    pub types: Vec<(String, String)>,
    pub source: String,
    pub launches: FunctionLaunches,
    /// Per launch: the problem of a Hopper launch, whose parameter block, grid and shared memory the
    /// module's compile fills in ([`hopper`]); `None` for a launch of pointers.
    pub problems: Vec<Option<Problem>>,
}

/// A configuration of the backend: a tile of the sm80 family or of the Hopper family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Config {
    Sm80(Tile),
    Hopper(HopperTile),
}

/// Whether the Hopper kernels run a GEMM: 16-bit elements, rows of A, B and D 16-byte aligned (TMA's global
/// strides), and batches that each have their own A and B.
pub fn hopper_runs(element: Element, batch: u64, n: u64, k: u64, a_stride: u64, b_stride: u64) -> Result<(), Refusal> {
    if !element.is_half() {
        return Err(refuse!("the Hopper kernels run fp16 and bf16 GEMMs, not {element:?}"));
    }
    if n % 8 != 0 || k % 8 != 0 {
        return Err(refuse!("TMA needs rows of 16 bytes: K={k} and N={n} must be multiples of 8"));
    }
    if batch > 1 && (a_stride == 0 || b_stride == 0) {
        return Err("TMA needs a batch stride for each operand: a broadcast batch runs on the sm80 kernels".into());
    }
    Ok(())
}

/// The element type of a kernel graph's GEMMs (every MatMul of one kernel has the same: the chain rule and
/// a target's precision agree), or why there is none.
pub fn element_of(g: &Graph) -> Result<Element, Refusal> {
    let mut found = None;
    for node in g.nodes.iter().filter(|n| support::is_anchor_op(&n.op)) {
        let dt = g.ty(node.outputs[0]).dtype;
        let e = Element::of(dt).ok_or_else(|| format!("cutlass runs f32, f16 and bf16 GEMMs, got {dt:?}"))?;
        if found.is_some_and(|f| f != e) {
            return Err("one kernel mixes GEMMs of different element types".into());
        }
        found = Some(e);
    }
    found.ok_or_else(|| "a cutlass kernel needs a MatMul or a channels-last Conv".into())
}

fn arg(o: Operand) -> LaunchArg {
    LaunchArg { index: o.arg, offset: o.offset }
}

/// Lowers `g` with `config` into functions named `symbol_k<i>`.
pub fn lower_kernel(g: &Graph, symbol: &str, config: Config) -> Result<(CutlassCode, FunctionInfo), Refusal> {
    let element = element_of(g)?;
    let lasts = chain_ends(g, support::is_anchor_op, |n| support::anchor(g, n))?;
    let uses = g.use_counts();
    let use_of = |v: ValueId| uses[v.index()];
    let node_err = |n: NodeId, msg: Refusal| refuse!("node '{}' ({}): {msg}", g.node(n).name, g.node(n).op.name());
    let mut places = Places::new(g)?;
    let mut code = CutlassCode { types: Vec::new(), source: String::new(), launches: FunctionLaunches::default(), problems: Vec::new() };
    for (i, &last) in lasts.iter().enumerate() {
        let chain = support::chain_of(g, last, &use_of).map_err(|e| node_err(last, e))?;
        if matches!(g.node(chain.anchor).op, Op::NhwcConv(_)) {
            let Config::Sm80(tile) = config else {
                return Err(node_err(chain.anchor, "the Hopper tiles run GEMMs; a convolution runs on the sm80 tiles".into()));
            };
            lower_conv(g, &mut places, &mut code, &chain, element, tile, format!("{symbol}_k{i}")).map_err(|e| node_err(chain.anchor, e))?;
            continue;
        }
        let (batch, m, n, k, a_stride, b_stride) = crate::backend::library::matmul_shape(g, chain.anchor).map_err(|e| node_err(chain.anchor, e))?;
        let node = g.node(chain.anchor);
        let e = |msg: Refusal| node_err(chain.anchor, msg);
        let d_stride = if batch > 1 { m * n } else { 0 };
        let a = places.read(g, node.inputs[0], a_stride).map_err(e)?;
        let b = places.read(g, node.inputs[1], b_stride).map_err(e)?;
        // C: the epilogue's source, as (operand, leading dimension, batch stride).
        let c = match chain.addend {
            None => None,
            Some(Addend::Bias(v)) => Some((places.read(g, v, 0).map_err(|m| node_err(last, m))?, 0, 0)),
            Some(Addend::Residual(v)) => Some((places.read(g, v, d_stride).map_err(|m| node_err(last, m))?, n, d_stride)),
        };
        let d = places.result(g, g.node(last).outputs[0], d_stride);
        let tile = match config {
            Config::Sm80(tile) => tile,
            Config::Hopper(tile) => {
                hopper_runs(element, batch, n, k, a_stride, b_stride).map_err(e)?;
                let source = match chain.addend {
                    None => Source::None,
                    Some(Addend::Bias(_)) => Source::Bias,
                    Some(Addend::Residual(_)) => Source::Residual,
                };
                let gemm = HopperGemm { element, tile, source, activation: chain.activation };
                let type_name = gemm.type_name();
                if !code.types.iter().any(|(t, _)| *t == type_name) {
                    code.types.push((type_name.clone(), gemm.declaration()));
                }
                let entry = format!("{symbol}_k{i}");
                let _ = writeln!(code.source, "// node '{}': {batch} x ({m}x{k} by {k}x{n}), {source:?}, {:?}\n{}", node.name, chain.activation, hopper::entry_source(&entry, &type_name));
                let mut args = vec![arg(a), arg(b)];
                args.extend(c.map(|(o, _, _)| arg(o)));
                args.push(arg(d));
                // Grid and shared memory come from the probe, when the module compiles.
                code.launches.launches.push(Launch { entry, grid: [1, 1, 1], block: [hopper::THREADS, 1, 1], shared_bytes: 0, args });
                code.problems.push(Some(Problem { type_name, m, n, k, batch, a_stride, b_stride, source }));
                continue;
            }
        };
        let unaligned = || e(refuse!("extents K={k}, N={n} are not a multiple of any access width of {element:?}"));
        let gemm = Gemm {
            element,
            tile,
            align_a: alignment(element, k).ok_or_else(unaligned)?,
            align_b: alignment(element, n).ok_or_else(unaligned)?,
            align_c: alignment(element, n).ok_or_else(unaligned)?,
            activation: chain.activation,
        };
        let [tm, tn, _] = tile.threadblock;
        let grid = [m.div_ceil(tm as u64), n.div_ceil(tn as u64), batch.min(65535)];
        if grid[0] > i32::MAX as u64 || grid[1] > 65535 {
            return Err(e(refuse!("a {m}x{n} result needs a grid of {grid:?} tiles of {tm}x{tn}")));
        }
        let type_name = gemm.type_name();
        if !code.types.iter().any(|(t, _)| *t == type_name) {
            code.types.push((type_name.clone(), gemm.declaration()));
        }
        let entry = format!("{symbol}_k{i}");
        let (ld_c, c_stride) = c.map(|(_, ld, s)| (ld, s)).unwrap_or((0, 0));
        let c_param = if c.is_some() { "c" } else { "nullptr" };
        let c_decl = if c.is_some() { " const void* c," } else { "" };
        let _ = writeln!(
            code.source,
            "// node '{}': {batch} x ({m}x{k} by {k}x{n}){}, {:?}\n\
             extern \"C\" __global__ void __launch_bounds__({threads}) {entry}(const void* a, const void* b,{c_decl} void* d) {{\n  \
             tessera::gemm<{type_name}, {m}, {n}, {k}, {batch}, {a_stride}LL, {b_stride}LL, {ld_c}, {c_stride}LL>(a, b, {c_param}, d);\n}}",
            node.name,
            match chain.addend {
                None => "",
                Some(Addend::Bias(_)) => " + bias",
                Some(Addend::Residual(_)) => " + residual",
            },
            chain.activation,
            threads = tile.threads(),
        );
        let mut args = vec![arg(a), arg(b)];
        if let Some((o, _, _)) = c {
            args.push(arg(o));
        }
        args.push(arg(d));
        code.launches.launches.push(Launch {
            entry,
            grid: [grid[0] as u32, grid[1] as u32, grid[2] as u32],
            block: [tile.threads(), 1, 1],
            shared_bytes: tile.shared_bytes(element),
            args,
        });
        code.problems.push(None);
    }
    Ok((code, places.info(g, symbol, 0)))
}

/// One convolution chain's launch: `entry(x, w, [c,] y)` on the conv2d template ([`conv`]).
fn lower_conv(g: &Graph, places: &mut Places, code: &mut CutlassCode, chain: &support::Chain, element: Element, tile: Tile, entry: String) -> Result<(), Refusal> {
    let node = g.node(chain.anchor);
    let p = conv::problem(g, chain.anchor)?;
    let x = places.read(g, node.inputs[0], 0)?;
    let w = places.read(g, node.inputs[1], 0)?;
    let c = match chain.addend {
        None => None,
        Some(Addend::Bias(v)) => Some((places.read(g, v, 0)?, true)),
        Some(Addend::Residual(v)) => Some((places.read(g, v, 0)?, false)),
    };
    let y = places.result(g, g.node(chain.last).outputs[0], 0);
    let inst = conv::Conv::of(element, tile, &p, chain.activation)?;
    let type_name = inst.type_name();
    if !code.types.iter().any(|(t, _)| *t == type_name) {
        code.types.push((type_name.clone(), inst.declaration()));
    }
    let (m, n, k) = p.gemm();
    let _ = writeln!(
        code.source,
        "// node '{}': conv {}x{}x{}x{} * {}x{}x{}x{} (implicit GEMM {m}x{n}x{k}){}, {:?}\n{}",
        node.name,
        p.n,
        p.h,
        p.w,
        p.c,
        p.k,
        p.r,
        p.s,
        p.c,
        match c {
            None => "",
            Some((_, true)) => " + bias",
            Some((_, false)) => " + residual",
        },
        chain.activation,
        conv::entry_source(&entry, &type_name, &p, tile.threads(), c.map(|(_, bias)| bias)),
    );
    let mut args = vec![arg(x), arg(w)];
    args.extend(c.map(|(o, _)| arg(o)));
    args.push(arg(y));
    code.launches.launches.push(Launch { entry, grid: conv::grid(&p, &tile)?, block: [tile.threads(), 1, 1], shared_bytes: tile.shared_bytes(element), args });
    code.problems.push(None);
    Ok(())
}
