//! What the GPU library backends (`cublas`, `cudnn`) share on the compile side: a kernel graph is a sequence
//! of chains (an anchor and the epilogues fused into it, by `gemm`'s chain rule), each one library call;
//! [`chain_ends`] finds them, [`Places`] says where every value a call touches lives (an argument, or scratch
//! for a chain result that feeds the next chain of a merged partition), and [`compile_module`] packs the calls
//! into a checked module.

use crate::backend::{refuse, Refusal};
use super::{BackendError, FunctionInfo, LoweredKernel, Module, ModuleFormat};
use crate::ir::{self, Graph, NodeId, Op, ValueDef, ValueId};
use crate::target::Target;
use std::collections::BTreeMap;
use tessera_kernels::runtime::cuda::library::{CallDesc, LibraryModule, Operand};

fn node_err(g: &Graph, n: NodeId, msg: Refusal) -> Refusal {
    refuse!("node '{}' ({}): {msg}", g.node(n).name, g.node(n).op.name())
}

/// The last node of each chain of `g`, in topological order (where its call is emitted, so everything the
/// call reads exists). Every node must be an anchor (`is_anchor`, checked by `check_anchor`) or an epilogue
/// continuing the chain of its fused input's producer.
pub fn chain_ends(g: &Graph, is_anchor: impl Fn(&Op) -> bool, check_anchor: impl Fn(NodeId) -> Result<(), Refusal>) -> Result<Vec<NodeId>, Refusal> {
    ir::verify(g).map_err(|e| format!("invalid kernel graph: {e}"))?;
    let uses = g.use_counts();
    let mut chain_of: Vec<Option<usize>> = vec![None; g.nodes.len()];
    let mut lasts: Vec<NodeId> = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let n = NodeId(i as u32);
        if is_anchor(&node.op) {
            check_anchor(n).map_err(|e| node_err(g, n, e))?;
            chain_of[i] = Some(lasts.len());
            lasts.push(n);
            continue;
        }
        let f = crate::rules::epilogue::fusion(g, n, &|v| uses[v.index()]).map_err(|e| node_err(g, n, e.into()))?;
        let p = g.producer(f.input()).ok_or_else(|| node_err(g, n, "its input has no producer".into()))?;
        let c = chain_of[p.index()].ok_or_else(|| node_err(g, n, "not fused into an anchor of this kernel".into()))?;
        lasts[c] = n;
        chain_of[i] = Some(c);
    }
    lasts.sort();
    Ok(lasts)
}

/// The strided-batch form of a MatMul, as the GPU GEMM libraries (`cublas`, `cutlass`) run it: `(batch, m, n, k,
/// a_stride, b_stride)` in elements (a stride of 0: the same matrix for every batch), or why it has none.
pub fn matmul_shape(g: &Graph, n: NodeId) -> Result<(u64, u64, u64, u64, u64, u64), Refusal> {
    let node = g.node(n);
    if node.op != Op::MatMul {
        return Err(refuse!("a GEMM library runs MatMul, not {}", node.op.name()));
    }
    let dt = g.ty(node.outputs[0]).dtype;
    if let Some(&v) = node.inputs.iter().find(|&&v| g.ty(v).dtype != dt) {
        return Err(refuse!("MatMul of mixed types ({} and {})", g.ty(v), g.ty(node.outputs[0])));
    }
    if !matches!(dt, crate::ir::DType::F32 | crate::ir::DType::F16 | crate::ir::DType::BF16) {
        return Err(refuse!("GEMM libraries run f32, f16 and bf16 MatMuls, got {dt:?}"));
    }
    let (sa, sb) = (&g.ty(node.inputs[0]).shape, &g.ty(node.inputs[1]).shape);
    if sa.len() < 2 || sb.len() < 2 {
        return Err("GEMM libraries take MatMul operands of rank 2 or more".into());
    }
    let u = |x: usize| x as u64;
    let (m, k, nn) = (u(sa[sa.len() - 2]), u(sa[sa.len() - 1]), u(sb[sb.len() - 1]));
    let (ba, bb) = (&sa[..sa.len() - 2], &sb[..sb.len() - 2]);
    let batch = crate::ir::broadcast_shapes(ba, bb).map_err(|e| e.to_string())?;
    let count: u64 = batch.iter().map(|&d| u(d)).product();
    // An operand is shared (all its batch dims 1) or dense over the whole batch (its batch dims equal it, after
    // right-aligning): anything in between needs more than one stride.
    let stride = |x: &[usize], mat: u64| -> Result<u64, Refusal> {
        let numel: u64 = x.iter().map(|&d| u(d)).product();
        if numel == 1 {
            Ok(0)
        } else if numel == count {
            Ok(mat)
        } else {
            Err(refuse!("MatMul batch {x:?} broadcast to {batch:?} is not one strided batch"))
        }
    };
    let (sa_b, sb_b) = (stride(ba, m * k)?, stride(bb, k * nn)?);
    if [m, k, nn].iter().any(|&d| d == 0 || d > i32::MAX as u64) || count == 0 {
        return Err(refuse!("MatMul of {m}x{k} by {k}x{nn}: empty or too large for a 32-bit GEMM"));
    }
    if sb_b == 0 && count > 1 {
        // A's batches stacked into one tall GEMM (C is dense in the same order).
        return Ok((1, m * count, nn, k, 0, 0));
    }
    Ok((count.max(1), m, nn, k, sa_b, sb_b))
}

fn align256(x: u64) -> u64 {
    x.div_ceil(256) * 256
}

/// Where each value a kernel's calls touch lives: inputs and outputs in their arguments, intermediate chain
/// results in scratch (256-byte aligned, never reused: a merged partition holds few of them).
pub struct Places {
    loc: BTreeMap<ValueId, (u32, u64)>,
    scratch_arg: u32,
    scratch_used: u64,
}

impl Places {
    pub fn new(g: &Graph) -> Result<Places, Refusal> {
        let n_in = g.inputs.len() as u32;
        let mut loc = BTreeMap::new();
        for (i, &v) in g.inputs.iter().enumerate() {
            loc.insert(v, (i as u32, 0));
        }
        for (j, &v) in g.outputs.iter().enumerate() {
            if !matches!(g.value(v).def, ValueDef::Node { .. }) {
                return Err(refuse!("output {j} ('{}') is not computed by a node of the kernel", g.value(v).name));
            }
            if loc.insert(v, (n_in + j as u32, 0)).is_some() {
                return Err(refuse!("output {j} ('{}') is listed twice", g.value(v).name));
            }
        }
        Ok(Places { loc, scratch_arg: n_in + g.outputs.len() as u32, scratch_used: 0 })
    }

    /// Where chain result `v` goes: its output argument, or fresh scratch.
    pub fn result(&mut self, g: &Graph, v: ValueId, batch_stride: u64) -> Operand {
        let (arg, offset) = *self.loc.entry(v).or_insert_with(|| {
            let at = (self.scratch_arg, self.scratch_used);
            self.scratch_used = align256(self.scratch_used + g.ty(v).size_bytes() as u64);
            at
        });
        Operand { arg, offset, batch_stride }
    }

    /// Where `v` is read from.
    pub fn read(&self, g: &Graph, v: ValueId, batch_stride: u64) -> Result<Operand, Refusal> {
        match self.loc.get(&v) {
            Some(&(arg, offset)) => Ok(Operand { arg, offset, batch_stride }),
            None => Err(refuse!("value '{}' is a constant inside the kernel or read before it is computed", g.value(v).name)),
        }
    }

    /// The workspace, after the intermediates.
    pub fn workspace(&self) -> Operand {
        Operand { arg: self.scratch_arg, offset: self.scratch_used, batch_stride: 0 }
    }

    /// The function's signature, with scratch for the intermediates and a workspace of `workspace` bytes.
    pub fn info(&self, g: &Graph, symbol: &str, workspace: u64) -> FunctionInfo {
        FunctionInfo {
            symbol: symbol.to_string(),
            inputs: g.inputs.iter().map(|&v| g.ty(v).clone()).collect(),
            outputs: g.outputs.iter().map(|&v| g.ty(v).clone()).collect(),
            scratch_bytes: self.scratch_used + workspace,
        }
    }
}

/// One module of `format` from the lowered kernels (each a postcard list of calls `C`), checked as the runtime
/// will check it when loading: a module that would not load is refused here ([`BackendError::Invalid`]).
pub fn compile_module<C: CallDesc>(backend: &str, target: &Target, format: ModuleFormat, kernels: &[LoweredKernel]) -> Result<Module, BackendError> {
    let err = |why: String| BackendError::invalid(backend, why);
    let functions = kernels
        .iter()
        .map(|k| postcard::from_bytes::<Vec<C>>(&k.code).map_err(|e| err(format!("kernel '{}': undecodable lowered code ({e})", k.info.symbol))))
        .collect::<Result<Vec<_>, _>>()?;
    let module = Module {
        backend: backend.into(),
        target: target.canonical(),
        format,
        functions: kernels.iter().map(|k| k.info.clone()).collect(),
        bytes: LibraryModule { functions }.encode(),
    };
    LibraryModule::<C>::decode(&module).map_err(|e| err(e.to_string()))?;
    Ok(module)
}

/// The tuning space the library backends share: which of the library heuristic's answers a call runs,
/// by rank (0: the library's first choice), `ranks` of them. Rank 0 is the backend's default configuration
/// (`<backend>/v<version>/default`), rank `r` is `<backend>/v<version>/algo<r>`.
#[derive(Clone, Copy, Debug)]
pub struct Ranks {
    pub backend: &'static str,
    pub version: u32,
    pub ranks: u8,
}

impl Ranks {
    /// The configuration running the heuristic's answer of rank `rank`.
    pub fn name(&self, rank: u8) -> String {
        if rank == 0 {
            format!("{}/v{}/default", self.backend, self.version)
        } else {
            format!("{}/v{}/algo{rank}", self.backend, self.version)
        }
    }

    /// Every configuration, the default first.
    pub fn all(&self) -> Vec<String> {
        (0..self.ranks).map(|r| self.name(r)).collect()
    }

    /// The rank `config` names; an error naming the configurations there are.
    pub fn rank(&self, config: &str) -> Result<u8, BackendError> {
        (0..self.ranks)
            .find(|&r| self.name(r) == config)
            .ok_or_else(|| BackendError::unsupported(self.backend, format!("no configuration '{config}' (it has {})", self.all().join(", "))))
    }
}
