//! MatMul and convolution on the GPU.
//!
//! Both run as one tiled GEMM kernel (fp32, SIMT): a block computes a `BM x BN` tile of C through `BK`-deep
//! slices of A and B staged in shared memory, each thread a `TM x TN` register tile. Convolution is an
//! implicit GEMM (rows: output channels of a group; columns: images x output positions; depth: input
//! channels of the group x kernel taps), its B tile gathered from the input with the padding as zeros, so
//! no im2col buffer exists. The output tile leaves registers through the partition's fused epilogue (bias,
//! activation, residual, ...). Small problems (batch-1 inference is mostly small problems) take a smaller
//! tile and split K across blocks, a second kernel summing the slices in a fixed order and applying the
//! epilogue (see [`Schedule::for_problem`]). Tile shapes and the split are explicit values with defaults;
//! [`Knobs`] override the defaults' choices, and the backend's configurations (the tune stage's search space)
//! are named knob settings.
//!
//! Convolutions with few output channels per group (depthwise) would waste a row tile: they run one thread
//! per output element over their few taps instead, as do ConvTranspose and integer MatMul (rare, small).

use crate::backend::{refuse, Refusal};
use super::ew;
use super::index::{batch_offset, Ix};
use super::kernel::{coords, is_float, is_half, ld, mem_type, st, zero, Kernel, EW_BLOCK};
pub use super::knobs::{AttentionChoice, Knobs, SplitChoice, TileChoice};
use crate::backend::lowering::nest::{broadcast, contiguous};
use crate::backend::lowering::plan::Group;
use crate::ir::{ConvAttrs, ConvTransposeAttrs, DType, NodeId, ValueId};

/// Tile shape of the GEMM kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiles {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub tm: u32,
    pub tn: u32,
}

impl Default for Tiles {
    fn default() -> Tiles {
        Tiles { bm: 64, bn: 64, bk: 16, tm: 4, tn: 4 }
    }
}

/// The smaller tile, for problems too small to fill the GPU with [`Tiles::default`].
pub const SMALL_TILES: Tiles = Tiles { bm: 32, bn: 32, bk: 16, tm: 2, tn: 2 };

/// Blocks a launch needs to fill an sm_90 GPU (132 SMs, two blocks each).
pub const FILL_BLOCKS: usize = 264;

/// Most K slices of a split-K GEMM.
pub const MAX_SPLITS: usize = 16;

/// Least depth of one K slice.
pub const MIN_SLICE_K: usize = 128;

impl Tiles {
    fn threads(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    fn blocks(&self, m: usize, n: usize, z: usize) -> usize {
        m.div_ceil(self.bm as usize) * n.div_ceil(self.bn as usize) * z
    }
}

/// The knob settings the tune stage measures, by the name their configuration ends in; `default` first.
/// The attention settings change only kernels with a tensor-core attention (`configs_for` measures a setting only
/// where it changes the code): one warp of rows per block, the keys unsplit, took 34 us a layer for ViT-B/16's 197
/// tokens on an H200 (2026-11-26; 13.4 us once K was read in its natural layout); the measurement decides between
/// blocks sharing K/V tiles, one warp walking every key, and the keys split.
pub const KNOB_SETTINGS: [(&str, Knobs); 9] = [
    ("default", Knobs { tiles: TileChoice::Auto, split: SplitChoice::Auto, attention: AttentionChoice::Auto }),
    ("tiles-large", Knobs { tiles: TileChoice::Large, split: SplitChoice::Auto, attention: AttentionChoice::Auto }),
    ("tiles-small", Knobs { tiles: TileChoice::Small, split: SplitChoice::Auto, attention: AttentionChoice::Auto }),
    ("split-none", Knobs { tiles: TileChoice::Auto, split: SplitChoice::None, attention: AttentionChoice::Auto }),
    ("split-double", Knobs { tiles: TileChoice::Auto, split: SplitChoice::Double, attention: AttentionChoice::Auto }),
    ("attention-2warps", Knobs { tiles: TileChoice::Auto, split: SplitChoice::Auto, attention: AttentionChoice::Warps(2) }),
    ("attention-4warps", Knobs { tiles: TileChoice::Auto, split: SplitChoice::Auto, attention: AttentionChoice::Warps(4) }),
    ("attention-1warp", Knobs { tiles: TileChoice::Auto, split: SplitChoice::Auto, attention: AttentionChoice::Warps(1) }),
    ("attention-split-keys", Knobs { tiles: TileChoice::Auto, split: SplitChoice::Auto, attention: AttentionChoice::SplitKeys }),
];

/// The tile `choice` picks between `big` and `small` for `blocks` (the big tile's block count).
fn pick_tiles<T>(choice: TileChoice, big: T, small: T, big_blocks: usize) -> T {
    match choice {
        TileChoice::Auto if big_blocks >= FILL_BLOCKS => big,
        TileChoice::Auto => small,
        TileChoice::Large => big,
        TileChoice::Small => small,
    }
}

/// The K slices `choice` gives a GEMM of `blocks` tiles over depth `k`, `z` of them.
fn pick_splits(choice: SplitChoice, blocks: usize, k: usize, z: usize) -> usize {
    let auto = splits_for(blocks, k, z);
    match choice {
        SplitChoice::Auto => auto,
        SplitChoice::None => 1,
        SplitChoice::Double => (2 * auto).min(MAX_SPLITS).min(k / (MIN_SLICE_K / 2)).min(65535 / z.max(1)).max(1),
    }
}

/// How one GEMM runs: its tile and how many K slices (1: no split).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub tiles: Tiles,
    pub splits: usize,
}

impl Schedule {
    /// The default schedule of an `m x n x k` problem, `z` of them: the large tile when it fills the GPU,
    /// else the small one; then, if the blocks still leave SMs idle, K split into slices (each at least
    /// [`MIN_SLICE_K`] deep) whose partial sums a second kernel adds up (in a fixed order) before the
    /// epilogue. Batch-1 inference is mostly such small problems: a ResNet-50 stage-4 conv is 512 x 49 with
    /// K = 4608, one row of 8 large tiles.
    pub fn for_problem(m: usize, n: usize, k: usize, z: usize) -> Schedule {
        Schedule::with_knobs(m, n, k, z, Knobs::default())
    }

    /// The schedule `knobs` choose (the default's choices where a knob says `Auto`).
    pub fn with_knobs(m: usize, n: usize, k: usize, z: usize, knobs: Knobs) -> Schedule {
        let big = Tiles::default();
        let tiles = pick_tiles(knobs.tiles, big, SMALL_TILES, big.blocks(m, n, z));
        Schedule { tiles, splits: pick_splits(knobs.split, tiles.blocks(m, n, z), k, z) }
    }
}

/// K slices for a GEMM of `blocks` tiles over depth `k`, `z` of them: none when the tiles fill the GPU, else
/// enough to (each slice at least [`MIN_SLICE_K`] deep, at most [`MAX_SPLITS`]).
fn splits_for(blocks: usize, k: usize, z: usize) -> usize {
    if blocks >= FILL_BLOCKS {
        return 1;
    }
    FILL_BLOCKS.div_ceil(blocks).min(k / MIN_SLICE_K).min(MAX_SPLITS).min(65535 / z.max(1)).max(1)
}

/// Tile shape of the tensor-core GEMM: the block's `bm x bn` tile, `bk` deep per shared-memory stage, each
/// warp a `wm x wn` piece (multiples of the 16x16 WMMA fragment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcTiles {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub wm: u32,
    pub wn: u32,
}

impl Default for TcTiles {
    fn default() -> TcTiles {
        TcTiles { bm: 64, bn: 64, bk: 32, wm: 32, wn: 32 }
    }
}

/// The smaller tensor-core tile (four warps of one fragment each), for problems the default leaves idle.
pub const SMALL_TC_TILES: TcTiles = TcTiles { bm: 32, bn: 32, bk: 32, wm: 16, wn: 16 };

impl TcTiles {
    fn threads(&self) -> u32 {
        (self.bm / self.wm) * (self.bn / self.wn) * 32
    }

    fn blocks(&self, m: usize, n: usize, z: usize) -> usize {
        m.div_ceil(self.bm as usize) * n.div_ceil(self.bn as usize) * z
    }
}

/// How one tensor-core GEMM runs (chosen as [`Schedule::for_problem`] chooses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcSchedule {
    pub tiles: TcTiles,
    pub splits: usize,
}

impl TcSchedule {
    pub fn for_problem(m: usize, n: usize, k: usize, z: usize) -> TcSchedule {
        TcSchedule::with_knobs(m, n, k, z, Knobs::default())
    }

    pub fn with_knobs(m: usize, n: usize, k: usize, z: usize, knobs: Knobs) -> TcSchedule {
        let big = TcTiles::default();
        let tiles = pick_tiles(knobs.tiles, big, SMALL_TC_TILES, big.blocks(m, n, z));
        TcSchedule { tiles, splits: pick_splits(knobs.split, tiles.blocks(m, n, z), k, z) }
    }
}

/// One GEMM problem, as data: the sizes, how the kernel addresses A, B and the output (index expressions
/// over the coordinates `m`, `n`, `k`, `z` and the batch coordinates), and the conv bias. The kernel written
/// from it calls a main loop of `gemm.cuh`, passing these as lambdas.
struct Problem {
    /// The operands' element type (f32: SIMT; f16, bf16: tensor cores).
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    z: usize,
    /// The batch dims `z` runs over (flat), whose coordinates `zb{d}` the operands' offsets use.
    batch: Vec<usize>,
    /// A's element `(m, k)`.
    a: Operand,
    /// B's element `(k, n)`, read directly or gathered.
    b: BOperand,
    /// The flat output index of `(m, n)`, affine in `m`: rows `m` and `m + 1` are `out_m_stride` apart (the
    /// tensor-core epilogue steps through eight rows by it).
    out: Ix,
    out_m_stride: usize,
    /// A conv bias: the value, its index from `(z, m)` and its index from the flat output index `i`.
    bias: Option<(ValueId, Ix, Ix)>,
}

/// An operand read at an index of its buffer (a kernel parameter).
struct Operand {
    buf: String,
    at: Ix,
    /// Elements `(r, c..c+8)` are contiguous and 16-byte aligned (the inner dim a multiple of 8): the tensor-core
    /// kernels then stage eight halves per load.
    vec: bool,
}

/// B: a matrix read directly, or a convolution's input gathered column by column (its vector staging, where a
/// pointwise convolution allows it, reading `vec_at`).
enum BOperand {
    Direct(Operand),
    Gathered { gather: Gather, vec_at: Option<Ix> },
}

impl BOperand {
    fn vec(&self) -> bool {
        match self {
            BOperand::Direct(o) => o.vec,
            BOperand::Gathered { vec_at, .. } => vec_at.is_some(),
        }
    }
}

/// A convolution's B operand, gathered from its input `x`: column `n` is an output position of an image, depth
/// `k` an input channel of the group and a kernel tap.
struct Gather {
    x: String,
    geo: ConvGeom,
    strides: Vec<usize>,
    pads: Vec<usize>,
    dilations: Vec<usize>,
    cin: usize,
    cg: usize,
    channels_last: bool,
}

impl Gather {
    /// The column lambda `gn -> (k -> element)` of [`gemm.cuh`]: per thread, the image's channel-group plane `xg`
    /// and the input window's corner `c{d}` of its output position (for the tile's spare columns past the
    /// problem these are computed but never read through); per element, the channel and kernel tap of depth
    /// `k`, the input position, and whether it is inside (unsigned compares: a negative coordinate wraps past
    /// the bound), zero outside. Channels-last, `xg` is the image's first channel of the group and depth runs
    /// over the channels of a tap first (`k = tap * cg + channel`, the weight's `[M, k.., C/g]` order).
    /// (Recomputing the column's decomposition for every element made the gather, not the tensor cores, the
    /// bottleneck: a 3x3 convolution of ResNet-50 at batch 32 ran at 17 TFLOP/s, H100 2026-11-25.)
    #[allow(clippy::needless_range_loop)]
    fn column_lambda(&self, dtype: DType) -> String {
        let (geo, cin, cg) = (&self.geo, self.cin, self.cg);
        let (in_st, out_st, k_st) = (contiguous(&geo.in_sp), contiguous(&geo.out_sp), contiguous(&geo.kernel));
        let (isz, osz, taps) = (geo.in_sp.iter().product::<usize>(), geo.out_sp.iter().product::<usize>(), geo.kernel.iter().product::<usize>());
        let t = if is_half(dtype) { mem_type(dtype) } else { "float" };
        let x = &self.x;
        let plane = if self.channels_last { format!("gimg * {}u + z * {cg}u", isz * cin) } else { format!("(gimg * {cin}u + z * {cg}u) * {isz}u") };
        let mut s = format!("[&](int gn) {{\nconst unsigned gimg = (unsigned)gn / {osz}u, gq = (unsigned)gn % {osz}u;\nconst {t}* const xg = {x} + {plane};\n");
        for d in 0..geo.sp {
            s.push_str(&format!("const int c{d} = (int)((gq / {}u) % {}u) * {} - {};\n", out_st[d], geo.out_sp[d], self.strides[d], self.pads[d]));
        }
        let split = if self.channels_last {
            format!("const unsigned ci = (unsigned)k % {cg}u, r = (unsigned)k / {cg}u;")
        } else {
            format!("const unsigned ci = (unsigned)k / {taps}u, r = (unsigned)k % {taps}u;")
        };
        s.push_str(&format!("return [=](int k) -> {t} {{\n{split}\nint xo = 0;\nbool ok = true;\n"));
        for d in 0..geo.sp {
            let kd = if d == 0 { format!("r / {}u", k_st[0]) } else { format!("(r / {}u) % {}u", k_st[d], geo.kernel[d]) };
            s.push_str(&format!("{{\nconst int id = c{d} + (int)({kd}) * {};\nok = ok && (unsigned)id < {}u;\nxo += id * {};\n\
                }}\n", self.dilations[d], geo.in_sp[d], in_st[d]));
        }
        let zero = if is_half(dtype) { zero(dtype) } else { "0.0f".to_string() };
        let at = if self.channels_last { format!("(unsigned)xo * {cin}u + ci") } else { format!("ci * {isz}u + xo") };
        s.push_str(&format!("return ok ? xg[{at}] : {zero};\n}};\n}}"));
        s
    }
}

/// The lambdas of problem `p` that the main loops of `gemm.cuh` take (`a`, `b`, `index`; `out` is written by
/// [`finish`]), after the batch coordinates and operand bases they read.
fn operand_lambdas(p: &Problem, vec_a: bool, vec_b: bool) -> String {
    let mut s = coords(&p.batch, "z", "zb", &vec![true; p.batch.len()]);
    let a = &p.a;
    s.push_str(&if vec_a {
        format!("auto a = [&](int m, int k) {{ return {} + ({}); }};\n", a.buf, a.at)
    } else {
        format!("auto a = [&](int m, int k) {{ return {}[{}]; }};\n", a.buf, a.at)
    });
    s.push_str(&match (&p.b, vec_b) {
        (BOperand::Direct(b), true) => format!("auto b = [&](int k, int n) {{ return {} + ({}); }};\n", b.buf, b.at),
        (BOperand::Direct(b), false) => format!("auto b = [&](int n) {{ return [=](int k) {{ return {}[{}]; }}; }};\n", b.buf, b.at),
        (BOperand::Gathered { gather, vec_at: Some(at) }, true) => format!("auto b = [&](int k, int n) {{ return {} + ({at}); }};\n", gather.x),
        (BOperand::Gathered { gather, .. }, _) => format!("auto b = {};\n", gather.column_lambda(p.dtype)),
    });
    s.push_str(&format!("auto index = [&](int m, int n) -> unsigned {{ return {}; }};\n", p.out));
    s
}

/// The epilogue of output element `f` with value `value`, stored through the group.
fn epilogue(k: &mut Kernel, grp: &Group, value: &str, f: &str) -> Result<String, Refusal> {
    let loaded = ew::loaded_operands(k, grp);
    let mut b = ew::operand_offsets(k, &grp.domain, &loaded, f);
    b.push_str(&ew::element(k, grp, &loaded, &|o| format!("o{o}"), Some(value), f)?);
    Ok(b)
}

/// The GEMM kernel in `k`, a call of one of `gemm.cuh`'s main loops (tensor cores for f16 and bf16 operands,
/// SIMT for f32); with a split schedule, also the kernel adding the slices up and applying the epilogue
/// (returned).
fn tiled<'a>(k: &mut Kernel<'a>, p: Problem, grp: &Group) -> Result<Option<Kernel<'a>>, Refusal> {
    let (m, n, kd, z) = (p.m, p.n, p.k, p.z);
    let (call, splits, (bm, bn, bk), threads, vec) = if is_half(p.dtype) {
        let sch = TcSchedule::with_knobs(m, n, kd, z, k.knobs);
        let TcTiles { bm, bn, bk, wm, wn } = sch.tiles;
        let (t, stride, va, vb) = (mem_type(p.dtype), p.out_m_stride, p.a.vec, p.b.vec());
        let call = if va && vb {
            format!("tc_pipelined<{m}, {n}, {kd}, SLICE, {bm}, {bn}, {bk}, {wm}, {wn}, {stride}, {PIPELINE_STAGES}, {t}>")
        } else {
            format!("tc_staged<{m}, {n}, {kd}, SLICE, {bm}, {bn}, {bk}, {wm}, {wn}, {stride}, {va}, {vb}, {t}>")
        };
        (call, sch.splits, (bm, bn, bk), sch.tiles.threads(), (va, vb))
    } else {
        let sch = Schedule::with_knobs(m, n, kd, z, k.knobs);
        let Tiles { bm, bn, bk, tm, tn } = sch.tiles;
        (format!("simt<{m}, {n}, {kd}, SLICE, {bm}, {bn}, {bk}, {tm}, {tn}>"), sch.splits, (bm, bn, bk), sch.tiles.threads(), (false, false))
    };
    if z * splits > 65535 {
        return Err(refuse!("{z} GEMMs in one batch (at most 65535)"));
    }
    let slice = kd.div_ceil(splits).div_ceil(bk as usize) * bk as usize;
    let mut b = format!("const unsigned z = blockIdx.z / {splits}u, slice = blockIdx.z % {splits}u;\n");
    b.push_str(&operand_lambdas(&p, vec.0, vec.1));
    b.push_str("auto out = [&](int m, int n, unsigned f, float v) {\n");
    let second = finish(k, &p, grp, splits, "v", &mut b)?;
    b.push_str("};\n");
    b.push_str(&format!("tsr_gemm::{}(slice, a, b, index, out);\n", call.replace("SLICE", &slice.to_string())));
    k.body.push_str(&b);
    launch(k, &p, bm, bn, splits, threads)?;
    if !is_half(p.dtype) {
        k.min_blocks = SIMT_MIN_BLOCKS;
    }
    Ok(second)
}

/// Blocks per SM the SIMT GEMM kernels are compiled for. Left to itself, NVRTC 13 fits the 32x32 tile's
/// kernel into 32 registers (full occupancy) and, to do so, sinks the next step's prefetched loads below the
/// step's FMAs, so every step waits a whole memory round trip. At four blocks (at most 64 registers for 256
/// threads) the loads go out at the top of the step. Each kernel alone, H200 2026-11-27
/// (`scripts/gpu/kernel_ab.py`, bench/gpu_cuda_templates.md): BERT-base b1's FFN GEMM with bias + GELU 69.6 ->
/// 62.8 us, its QKV GEMM 68.7 -> 62.3, the split-K ones 27.9 -> 26.4 and 86.5 -> 80.5 (five and six blocks
/// measured the same within 1%). The 64x64 tile's kernels (ResNet, MobileNetV2, BERT b8) gained 5-16% per
/// model from the same bound.
const SIMT_MIN_BLOCKS: u32 = 4;

/// The grid of a GEMM of `bm x bn` tiles, `splits` K slices each, and its block.
fn launch(k: &mut Kernel, p: &Problem, bm: u32, bn: u32, splits: usize, threads: u32) -> Result<(), Refusal> {
    k.grid = [p.n.div_ceil(bn as usize).max(1) as u32, p.m.div_ceil(bm as usize).max(1) as u32, (p.z * splits).max(1) as u32];
    if k.grid[1] > 65535 {
        return Err(refuse!("a GEMM with {} rows (at most {} row tiles)", p.m, 65535));
    }
    k.block = [threads, 1, 1];
    Ok(())
}

/// (Measured alternative, H100 2026-11-24: a serial split-K in one kernel, the tile's last block summing
/// the slices behind an atomic counter, removed 61 of BERT-base's 225 launches but made it 11% slower
/// (1102 -> 1229 us fp16): the last block's fence, atomic and reloads sit on the critical path, while the
/// second kernel's reduction runs wide and costs about a microsecond of graph replay.)
///
/// What happens to the accumulated `value` of output element `f` (in scope as `f`, in the code `b`): the
/// bias and epilogue applied and stored; or, with K split, the partial sum written to slice `slice` of an
/// item-private buffer, and a second kernel (returned) that sums the slices in a fixed order, then adds the
/// bias and applies the epilogue.
fn finish<'a>(k: &mut Kernel<'a>, p: &Problem, grp: &Group, splits: usize, value: &str, b: &mut String) -> Result<Option<Kernel<'a>>, Refusal> {
    let total = p.m * p.n * p.z;
    if splits == 1 {
        let value = match &p.bias {
            Some((v, by_zm, _)) => {
                let bias = k.buf(*v, false);
                format!("{value} + {}", ld(k.g.ty(*v).dtype, &bias, &by_zm.to_string()))
            }
            None => value.to_string(),
        };
        b.push_str(&epilogue(k, grp, &value, "f")?);
        return Ok(None);
    }
    // Slice `s` of the partial sums holds element `f` at `s * total + f`.
    let ws = k.temp(0, splits * total);
    b.push_str(&format!("{ws}[slice * {total}u + f] = {value};\n"));
    let mut e = Kernel::new(k.g, k.plan, k.symbol);
    let ws = e.temp(0, splits * total);
    let mut eb = format!("float s = {ws}[i];\n");
    for sl in 1..splits {
        eb.push_str(&format!("s += {ws}[{}u + i];\n", sl * total));
    }
    if let Some((v, _, by_flat)) = &p.bias {
        let bias = e.buf(*v, false);
        eb.push_str(&format!("s += {};\n", ld(k.g.ty(*v).dtype, &bias, &by_flat.to_string())));
    }
    eb.push_str(&epilogue(&mut e, grp, "s", "i")?);
    e.body.push_str(&eb);
    e.per_element(total);
    Ok(Some(e))
}

/// Shared-memory stages of the pipelined tensor-core GEMM (three 64x64x32 stages and the fp32 output tile
/// fit the 48 KiB of static shared memory).
pub const PIPELINE_STAGES: u32 = 3;

/// An f32 MatMul (NumPy semantics: batched, broadcast batch dims, rank-1 operands) as a tiled GEMM; `grp` is
/// the group anchored on it (its epilogue).
pub fn matmul<'a>(k: &mut Kernel<'a>, node: NodeId, grp: &Group) -> Result<Option<Kernel<'a>>, Refusal> {
    let g = k.g;
    let nd = g.node(node);
    let (a, bv, o) = (nd.inputs[0], nd.inputs[1], nd.outputs[0]);
    let (sa, sb) = (g.ty(a).shape.clone(), g.ty(bv).shape.clone());
    let (m, kd) = if sa.len() == 1 { (1, sa[0]) } else { (sa[sa.len() - 2], sa[sa.len() - 1]) };
    let n = if sb.len() == 1 { 1 } else { sb[sb.len() - 1] };
    let abatch: Vec<usize> = if sa.len() > 2 { sa[..sa.len() - 2].to_vec() } else { Vec::new() };
    let bbatch: Vec<usize> = if sb.len() > 2 { sb[..sb.len() - 2].to_vec() } else { Vec::new() };
    let rank = abatch.len().max(bbatch.len());
    let mut obatch = vec![1usize; rank];
    for (d, ob) in obatch.iter_mut().enumerate() {
        let pick = |s: &[usize]| if d + s.len() >= rank { s[d + s.len() - rank] } else { 1 };
        *ob = pick(&abatch).max(pick(&bbatch));
    }
    let mut z: usize = obatch.iter().product();
    let mut ast = broadcast(&abatch, &obatch);
    let mut bst = broadcast(&bbatch, &obatch);
    // A batch of GEMMs sharing one B, over an A that is not broadcast, is one GEMM of `z * m` rows: A's and
    // the output's batches are contiguous row blocks. (PyTorch's MultiheadAttention exports its projections
    // as [S, 1, E] x [E, 3E]: 197 one-row GEMMs, each block re-reading B, cost ViT-B/16 3.4 ms of 4.6.)
    let m = if z > 1 && bst.iter().all(|&s| s == 0) && abatch.iter().product::<usize>() == z {
        let rows = z * m;
        z = 1;
        obatch.clear();
        ast.clear();
        bst.clear();
        rows
    } else {
        m
    };
    let pa = k.buf(a, false);
    let pb = k.buf(bv, false);
    let _ = o;
    let dtype = g.ty(a).dtype;
    if g.ty(bv).dtype != dtype || !is_float(dtype) {
        return Err(refuse!("MatMul of {} by {} is not supported by the cuda backend", dtype, g.ty(bv).dtype));
    }
    let (mi, ni, ki) = (Ix::var("m"), Ix::var("n"), Ix::var("k"));
    let p = Problem {
        dtype,
        m,
        n,
        k: kd,
        z,
        batch: obatch,
        a: Operand { buf: pa, at: batch_offset(&ast, m * kd) + mi.clone() * kd + ki.clone(), vec: kd % 8 == 0 },
        b: BOperand::Direct(Operand { buf: pb, at: batch_offset(&bst, kd * n) + ki * n + ni.clone(), vec: n % 8 == 0 }),
        out: Ix::var("z") * (m * n) + mi * n + ni,
        out_m_stride: n,
        bias: None,
    };
    tiled(k, p, grp)
}

/// Geometry of a convolution's spatial dims.
struct ConvGeom {
    sp: usize,
    in_sp: Vec<usize>,
    out_sp: Vec<usize>,
    kernel: Vec<usize>,
}

/// The spatial dims of image shape `s`: after batch and channels, or between them channels-last.
fn spatial(s: &[usize], channels_last: bool) -> Vec<usize> {
    if channels_last {
        s[1..s.len() - 1].to_vec()
    } else {
        s[2..].to_vec()
    }
}

fn conv_geom(k: &Kernel, node: NodeId, channels_last: bool) -> ConvGeom {
    let nd = k.g.node(node);
    let xs = k.g.ty(nd.inputs[0]).shape.clone();
    let ws = k.g.ty(nd.inputs[1]).shape.clone();
    let ys = k.g.ty(nd.outputs[0]).shape.clone();
    ConvGeom { sp: xs.len() - 2, in_sp: spatial(&xs, channels_last), out_sp: spatial(&ys, channels_last), kernel: spatial(&ws, channels_last) }
}

/// Statements computing, from output position `q` (flat over the output's spatial dims) and kernel tap
/// `r` (flat over the kernel), the input offset `xo` within a channel plane and whether it is inside
/// (`ok`).
fn conv_tap(geo: &ConvGeom, a: &ConvAttrs, q: &str, r: &str) -> String {
    let (in_st, out_st, k_st) = (contiguous(&geo.in_sp), contiguous(&geo.out_sp), contiguous(&geo.kernel));
    let mut s = String::from("bool ok = true;\nint xo = 0;\n");
    for d in 0..geo.sp {
        s.push_str(&format!(
            "{{\nconst int od = (int)(({q} / {}u) % {}u), kd = (int)(({r} / {}u) % {}u);\nconst int id = od * {} - {} + kd * {};\n\
                ok = ok && id >= 0 && id < {};\nxo += id * {};\n}}\n",
            out_st[d], geo.out_sp[d], k_st[d], geo.kernel[d], a.strides[d], a.pads[d], a.dilations[d], geo.in_sp[d], in_st[d]
        ));
    }
    s
}

/// A convolution: a tiled implicit GEMM per group, or one thread per output for depthwise-like shapes.
/// Channels-last (`NhwcConv`) the image is `[N, spatial.., C]`, the weight `[M, k.., C/g]` and the output
/// `[N, spatial.., M]`: the GEMM's depth runs over a tap's channels first, and the output's rows (channels) are
/// adjacent.
pub fn conv<'a>(k: &mut Kernel<'a>, node: NodeId, a: &ConvAttrs, grp: &Group, channels_last: bool) -> Result<Option<Kernel<'a>>, Refusal> {
    let g = k.g;
    let nd = g.node(node);
    let xs = g.ty(nd.inputs[0]).shape.clone();
    let ws = g.ty(nd.inputs[1]).shape.clone();
    let geo = conv_geom(k, node, channels_last);
    let (nimg, cin, cout) = (xs[0], if channels_last { xs[xs.len() - 1] } else { xs[1] }, ws[0]);
    let (gr, cg) = (a.group, if channels_last { ws[ws.len() - 1] } else { ws[1] });
    let mg = cout / gr;
    let taps: usize = geo.kernel.iter().product();
    let isz: usize = geo.in_sp.iter().product();
    let osz: usize = geo.out_sp.iter().product();
    let kd = cg * taps;
    let dtype = g.ty(nd.inputs[0]).dtype;
    if nd.inputs.iter().chain(&nd.outputs).any(|&v| g.ty(v).dtype != dtype) || !is_float(dtype) {
        return Err(refuse!("{} on {dtype} (mixed or non-float operands) is not supported by the cuda backend", nd.op.name()));
    }
    let x = k.buf(nd.inputs[0], false);
    let w = k.buf(nd.inputs[1], false);
    if mg < 8 {
        let bias = if nd.inputs.len() > 2 { Some(k.buf(nd.inputs[2], false)) } else { None };
        if cg == 1 && mg == 1 && geo.sp == 2 {
            return conv_depthwise(k, node, a, grp, &geo, (x, w, bias), channels_last).map(|_| None);
        }
        return conv_direct(k, node, a, grp, &geo, (x, w, bias), channels_last).map(|_| None);
    }
    // A pointwise conv (1x1, stride 1, no padding) reads its input plane as a row-major [cin, positions]
    // matrix per image: eight positions of one image are contiguous when the plane is a multiple of 8.
    // (Channels-last, positions are `cin` apart: no vector loads along them.)
    let pointwise = taps == 1 && osz == isz && a.strides.iter().all(|&s| s == 1) && a.pads.iter().all(|&p| p == 0);
    let (mi, ni, ki, zi) = (Ix::var("m"), Ix::var("n"), Ix::var("k"), Ix::var("z"));
    let vec_at = (!channels_last && pointwise && osz.is_multiple_of(8))
        .then(|| (ni.clone() / osz * cin + zi.clone() * cg + ki.clone()) * isz + ni.clone() % osz);
    let channel = zi * mg + mi;
    let (out, out_m_stride, bias_by_flat) = if channels_last {
        (ni * cout + channel.clone(), 1, Ix::var("i") % cout)
    } else {
        ((ni.clone() / osz * cout + channel.clone()) * osz + ni % osz, osz, Ix::var("i") / osz % cout)
    };
    let gather = Gather { x, geo, strides: a.strides.clone(), pads: a.pads.clone(), dilations: a.dilations.clone(), cin, cg, channels_last };
    let p = Problem {
        dtype,
        m: mg,
        n: nimg * osz,
        k: kd,
        z: gr,
        batch: Vec::new(),
        a: Operand { buf: w, at: channel.clone() * kd + ki, vec: kd.is_multiple_of(8) },
        b: BOperand::Gathered { gather, vec_at },
        out,
        out_m_stride,
        bias: nd.inputs.get(2).map(|&b| (b, channel, bias_by_flat)),
    };
    tiled(k, p, grp)
}

/// Outputs along a row that one thread of [`conv_depthwise`] computes.
const DEPTHWISE_ROW: usize = 4;

/// A depthwise 2-D convolution (one input channel per output channel: MobileNet's and ConvNeXt's 3x3 to 7x7
/// layers), a call of `conv.cuh`'s row loop: each thread computes [`DEPTHWISE_ROW`] adjacent outputs of one
/// row and channel. Channels-last, adjacent threads take adjacent channels (coalesced loads and stores);
/// channels-first, adjacent row segments.
fn conv_depthwise(
    k: &mut Kernel,
    node: NodeId,
    a: &ConvAttrs,
    grp: &Group,
    geo: &ConvGeom,
    (x, w, bias): (String, String, Option<String>),
    channels_last: bool,
) -> Result<(), Refusal> {
    let g = k.g;
    let nd = g.node(node);
    let xs = g.ty(nd.inputs[0]).shape.clone();
    let c = if channels_last { xs[3] } else { xs[1] };
    let (nimg, [h, wd], [oh, ow], [kh, kw]) = (xs[0], [geo.in_sp[0], geo.in_sp[1]], [geo.out_sp[0], geo.out_sp[1]], [geo.kernel[0], geo.kernel[1]]);
    let (sh, sw, dh, dw, ph, pw) = (a.strides[0], a.strides[1], a.dilations[0], a.dilations[1], a.pads[0], a.pads[1]);
    let row = DEPTHWISE_ROW.min(ow);
    let segs = ow.div_ceil(row);
    let total = nimg * oh * segs * c;
    let d = g.ty(nd.inputs[0]).dtype;
    // The thread's coordinates from its index `t`, its image plane's start, the offset of input (ih, iw)
    // within the plane, and the flat output index of output column `ow0 + o`.
    let (t, ch, oy, img, o) = (Ix::var("t"), Ix::var("ch"), Ix::var("oy"), Ix::var("img"), Ix::var("o"));
    let column = Ix::var("ow0") + o;
    let (coords, plane, at, out) = if channels_last {
        (
            [t.clone() % c, t.clone() / c % segs, t.clone() / (c * segs) % oh, t / (c * segs * oh)],
            img.clone() * (h * wd * c) + ch.clone(),
            (Ix::var("ih") * wd + Ix::var("iw")) * c,
            ((img * oh + oy) * ow + column) * c + ch,
        )
    } else {
        (
            [t.clone() / (segs * oh) % c, t.clone() % segs, t.clone() / segs % oh, t / (segs * oh * c)],
            (img.clone() * c + ch.clone()) * (h * wd),
            Ix::var("ih") * wd + Ix::var("iw"),
            ((img * c + ch) * oh + oy) * ow + column,
        )
    };
    let [ch, seg, oy, img] = coords;
    let ty = mem_type(d);
    let mut b = format!("const unsigned t = blockIdx.x * {EW_BLOCK}u + threadIdx.x;\nif (t >= {total}u) return;\n");
    b.push_str(&format!("const unsigned ch = {ch}, seg = {seg}, oy = {oy}, img = {img};\nconst unsigned ow0 = seg * {row}u;\n"));
    b.push_str(&format!("const {ty}* const xp = {x} + ({plane});\nconst {ty}* const wp = {w} + ch * {}u;\n", kh * kw));
    b.push_str(&format!("auto x = [&](unsigned ih, unsigned iw) {{ return {}; }};\n", ld(d, "xp", &at.to_string())));
    b.push_str(&format!("auto w = [&](int tap) {{ return {}; }};\n", ld(d, "wp", "tap")));
    let value = match bias {
        Some(bb) => format!("v + {}", ld(d, &bb, "ch")),
        None => "v".to_string(),
    };
    let loaded = ew::loaded_operands(k, grp);
    b.push_str(&format!("auto out = [&](unsigned o, float v) {{\nconst unsigned i = {out};\n"));
    b.push_str(&ew::operand_offsets(k, &grp.domain, &loaded, "i"));
    b.push_str(&ew::element(k, grp, &loaded, &|o| format!("o{o}"), Some(&value), "i")?);
    b.push_str("};\n");
    b.push_str(&format!("tsr_conv::depthwise_row<{h}, {wd}, {ow}, {kh}, {kw}, {sh}, {sw}, {dh}, {dw}, {ph}, {pw}, {row}>(oy, ow0, x, w, out);\n"));
    k.body.push_str(&b);
    k.block = [EW_BLOCK, 1, 1];
    k.grid = [total.div_ceil(EW_BLOCK as usize).max(1) as u32, 1, 1];
    Ok(())
}

/// One thread per output element, looping over its group's input channels and the kernel taps.
fn conv_direct(
    k: &mut Kernel,
    node: NodeId,
    a: &ConvAttrs,
    grp: &Group,
    geo: &ConvGeom,
    (x, w, bias): (String, String, Option<String>),
    channels_last: bool,
) -> Result<(), Refusal> {
    let g = k.g;
    let nd = g.node(node);
    let xs = g.ty(nd.inputs[0]).shape.clone();
    let ws = g.ty(nd.inputs[1]).shape.clone();
    let ys = g.ty(nd.outputs[0]).shape.clone();
    let (cin, cout, cg) = if channels_last { (xs[xs.len() - 1], ws[0], ws[ws.len() - 1]) } else { (xs[1], ws[0], ws[1]) };
    let mg = cout / a.group;
    let taps: usize = geo.kernel.iter().product();
    let isz: usize = geo.in_sp.iter().product();
    let osz: usize = geo.out_sp.iter().product();
    let tap = conv_tap(geo, a, "q", "r");
    let d = g.ty(nd.inputs[0]).dtype;
    let t = mem_type(d);
    let (coords, xc, wc, xat, wat) = if channels_last {
        (
            format!("const unsigned co = i % {cout}u, q = (i / {cout}u) % {osz}u, img = i / {};", osz * cout),
            format!("{x} + img * {}u + gg * {cg}u + ci", isz * cin),
            format!("{w} + co * {}u + ci", taps * cg),
            format!("(unsigned)xo * {cin}u"),
            format!("r * {cg}u"),
        )
    } else {
        (
            format!("const unsigned q = i % {osz}u, co = (i / {osz}u) % {cout}u, img = i / {};", osz * cout),
            format!("{x} + (img * {cin}u + gg * {cg}u + ci) * {isz}u"),
            format!("{w} + (co * {cg}u + ci) * {taps}u"),
            "xo".to_string(),
            "r".to_string(),
        )
    };
    let mut b = format!(
        "{coords}\nconst unsigned gg = co / {mg}u;\nfloat s = 0.0f;\nfor (unsigned ci = 0; ci < {cg}u; ci++) {{\nconst {t}* xc = {xc};\n\
            const {t}* wc = {wc};\n#pragma unroll 3\nfor (unsigned r = 0; r < {taps}u; r++) {{\n{tap}if (ok) s = fmaf({}, {}, s);\n}}\n}}\n",
        ld(d, "xc", &xat),
        ld(d, "wc", &wat)
    );
    let value = match bias {
        Some(bb) => format!("s + {}", ld(d, &bb, "co")),
        None => "s".to_string(),
    };
    let loaded = ew::loaded_operands(k, grp);
    b.push_str(&ew::operand_offsets(k, &grp.domain, &loaded, "i"));
    b.push_str(&ew::element(k, grp, &loaded, &|o| format!("o{o}"), Some(&value), "i")?);
    k.body.push_str(&b);
    k.per_element(ys.iter().product());
    Ok(())
}

/// ConvTranspose, one thread per output element gathering the inputs that reach it.
pub fn conv_transpose(k: &mut Kernel, node: NodeId, a: &ConvTransposeAttrs) -> Result<(), Refusal> {
    let g = k.g;
    let nd = g.node(node);
    let xs = g.ty(nd.inputs[0]).shape.clone();
    let ws = g.ty(nd.inputs[1]).shape.clone();
    let ys = g.ty(nd.outputs[0]).shape.clone();
    let sp = xs.len() - 2;
    let (c, gr) = (xs[1], a.group);
    let cg = c / gr;
    let mg = ws[1];
    let mo = mg * gr;
    let kernel = &ws[2..];
    let taps: usize = kernel.iter().product();
    let (in_sp, out_sp) = (&xs[2..], &ys[2..]);
    let isz: usize = in_sp.iter().product();
    let osz: usize = out_sp.iter().product();
    let (in_st, out_st, k_st) = (contiguous(in_sp), contiguous(out_sp), contiguous(kernel));
    let x = k.buf(nd.inputs[0], false);
    let w = k.buf(nd.inputs[1], false);
    let bias = if nd.inputs.len() > 2 { Some(k.buf(nd.inputs[2], false)) } else { None };
    let y = k.buf(nd.outputs[0], true);
    let mut b = format!("const unsigned q = i % {osz}u, m = (i / {osz}u) % {mo}u, img = i / {};\nconst unsigned gg = m / {mg}u, co = m % {mg}u;\n\
        float s = 0.0f;\n", osz * mo);
    b.push_str(&format!("for (unsigned r = 0; r < {taps}u; r++) {{\nbool ok = true;\nint xo = 0;\n"));
    for d in 0..sp {
        b.push_str(&format!(
            "{{\nconst int od = (int)((q / {}u) % {}u), kd = (int)((r / {}u) % {}u);\nconst int t = od + {} - kd * {};\nconst int id = t / {};\n\
                ok = ok && t >= 0 && t % {} == 0 && id < {};\nxo += id * {};\n}}\n",
            out_st[d], out_sp[d], k_st[d], kernel[d], a.pads[d], a.dilations[d], a.strides[d], a.strides[d], in_sp[d], in_st[d]
        ));
    }
    let d = g.ty(nd.outputs[0]).dtype;
    if !is_float(d) {
        return Err(refuse!("ConvTranspose on {d} is not supported by the cuda backend"));
    }
    b.push_str(&format!(
        "if (!ok) continue;\nfor (unsigned ci = 0; ci < {cg}u; ci++) s = fmaf({}, {}, s);\n}}\n",
        ld(d, &x, &format!("(img * {c}u + gg * {cg}u + ci) * {isz}u + xo")),
        ld(d, &w, &format!("((gg * {cg}u + ci) * {mg}u + co) * {taps}u + r"))
    ));
    let add = bias.map(|bb| format!(" + {}", ld(d, &bb, "m"))).unwrap_or_default();
    b.push_str(&format!("{y}[i] = {};\n", st(d, &format!("s{add}"))));
    k.body.push_str(&b);
    k.per_element(ys.iter().product());
    Ok(())
}

/// An integer MatMul (shape arithmetic that survived folding): one thread per output, wrapping i64 sums.
pub fn matmul_int(k: &mut Kernel, node: NodeId) -> Result<(), Refusal> {
    let g = k.g;
    let nd = g.node(node);
    let (a, bv, o) = (nd.inputs[0], nd.inputs[1], nd.outputs[0]);
    let (sa, sb) = (g.ty(a).shape.clone(), g.ty(bv).shape.clone());
    if sa.len() != 2 || sb.len() != 2 {
        return Err("integer MatMul of rank other than 2 is not supported by the cuda backend".into());
    }
    let d = g.ty(o).dtype;
    if !matches!(d, DType::I64 | DType::I32) {
        return Err(refuse!("MatMul on {d} is not supported by the cuda backend"));
    }
    let (m, kd, n) = (sa[0], sa[1], sb[1]);
    let (pa, pb, y) = (k.buf(a, false), k.buf(bv, false), k.buf(o, true));
    k.body.push_str(&format!(
        "const unsigned r = i / {n}u, c = i % {n}u;\nunsigned long long s = 0;\n\
            for (unsigned q = 0; q < {kd}u; q++) s += (unsigned long long)(long long){pa}[r * {kd}u + q] * (unsigned long long)(long long){pb}[q * {n}u + c];\n\
            {y}[i] = ({})(long long)s;\n",
        mem_type(d)
    ));
    k.per_element(m * n);
    Ok(())
}
