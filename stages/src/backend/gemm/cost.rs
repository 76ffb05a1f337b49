//! The analytical cost model that stands in for measurements: GEMM FLOPs at a nominal `sgemm` rate, im2col
//! traffic at a nominal memory bandwidth, direct depthwise FLOPs at a lower rate, and epilogues per element.
//!
//! The constants are nominal figures for `matrixmultiply` on a 2-core x86-64 host (AVX2 + FMA), read off the
//! `gemm_conv` bench in kernels/benches run on two cores of a quiet Xeon (sgemm 75-95 GFLOP/s on BERT's FFN and
//! ResNet's 3x3 convs, the depthwise loop 12 GFLOP/s, GELU's f64 `erf` about 40 ns per element on one core).
//! They rank candidates sensibly; they do not predict any particular machine. Measured costs (the tune stage)
//! replace them when a device is there to measure on.

use super::support::{self, Fusion, Unary};
use crate::ir::{GeluApprox, Graph, NodeId, Op};
use std::collections::BTreeSet;

/// Sustained f32 GEMM rate, GFLOP/s, for products large enough to fill the micro-kernel.
pub const SGEMM_GFLOPS: f64 = 75.0;
/// Micro-kernel tile of `matrixmultiply`'s f32 kernels (rows x columns of C): smaller products waste the rest.
pub const MICRO_TILE: (u64, u64) = (8, 8);
/// Fixed cost of one GEMM call (packing set-up, thread hand-off), microseconds.
pub const GEMM_CALL_US: f64 = 3.0;
/// Rate of the direct depthwise loop, GFLOP/s.
pub const DEPTHWISE_GFLOPS: f64 = 10.0;
/// Memory bandwidth for im2col traffic, GB/s.
pub const MEM_GBPS: f64 = 20.0;
/// Per output element and epilogue op, with the epilogue spread over two cores: a cheap op (add, relu, clip,
/// hardswish), one calling `exp` or `tanh` (sigmoid, tanh-GELU), and erf-GELU (libm's f64 `erf`).
pub const EPILOGUE_CHEAP_NS: f64 = 0.2;
pub const EPILOGUE_TRANSCENDENTAL_NS: f64 = 4.0;
pub const EPILOGUE_ERF_NS: f64 = 20.0;

fn gemm_us(calls: u64, m: u64, n: u64, k: u64) -> f64 {
    let pad = |x: u64, t: u64| x.div_ceil(t) * t;
    let flops = 2.0 * calls as f64 * pad(m, MICRO_TILE.0) as f64 * pad(n, MICRO_TILE.1) as f64 * k as f64;
    calls as f64 * GEMM_CALL_US + flops / (SGEMM_GFLOPS * 1e3)
}

fn dims(d: &[usize]) -> u64 {
    d.iter().map(|&x| x as u64).product()
}

fn anchor_us(g: &Graph, n: NodeId) -> f64 {
    let node = g.node(n);
    let out = &g.ty(node.outputs[0]).shape;
    match &node.op {
        Op::MatMul => {
            let (a, b) = (&g.ty(node.inputs[0]).shape, &g.ty(node.inputs[1]).shape);
            let k = *a.last().expect("MatMul operands have rank >= 1") as u64;
            let nn = if b.len() == 1 { 1 } else { b[b.len() - 1] as u64 };
            let m = if a.len() == 1 { 1 } else { a[a.len() - 2] as u64 };
            let batches = dims(out) / (m * nn).max(1);
            // A shared B stacks the batches into one tall GEMM.
            let b_batches = if b.len() <= 2 { 1 } else { dims(&b[..b.len() - 2]) };
            if b_batches == 1 {
                gemm_us(1, m * batches, nn, k)
            } else {
                gemm_us(batches, m, nn, k)
            }
        }
        Op::Conv(a) => {
            let (x, w) = (&g.ty(node.inputs[0]).shape, &g.ty(node.inputs[1]).shape);
            let (batch, c, m, groups) = (x[0] as u64, x[1] as u64, w[0] as u64, a.group as u64);
            let (cg, mg) = (c / groups, m / groups);
            let (ps, kk) = (dims(&out[2..]), dims(&w[2..]));
            if cg == 1 && groups == c && groups > 1 && x.len() <= 4 {
                let flops = 2.0 * (batch * m * ps * kk) as f64;
                let bytes = 4.0 * (dims(x) + dims(out)) as f64;
                return flops / (DEPTHWISE_GFLOPS * 1e3) + bytes / (MEM_GBPS * 1e3);
            }
            let pointwise = kk == 1 && a.strides.iter().all(|&s| s == 1) && a.pads.iter().all(|&p| p == 0);
            if pointwise {
                return gemm_us(batch * groups, mg, ps, cg);
            }
            // im2col writes the column matrix and the GEMM reads it back.
            let im2col = 2.0 * 4.0 * (batch * c * kk * ps) as f64 / (MEM_GBPS * 1e3);
            im2col + gemm_us(batch * groups, mg, ps, cg * kk)
        }
        _ => unreachable!("anchors are MatMul or Conv"),
    }
}

fn epilogue_us(g: &Graph, n: NodeId, f: &Fusion) -> f64 {
    let elems = g.ty(g.node(n).outputs[0]).numel() as f64;
    let ns = match f {
        Fusion::Unary { op: Unary::Gelu(GeluApprox::Erf), .. } => EPILOGUE_ERF_NS,
        Fusion::Unary { op: Unary::Gelu(GeluApprox::Tanh) | Unary::Sigmoid, .. } => EPILOGUE_TRANSCENDENTAL_NS,
        _ => EPILOGUE_CHEAP_NS,
    };
    elems * ns / 1e3
}

/// Estimated microseconds to run `nodes` as one partition; infinite when a node is one the backend cannot run.
///
/// An epilogue is priced at its marginal cost inside its chain (one more op in the fused pass), whether or not
/// its anchor is among `nodes`: partitioners price nodes one at a time and let an epilogue join a library
/// backend only together with its producer (the Collage gemm rules), and `lower` refuses a partition that
/// separates an epilogue from its chain, naming the node.
pub fn estimate_us(g: &Graph, nodes: &[NodeId]) -> f64 {
    let set: BTreeSet<NodeId> = nodes.iter().copied().collect();
    let uses = g.use_counts();
    let use_of = |v| uses[crate::ir::ValueId::index(v)];
    let mut total = 0.0;
    for &n in &set {
        if support::anchor(g, n).is_ok() {
            total += anchor_us(g, n);
            continue;
        }
        match support::fusion(g, n, &use_of) {
            Ok(f) => total += epilogue_us(g, n, &f),
            Err(_) => return f64::INFINITY,
        }
    }
    total
}

#[cfg(test)]
#[path = "cost_tests.rs"]
mod tests;
