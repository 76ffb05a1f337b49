//! Channels-last convolutions (`NhwcConv`, 2-D, one group) as CUTLASS implicit GEMMs: the problem a node
//! poses ([`ConvProblem`], or why CUTLASS's sm80 fprop kernel cannot run it), the instantiation that runs it
//! ([`Conv`]: element, tile, alignments, activation) and the `extern "C"` function of one launch, which
//! instantiates the `tessera::conv2d` template of `conv.cuh`.
//!
//! The implicit GEMM is `M = N*P*Q` output pixels by `N = K` output channels over `K = R*S*C`: the tiles of
//! [`super::instance::tiles`] apply as they are, and a grid has one threadblock per `M x N` tile.

use crate::backend::{refuse, Refusal};
use super::instance::{alignment, Activation, Element, Tile};
use crate::ir::{Graph, NodeId, Op};

/// One 2-D forward convolution in CUTLASS's terms: x `[n, h, w, c]`, w `[k, r, s, c]`, y `[n, p, q, k]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvProblem {
    pub n: u64,
    pub h: u64,
    pub w: u64,
    pub c: u64,
    pub k: u64,
    pub r: u64,
    pub s: u64,
    pub p: u64,
    pub q: u64,
    /// Leading padding (the trailing one is implied by `p` and `q`: the iterators mask every tap outside x).
    pub pad: [u64; 2],
    pub stride: [u64; 2],
    pub dilation: [u64; 2],
}

impl ConvProblem {
    /// The implicit GEMM's extents `(M, N, K)`.
    pub fn gemm(&self) -> (u64, u64, u64) {
        (self.n * self.p * self.q, self.k, self.r * self.s * self.c)
    }

    /// Multiply-adds times two.
    pub fn flops(&self) -> f64 {
        let (m, n, k) = self.gemm();
        2.0 * m as f64 * n as f64 * k as f64
    }
}

/// The problem of channels-last convolution `n`, if CUTLASS's fprop kernel runs it: 2-D, one group, 16-bit
/// elements, C and K even (cp.async copies at least 4 bytes; the optimized iterators read whole accesses of
/// channels), filters of at most 32 taps a side (the iterators' mask bits) and tensors under 2 GiB.
pub fn problem(g: &Graph, n: NodeId) -> Result<ConvProblem, Refusal> {
    let node = g.node(n);
    let Op::NhwcConv(a) = &node.op else { return Err(refuse!("cutlass runs channels-last Conv, not {}", node.op.name())) };
    let x = &g.ty(node.inputs[0]).shape;
    let w = &g.ty(node.inputs[1]).shape;
    let y = &g.ty(node.outputs[0]).shape;
    if x.len() != 4 {
        return Err(refuse!("cutlass runs 2-D convolutions, not {}-D", x.len().saturating_sub(2)));
    }
    if a.group != 1 {
        return Err(refuse!("cutlass runs convolutions of one group, not {}", a.group));
    }
    let dt = g.ty(node.outputs[0]).dtype;
    let e = Element::of(dt).filter(|e| e.is_half()).ok_or_else(|| format!("cutlass runs fp16 and bf16 convolutions, not {dt:?}"))?;
    let d = |v: &[usize], i: usize| v[i] as u64;
    let p = ConvProblem {
        n: d(x, 0),
        h: d(x, 1),
        w: d(x, 2),
        c: d(x, 3),
        k: d(w, 0),
        r: d(w, 1),
        s: d(w, 2),
        p: d(y, 1),
        q: d(y, 2),
        pad: [a.pads[0] as u64, a.pads[1] as u64],
        stride: [a.strides[0] as u64, a.strides[1] as u64],
        dilation: [a.dilations[0] as u64, a.dilations[1] as u64],
    };
    if alignment(e, p.c).is_none() || alignment(e, p.k).is_none() {
        return Err(refuse!("a convolution of {} to {} channels: the sm80 mainloop reads channels in pairs", p.c, p.k));
    }
    if p.r > 32 || p.s > 32 {
        return Err(refuse!("a {}x{} filter: CUTLASS's optimized iterators take at most 32 taps a side", p.r, p.s));
    }
    let too_big = |elems: u64| elems * e.bytes() >= 1 << 31;
    if too_big(p.n * p.h * p.w * p.c) || too_big(p.k * p.r * p.s * p.c) || too_big(p.n * p.p * p.q * p.k) {
        return Err("a tensor of 2 GiB or more: CUTLASS's conv iterators index in 32 bits".into());
    }
    Ok(p)
}

/// How every conv instantiation's type name starts (a module with one includes the conv prelude).
pub const TYPE_PREFIX: &str = "conv_";

/// One instantiation of the conv2d forward kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv {
    pub element: Element,
    pub tile: Tile,
    /// Vector widths in elements: x's and w's (along C), and the epilogue's (along K).
    pub align_c: u32,
    pub align_k: u32,
    pub activation: Activation,
}

impl Conv {
    /// The instantiation of `problem` on `tile`.
    pub fn of(element: Element, tile: Tile, p: &ConvProblem, activation: Activation) -> Result<Conv, Refusal> {
        let unaligned = || format!("C={} and K={} are not a multiple of any access width of {element:?}", p.c, p.k);
        Ok(Conv { element, tile, align_c: alignment(element, p.c).ok_or_else(unaligned)?, align_k: alignment(element, p.k).ok_or_else(unaligned)?, activation })
    }

    pub fn type_name(&self) -> String {
        format!("{TYPE_PREFIX}{}_{}_a{}{}_{}", self.element.short(), self.tile.name(), self.align_c, self.align_k, self.activation.short())
    }

    /// The C++ declaration of the instantiation's kernel type, with the same checks as the GEMM's.
    pub fn declaration(&self) -> String {
        let e = self.element.cpp();
        let [m, n, k] = self.tile.threadblock;
        let [wm, wn, wk] = self.tile.warp;
        let name = self.type_name();
        format!(
            "using {name} = typename cutlass::conv::kernel::DefaultConv2dFprop<\n    \
             {e}, cutlass::layout::TensorNHWC, {e}, cutlass::layout::TensorNHWC, {e}, cutlass::layout::TensorNHWC, float,\n    \
             cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,\n    \
             cutlass::gemm::GemmShape<{m}, {n}, {k}>, cutlass::gemm::GemmShape<{wm}, {wn}, {wk}>, cutlass::gemm::GemmShape<16, 8, 16>,\n    \
             cutlass::epilogue::thread::LinearCombinationGeneric<{act}, {e}, {ak}, float, float>,\n    \
             cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<1>, {stages}, cutlass::arch::OpMultiplyAdd,\n    \
             cutlass::conv::IteratorAlgorithm::kOptimized, cutlass::conv::StrideSupport::kStrided, {ac}, {ac}>::Kernel;\n\
             static_assert(sizeof({name}::SharedStorage) == {smem}, \"{name}: shared memory differs from what tessera launches with\");\n\
             static_assert({name}::kThreadCount == {threads}, \"{name}: thread count\");\n",
            act = self.activation.cpp(),
            ak = self.align_k,
            ac = self.align_c,
            stages = self.tile.stages,
            smem = self.tile.shared_bytes(self.element),
            threads = self.tile.threads(),
        )
    }
}

/// The launch grid of `problem` on `tile`: one threadblock per tile of the implicit GEMM's result (CUTLASS's
/// identity swizzle of width 1 maps block (x, y) to tile (x, y)).
pub fn grid(p: &ConvProblem, tile: &Tile) -> Result<[u32; 3], Refusal> {
    let (m, n, _) = p.gemm();
    let [tm, tn, _] = tile.threadblock;
    let g = [m.div_ceil(tm as u64), n.div_ceil(tn as u64), 1];
    if g[0] > i32::MAX as u64 || g[1] > 65535 {
        return Err(refuse!("an implicit GEMM of {m}x{n} needs a grid of {g:?} tiles of {tm}x{tn}"));
    }
    Ok([g[0] as u32, g[1] as u32, 1])
}

/// The `extern "C"` function of one launch: `entry(x, w, [c,] y)`.
pub fn entry_source(entry: &str, type_name: &str, p: &ConvProblem, threads: u32, source: Option<bool>) -> String {
    let (c_decl, c_arg) = if source.is_some() { (" const void* c,", "c") } else { ("", "nullptr") };
    let bias = source == Some(true);
    format!(
        "extern \"C\" __global__ void __launch_bounds__({threads}) {entry}(const void* x, const void* w,{c_decl} void* y) {{\n  \
         tessera::conv2d<{type_name}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {bias}>(x, w, {c_arg}, y);\n}}",
        p.n, p.h, p.w, p.c, p.k, p.r, p.s, p.p, p.q, p.pad[0], p.pad[1], p.stride[0], p.stride[1], p.dilation[0], p.dilation[1],
    )
}

/// Whether a kernel graph has a convolution (its module then includes the conv prelude, and its
/// configurations are the sm80 tiles).
pub fn has_conv(g: &Graph) -> bool {
    g.nodes.iter().any(|n| matches!(n.op, Op::NhwcConv(_)))
}
