//! One CUTLASS instantiation as a typed value: element type, tile configuration, operand alignments and the
//! epilogue's activation. [`Gemm::declaration`] renders it as the C++ `using` that names the kernel type
//! (`cutlass::gemm::device::GemmBatched<...>`) with a `static_assert` on its shared memory, and
//! [`Gemm::type_name`] is that type's name: equal instantiations across the kernels of a module are declared
//! once and share their name.
//!
//! The tile configurations are the tuning space ([`tiles`]): the sm80 multistage family, which runs on sm_80
//! and later (Hopper included: mma.sync and cp.async), with the shapes CUTLASS's own profiler lists for it.

use crate::ir::DType;
use serde::{Deserialize, Serialize};

/// The element type of every operand (accumulation is always fp32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Element {
    F16,
    F32,
    /// Declared last: the derived order and encoding of the others stay what they were.
    Bf16,
}

impl Element {
    pub fn of(dtype: DType) -> Option<Element> {
        match dtype {
            DType::F16 => Some(Element::F16),
            DType::BF16 => Some(Element::Bf16),
            DType::F32 => Some(Element::F32),
            _ => None,
        }
    }

    /// Whether the GEMM runs on tensor cores (the 16-bit types; fp32 stays exact on the SIMT cores).
    pub fn is_half(self) -> bool {
        matches!(self, Element::F16 | Element::Bf16)
    }

    pub fn bytes(self) -> u64 {
        if self.is_half() {
            2
        } else {
            4
        }
    }

    pub(crate) fn cpp(self) -> &'static str {
        match self {
            Element::F16 => "cutlass::half_t",
            Element::Bf16 => "cutlass::bfloat16_t",
            Element::F32 => "float",
        }
    }

    /// The short name in instantiation names (`gemm_bf16_...`).
    pub(crate) fn short(self) -> &'static str {
        match self {
            Element::F16 => "f16",
            Element::Bf16 => "bf16",
            Element::F32 => "f32",
        }
    }

    /// The widest vector access the mainloop and epilogue take, in elements: 16 bytes on tensor cores; the
    /// SIMT kernels (fp32) read and write single elements.
    pub fn max_alignment(self) -> u32 {
        if self.is_half() {
            8
        } else {
            1
        }
    }

    /// The narrowest access CUTLASS's sm80 mainloop takes: cp.async copies 4, 8 or 16 bytes (so fp16 and bf16
    /// need even extents); SIMT fp32 takes single elements.
    pub fn min_alignment(self) -> u32 {
        if self.is_half() {
            2
        } else {
            1
        }
    }
}

/// A tile configuration: threadblock and warp tiles (M, N, K) and mainloop stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    pub threadblock: [u32; 3],
    pub warp: [u32; 3],
    pub stages: u32,
}

impl Tile {
    /// `128x128x32_64x64x32_s4`: the configuration's name (with the backend's prefix, a tune configuration).
    pub fn name(&self) -> String {
        let [m, n, k] = self.threadblock;
        let [wm, wn, wk] = self.warp;
        format!("{m}x{n}x{k}_{wm}x{wn}x{wk}_s{}", self.stages)
    }

    pub fn threads(&self) -> u32 {
        32 * (0..3).map(|i| self.threadblock[i] / self.warp[i]).product::<u32>()
    }

    /// Shared memory of the kernel: the mainloop's stages of A and B tiles (the epilogue's staging, which
    /// shares the union, is smaller for every tile here). The generated code asserts the equality, so a CUTLASS
    /// whose layout differs fails to compile instead of launching with too little.
    pub fn shared_bytes(&self, e: Element) -> u32 {
        let [m, n, k] = self.threadblock;
        self.stages * (m * k + k * n) * e.bytes() as u32
    }
}

const fn tile(threadblock: [u32; 3], warp: [u32; 3], stages: u32) -> Tile {
    Tile { threadblock, warp, stages }
}

/// fp16 and bf16 on tensor cores (mma.sync m16n8k16, fp32 accumulators; both types have the same
/// instruction shape and operand sizes); the first is the default.
pub const HALF_TILES: &[Tile] = &[
    tile([128, 128, 32], [64, 64, 32], 4),
    tile([128, 256, 32], [64, 64, 32], 3),
    tile([256, 128, 32], [64, 64, 32], 3),
    tile([128, 64, 32], [64, 32, 32], 4),
    tile([64, 128, 32], [32, 64, 32], 4),
    tile([64, 64, 64], [32, 32, 64], 5),
    tile([128, 128, 64], [64, 64, 64], 3),
];

/// fp32 on the SIMT cores (exact fp32 products; no TF32); the first is the default.
pub const F32_TILES: &[Tile] = &[tile([128, 128, 8], [32, 64, 8], 4), tile([64, 64, 8], [32, 32, 8], 4), tile([128, 64, 8], [64, 32, 8], 4)];

/// The tile configurations of an element type, the default first.
pub fn tiles(e: Element) -> &'static [Tile] {
    match e {
        Element::F16 | Element::Bf16 => HALF_TILES,
        Element::F32 => F32_TILES,
    }
}

/// The epilogue's activation, applied last: `D = act(acc + C)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Activation {
    Identity,
    Relu,
    /// 0.5 x (1 + erf(x / sqrt 2))
    Gelu,
    /// The tanh approximation.
    GeluTanh,
    Sigmoid,
    HardSwish,
}

impl Activation {
    pub(crate) fn cpp(self) -> &'static str {
        match self {
            Activation::Identity => "cutlass::epilogue::thread::Identity",
            Activation::Relu => "cutlass::epilogue::thread::ReLu",
            Activation::Gelu => "cutlass::epilogue::thread::GELU",
            Activation::GeluTanh => "cutlass::epilogue::thread::GELU_taylor",
            Activation::Sigmoid => "cutlass::epilogue::thread::Sigmoid",
            Activation::HardSwish => "cutlass::epilogue::thread::HardSwish",
        }
    }

    pub(crate) fn short(self) -> &'static str {
        match self {
            Activation::Identity => "id",
            Activation::Relu => "relu",
            Activation::Gelu => "gelu",
            Activation::GeluTanh => "gelutanh",
            Activation::Sigmoid => "sigmoid",
            Activation::HardSwish => "hardswish",
        }
    }
}

/// One instantiation of the GEMM template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm {
    pub element: Element,
    pub tile: Tile,
    /// Vector widths in elements: A's (along K), B's (along N), and C's and D's (along N).
    pub align_a: u32,
    pub align_b: u32,
    pub align_c: u32,
    pub activation: Activation,
}

/// The widest alignment of `e` dividing `extent`, if it is one the mainloop takes.
pub fn alignment(e: Element, extent: u64) -> Option<u32> {
    let mut a = e.max_alignment();
    while a >= e.min_alignment() {
        if extent % a as u64 == 0 {
            return Some(a);
        }
        a /= 2;
    }
    None
}

impl Gemm {
    pub fn type_name(&self) -> String {
        let e = self.element.short();
        format!("gemm_{e}_{}_a{}{}{}_{}", self.tile.name(), self.align_a, self.align_b, self.align_c, self.activation.short())
    }

    /// The C++ declaration of the instantiation's type.
    pub fn declaration(&self) -> String {
        let e = self.element.cpp();
        let [m, n, k] = self.tile.threadblock;
        let [wm, wn, wk] = self.tile.warp;
        let (class, instruction) = if self.element.is_half() { ("cutlass::arch::OpClassTensorOp", "16, 8, 16") } else { ("cutlass::arch::OpClassSimt", "1, 1, 1") };
        let name = self.type_name();
        format!(
            "using {name} = cutlass::gemm::device::GemmBatched<\n    \
             {e}, cutlass::layout::RowMajor, {e}, cutlass::layout::RowMajor, {e}, cutlass::layout::RowMajor, float,\n    \
             {class}, cutlass::arch::Sm80,\n    \
             cutlass::gemm::GemmShape<{m}, {n}, {k}>, cutlass::gemm::GemmShape<{wm}, {wn}, {wk}>, cutlass::gemm::GemmShape<{instruction}>,\n    \
             cutlass::epilogue::thread::LinearCombinationGeneric<{act}, {e}, {c}, float, float>,\n    \
             cutlass::gemm::threadblock::GemmBatchedIdentityThreadblockSwizzle, {stages}, {a}, {b}>;\n\
             static_assert(sizeof({name}::GemmKernel::SharedStorage) == {smem}, \"{name}: shared memory differs from what tessera launches with\");\n\
             static_assert({name}::GemmKernel::kThreadCount == {threads}, \"{name}: thread count\");\n",
            act = self.activation.cpp(),
            c = self.align_c,
            stages = self.tile.stages,
            a = self.align_a,
            b = self.align_b,
            smem = self.tile.shared_bytes(self.element),
            threads = self.tile.threads(),
        )
    }
}

#[cfg(test)]
#[path = "instance_tests.rs"]
mod tests;
