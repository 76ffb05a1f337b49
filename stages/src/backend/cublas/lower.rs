//! Lowering of one kernel graph (a partition) to cuBLASLt matmuls.
//!
//! The kernel's nodes group into chains (a MatMul and the epilogues fused into it, by the rule of
//! [`super::support`]); each chain becomes one [`Matmul`], emitted where its last node stands in topological
//! order, so a residual or bias it reads already exists. A chain's result goes to its output argument if it
//! leaves the kernel, else to scratch (a merged partition can feed one chain into the next). The rest of the
//! scratch is the matmuls' workspace.

use super::support::{self, Epilogue};
use crate::backend::FunctionInfo;
use crate::ir::{self, Graph, NodeId, Op, ValueDef, ValueId};
use std::collections::BTreeMap;
use tessera_kernels::runtime::cuda::blas::{Matmul, Operand, WORKSPACE_BYTES};

fn align256(x: u64) -> u64 {
    x.div_ceil(256) * 256
}

/// The matmuls of a kernel graph and its function signature.
pub fn lower_kernel(g: &Graph, symbol: &str) -> Result<(Vec<Matmul>, FunctionInfo), String> {
    ir::verify(g).map_err(|e| format!("invalid kernel graph: {e}"))?;
    let uses = g.use_counts();
    let use_of = |v: ValueId| uses[v.index()];
    let node_err = |n: NodeId, msg: String| format!("node '{}' ({}): {msg}", g.node(n).name, g.node(n).op.name());

    // Chains: every node is a MatMul or an epilogue continuing the chain of its fused input's producer.
    let mut chain_of: Vec<Option<usize>> = vec![None; g.nodes.len()];
    let mut lasts: Vec<NodeId> = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let n = NodeId(i as u32);
        if node.op == Op::MatMul {
            support::anchor(g, n).map_err(|e| node_err(n, e))?;
            chain_of[i] = Some(lasts.len());
            lasts.push(n);
            continue;
        }
        let f = crate::backend::gemm::support::fusion(g, n, &use_of).map_err(|e| node_err(n, e))?;
        let p = g.producer(f.input()).ok_or_else(|| node_err(n, "its input has no producer".into()))?;
        let c = chain_of[p.index()].ok_or_else(|| node_err(n, "not fused into a MatMul of this kernel".into()))?;
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
    let mut calls = Vec::with_capacity(lasts.len());
    for &last in &lasts {
        let (anchor, eps) = support::chain_of(g, last, &use_of).map_err(|e| node_err(last, e))?;
        let (batch, m, n, k, a_stride, b_stride) = support::matmul_shape(g, anchor).map_err(|e| node_err(anchor, e))?;
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
        let operand = |v: ValueId, batch_stride: u64| -> Result<Operand, String> {
            match loc.get(&v) {
                Some(&(arg, offset)) => Ok(Operand { arg, offset, batch_stride }),
                None => Err(format!("value '{}' is a constant inside the kernel or read before it is computed", g.value(v).name)),
            }
        };
        let node = g.node(anchor);
        let d_stride = if batch > 1 { m * n } else { 0 };
        let mut call = Matmul {
            dtype: g.ty(end).dtype,
            m,
            n,
            k,
            batch,
            a: operand(node.inputs[0], a_stride).map_err(|e| node_err(anchor, e))?,
            b: operand(node.inputs[1], b_stride).map_err(|e| node_err(anchor, e))?,
            d: Operand { arg: dest.0, offset: dest.1, batch_stride: d_stride },
            residual: None,
            bias: None,
            relu: false,
            workspace: Operand { arg: scratch_arg, offset: 0, batch_stride: 0 },
        };
        for (at, ep) in eps {
            match ep {
                Epilogue::Bias(v) => call.bias = Some(operand(v, 0).map_err(|e| node_err(at, e))?),
                Epilogue::Residual(v) => call.residual = Some(operand(v, d_stride).map_err(|e| node_err(at, e))?),
                Epilogue::Relu => call.relu = true,
            }
        }
        calls.push(call);
    }
    // The workspace follows the intermediates.
    for c in &mut calls {
        c.workspace.offset = scratch_used;
    }
    let info = FunctionInfo {
        symbol: symbol.to_string(),
        inputs: g.inputs.iter().map(|&v| g.ty(v).clone()).collect(),
        outputs: g.outputs.iter().map(|&v| g.ty(v).clone()).collect(),
        scratch_bytes: scratch_used + WORKSPACE_BYTES,
    };
    Ok((calls, info))
}
