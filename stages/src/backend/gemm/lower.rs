//! Lowering of one kernel graph (a partition, extracted as a standalone graph) to a plan function.
//!
//! The kernel's nodes are grouped into chains by the rule of [`super::support`]: an anchor (MatMul or Conv)
//! followed by the epilogues fused into it. A chain is emitted where its last node stands in the kernel's
//! topological order, so every value its epilogues read (a residual, a bias) already exists; only a chain's
//! final value is materialized, in an output argument if it leaves the kernel and in scratch otherwise.
//!
//! MatMul becomes one batched `Sgemm` (batches of A stacked into one tall GEMM when B is shared, as a layer's
//! weight is). Conv becomes, per sample, an `Im2col` of all channels into scratch and one `Sgemm` batched over
//! groups; a 1x1, stride-1, unpadded conv multiplies the input in place (one `Sgemm` over samples and groups);
//! a depthwise conv (one input channel per group) of 1 or 2 spatial dimensions runs the direct `Depthwise2d`
//! loop, which is several times faster than one tiny GEMM per channel.

use crate::backend::{refuse, Refusal};
use super::arena::Arena;
use super::chain::Chain;
use super::layout::{self, ConvShape};
use super::plan::{Buf, Depthwise2d, EpOp, Epilogue, GeluKind, Im2col, Mat, PlanFunction, Sgemm, Step, View};
use super::support::{self, AnchorKind, Fusion, Unary};
use crate::backend::FunctionInfo;
use crate::ir::{self, broadcast_shapes, ConvAttrs, DType, GeluApprox, Graph, NodeId, Op, ValueDef, ValueId};
use std::collections::{BTreeMap, BTreeSet};

struct Lowerer<'g> {
    g: &'g Graph,
    /// Where each materialized value lives.
    loc: BTreeMap<ValueId, View>,
    consts: Vec<Vec<f32>>,
    arena: Arena,
    /// Scratch regions of materialized intermediates: offset and length.
    scratch: BTreeMap<ValueId, (u64, u64)>,
    /// Materialized values laid out channels-last (NHWC), from [`layout::channels_last`].
    nhwc: BTreeSet<ValueId>,
    steps: Vec<Step>,
}

fn u(x: usize) -> u64 {
    x as u64
}

fn product(d: &[usize]) -> u64 {
    d.iter().map(|&x| x as u64).product()
}

/// Row-major strides (in elements) of a dense tensor of shape `d`.
fn dense_strides(d: &[usize]) -> Vec<u64> {
    let mut s = vec![0u64; d.len()];
    let mut acc = 1u64;
    for i in (0..d.len()).rev() {
        s[i] = acc;
        acc *= d[i] as u64;
    }
    s
}

/// Strides of operand batch dims `x` broadcast to `batch` (right-aligned), times `mat` elements per matrix;
/// 0 along broadcast dimensions.
fn batch_strides(x: &[usize], batch: &[usize], mat: u64) -> Vec<u64> {
    let own = dense_strides(x);
    let lead = batch.len() - x.len();
    (0..batch.len())
        .map(|d| if d < lead || x[d - lead] == 1 { 0 } else { own[d - lead] * mat })
        .collect()
}

impl<'g> Lowerer<'g> {
    /// Where `v` lives; a constant is inlined into the plan on first use.
    fn view(&mut self, v: ValueId) -> Result<View, Refusal> {
        if let Some(&view) = self.loc.get(&v) {
            return Ok(view);
        }
        let val = self.g.value(v);
        match &val.def {
            ValueDef::Const(t) => {
                if t.dtype() != DType::F32 {
                    return Err(refuse!("constant '{}' is {}; the gemm backend runs f32 only", val.name, t.ty));
                }
                let view = View { buf: Buf::Const(self.consts.len() as u32), offset: 0 };
                self.consts.push(t.to_f32_vec());
                self.loc.insert(v, view);
                Ok(view)
            }
            _ => Err(refuse!("value '{}' is read before it is computed", val.name)),
        }
    }

    /// The chain's epilogue over its output, channels-last if `nhwc`: a per-channel operand then varies
    /// fastest (`inner` 1); same-shaped operands are channels-last too (see [`layout`]) and scalars have no layout.
    fn epilogue_ops(&mut self, chain: &Chain, nhwc: bool) -> Result<Vec<EpOp>, Refusal> {
        let mut ops = Vec::new();
        let anchor = self.g.node(chain.anchor);
        if let (AnchorKind::Conv, Some(&bias)) = (chain.kind, anchor.inputs.get(2)) {
            let out = &self.g.ty(anchor.outputs[0]).shape;
            let inner = if nhwc { 1 } else { product(&out[2..]) };
            ops.push(EpOp::Add { src: self.view(bias)?, inner, count: u(out[1]) });
        }
        for &(_, f) in &chain.eps {
            ops.push(match f {
                Fusion::Add { other, inner, count, .. } => {
                    let inner = if nhwc && count > 1 { 1 } else { inner };
                    EpOp::Add { src: self.view(other)?, inner, count }
                }
                Fusion::Unary { op, .. } => match op {
                    Unary::Relu => EpOp::Relu,
                    Unary::Clip { min, max } => EpOp::Clip { min, max },
                    Unary::Gelu(GeluApprox::Erf) => EpOp::Gelu(GeluKind::Erf),
                    Unary::Gelu(GeluApprox::Tanh) => EpOp::Gelu(GeluKind::Tanh),
                    Unary::Sigmoid => EpOp::Sigmoid,
                    Unary::HardSwish => EpOp::HardSwish,
                },
            });
        }
        Ok(ops)
    }

    fn matmul(&mut self, n: NodeId, dest: View, ops: Vec<EpOp>) -> Result<(), Refusal> {
        let node = self.g.node(n);
        let (av, bv) = (self.view(node.inputs[0])?, self.view(node.inputs[1])?);
        let (sa, sb) = (&self.g.ty(node.inputs[0]).shape, &self.g.ty(node.inputs[1]).shape);
        let a2: Vec<usize> = if sa.len() == 1 { vec![1, sa[0]] } else { sa.clone() };
        let b2: Vec<usize> = if sb.len() == 1 { vec![sb[0], 1] } else { sb.clone() };
        let (m, k, nn) = (u(a2[a2.len() - 2]), u(a2[a2.len() - 1]), u(b2[b2.len() - 1]));
        let (ba, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
        let batch = broadcast_shapes(ba, bb).map_err(|e| e.to_string())?;
        let (sa_b, sb_b) = (batch_strides(ba, &batch, m * k), batch_strides(bb, &batch, k * nn));
        // Size-1 batch dimensions index nothing.
        let keep: Vec<usize> = (0..batch.len()).filter(|&d| batch[d] != 1).collect();
        let mut dims: Vec<u64> = keep.iter().map(|&d| u(batch[d])).collect();
        let mut a_bs: Vec<u64> = keep.iter().map(|&d| sa_b[d]).collect();
        let mut b_bs: Vec<u64> = keep.iter().map(|&d| sb_b[d]).collect();
        let mut rows = m;
        // One B for every batch and A dense over the batches: one tall GEMM (C is dense in the same order).
        let a_dense: Vec<u64> = dense_strides(&dims.iter().map(|&d| d as usize).collect::<Vec<_>>()).iter().map(|s| s * m * k).collect();
        if !dims.is_empty() && b_bs.iter().all(|&s| s == 0) && a_bs == a_dense {
            rows = m * dims.iter().product::<u64>();
            dims.clear();
            a_bs.clear();
            b_bs.clear();
        }
        let b_mat = if sb.len() == 1 { Mat { at: bv, rs: 1, cs: 1, batch_strides: b_bs } } else { Mat { at: bv, rs: nn, cs: 1, batch_strides: b_bs } };
        self.steps.push(Step::Sgemm(Sgemm {
            batch: dims,
            m: rows,
            n: nn,
            k,
            a: Mat { at: av, rs: k, cs: 1, batch_strides: a_bs },
            b: b_mat,
            c: dest,
            epilogue: Epilogue { base: 0, ops },
        }));
        Ok(())
    }

    /// `out_nhwc`: whether the chain's result (`dest`) is channels-last.
    fn conv(&mut self, n: NodeId, a: &ConvAttrs, dest: View, out_nhwc: bool, ops: Vec<EpOp>) -> Result<(), Refusal> {
        let node = self.g.node(n);
        let in_nhwc = self.nhwc.contains(&node.inputs[0]);
        let (xv, wv) = (self.view(node.inputs[0])?, self.view(node.inputs[1])?);
        let (xs, ws) = (self.g.ty(node.inputs[0]).shape.clone(), self.g.ty(node.inputs[1]).shape.clone());
        let os = self.g.ty(node.outputs[0]).shape.clone();
        let nd = xs.len() - 2;
        let (batch, c, m, groups) = (u(xs[0]), u(xs[1]), u(ws[0]), u(a.group));
        let (cg, mg) = (c / groups, m / groups);
        let (isz, ps, kk) = (product(&xs[2..]), product(&os[2..]), product(&ws[2..]));
        let vec64 = |v: &[usize]| v.iter().map(|&x| u(x)).collect::<Vec<u64>>();
        if cg == 1 && groups == c && groups > 1 && nd <= 2 {
            // Depthwise: 1-D convs run as 2-D ones of height 1.
            let two = |v: &[usize], fill: usize| -> [u64; 2] {
                if v.len() == 2 {
                    [u(v[0]), u(v[1])]
                } else {
                    [u(fill), u(v[0])]
                }
            };
            debug_assert!(in_nhwc == out_nhwc, "a depthwise step reads and writes one layout");
            self.steps.push(Step::Depthwise2d(Depthwise2d {
                channels_last: out_nhwc,
                x: xv,
                w: wv,
                out: dest,
                batch,
                channels: c,
                multiplier: mg,
                input: two(&xs[2..], 1),
                kernel: two(&ws[2..], 1),
                output: two(&os[2..], 1),
                strides: two(&a.strides, 1),
                pads_begin: two(&a.pads[..nd], 0),
                dilations: two(&a.dilations, 1),
                epilogue: Epilogue { base: 0, ops },
            }));
            return Ok(());
        }
        // Batch dims over (sample, group): (size, stride in W, stride in the GEMM's B operand).
        let batch_of = |dims: Vec<(u64, u64, u64)>| -> (Vec<u64>, Vec<u64>, Vec<u64>) {
            let kept: Vec<_> = dims.into_iter().filter(|d| d.0 != 1).collect();
            (kept.iter().map(|d| d.0).collect(), kept.iter().map(|d| d.1).collect(), kept.iter().map(|d| d.2).collect())
        };
        let pointwise = kk == 1 && a.strides.iter().all(|&s| s == 1) && a.pads.iter().all(|&p| p == 0);
        if pointwise && (in_nhwc || out_nhwc) {
            debug_assert_eq!(layout::conv_shape(self.g, n), ConvShape::Pointwise);
            // One GEMM per image. Channels-last X is `[pixels, channels]` row-major; channels-first it is the
            // transpose. A channels-last result is `X' W'` (pixels x out channels, W' = W transposed); a
            // channels-first one `W X'`.
            let (x_rs, x_cs) = if in_nhwc { (c, 1) } else { (1, isz) };
            let (dims, x_bs, _) = batch_of(vec![(batch, c * isz, 0)]);
            let w_bs = vec![0; dims.len()];
            let x_mat = Mat { at: xv, rs: x_rs, cs: x_cs, batch_strides: x_bs };
            let (m_, n_, a_mat, b_mat) = if out_nhwc {
                (ps, m, x_mat, Mat { at: wv, rs: 1, cs: c, batch_strides: w_bs })
            } else {
                // B[ci, p] = X[p, ci]: the transpose of X'.
                (m, ps, Mat { at: wv, rs: c, cs: 1, batch_strides: w_bs }, Mat { at: xv, rs: x_cs, cs: x_rs, batch_strides: x_mat.batch_strides })
            };
            self.steps.push(Step::Sgemm(Sgemm { batch: dims, m: m_, n: n_, k: c, a: a_mat, b: b_mat, c: dest, epilogue: Epilogue { base: 0, ops } }));
            return Ok(());
        }
        if pointwise {
            let (dims, w_bs, x_bs) = batch_of(vec![(batch, 0, c * isz), (groups, mg * cg, cg * isz)]);
            self.steps.push(Step::Sgemm(Sgemm {
                batch: dims,
                m: mg,
                n: ps,
                k: cg,
                a: Mat { at: wv, rs: cg, cs: 1, batch_strides: w_bs },
                b: Mat { at: xv, rs: isz, cs: 1, batch_strides: x_bs },
                c: dest,
                epilogue: Epilogue { base: 0, ops },
            }));
            return Ok(());
        }
        let cols_len = c * kk * ps;
        let cols_off = self.arena.alloc(cols_len);
        let cols = View { buf: Buf::Scratch, offset: cols_off };
        for b in 0..batch {
            self.steps.push(Step::Im2col(Im2col {
                x: xv.at(b * c * isz),
                channels: c,
                input: vec64(&xs[2..]),
                kernel: vec64(&ws[2..]),
                output: vec64(&os[2..]),
                strides: vec64(&a.strides),
                pads_begin: vec64(&a.pads[..nd]),
                dilations: vec64(&a.dilations),
                dst: cols,
            }));
            let (dims, w_bs, c_bs) = batch_of(vec![(groups, mg * cg * kk, cg * kk * ps)]);
            self.steps.push(Step::Sgemm(Sgemm {
                batch: dims,
                m: mg,
                n: ps,
                k: cg * kk,
                a: Mat { at: wv, rs: cg * kk, cs: 1, batch_strides: w_bs },
                b: Mat { at: cols, rs: ps, cs: 1, batch_strides: c_bs },
                c: dest.at(b * m * ps),
                epilogue: Epilogue { base: b * m * ps, ops: ops.clone() },
            }));
        }
        self.arena.free(cols_off, cols_len);
        Ok(())
    }
}

/// Lowers a kernel graph to a plan function named `symbol`, with its signature. The error names the node and
/// op that cannot be lowered.
pub fn lower_kernel(kernel: &Graph, symbol: &str) -> Result<(PlanFunction, FunctionInfo), Refusal> {
    let g = kernel;
    ir::verify(g).map_err(|e| format!("invalid kernel graph: {e}"))?;
    for (what, list) in [("input", &g.inputs), ("output", &g.outputs)] {
        for (i, &v) in list.iter().enumerate() {
            if g.ty(v).dtype != DType::F32 {
                return Err(refuse!("{what} {i} ('{}') is {}; the gemm backend runs f32 only", g.value(v).name, g.ty(v)));
            }
        }
    }
    let uses = g.use_counts();
    let use_of = |v: ValueId| uses[v.index()];
    let node_err = |n: NodeId, msg: Refusal| refuse!("node '{}' ({}): {msg}", g.node(n).name, g.node(n).op.name());

    // Group nodes into chains.
    let mut chains: Vec<Chain> = Vec::new();
    let mut chain_of: Vec<Option<usize>> = vec![None; g.nodes.len()];
    for (i, node) in g.nodes.iter().enumerate() {
        let n = NodeId(i as u32);
        let anchor = if matches!(node.op, Op::MatMul | Op::Conv(_)) { Some(support::anchor(g, n).map_err(|e| node_err(n, e.into()))?) } else { None };
        if let Some(kind) = anchor {
            chain_of[i] = Some(chains.len());
            chains.push(Chain { anchor: n, kind, eps: Vec::new() });
            continue;
        }
        let f = support::fusion(g, n, &use_of).map_err(|e| node_err(n, e.into()))?;
        let p = g.producer(f.input()).expect("a fused value has a producer");
        let c = chain_of[p.index()].expect("the rule fuses only into a chain found earlier in topological order");
        debug_assert_eq!(chains[c].last(), p);
        chains[c].eps.push((n, f));
        chain_of[i] = Some(c);
    }

    let nhwc = layout::channels_last(g, &chains);
    let mut lw = Lowerer { g, loc: BTreeMap::new(), consts: Vec::new(), arena: Arena::default(), scratch: BTreeMap::new(), nhwc, steps: Vec::new() };
    for (i, &v) in g.inputs.iter().enumerate() {
        lw.loc.insert(v, View { buf: Buf::Arg(i as u32), offset: 0 });
    }
    for (j, &v) in g.outputs.iter().enumerate() {
        if !matches!(g.value(v).def, ValueDef::Node { .. }) {
            return Err(refuse!("output {j} ('{}') is not computed by a node of the kernel", g.value(v).name));
        }
        if lw.loc.insert(v, View { buf: Buf::Arg((g.inputs.len() + j) as u32), offset: 0 }).is_some() {
            return Err(refuse!("output {j} ('{}') is listed twice", g.value(v).name));
        }
    }

    // Chains in emission order (by their last node) and, per value, the last chain that reads it.
    let mut order: Vec<usize> = (0..chains.len()).collect();
    order.sort_by_key(|&c| chains[c].last());
    let mut last_read: BTreeMap<ValueId, usize> = BTreeMap::new();
    for (e, &c) in order.iter().enumerate() {
        let ch = &chains[c];
        let reads = g.node(ch.anchor).inputs.iter().copied().chain(ch.eps.iter().filter_map(|(_, f)| match f {
            Fusion::Add { other, .. } => Some(*other),
            Fusion::Unary { .. } => None,
        }));
        for v in reads {
            last_read.insert(v, e);
        }
    }

    for (e, &c) in order.iter().enumerate() {
        let ch = &chains[c];
        let end = g.node(ch.last()).outputs[0];
        let dest = match lw.loc.get(&end) {
            Some(&v) => v,
            None => {
                let len = g.ty(end).numel() as u64;
                let off = lw.arena.alloc(len);
                lw.scratch.insert(end, (off, len));
                let v = View { buf: Buf::Scratch, offset: off };
                lw.loc.insert(end, v);
                v
            }
        };
        let out_nhwc = lw.nhwc.contains(&end);
        let ops = lw.epilogue_ops(ch, out_nhwc).map_err(|m| node_err(ch.last(), m))?;
        let anchor = ch.anchor;
        match &g.node(anchor).op {
            Op::MatMul => lw.matmul(anchor, dest, ops),
            Op::Conv(a) => lw.conv(anchor, a, dest, out_nhwc, ops),
            _ => unreachable!("anchors are MatMul or Conv"),
        }
        .map_err(|m| node_err(anchor, m))?;
        // Free intermediates read for the last time here (and a result nothing reads).
        let done: Vec<ValueId> = lw.scratch.keys().copied().filter(|v| last_read.get(v).is_none_or(|&l| l == e)).collect();
        for v in done {
            let (off, len) = lw.scratch.remove(&v).expect("listed");
            lw.arena.free(off, len);
        }
    }

    let info = FunctionInfo {
        symbol: symbol.to_string(),
        inputs: g.inputs.iter().map(|&v| g.ty(v).clone()).collect(),
        outputs: g.outputs.iter().map(|&v| g.ty(v).clone()).collect(),
        scratch_bytes: lw.arena.size() * 4,
    };
    let f = PlanFunction { symbol: symbol.to_string(), consts: lw.consts, scratch_len: lw.arena.size(), steps: lw.steps };
    Ok((f, info))
}
