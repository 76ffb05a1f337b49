//! Analytical cost of a partition on the `cuda` backend, for the partitioner while nothing is measured on a
//! GPU: `GEMM flops / GEMM_TFLOPS + other flops / SIMT_TFLOPS + boundary bytes / BANDWIDTH + LAUNCH_US`.
//!
//! Nominal figures for an H100-class GPU running this backend's kernels (not measured; the tune stage on the
//! GPU replaces them): the tiled fp32 SIMT GEMM reaches a fraction of the 60 TFLOP/s fp32 peak
//! (`GEMM_TFLOPS = 15`), other arithmetic is bound by memory long before the ALUs (`SIMT_TFLOPS = 20`),
//! HBM3 streams at about 2.5 TB/s for kernels this size (`BANDWIDTH_GBS = 2000`), and every kernel of a
//! replayed CUDA graph costs a couple of microseconds of launch and tail (`LAUNCH_US = 2`), which is what
//! makes fusing small kernels pay.

use crate::backend::lowering::cost::{boundary_bytes, partition_flops};
use crate::ir::{Graph, NodeId};

pub const GEMM_TFLOPS: f64 = 15.0;
pub const SIMT_TFLOPS: f64 = 20.0;
pub const BANDWIDTH_GBS: f64 = 2000.0;
pub const LAUNCH_US: f64 = 2.0;

pub fn estimate_us(g: &Graph, nodes: &[NodeId]) -> f64 {
    let (gemm, other) = partition_flops(g, nodes);
    let bytes = boundary_bytes(g, nodes) as f64;
    gemm / (GEMM_TFLOPS * 1e6) + other / (SIMT_TFLOPS * 1e6) + bytes / (BANDWIDTH_GBS * 1e3) + LAUNCH_US
}
