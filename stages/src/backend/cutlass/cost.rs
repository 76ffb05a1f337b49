//! Analytical cost of a partition on the `cutlass` backend, for the partitioner while nothing is measured on a
//! GPU: `GEMM flops / TFLOPS + boundary bytes / BANDWIDTH + LAUNCH_US` per kernel.
//!
//! Nominal figures for an H100-class GPU (not measured; the tune stage replaces them): the sm80 multistage
//! mainloop (mma.sync, no wgmma) reaches less of Hopper's dense rate than cuBLASLt's own kernels, fp16 about
//! 200 TFLOP/s on mid-sized GEMMs and SIMT fp32 about 25; what it gains is the epilogue fused into the same
//! kernel (bias, activation, residual), which the boundary bytes count: a chain's intermediates never reach
//! memory. A launch of one kernel costs less than a library call (`LAUNCH_US = 2`).

use crate::backend::c::cost::{boundary_bytes, partition_flops};
use crate::ir::{DType, Graph, NodeId, Op};

pub const F32_TFLOPS: f64 = 25.0;
pub const F16_TFLOPS: f64 = 200.0;
pub const BANDWIDTH_GBS: f64 = 2000.0;
pub const LAUNCH_US: f64 = 2.0;

pub fn estimate_us(g: &Graph, nodes: &[NodeId]) -> f64 {
    let (gemm, other) = partition_flops(g, nodes);
    let half = nodes.iter().any(|&n| g.ty(g.node(n).outputs[0]).dtype == DType::F16);
    let tflops = if half { F16_TFLOPS } else { F32_TFLOPS };
    let kernels = nodes.iter().filter(|&&n| g.node(n).op == Op::MatMul).count().max(1) as f64;
    (gemm + other) / (tflops * 1e6) + boundary_bytes(g, nodes) as f64 / (BANDWIDTH_GBS * 1e3) + LAUNCH_US * kernels
}
