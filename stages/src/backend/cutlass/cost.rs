//! Analytical cost of a partition on the `cutlass` backend, for the partitioner while nothing is measured on a
//! GPU: per GEMM, its padded tile work at the occupied share of the rate, plus boundary bytes / BANDWIDTH and a
//! launch per kernel.
//!
//! Nominal figures for an H100-class GPU (not measured; the tune stage replaces them): the sm80 multistage
//! mainloop (mma.sync, no wgmma) reaches about 200 TFLOP/s in fp16 on mid-sized GEMMs (measured 211 on BERT-base
//! b8's 1024x3072x768 with its GELU, H200, 2026-11-26) and SIMT fp32 about 25. A GEMM runs whole tiles of the
//! default configuration (128x128), so a thin one (batch-1 rows) pays for the rows it pads, and a grid of fewer
//! tiles than the GPU has SMs runs at that fraction of the rate: without this the estimate would hand
//! `cutlass` the GEMV-like MatMuls our own kernels run far faster. What it gains is the epilogue fused into the
//! same kernel, which the boundary bytes count. A launch of one kernel costs less than a library call.

use super::instance::{tiles, Element};
use crate::backend::lowering::cost::{boundary_bytes, partition_flops};
use crate::backend::library::matmul_shape;
use crate::ir::{Graph, NodeId, Op};

pub const F32_TFLOPS: f64 = 25.0;
pub const F16_TFLOPS: f64 = 200.0;
pub const BANDWIDTH_GBS: f64 = 2000.0;
pub const LAUNCH_US: f64 = 2.0;
/// Streaming multiprocessors of the GPU the figures are for (H100 SXM: 132).
pub const SMS: f64 = 132.0;

/// Microseconds of `batch` GEMMs of `m x n x k` in `e` on the default tile: padded FLOPs at the rate the
/// occupied SMs give.
fn tiled_us(e: Element, batch: u64, m: u64, n: u64, k: u64) -> f64 {
    let [tm, tn, _] = tiles(e)[0].threadblock;
    let (rows, cols) = (m.div_ceil(tm as u64), n.div_ceil(tn as u64));
    let ctas = (rows * cols * batch) as f64;
    let padded = 2.0 * (rows * tm as u64) as f64 * (cols * tn as u64) as f64 * k as f64 * batch as f64;
    let rate = if e.is_half() { F16_TFLOPS } else { F32_TFLOPS } * (ctas / SMS).min(1.0);
    padded / (rate * 1e6)
}

/// Microseconds of one GEMM (a MatMul) or one convolution's implicit GEMM.
fn anchor_us(g: &Graph, n: NodeId) -> Option<f64> {
    let e = Element::of(g.ty(g.node(n).outputs[0]).dtype)?;
    if g.node(n).op == Op::MatMul {
        let (batch, m, nn, k, _, _) = matmul_shape(g, n).ok()?;
        return Some(tiled_us(e, batch, m, nn, k));
    }
    let (m, nn, k) = super::conv::problem(g, n).ok()?.gemm();
    Some(tiled_us(e, 1, m, nn, k))
}

pub fn estimate_us(g: &Graph, nodes: &[NodeId]) -> f64 {
    let (_, other) = partition_flops(g, nodes);
    let matmuls: Vec<NodeId> = nodes.iter().copied().filter(|&n| super::support::is_anchor_op(&g.node(n).op)).collect();
    let gemm: f64 = matmuls.iter().map(|&n| anchor_us(g, n).unwrap_or(f64::INFINITY)).sum();
    gemm + other / (F16_TFLOPS * 1e6) + boundary_bytes(g, nodes) as f64 / (BANDWIDTH_GBS * 1e3) + LAUNCH_US * matmuls.len().max(1) as f64
}

#[cfg(test)]
#[path = "cost_tests.rs"]
mod tests;
