//! Lowering of one kernel graph (a partition) to cuBLASLt matmuls: one per chain (a MatMul and the epilogues
//! fused into it, by the rule of [`super::support`]), placed by [`crate::backend::library`].

use crate::backend::{refuse, Refusal};
use super::support::{self, Epilogue};
use crate::backend::library::{chain_ends, Places};
use crate::backend::FunctionInfo;
use crate::ir::{Graph, NodeId, Op, ValueId};
use tessera_kernels::runtime::cuda::blas::{Activation, Matmul, WORKSPACE_BYTES};

/// The matmuls of a kernel graph and its function signature.
pub fn lower_kernel(g: &Graph, symbol: &str) -> Result<(Vec<Matmul>, FunctionInfo), Refusal> {
    let lasts = chain_ends(g, |op| *op == Op::MatMul, |n| support::anchor(g, n))?;
    let uses = g.use_counts();
    let use_of = |v: ValueId| uses[v.index()];
    let node_err = |n: NodeId, msg: Refusal| refuse!("node '{}' ({}): {msg}", g.node(n).name, g.node(n).op.name());
    let mut places = Places::new(g)?;
    let mut calls = Vec::with_capacity(lasts.len());
    for &last in &lasts {
        let (anchor, eps) = support::chain_of(g, last, &use_of).map_err(|e| node_err(last, e))?;
        let (batch, m, n, k, a_stride, b_stride) = support::matmul_shape(g, anchor).map_err(|e| node_err(anchor, e))?;
        let end = g.node(last).outputs[0];
        let d_stride = if batch > 1 { m * n } else { 0 };
        let node = g.node(anchor);
        let e = |m: Refusal| node_err(anchor, m);
        let mut call = Matmul {
            dtype: g.ty(end).dtype,
            m,
            n,
            k,
            batch,
            a: places.read(g, node.inputs[0], a_stride).map_err(e)?,
            b: places.read(g, node.inputs[1], b_stride).map_err(e)?,
            d: places.result(g, end, d_stride),
            residual: None,
            bias: None,
            activation: Activation::None,
            workspace: places.workspace(),
            rank: 0,
        };
        for (at, ep) in eps {
            match ep {
                Epilogue::Bias(v) => call.bias = Some(places.read(g, v, 0).map_err(|m| node_err(at, m))?),
                Epilogue::Residual(v) => call.residual = Some(places.read(g, v, d_stride).map_err(|m| node_err(at, m))?),
                Epilogue::Relu => call.activation = Activation::Relu,
                Epilogue::GeluTanh => call.activation = Activation::GeluTanh,
            }
        }
        calls.push(call);
    }
    // The workspace follows every intermediate.
    for c in &mut calls {
        c.workspace = places.workspace();
    }
    Ok((calls, places.info(g, symbol, WORKSPACE_BYTES)))
}
