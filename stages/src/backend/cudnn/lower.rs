//! Lowering of one kernel graph (a partition) to cuDNN fused convolutions: one per chain (a Conv, a residual
//! Add, a ReLU, by the rule of [`super::support`]), placed by [`crate::backend::library`].

use crate::backend::{refuse, Refusal};
use super::support;
use crate::backend::library::{chain_ends, Places};
use crate::backend::FunctionInfo;
use crate::ir::{Graph, NodeId, ValueId};
use tessera_kernels::runtime::cuda::dnn::{workspace_bytes, Conv, MIN_WORKSPACE_BYTES};

fn dims4(s: &[usize]) -> Result<[u32; 4], Refusal> {
    match s {
        [a, b, c, d] => Ok([*a as u32, *b as u32, *c as u32, *d as u32]),
        _ => Err(refuse!("shape {s:?} is not 4-D")),
    }
}

/// The convolutions of a kernel graph and its function signature.
pub fn lower_kernel(g: &Graph, symbol: &str) -> Result<(Vec<Conv>, FunctionInfo), Refusal> {
    let lasts = chain_ends(g, |op| support::conv_of(op).is_some(), |n| support::anchor(g, n))?;
    let uses = g.use_counts();
    let use_of = |v: ValueId| uses[v.index()];
    let node_err = |n: NodeId, msg: Refusal| refuse!("node '{}' ({}): {msg}", g.node(n).name, g.node(n).op.name());
    let mut places = Places::new(g)?;
    let mut convs = Vec::with_capacity(lasts.len());
    for &last in &lasts {
        let (anchor, residual, relu) = support::chain_of(g, last, &use_of).map_err(|e| node_err(last, e))?;
        let node = g.node(anchor);
        let (a, channels_last) = support::conv_of(&node.op).expect("chains start at a convolution");
        let e = |m: Refusal| node_err(anchor, m);
        let dtype = g.ty(node.outputs[0]).dtype;
        let dims = |v: ValueId| dims4(&support::logical_dims(&g.ty(v).shape, channels_last));
        let input = dims(node.inputs[0]).map_err(e)?;
        let weight = dims(node.inputs[1]).map_err(e)?;
        let output = dims(node.outputs[0]).map_err(e)?;
        convs.push(Conv {
            dtype,
            input,
            weight,
            output,
            pads: [a.pads[0] as u32, a.pads[1] as u32],
            strides: [a.strides[0] as u32, a.strides[1] as u32],
            dilations: [a.dilations[0] as u32, a.dilations[1] as u32],
            groups: a.group as u32,
            x: places.read(g, node.inputs[0], 0).map_err(e)?,
            w: places.read(g, node.inputs[1], 0).map_err(e)?,
            y: places.result(g, g.node(last).outputs[0], 0),
            bias: places.read(g, node.inputs[2], 0).map_err(e)?,
            residual: residual.map(|v| places.read(g, v, 0)).transpose().map_err(e)?,
            relu,
            workspace: places.workspace(),
            workspace_bytes: workspace_bytes(dtype, input, weight, output, residual.is_some()),
            rank: 0,
            channels_last,
        });
    }
    // One workspace after the intermediates, shared by the calls (they run in order on one stream), as long
    // as the largest any of them declares.
    for c in &mut convs {
        c.workspace = places.workspace();
    }
    let workspace = convs.iter().map(|c| c.workspace_bytes).max().unwrap_or(MIN_WORKSPACE_BYTES);
    Ok((convs, places.info(g, symbol, workspace)))
}
