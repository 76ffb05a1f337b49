//! Lowering one kernel graph (a partition) to CUDA: the shared fusion plan (`backend/lowering/plan.rs`) orders it
//! into items, each item becomes one or more `__global__` kernels (see [`super::kernel`]), and their
//! launches bind each kernel parameter to the function's argument array (`[inputs.., outputs.., scratch]`),
//! scratch values at offsets laid out by liveness. Everything is emitted in a fixed order from the canonical
//! kernel graph, so equal partitions give byte-identical source.

use crate::backend::{refuse, Refusal};
use super::gemm::{self, Knobs};
use super::kernel::{const_array, Binding, Kernel};
use super::{attention, movement, nd, pool, reduce, scan};
use crate::backend::lowering::plan::{plan_with_views, Group, Item, Plan, Storage, Views};
use crate::backend::lowering::scratch::{assign, Request};
use crate::backend::FunctionInfo;
use crate::ir::{self, Graph, NodeId, Op, ValueId};
use serde::{Deserialize, Serialize};
use tessera_kernels::runtime::cuda::format::{FunctionLaunches, Launch, LaunchArg};

/// What [`lower`] makes of a partition: its kernels' source and its launches (postcard-encoded as the
/// lowered kernel's code).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaCode {
    pub source: String,
    pub launches: FunctionLaunches,
    /// Where each launch's kernel text starts in `source`, one offset per launch, in order: the text before
    /// the first is what every launch may use (the kernel's constant arrays), and each launch's text runs
    /// to the next offset. Empty: the source is one piece, compiled whole.
    pub entry_offsets: Vec<u32>,
}

pub struct Lowered {
    pub code: CudaCode,
    pub info: FunctionInfo,
}

fn is_identifier(s: &str) -> bool {
    let mut ch = s.chars();
    matches!(ch.next(), Some(c) if c.is_ascii_alphabetic() || c == '_') && ch.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Why a graph cannot be lowered: the first value whose dtype the backend does not run, or one too large
/// for 32-bit indexing.
pub fn unsupported(g: &Graph) -> Option<String> {
    for node in &g.nodes {
        for &v in node.inputs.iter().chain(&node.outputs) {
            let ty = g.ty(v);
            if ty.numel() >= 1 << 31 {
                return Some(format!("node '{}' ({}): a tensor of {} elements exceeds 32-bit indexing", node.name, node.op.name(), ty.numel()));
            }
        }
    }
    None
}

/// What this backend's kernels address through strided views: the tensor-core attention reads Q, K and V
/// and stores its output through them, so the heads' movement around it (out of a fused QKV projection,
/// into and out of heads) runs no kernel.
struct CudaViews;

impl Views for CudaViews {
    fn reads_view(&self, g: &Graph, node: NodeId, input: usize) -> bool {
        input < 3 && self.stores_view(g, node)
    }

    fn stores_view(&self, g: &Graph, node: NodeId) -> bool {
        matches!(&g.node(node).op, Op::Attention(a) if attention::on_tensor_cores(g, node, a))
    }
}

/// The plan this backend lowers: [`crate::backend::lowering::plan`]'s, with [`CudaViews`].
pub fn cuda_plan(g: &Graph) -> Plan {
    plan_with_views(g, &CudaViews)
}

/// The kernels of one item.
fn emit_item<'a>(g: &'a Graph, p: &'a Plan, symbol: &'a str, item: &Item, knobs: Knobs) -> Result<Vec<Kernel<'a>>, Refusal> {
    let one = |f: &mut dyn FnMut(&mut Kernel<'a>) -> Result<(), Refusal>| -> Result<Vec<Kernel<'a>>, Refusal> {
        let mut k = Kernel::new(g, p, symbol);
        f(&mut k)?;
        Ok(vec![k])
    };
    // A GEMM may add a second kernel (the split-K reduction and epilogue).
    let gemm = |f: &mut dyn FnMut(&mut Kernel<'a>) -> Result<Option<Kernel<'a>>, Refusal>| -> Result<Vec<Kernel<'a>>, Refusal> {
        let mut k = Kernel::new(g, p, symbol);
        k.knobs = knobs;
        let second = f(&mut k)?;
        Ok(std::iter::once(k).chain(second).collect())
    };
    match item {
        Item::Group(gid) => {
            let grp = &p.groups[*gid];
            match grp.anchor {
                None => one(&mut |k| super::ew::standalone(k, grp)),
                Some(a) => match &g.node(a).op {
                    Op::MatMul => gemm(&mut |k| gemm::matmul(k, a, grp)),
                    Op::Conv(attrs) => gemm(&mut |k| gemm::conv(k, a, attrs, grp, false)),
                    Op::NhwcConv(attrs) => gemm(&mut |k| gemm::conv(k, a, attrs, grp, true)),
                    op => Err(refuse!("{} cannot anchor a group", op.name())),
                },
            }
        }
        Item::Copy { from, output } => one(&mut |k| {
            movement::copy_value(k, *from, *output);
            Ok(())
        }),
        // Movement whose outputs are read through views, or already stored by its input's producer.
        Item::Node(n) if !p.moves(g, *n) => Ok(Vec::new()),
        Item::Node(n) => {
            let node = g.node(*n);
            let at = |e: Refusal| refuse!("node '{}' ({}): {e}", node.name, node.op.name());
            let f32_out = super::kernel::is_float(g.ty(node.outputs[0]).dtype);
            let alone = Group::anchored(g, *n);
            match &node.op {
                Op::MatMul if f32_out => gemm(&mut |k| gemm::matmul(k, *n, &alone)),
                Op::MatMul => one(&mut |k| gemm::matmul_int(k, *n)),
                Op::Conv(a) => gemm(&mut |k| gemm::conv(k, *n, a, &alone, false)),
                Op::NhwcConv(a) => gemm(&mut |k| gemm::conv(k, *n, a, &alone, true)),
                Op::ConvTranspose(a) => one(&mut |k| gemm::conv_transpose(k, *n, a)),
                Op::BatchNorm { epsilon } => one(&mut |k| reduce::batch_norm(k, *n, *epsilon)),
                Op::MaxPool(pa) => one(&mut |k| pool::pool(k, *n, pa, None, false)),
                Op::NhwcMaxPool(pa) => one(&mut |k| pool::pool(k, *n, pa, None, true)),
                Op::AveragePool { pool: pa, count_include_pad } => one(&mut |k| pool::pool(k, *n, pa, Some(*count_include_pad), false)),
                Op::GlobalAveragePool => {
                    let r = g.ty(node.inputs[0]).rank();
                    one(&mut |k| reduce::reduce(k, *n, ir::ReduceKind::Mean, &(2..r).collect::<Vec<_>>()))
                }
                Op::Reduce { kind, axes, .. } => one(&mut |k| reduce::reduce(k, *n, *kind, axes)),
                Op::Softmax { axis } => one(&mut |k| reduce::softmax(k, *n, *axis, false)),
                Op::LogSoftmax { axis } => one(&mut |k| reduce::softmax(k, *n, *axis, true)),
                Op::LayerNorm { axis, epsilon } => one(&mut |k| reduce::layer_norm(k, *n, *axis, *epsilon)),
                // No kernel when the output is empty.
                Op::Attention(attrs) => {
                    let mut k = Kernel::new(g, p, symbol);
                    k.knobs = knobs;
                    attention::attention(&mut k, *n, attrs).map(|needed| if needed { vec![k] } else { Vec::new() })
                }
                Op::Transpose { perm } => one(&mut |k| {
                    movement::transpose(k, *n, perm);
                    Ok(())
                }),
                Op::Concat { axis } => Ok((0..node.inputs.len())
                    .filter(|&w| g.ty(node.inputs[w]).numel() > 0)
                    .map(|w| {
                        let mut k = Kernel::new(g, p, symbol);
                        movement::concat_one(&mut k, *n, *axis, w);
                        k
                    })
                    .collect()),
                Op::Split { axis, sizes } => Ok((0..sizes.len())
                    .filter(|&o| p.materialized[node.outputs[o].index()] && g.ty(node.outputs[o]).numel() > 0)
                    .map(|o| {
                        let mut k = Kernel::new(g, p, symbol);
                        movement::split_one(&mut k, *n, *axis, sizes, o);
                        k
                    })
                    .collect()),
                Op::Slice { axes, starts, steps, .. } => one(&mut |k| {
                    movement::slice(k, *n, axes, starts, steps);
                    Ok(())
                }),
                Op::Gather { axis } => one(&mut |k| {
                    movement::gather(k, *n, *axis);
                    Ok(())
                }),
                Op::GatherElements { axis } => one(&mut |k| movement::gather_elements(k, *n, *axis)),
                Op::Expand { .. } => one(&mut |k| {
                    movement::expand(k, *n);
                    Ok(())
                }),
                Op::Tile { repeats } => one(&mut |k| {
                    movement::tile(k, *n, repeats);
                    Ok(())
                }),
                Op::Pad { pads, mode, value } => one(&mut |k| movement::pad(k, *n, pads, *mode, *value)),
                // No kernel when there is nothing to compute.
                Op::CumSum { .. } | Op::GatherND { .. } | Op::ScatterND if g.ty(node.outputs[0]).numel() == 0 => Ok(Vec::new()),
                Op::CumSum { axis, exclusive, reverse } => one(&mut |k| {
                    scan::cumsum(k, *n, *axis, *exclusive, *reverse);
                    Ok(())
                }),
                Op::GatherND { batch_dims } => one(&mut |k| {
                    nd::gather_nd(k, *n, *batch_dims);
                    Ok(())
                }),
                Op::ScatterND => {
                    let mut copy = Kernel::new(g, p, symbol);
                    nd::scatter_nd_copy(&mut copy, *n);
                    let mut kernels = vec![copy];
                    if g.ty(node.inputs[2]).numel() > 0 {
                        let mut upd = Kernel::new(g, p, symbol);
                        nd::scatter_nd_updates(&mut upd, *n);
                        kernels.push(upd);
                    }
                    Ok(kernels)
                }
                op => Err(refuse!("{} is not planned as a standalone item", op.name())),
            }
            .map_err(at)
        }
    }
}

/// Lowers with the default schedules ([`lower_with`] [`Knobs::default`]).
pub fn lower(g: &Graph, symbol: &str) -> Result<Lowered, Refusal> {
    lower_with(g, symbol, Knobs::default())
}

/// Lowers `g` to the function `symbol`, its GEMMs scheduled as `knobs` say.
pub fn lower_with(g: &Graph, symbol: &str, knobs: Knobs) -> Result<Lowered, Refusal> {
    if !is_identifier(symbol) {
        return Err(refuse!("symbol '{symbol}' is not a C identifier"));
    }
    ir::verify(g).map_err(|e| e.to_string())?;
    if let Some(why) = unsupported(g) {
        return Err(why.into());
    }
    let p = cuda_plan(g);
    let (n_in, n_out) = (g.inputs.len(), g.outputs.len());

    let mut kernels: Vec<(usize, Kernel)> = Vec::new();
    for (i, item) in p.items.iter().enumerate() {
        for k in emit_item(g, &p, symbol, item, knobs)? {
            kernels.push((i, k));
        }
    }

    // Scratch: a value lives from the item that writes it to the last item that reads it.
    let mut reqs: Vec<Request> = Vec::new();
    let mut value_req: Vec<Option<usize>> = vec![None; g.values.len()];
    for &(root, bytes) in &p.scratch {
        let start = p.items.iter().position(|it| p.writes(g, it).contains(&root)).unwrap_or(0);
        let end = p.items.iter().rposition(|it| p.reads(g, it).contains(&root)).unwrap_or(start).max(start);
        value_req[root.index()] = Some(reqs.len());
        reqs.push(Request { bytes, start, end });
    }
    // Item-private buffers (split-K partials) live during their item only.
    let mut temp_req: Vec<((usize, u32), usize)> = Vec::new();
    for (item, k) in &kernels {
        for &(id, bytes) in &k.temps {
            match temp_req.iter().find(|(key, _)| *key == (*item, id)) {
                Some(&(_, r)) => reqs[r].bytes = reqs[r].bytes.max(bytes),
                None => {
                    temp_req.push(((*item, id), reqs.len()));
                    reqs.push(Request { bytes, start: *item, end: *item });
                }
            }
        }
    }
    let (offsets, scratch_bytes) = assign(&reqs);

    let mut consts: Vec<ValueId> = kernels.iter().flat_map(|(_, k)| k.consts.iter().copied()).collect();
    consts.sort();
    consts.dedup();
    let (n_nodes, n_items, n_launches) = (g.nodes.len(), p.items.len(), kernels.len());
    let mut source = format!("/* tessera cuda kernel {symbol}: {n_nodes} nodes, {n_items} items, {n_launches} launches, {scratch_bytes} scratch bytes */\n");
    for &c in &consts {
        source.push_str(&const_array(symbol, c, g.constant(c).expect("const storage holds a constant")));
    }
    let mut launches = Vec::with_capacity(kernels.len());
    let mut entry_offsets = Vec::with_capacity(kernels.len());
    for (j, (item, k)) in kernels.iter().enumerate() {
        let entry = format!("{symbol}_k{item}_{j}");
        entry_offsets.push(u32::try_from(source.len()).map_err(|_| format!("kernel {symbol}: its source passes 4 GiB"))?);
        source.push_str(&k.render(&entry));
        let args = k
            .params
            .iter()
            .map(|(b, _)| match b {
                Binding::Temp(id) => {
                    let r = temp_req.iter().find(|(key, _)| *key == (*item, *id)).expect("a temp has a request").1;
                    Ok(LaunchArg { index: (n_in + n_out) as u32, offset: offsets[r] })
                }
                Binding::Output(o) => Ok(LaunchArg { index: (n_in + o) as u32, offset: 0 }),
                Binding::Root(root) => match p.storage[root.index()].as_ref() {
                    Some(Storage::Input(i)) => Ok(LaunchArg { index: *i as u32, offset: 0 }),
                    Some(Storage::Output(o)) => Ok(LaunchArg { index: (n_in + o) as u32, offset: 0 }),
                    Some(Storage::Scratch(_)) => {
                        Ok(LaunchArg { index: (n_in + n_out) as u32, offset: offsets[value_req[root.index()].expect("a scratch value has a request")] })
                    }
                    other => Err(refuse!("value {root} has no buffer to pass ({other:?})")),
                },
            })
            .collect::<Result<Vec<_>, Refusal>>()?;
        launches.push(Launch { entry, grid: k.grid, block: k.block, shared_bytes: k.shared_bytes, args });
    }
    let info = FunctionInfo {
        symbol: symbol.to_string(),
        inputs: g.inputs.iter().map(|&v| g.ty(v).clone()).collect(),
        outputs: g.outputs.iter().map(|&v| g.ty(v).clone()).collect(),
        scratch_bytes,
    };
    Ok(Lowered { code: CudaCode { source, launches: FunctionLaunches { launches }, entry_offsets }, info })
}
