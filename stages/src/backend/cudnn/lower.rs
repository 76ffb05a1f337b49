//! Lowering of one kernel graph (a partition) to cuDNN fused convolutions: one per chain (a Conv, a residual
//! Add, a ReLU), emitted where its last node stands; a result that leaves the kernel goes to its output
//! argument, one that feeds the next chain of a merged partition to scratch, and the workspace follows.

use super::support;
use crate::backend::FunctionInfo;
use crate::ir::{self, Graph, NodeId, Op, ValueDef, ValueId};
use std::collections::BTreeMap;
use tessera_kernels::runtime::cuda::blas::Operand;
use tessera_kernels::runtime::cuda::dnn::{Conv, WORKSPACE_BYTES};

fn align256(x: u64) -> u64 {
    x.div_ceil(256) * 256
}

fn dims4(s: &[usize]) -> Result<[u32; 4], String> {
    match s {
        [a, b, c, d] => Ok([*a as u32, *b as u32, *c as u32, *d as u32]),
        _ => Err(format!("shape {s:?} is not 4-D")),
    }
}

/// The convolutions of a kernel graph and its function signature.
pub fn lower_kernel(g: &Graph, symbol: &str) -> Result<(Vec<Conv>, FunctionInfo), String> {
    ir::verify(g).map_err(|e| format!("invalid kernel graph: {e}"))?;
    let uses = g.use_counts();
    let use_of = |v: ValueId| uses[v.index()];
    let node_err = |n: NodeId, msg: String| format!("node '{}' ({}): {msg}", g.node(n).name, g.node(n).op.name());

    let mut chain_of: Vec<Option<usize>> = vec![None; g.nodes.len()];
    let mut lasts: Vec<NodeId> = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let n = NodeId(i as u32);
        if matches!(node.op, Op::Conv(_)) {
            support::anchor(g, n).map_err(|e| node_err(n, e))?;
            chain_of[i] = Some(lasts.len());
            lasts.push(n);
            continue;
        }
        let f = crate::backend::gemm::support::fusion(g, n, &use_of).map_err(|e| node_err(n, e))?;
        let p = g.producer(f.input()).ok_or_else(|| node_err(n, "its input has no producer".into()))?;
        let c = chain_of[p.index()].ok_or_else(|| node_err(n, "not fused into a Conv of this kernel".into()))?;
        lasts[c] = n;
        chain_of[i] = Some(c);
    }
    lasts.sort();

    let n_in = g.inputs.len() as u32;
    let scratch_arg = n_in + g.outputs.len() as u32;
    let mut loc: BTreeMap<ValueId, (u32, u64)> = BTreeMap::new();
    for (i, &v) in g.inputs.iter().enumerate() {
        loc.insert(v, (i as u32, 0));
    }
    for (j, &v) in g.outputs.iter().enumerate() {
        if !matches!(g.value(v).def, ValueDef::Node { .. }) {
            return Err(format!("output {j} ('{}') is not computed by a node of the kernel", g.value(v).name));
        }
        if loc.insert(v, (n_in + j as u32, 0)).is_some() {
            return Err(format!("output {j} ('{}') is listed twice", g.value(v).name));
        }
    }
    let mut scratch_used = 0u64;
    let mut convs = Vec::with_capacity(lasts.len());
    for &last in &lasts {
        let (anchor, residual, relu) = support::chain_of(g, last, &use_of).map_err(|e| node_err(last, e))?;
        let node = g.node(anchor);
        let Op::Conv(a) = &node.op else { unreachable!("chains start at a Conv") };
        let end = g.node(last).outputs[0];
        let dest = match loc.get(&end) {
            Some(&d) => d,
            None => {
                let at = (scratch_arg, scratch_used);
                scratch_used = align256(scratch_used + g.ty(end).size_bytes() as u64);
                loc.insert(end, at);
                at
            }
        };
        let operand = |v: ValueId| -> Result<Operand, String> {
            match loc.get(&v) {
                Some(&(arg, offset)) => Ok(Operand { arg, offset, batch_stride: 0 }),
                None => Err(format!("value '{}' is a constant inside the kernel or read before it is computed", g.value(v).name)),
            }
        };
        let e = |m: String| node_err(anchor, m);
        convs.push(Conv {
            dtype: g.ty(end).dtype,
            input: dims4(&g.ty(node.inputs[0]).shape).map_err(e)?,
            weight: dims4(&g.ty(node.inputs[1]).shape).map_err(e)?,
            output: dims4(&g.ty(node.outputs[0]).shape).map_err(e)?,
            pads: [a.pads[0] as u32, a.pads[1] as u32],
            strides: [a.strides[0] as u32, a.strides[1] as u32],
            dilations: [a.dilations[0] as u32, a.dilations[1] as u32],
            groups: a.group as u32,
            x: operand(node.inputs[0]).map_err(e)?,
            w: operand(node.inputs[1]).map_err(e)?,
            y: Operand { arg: dest.0, offset: dest.1, batch_stride: 0 },
            bias: operand(node.inputs[2]).map_err(e)?,
            residual: residual.map(operand).transpose().map_err(e)?,
            relu,
            workspace: Operand { arg: scratch_arg, offset: 0, batch_stride: 0 },
        });
    }
    for c in &mut convs {
        c.workspace.offset = scratch_used;
    }
    let info = FunctionInfo {
        symbol: symbol.to_string(),
        inputs: g.inputs.iter().map(|&v| g.ty(v).clone()).collect(),
        outputs: g.outputs.iter().map(|&v| g.ty(v).clone()).collect(),
        scratch_bytes: scratch_used + WORKSPACE_BYTES,
    };
    Ok((convs, info))
}
