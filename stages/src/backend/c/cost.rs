//! Analytical cost of a partition on the c backend, for the rule-first partitioner:
//! `GEMM flops / GEMM_GFLOPS + other flops / SCALAR_GFLOPS + boundary bytes / BANDWIDTH_GBS + CALL_US`.
//!
//! Constants are nominal figures for one core of a current x86-64 server running this backend's code
//! (not measured on this machine; the measured Collage search replaces them):
//! - `GEMM_GFLOPS = 20`: the blocked, register-tiled GEMM (MatMul, im2col Conv) with SSE/AVX.
//! - `SCALAR_GFLOPS = 2`: everything else (loops the compiler may or may not vectorize); a
//!   transcendental function (exp, tanh, erf, pow, log, sigmoid, GELU, softmax's exp) counts 20 flops.
//! - `BANDWIDTH_GBS = 10`: bytes read from and written to outside the partition (fused intermediates are
//!   free, which is what makes fusion win in the partitioner).
//! - `CALL_US = 1`: a call into the module.

use crate::backend::lowering::cost::{boundary_bytes, partition_flops};
use crate::ir::{Graph, NodeId};

pub const GEMM_GFLOPS: f64 = 20.0;
pub const SCALAR_GFLOPS: f64 = 2.0;
pub const BANDWIDTH_GBS: f64 = 10.0;
pub const CALL_US: f64 = 1.0;

pub fn estimate_us(g: &Graph, nodes: &[NodeId]) -> f64 {
    let (gemm, other) = partition_flops(g, nodes);
    let bytes = boundary_bytes(g, nodes);
    gemm / (GEMM_GFLOPS * 1e3) + other / (SCALAR_GFLOPS * 1e3) + bytes as f64 / (BANDWIDTH_GBS * 1e3) + CALL_US
}
