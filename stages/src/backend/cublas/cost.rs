//! Analytical cost of a partition on the `cublas` backend, for the partitioner while nothing is measured on a
//! GPU: `GEMM flops / TFLOPS + boundary bytes / BANDWIDTH + LAUNCH_US`.
//!
//! Nominal figures for an H100-class GPU (not measured; the tune stage on the GPU replaces them): cuBLASLt
//! reaches most of the dense peak on large problems, fp32 without TF32 about 40 of 60 TFLOP/s and fp16 with
//! fp32 accumulation about 300 of 990 (a fraction, for the mid-sized GEMMs of batch-1 models); memory as the
//! `cuda` backend's estimate (2000 GB/s); a call costs a little more than one of our kernels (`LAUNCH_US = 3`),
//! so the search keeps tiny GEMMs, which our kernels fuse with their neighbours, on `cuda`.

use crate::backend::lowering::cost::{boundary_bytes, partition_flops};
use crate::ir::{DType, Graph, NodeId};

pub const F32_TFLOPS: f64 = 40.0;
pub const F16_TFLOPS: f64 = 300.0;
pub const BANDWIDTH_GBS: f64 = 2000.0;
pub const LAUNCH_US: f64 = 3.0;

pub fn estimate_us(g: &Graph, nodes: &[NodeId]) -> f64 {
    let (gemm, other) = partition_flops(g, nodes);
    // bf16 runs at fp16's tensor-core rate.
    let half = nodes.iter().any(|&n| matches!(g.ty(g.node(n).outputs[0]).dtype, DType::F16 | DType::BF16));
    let tflops = if half { F16_TFLOPS } else { F32_TFLOPS };
    let calls = nodes.iter().filter(|&&n| g.node(n).op == crate::ir::Op::MatMul).count().max(1) as f64;
    (gemm + other) / (tflops * 1e6) + boundary_bytes(g, nodes) as f64 / (BANDWIDTH_GBS * 1e3) + LAUNCH_US * calls
}
