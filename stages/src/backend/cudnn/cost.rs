//! Analytical cost of a partition on the `cudnn` backend, for the partitioner while nothing is measured on a
//! GPU: `conv flops / TFLOPS + boundary bytes / BANDWIDTH + LAUNCH_US` per convolution.
//!
//! Nominal figures for an H100-class GPU (the tune stage on the GPU replaces them): in fp16 on tensor cores
//! cuDNN's NCHW convolutions reach about 150 TFLOP/s (NCHW costs it layout transforms NHWC would not); in fp32
//! on FMA kernels (no TF32) they ran *slower* than our own kernels on the H100 (2026-11-24: the zoo's
//! resnet18-b1 went from 837 to 1195 us, resnet50-b1 from 1746 to 2002 us with cuDNN taking its convolutions),
//! so fp32 is priced below the `cuda` backend's GEMM rate (`F32_TFLOPS = 10` against its 15). A call costs a few
//! microseconds more than one of our kernels (`LAUNCH_US = 4`: its own transforms).
//!
//! A partition with a convolution that does not end in ReLU costs infinity: `cudnnConvolutionBiasActivationForward`
//! without an activation allows only the implicit precomputed GEMM, whose workspace grows with the output
//! (22 MB for a batch-8 MobileNetV2 1x1 convolution in fp16, more than the fixed 16 MiB workspace modules
//! declared when this was measured), so those convolutions stay on `cuda`. (Workspaces now grow with the
//! tensors, [`tessera_kernels::runtime::cuda::dnn::workspace_bytes`]; whether the one algorithm is then worth
//! taking has not been measured.) Channels-last convolutions (`-layout=nhwc`) are priced either way: the
//! workspace that rule guarded against held NCHW's transforms, which NHWC has none of, so the tune stage
//! measures them.

use crate::backend::lowering::cost::{boundary_bytes, partition_flops};
use crate::ir::{DType, Graph, NodeId, Op, UnaryOp};

pub const F32_TFLOPS: f64 = 10.0;
pub const F16_TFLOPS: f64 = 150.0;
pub const BANDWIDTH_GBS: f64 = 2000.0;
pub const LAUNCH_US: f64 = 4.0;

pub fn estimate_us(g: &Graph, nodes: &[NodeId]) -> f64 {
    let convs = nodes.iter().filter(|&&n| matches!(g.node(n).op, Op::Conv(_) | Op::NhwcConv(_))).count();
    let channels_first = nodes.iter().any(|&n| matches!(g.node(n).op, Op::Conv(_)));
    let relus = nodes.iter().filter(|&&n| matches!(g.node(n).op, Op::Unary(UnaryOp::Relu))).count();
    // Each chain holds at most one ReLU, its last node (the support rule): every chain ends in one iff the
    // counts agree.
    if channels_first && relus != convs {
        return f64::INFINITY;
    }
    let (heavy, other) = partition_flops(g, nodes);
    // bf16 runs at fp16's tensor-core rate.
    let half = nodes.iter().any(|&n| matches!(g.ty(g.node(n).outputs[0]).dtype, DType::F16 | DType::BF16));
    let tflops = if half { F16_TFLOPS } else { F32_TFLOPS };
    let calls = convs.max(1) as f64;
    (heavy + other) / (tflops * 1e6) + boundary_bytes(g, nodes) as f64 / (BANDWIDTH_GBS * 1e3) + LAUNCH_US * calls
}
