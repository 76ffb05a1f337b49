//! One CUTLASS instantiation as a typed value: element type, tile configuration, operand alignments and the
//! epilogue's activation. [`Gemm::declaration`] renders it as the C++ `using` that names the kernel type
//! (`cutlass::gemm::device::GemmBatched<...>`) with a `static_assert` on its shared memory, and
//! [`Gemm::type_name`] is that type's name: equal instantiations across the kernels of a module are declared
//! once and share their name.
//!
//! The tile configurations are the tuning space ([`tiles`]), in two kernel families ([`Family`]):
//! - the sm80 multistage family (CUTLASS 2.x's `GemmBatched`: cp.async, mma.sync), which runs on sm_80 and
//!   later, with the shapes CUTLASS's own profiler lists for it;
//! - on Hopper (sm_90) targets and the 16-bit types, CUTLASS 3.x's warp-specialized kernel
//!   (`KernelCpAsyncWarpSpecialized`): two producer warpgroups copy A and B tiles with cp.async into a
//!   pipeline of shared-memory stages guarded by mbarriers, one consumer warpgroup multiplies them with
//!   wgmma. Its parameters are pointers and strides, so the kernel builds them on the device from the
//!   launch's pointers as the sm80 family does. The TMA kernels need tensor maps encoded by the driver on
//!   the host, which tessera's pointer-only launches do not carry yet.

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

    fn cpp(self) -> &'static str {
        match self {
            Element::F16 => "cutlass::half_t",
            Element::Bf16 => "cutlass::bfloat16_t",
            Element::F32 => "float",
        }
    }

    /// The short name in instantiation names (`gemm_bf16_...`).
    fn short(self) -> &'static str {
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

/// The kernel family a configuration instantiates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// CUTLASS 2.x's multistage `GemmBatched` (cp.async, mma.sync), with its warp tile (M, N, K).
    Sm80 { warp: [u32; 3] },
    /// CUTLASS 3.x's Hopper warp-specialized kernel (cp.async producers, a wgmma consumer warpgroup), for
    /// sm_90a only.
    Sm90,
}

/// Threads of the sm90 warp-specialized kernel: two producer warpgroups and one consumer.
pub const SM90_THREADS: u32 = 384;

/// A tile configuration: the kernel family, the threadblock tile (M, N, K) and the mainloop's stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    pub threadblock: [u32; 3],
    pub family: Family,
    pub stages: u32,
}

impl Tile {
    /// `128x128x32_64x64x32_s4` (sm80: threadblock and warp tiles) or `sm90_128x128x64_s4`: the
    /// configuration's name (with the backend's prefix, a tune configuration).
    pub fn name(&self) -> String {
        let [m, n, k] = self.threadblock;
        match self.family {
            Family::Sm80 { warp: [wm, wn, wk] } => format!("{m}x{n}x{k}_{wm}x{wn}x{wk}_s{}", self.stages),
            Family::Sm90 => format!("sm90_{m}x{n}x{k}_s{}", self.stages),
        }
    }

    pub fn threads(&self) -> u32 {
        match self.family {
            Family::Sm80 { warp } => 32 * (0..3).map(|i| self.threadblock[i] / warp[i]).product::<u32>(),
            Family::Sm90 => SM90_THREADS,
        }
    }

    /// Shared memory of the kernel. sm80: the mainloop's stages of A and B tiles (the epilogue's staging,
    /// which shares the union, is smaller for every tile here). sm90: the stages, then the pipelines'
    /// mbarriers (a full and an empty one per stage, and the epilogue's load pipeline), the whole rounded to
    /// the storage's 128-byte alignment (the epilogue writes from registers and keeps nothing there). The
    /// generated code asserts the equality, so a CUTLASS whose layout differs fails to compile instead of
    /// launching with too little.
    pub fn shared_bytes(&self, e: Element) -> u32 {
        let [m, n, k] = self.threadblock;
        let stages = self.stages * (m * k + k * n) * e.bytes() as u32;
        match self.family {
            Family::Sm80 { .. } => stages,
            Family::Sm90 => (stages + 16 * self.stages + 16).next_multiple_of(128),
        }
    }

    pub fn is_sm90(&self) -> bool {
        self.family == Family::Sm90
    }
}

const fn tile(threadblock: [u32; 3], warp: [u32; 3], stages: u32) -> Tile {
    Tile { threadblock, family: Family::Sm80 { warp }, stages }
}

const fn sm90(threadblock: [u32; 3], stages: u32) -> Tile {
    Tile { threadblock, family: Family::Sm90, stages }
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

/// The Hopper warp-specialized tiles (fp16 and bf16; wgmma's K step is 16, a stage holds four). One consumer
/// warpgroup holds the whole M x N accumulator (M x N / 128 floats a thread), so M x N stays at 16K or below.
pub const SM90_TILES: &[Tile] = &[sm90([128, 128, 64], 4), sm90([64, 128, 64], 4), sm90([128, 64, 64], 5), sm90([64, 256, 64], 3)];

/// fp32 on the SIMT cores (exact fp32 products; no TF32); the first is the default.
pub const F32_TILES: &[Tile] = &[tile([128, 128, 8], [32, 64, 8], 4), tile([64, 64, 8], [32, 32, 8], 4), tile([128, 64, 8], [64, 32, 8], 4)];

/// The tile configurations of an element type on an architecture (`sm_90`), the default first: the sm80
/// family everywhere, and for the 16-bit types on sm_90 the Hopper tiles after it (fp32 stays exact on the
/// SIMT cores: the Hopper builder would multiply it as TF32).
pub fn tiles(e: Element, arch: &str) -> Vec<Tile> {
    match e {
        Element::F16 | Element::Bf16 if arch == "sm_90" => HALF_TILES.iter().chain(SM90_TILES).copied().collect(),
        Element::F16 | Element::Bf16 => HALF_TILES.to_vec(),
        Element::F32 => F32_TILES.to_vec(),
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
    /// The functor template (`LinearCombinationGeneric`'s first argument, `tessera::Sm90Epilogue`'s too).
    fn cpp(self) -> &'static str {
        match self {
            Activation::Identity => "cutlass::epilogue::thread::Identity",
            Activation::Relu => "cutlass::epilogue::thread::ReLu",
            Activation::Gelu => "cutlass::epilogue::thread::GELU",
            Activation::GeluTanh => "cutlass::epilogue::thread::GELU_taylor",
            Activation::Sigmoid => "cutlass::epilogue::thread::Sigmoid",
            Activation::HardSwish => "cutlass::epilogue::thread::HardSwish",
        }
    }

    fn short(self) -> &'static str {
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
        match self.tile.family {
            Family::Sm80 { warp } => self.sm80_declaration(warp),
            Family::Sm90 => self.sm90_declaration(),
        }
    }

    /// The kernel type of the Hopper family: the collective mainloop from CUTLASS's builder, tessera's
    /// epilogue (`gemm_sm90.cuh`), and the kernel that joins them. The epilogue writes single elements, so
    /// C's and D's alignments do not enter it.
    fn sm90_declaration(&self) -> String {
        let e = self.element.cpp();
        let [m, n, k] = self.tile.threadblock;
        let name = self.type_name();
        format!(
            "using {name}_mainloop = typename cutlass::gemm::collective::CollectiveBuilder<\n    \
             cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,\n    \
             {e}, cutlass::layout::RowMajor, {a}, {e}, cutlass::layout::RowMajor, {b}, float,\n    \
             cute::Shape<cute::Int<{m}>, cute::Int<{n}>, cute::Int<{k}>>, cute::Shape<cute::_1, cute::_1, cute::_1>,\n    \
             cutlass::gemm::collective::StageCount<{stages}>, cutlass::gemm::KernelCpAsyncWarpSpecialized>::CollectiveOp;\n\
             using {name} = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, {name}_mainloop, tessera::Sm90Epilogue<{act}, {e}>>;\n\
             static_assert(sizeof({name}::SharedStorage) == {smem}, \"{name}: shared memory differs from what tessera launches with\");\n\
             static_assert({name}::MaxThreadsPerBlock == {threads}, \"{name}: thread count\");\n",
            a = self.align_a,
            b = self.align_b,
            stages = self.tile.stages,
            act = self.activation.cpp(),
            smem = self.tile.shared_bytes(self.element),
            threads = self.tile.threads(),
        )
    }

    fn sm80_declaration(&self, warp: [u32; 3]) -> String {
        let e = self.element.cpp();
        let [m, n, k] = self.tile.threadblock;
        let [wm, wn, wk] = warp;
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
mod tests {
    use super::*;

    #[test]
    fn alignments_are_the_widest_dividing_access() {
        assert_eq!(alignment(Element::F16, 768), Some(8));
        assert_eq!(alignment(Element::F16, 12), Some(4));
        assert_eq!(alignment(Element::F16, 6), Some(2));
        assert_eq!(alignment(Element::F16, 7), None, "cp.async cannot copy one half");
        assert_eq!(alignment(Element::F32, 7), Some(1));
        assert_eq!(alignment(Element::F32, 1000), Some(1));
    }

    #[test]
    fn tiles_split_into_whole_warps_and_fit_shared_memory() {
        for e in [Element::F16, Element::F32] {
            let all = tiles(e, "sm_90");
            let names: std::collections::BTreeSet<String> = all.iter().map(|t| t.name()).collect();
            assert_eq!(names.len(), all.len(), "configuration names are distinct");
            for t in &all {
                match t.family {
                    Family::Sm80 { warp } => (0..3).for_each(|i| assert_eq!(t.threadblock[i] % warp[i], 0, "{}", t.name())),
                    // wgmma: M in steps of 64 (one warpgroup), N in steps of 8 up to 256, K in steps of 16;
                    // the one consumer warpgroup's accumulator fits its registers.
                    Family::Sm90 => {
                        let [m, n, k] = t.threadblock;
                        assert!(m % 64 == 0 && n % 8 == 0 && n <= 256 && k % 16 == 0 && m * n <= 16384, "{}", t.name());
                    }
                }
                assert!(t.threads() >= 64 && t.threads() <= 512, "{}", t.name());
                assert!(t.shared_bytes(e) <= tessera_kernels::runtime::cuda::format::MAX_SHARED_BYTES, "{}", t.name());
            }
        }
    }

    #[test]
    fn a_declaration_names_every_template_argument() {
        let g = Gemm { element: Element::F16, tile: HALF_TILES[0], align_a: 8, align_b: 8, align_c: 8, activation: Activation::Gelu };
        let d = g.declaration();
        assert!(d.starts_with("using gemm_f16_128x128x32_64x64x32_s4_a888_gelu = cutlass::gemm::device::GemmBatched<"), "{d}");
        assert!(d.contains("GemmShape<16, 8, 16>") && d.contains("cutlass::epilogue::thread::GELU, cutlass::half_t, 8, float, float") && d.contains("== 65536"), "{d}");
        let h = Gemm { tile: SM90_TILES[0], ..g }.declaration();
        assert!(h.starts_with("using gemm_f16_sm90_128x128x64_s4_a888_gelu_mainloop = typename cutlass::gemm::collective::CollectiveBuilder<"), "{h}");
        assert!(h.contains("KernelCpAsyncWarpSpecialized>") && h.contains("tessera::Sm90Epilogue<cutlass::epilogue::thread::GELU, cutlass::half_t>") && h.contains("== 131200") && h.contains("== 384"), "{h}");
    }

    #[test]
    fn hopper_tiles_are_for_the_16_bit_types_on_sm_90_only() {
        assert_eq!(tiles(Element::F16, "sm_90").len(), HALF_TILES.len() + SM90_TILES.len());
        assert_eq!(tiles(Element::Bf16, "sm_80"), HALF_TILES.to_vec());
        assert_eq!(tiles(Element::F32, "sm_90"), F32_TILES.to_vec());
        assert_eq!(tiles(Element::F16, "sm_90")[0], HALF_TILES[0], "the default stays the sm80 tile");
    }
}
