//! Attention on tensor cores for fp16 and bf16 operands: FlashAttention-2's structure with `mma.sync`
//! m16n8k16 (fp16 or bf16 inputs, fp32 accumulation; the fragment layouts are the same for both), so the `Sq x Sk` scores never touch global memory and both products
//! run on the tensor cores. The fp32 path and head dims above [`MAX_HEAD_DIM`] keep the SIMT kernel of
//! [`super::attention`], whose semantics this one follows exactly (masks, NaN rows, empty key axes).
//!
//! A block has `warps x split` warps ([`MmaTiles`]). With `split = 1` each warp owns 16 query rows of one batch
//! matrix; with key slices (`split > 1`) `split` warps share the same 16 rows, each walking every `split`-th
//! key tile, and their partial results are combined through shared memory at the end. Each warp keeps, in
//! registers,
//! - its Q rows as the A fragments of `QK^T` (loaded once, zero past `Sq` and past `D`);
//! - the output accumulator (`16 x Dv`, the C fragments of `PV`), the running row max `m` and sum `l`.
//!
//! The block walks the keys in tiles of [`MmaTiles::bk`] (`bk` keys per warp per round), staging the tile's K (`Ks[j][t]`) and V
//! (`Vs[j][c]`) in shared memory, zero past `Sk`, `D` and `Dv`; per tile each warp
//! 1. computes its scores `S = Q K^T` (B fragments of K read as 32-bit pairs from `Ks`);
//! 2. applies the scale, the keep mask and the additive mask element by element (each thread knows the row
//!    and key of its fragment elements), -inf past `Sk`;
//! 3. updates `m` and `l` (row maxima over the four threads sharing a row, by shuffles), rescales the
//!    accumulator, and turns `P = exp(S - m)` into A fragments of the operands' type in registers: the C fragment layout of
//!    two adjacent 8-key tiles is the A fragment layout of one 16-key step, so P never leaves registers;
//! 4. accumulates `P V`, V's B fragments loaded transposed by `ldmatrix.trans`.
//!
//! Rows are owned by quads of threads, so `l` stays a per-thread partial sum until the end (every thread of
//! a quad rescales by the same `alpha`) and is summed over the quad once. The output is `acc / l`: a row of
//! -inf scores keeps `m = -inf`, its exponentials are taken against 0 (so they are 0, not NaN), and gives
//! `0 / 0 = NaN`, as the reference; a NaN or +inf score makes the row NaN. P is rounded to the operands' type for
//! the second product (as FlashAttention does); `l` sums the unrounded probabilities.

use super::kernel::{coords, is_half, mem_type, offset, zero, Kernel};
use crate::backend::c::cexpr::f32_lit;
use crate::backend::c::nest::broadcast;
use crate::backend::c::plan::Storage;
use crate::ir::{attention_dims, AttentionAttrs, DType, NodeId, StridedView, ValueId};

/// Largest head dims (`D`, `Dv`) this kernel takes (the accumulator is `Dv / 2` registers per thread).
pub const MAX_HEAD_DIM: usize = 128;

/// Query rows of one warp (the m of m16n8k16).
const WARP_ROWS: u32 = 16;

/// Shared-memory row padding, in halves: 16 bytes, so rows stay 16-byte aligned (ldmatrix, vector
/// stores) and the 32-bit fragment reads of one warp fall in 32 different banks.
const PAD: usize = 8;

/// The kernel's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmaTiles {
    /// Warps per block along the query rows (each 16 rows).
    pub warps: u32,
    /// Keys per warp per round (a multiple of 16: one `P V` k-step per 16 keys).
    pub bk: u32,
    /// Key slices: the block's rows are computed `split` times over, each warp group walking every
    /// `split`-th key tile with its own running max, sum and accumulator, combined through shared memory at
    /// the end (FlashDecoding's split inside one block). Batch-1 attention has too few query tiles to fill
    /// the GPU (ViT-B/16: 12 heads x 13 tiles of 16 rows), so one warp walking every key is latency-bound.
    pub split: u32,
}

impl MmaTiles {
    pub fn rows(&self) -> u32 {
        self.warps * WARP_ROWS
    }

    pub fn threads(&self) -> u32 {
        self.warps * self.split * 32
    }

    /// Keys staged per round: one tile per key slice.
    pub fn round_keys(&self) -> u32 {
        self.bk * self.split
    }

    pub fn blocks(&self, batch: usize, sq: usize) -> usize {
        batch * sq.div_ceil(self.rows() as usize)
    }

    /// Why the tile is not valid, if it is not (`%` rather than `is_multiple_of`: the README promises Rust 1.85).
    #[allow(clippy::manual_is_multiple_of)]
    pub fn check(&self) -> Result<(), String> {
        let split_ok = (1..=8).contains(&self.split) && self.warps * self.split <= 8 && self.round_keys() <= 256;
        if (1..=8).contains(&self.warps) && self.bk > 0 && self.bk % 16 == 0 && self.bk <= 128 && split_ok {
            Ok(())
        } else {
            Err(format!("tensor-core attention tile {self:?}: 1 to 8 warps in all, bk a multiple of 16 up to 128, at most 256 keys a round"))
        }
    }

    /// The default for `batch` matrices of `sq` query rows and `sk` keys: the most warps per block (they share
    /// each K/V tile) whose blocks still fill the GPU ([`super::gemm::FILL_BLOCKS`]); else one warp of rows
    /// with the keys split in up to four slices, 32 keys a tile (batch-1 inference: BERT-base at 128 tokens is
    /// 12 heads x 8 warps of rows, each row computed by four warps over 32 keys each). Rounds of 128 keys keep a
    /// block's two stages at 72 KiB for 64-dim heads, so three blocks fit an SM.
    pub fn for_problem(batch: usize, sq: usize, sk: usize) -> MmaTiles {
        [4, 2].into_iter().map(|warps| MmaTiles { warps, bk: 64, split: 1 }).find(|t| t.blocks(batch, sq) >= super::gemm::FILL_BLOCKS).unwrap_or_else(|| MmaTiles::split_keys(sk))
    }

    /// One warp of rows, the keys split in up to four slices of 32-key tiles.
    pub fn split_keys(sk: usize) -> MmaTiles {
        MmaTiles { warps: 1, bk: 32, split: sk.div_ceil(32).clamp(1, 4) as u32 }
    }
}

/// Whether the tensor-core kernel takes this attention: Q, K and V of one 16-bit float type (f16 or bf16)
/// with head dims it holds.
pub fn applies(dtypes: [DType; 3], d: usize, dv: usize) -> bool {
    is_half(dtypes[0]) && dtypes.iter().all(|&t| t == dtypes[0]) && (1..=MAX_HEAD_DIM).contains(&d) && (1..=MAX_HEAD_DIM).contains(&dv)
}

/// Shared-memory layout of one block, in halves: two stages (the next key tile is copied in, by cp.async,
/// while the warps compute on this one), each K then V.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// `D` rounded up to 16 (the k of one `QK^T` step); the pad is zero in Q and K.
    pub dp: usize,
    /// `Dv` rounded up to 16 (V's B fragments are loaded two 8-column tiles at a time).
    pub dvp: usize,
    /// Row stride of K's tile: `Ks[j][t]` (`dp + PAD`) for K stored `[Sk, D]`, `Ks[t][j]` (`bk + PAD`) for K
    /// stored transposed, `[D, Sk]` (each tile a copy of the source's rows).
    pub ldk: usize,
    /// Row stride of `Vs[j][c]`.
    pub ldv: usize,
    /// Offset of `Vs` in a stage, and the halves of one stage.
    pub v_at: usize,
    pub stage: usize,
}

impl Layout {
    pub fn new(t: MmaTiles, d: usize, dv: usize, k_transposed: bool) -> Layout {
        let bk = t.round_keys() as usize;
        let (dp, dvp) = (d.next_multiple_of(16), dv.next_multiple_of(16));
        let (ldk, k_rows) = if k_transposed { (bk + PAD, dp) } else { (dp + PAD, bk) };
        let ldv = dvp + PAD;
        let v_at = k_rows * ldk;
        Layout { dp, dvp, ldk, ldv, v_at, stage: v_at + bk * ldv }
    }

    /// Bytes of the two stages, and of the key slices' partial results after them (which reuse the stages).
    pub fn bytes(&self, t: MmaTiles) -> usize {
        (2 * self.stage * 2).max(Self::partial_bytes(t, self.dvp))
    }

    /// Floats of one warp's partial result in the combine: per lane its accumulator (`dvp / 8` tiles of 4),
    /// then its two rows' max and sum.
    fn partial_floats(dvp: usize) -> usize {
        32 * (dvp / 2 + 4)
    }

    fn partial_bytes(t: MmaTiles, dvp: usize) -> usize {
        if t.split > 1 {
            (t.warps * (t.split - 1)) as usize * Self::partial_floats(dvp) * 4
        } else {
            0
        }
    }
}

/// Whether `v` is an inline constant array (whose alignment is only its element's: no vector loads).
fn is_const(k: &Kernel, v: ValueId) -> bool {
    let root = k.plan.root[v.index()];
    matches!(k.plan.storage[root.index()], Some(Storage::Const))
}

/// `expr * s` as an unsigned expression: a negative stride wraps exactly modulo 2^32 (the sums are in range).
fn times(expr: &str, s: i64) -> String {
    match s {
        1 => expr.to_string(),
        s if s < 0 => format!("({expr}) * (unsigned)({s})"),
        s => format!("({expr}) * {s}u"),
    }
}

/// A tile to copy into shared memory: `height x width` halves (padded extents) whose element `(r, c)` is the
/// source's `src[base + (row0 + r) * stride + (col0 + c) * col_stride]`, zero where `row0 + r >= rows` or
/// `col0 + c >= cols`. `aligned`: `base` is a multiple of 8 halves whatever the batch matrix, in a buffer
/// aligned to 16 bytes (not an inline constant array).
struct Tile<'s> {
    dst: &'s str,
    ld: usize,
    src: &'s str,
    base: &'s str,
    row0: &'s str,
    col0: &'s str,
    rows: usize,
    cols: usize,
    stride: i64,
    col_stride: i64,
    aligned: bool,
    height: usize,
    width: usize,
}

/// Code copying `t` by all `threads` threads: 16-byte groups by cp.async (zero-filled where out of range,
/// so no branch) when every group is either whole or out of range and aligned (columns contiguous, `cols`,
/// the row stride and the base multiples of 8 halves, the tile's first column a multiple of 8, the source
/// not an inline constant array), else one half at a time.
fn stage_tile(t: &Tile, threads: u32, zero: &str) -> String {
    let Tile { dst, ld, src, base, row0, col0, rows, cols, stride, col_stride, aligned, height, width } = *t;
    let row = times(&format!("{row0} + r"), stride);
    if aligned && col_stride == 1 && cols % 8 == 0 && stride % 8 == 0 {
        let groups = width / 8;
        format!(
            "for (unsigned e = threadIdx.x; e < {n}u; e += {threads}u) {{\nconst unsigned r = e / {groups}u, c = (e % {groups}u) * 8u;\nconst bool ok = {row0} + r < {rows}u && {col0} + c < {cols}u;\ntsr_cp16({dst} + r * {ld}u + c, ok ? (const void*)({src} + {base} + {row} + {col0} + c) : (const void*){src}, ok ? 16u : 0u);\n}}\n",
            n = height * groups
        )
    } else {
        let col = times(&format!("{col0} + c"), col_stride);
        format!(
            "for (unsigned e = threadIdx.x; e < {n}u; e += {threads}u) {{\nconst unsigned r = e / {width}u, c = e % {width}u;\n{dst}[r * {ld}u + c] = ({row0} + r < {rows}u && {col0} + c < {cols}u) ? {src}[{base} + {row} + {col}] : {zero};\n}}\n",
            n = height * width
        )
    }
}

/// How the kernel addresses one operand or its output: the buffer, where the matrix of batch coordinates
/// `z` starts (an unsigned expression), its row and column strides, and whether every start is a multiple of
/// 8 elements (16 bytes) of a buffer aligned to 16 bytes.
struct Operand {
    buf: String,
    base: String,
    rows: i64,
    cols: i64,
    aligned: bool,
}

/// Operand or output `v` of the attention, through the view the plan reads or stores it by (its own buffer,
/// stored contiguously, if none), over the batch `batch` (a broadcast dim of the operand has stride 0).
fn operand(k: &mut Kernel, v: ValueId, batch: &[usize], write: bool) -> Operand {
    let g = k.g;
    let through = if write { &k.plan.store[v.index()] } else { &k.plan.view[v.index()] };
    let (src, view) = through.clone().unwrap_or_else(|| (v, StridedView::contiguous(&g.ty(v).shape)));
    let r = view.shape.len();
    let lead = &view.shape[..r - 2];
    let skip = batch.len() - lead.len();
    let bs: Vec<i64> = (0..batch.len()).map(|d| if d < skip || lead[d - skip] == 1 { 0 } else { view.strides[d - skip] }).collect();
    let base = match (view.offset, offset("z", &bs)) {
        (0, o) => o,
        (off, o) if off < 0 => format!("{o} + (unsigned)({off})"),
        (off, o) => format!("{o} + {off}u"),
    };
    let aligned = view.offset % 8 == 0 && bs.iter().all(|s| s % 8 == 0) && !is_const(k, src);
    Operand { buf: k.buf(src, write), base, rows: view.strides[r - 2], cols: view.strides[r - 1], aligned }
}

/// Code combining the key slices' partial results into slice 0's warps (the others write theirs to shared
/// memory, over the stages, and are done): per row the largest max `M`, and each slice's sum and accumulator
/// scaled by `exp(m - M)` (against 0 when `M` is -inf, so a row with no finite score stays `0 / 0`). Each
/// thread of slice 0 reads the same fragment positions of the others, so no layout changes hands. `l` is
/// still a per-thread partial here: the sum over the quad comes after, as without a split.
fn combine(t: MmaTiles, o_tiles: usize, floats: usize) -> String {
    let (w, others) = (t.warps, t.split - 1);
    format!(
        "__syncthreads();\nfloat* const part = reinterpret_cast<float*>(tsr_smem);\nif (ks > 0u) {{\nfloat* const mine = part + ((ks - 1u) * {w}u + rw) * {floats}u + lane;\n#pragma unroll\nfor (int n = 0; n < {o_tiles}; n++)\n#pragma unroll\nfor (int e = 0; e < 4; e++) mine[(n * 4 + e) * 32] = acc[n][e];\n#pragma unroll\nfor (int h = 0; h < 2; h++) {{\nmine[({acc_floats} + h) * 32] = m[h];\nmine[({acc_floats} + 2 + h) * 32] = l[h];\n}}\n}}\n__syncthreads();\nif (ks == 0u) {{\n#pragma unroll\nfor (int h = 0; h < 2; h++) {{\nfloat mx = m[h];\nfor (unsigned j = 0; j < {others}u; j++) mx = fmaxf(mx, part[(j * {w}u + rw) * {floats}u + lane + ({acc_floats} + h) * 32]);\nconst float base = mx == -__int_as_float(0x7f800000) ? 0.0f : mx;\nconst float own = expf(m[h] - base);\nl[h] *= own;\n#pragma unroll\nfor (int n = 0; n < {o_tiles}; n++) {{\nacc[n][2 * h] *= own;\nacc[n][2 * h + 1] *= own;\n}}\nfor (unsigned j = 0; j < {others}u; j++) {{\nconst float* const theirs = part + (j * {w}u + rw) * {floats}u + lane;\nconst float f = expf(theirs[({acc_floats} + h) * 32] - base);\nl[h] += theirs[({acc_floats} + 2 + h) * 32] * f;\n#pragma unroll\nfor (int n = 0; n < {o_tiles}; n++) {{\nacc[n][2 * h] += theirs[(n * 4 + 2 * h) * 32] * f;\nacc[n][2 * h + 1] += theirs[(n * 4 + 2 * h + 1) * 32] * f;\n}}\n}}\n}}\n}}\n",
        acc_floats = o_tiles * 4
    )
}

/// The attention node `node` as one tensor-core kernel in `k` with tile `tiles`; the caller has checked
/// [`applies`], a non-empty output and `Sk > 0`.
pub fn attention(k: &mut Kernel, node: NodeId, a: &AttentionAttrs, tiles: MmaTiles) -> Result<(), String> {
    tiles.check()?;
    let g = k.g;
    let nd = g.node(node);
    let types: Vec<_> = nd.inputs.iter().map(|&v| g.ty(v)).collect();
    let dims = attention_dims(a, &types).map_err(|e| e.0)?;
    let (sq, sk, d, dv) = (dims.sq, dims.sk, dims.d, dims.dv);
    if !applies([types[0].dtype, types[1].dtype, types[2].dtype], d, dv) {
        return Err(format!("the tensor-core attention kernel takes fp16 or bf16 operands with head dims up to {MAX_HEAD_DIM} (got {d}, {dv})"));
    }
    // The operands' element type: what shared memory holds, what the mma instructions multiply.
    let dt = types[0].dtype;
    let (t, zero) = (mem_type(dt), zero(dt));
    let batch: usize = dims.batch.iter().product();
    let nb = dims.batch.len();
    let ops: Vec<Operand> = (0..3).map(|i| operand(k, nd.inputs[i], &dims.batch, false)).collect();
    let out = operand(k, nd.outputs[0], &dims.batch, true);
    let (q, kp, v) = (&ops[0], &ops[1], &ops[2]);
    // K's strides along keys and along head dims, whichever way the operand holds it; its tiles are staged
    // transposed (rows of head dims) when keys, not head dims, are contiguous.
    let (key_stride, dim_stride) = if a.k_transposed { (kp.cols, kp.rows) } else { (kp.rows, kp.cols) };
    let k_staged_transposed = dim_stride != 1 && key_stride == 1;
    let lay = Layout::new(tiles, d, dv, k_staged_transposed);
    let q_tiles = sq.div_ceil(tiles.rows() as usize);
    let blocks = batch * q_tiles;
    if blocks >= 1 << 31 {
        return Err(format!("{blocks} attention blocks (at most 2^31 - 1)"));
    }
    let (bk, threads, round) = (tiles.bk as usize, tiles.threads(), tiles.round_keys() as usize);
    let Layout { dp, dvp, ldk, ldv, .. } = lay;
    let (dk_steps, s_tiles, o_tiles) = (dp / 16, bk / 8, dvp / 8);
    let scores_shape = dims.scores_shape();
    let mut b = format!("extern __shared__ float4 tsr_smem[];\n{t}* const smem = reinterpret_cast<{t}*>(tsr_smem);\n");
    // Warp `warp` owns rows `rw` of the block's and walks key slice `ks`: keys `ks * bk..` of every round.
    b.push_str(&format!(
        "const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u, gr = lane >> 2, tq = lane & 3u;\nconst unsigned rw = warp % {w}u, ks = warp / {w}u;\nconst unsigned bi = blockIdx.x / {q_tiles}u, q0 = (blockIdx.x % {q_tiles}u) * {}u + rw * {WARP_ROWS}u;\n",
        tiles.rows(),
        w = tiles.warps
    ));
    b.push_str(&coords(&dims.batch, "bi", "z", &vec![true; nb]));
    for (o, name) in ops.iter().chain([&out]).zip(["qb", "kb", "vb", "yb"]) {
        b.push_str(&format!("const unsigned {name} = {};\n", o.base));
    }
    // The masks: pointer, offset of the batch matrix, and (row, key) strides of their broadcast.
    let mut mask = |i: Option<usize>, name: &str, b: &mut String| {
        i.map(|i| {
            let st = broadcast(&g.ty(nd.inputs[i]).shape, &scores_shape);
            b.push_str(&format!("const unsigned {name} = {};\n", offset("z", &st[..nb])));
            (k.buf(nd.inputs[i], false), g.ty(nd.inputs[i]).dtype, name.to_string(), st[nb], st[nb + 1])
        })
    };
    let add = mask(a.mask_index(), "mb", &mut b);
    let keep = mask(a.keep_index(), "kpb", &mut b);

    // Q's A fragments: register i of step s holds row gr + (i & 1) * 8, columns s * 16 + tq * 2 + (i >> 1) * 8
    // and the next.
    let (qbuf, q_at, q_next) = (&q.buf, format!("qb + {} + {}", times("r", q.rows), times("c", q.cols)), times("c + 1u", q.cols));
    b.push_str(&format!(
        "unsigned qa[{dk_steps}][4];\n#pragma unroll\nfor (int s = 0; s < {dk_steps}; s++)\n#pragma unroll\nfor (int i = 0; i < 4; i++) {{\nconst unsigned r = q0 + gr + (i & 1) * 8u, c = s * 16u + tq * 2u + (i >> 1) * 8u;\nconst {t} lo = (r < {sq}u && c < {d}u) ? {qbuf}[{q_at}] : {zero};\nconst {t} hi = (r < {sq}u && c + 1u < {d}u) ? {qbuf}[qb + {} + {q_next}] : {zero};\nqa[s][i] = tsr_pack2(lo, hi);\n}}\n",
        times("r", q.rows)
    ));
    b.push_str(&format!(
        "float acc[{o_tiles}][4];\n#pragma unroll\nfor (int n = 0; n < {o_tiles}; n++)\n#pragma unroll\nfor (int e = 0; e < 4; e++) acc[n][e] = 0.0f;\nfloat m[2] = {{-__int_as_float(0x7f800000), -__int_as_float(0x7f800000)}}, l[2] = {{0.0f, 0.0f}};\n"
    ));
    // The key rounds, two stages: round `it + 1` is copied in while the warps compute on round `it`; a round
    // holds one tile of `bk` keys per key slice.
    let n_tiles = sk.div_ceil(round);
    let tiles_of = |k0: &str, stage: &str| -> String {
        let ks = format!("(smem + {stage} * {}u)", lay.stage);
        let vs = format!("(smem + {stage} * {}u + {}u)", lay.stage, lay.v_at);
        let kt = if k_staged_transposed {
            Tile { dst: &ks, ld: ldk, src: &kp.buf, base: "kb", row0: "0u", col0: k0, rows: d, cols: sk, stride: dim_stride, col_stride: 1, aligned: kp.aligned, height: dp, width: round }
        } else {
            Tile { dst: &ks, ld: ldk, src: &kp.buf, base: "kb", row0: k0, col0: "0u", rows: sk, cols: d, stride: key_stride, col_stride: dim_stride, aligned: kp.aligned, height: round, width: dp }
        };
        let vt = Tile { dst: &vs, ld: ldv, src: &v.buf, base: "vb", row0: k0, col0: "0u", rows: sk, cols: dv, stride: v.rows, col_stride: v.cols, aligned: v.aligned, height: round, width: dvp };
        format!("{}{}tsr_cp_commit();\n", stage_tile(&kt, threads, &zero), stage_tile(&vt, threads, &zero))
    };
    b.push_str(&tiles_of("0u", "0u"));
    b.push_str(&format!(
        "for (unsigned it = 0; it < {n_tiles}u; it++) {{\nconst unsigned r0 = it * {round}u;\nif (it + 1u < {n_tiles}u) {{\nconst unsigned k1 = r0 + {round}u;\n{}tsr_cp_wait<1>();\n}} else tsr_cp_wait<0>();\n__syncthreads();\nconst unsigned k0 = r0 + ks * {bk}u;\nconst {t}* const Ks = smem + (it & 1u) * {}u + ks * {}u;\nconst {t}* const Vs = smem + (it & 1u) * {}u + {}u + ks * {}u;\n",
        tiles_of("k1", "((it + 1u) & 1u)"),
        lay.stage,
        if k_staged_transposed { bk } else { bk * ldk },
        lay.stage,
        lay.v_at,
        bk * ldv
    ));
    // 1. Scores: tile n of 8 keys, step t of 16 head dims. K stored [Sk, D]: the B fragment is the pair
    // Ks[n * 8 + gr][t * 16 + tq * 2 (+ 8)]; stored [D, Sk]: rows of dims, loaded transposed by ldmatrix for
    // key tiles n and n + 1 at once.
    b.push_str(&format!("float s[{s_tiles}][4];\n#pragma unroll\nfor (int n = 0; n < {s_tiles}; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;\n"));
    if k_staged_transposed {
        b.push_str(&format!(
            "#pragma unroll\nfor (int t = 0; t < {dk_steps}; t++)\n#pragma unroll\nfor (int n = 0; n < {s_tiles}; n += 2) {{\nunsigned kb4[4];\ntsr_ldmatrix_x4_trans(kb4, Ks + (t * 16u + ((lane >> 3) & 1u) * 8u + (lane & 7u)) * {ldk}u + n * 8u + (lane >> 4) * 8u);\ntsr_mma16816<{t}>(s[n], qa[t], kb4[0], kb4[1]);\ntsr_mma16816<{t}>(s[n + 1], qa[t], kb4[2], kb4[3]);\n}}\n"
        ));
    } else {
        b.push_str(&format!(
            "#pragma unroll\nfor (int n = 0; n < {s_tiles}; n++) {{\nconst {t}* const kr = Ks + (n * 8u + gr) * {ldk}u + tq * 2u;\n#pragma unroll\nfor (int t = 0; t < {dk_steps}; t++) tsr_mma16816<{t}>(s[n], qa[t], *reinterpret_cast<const unsigned*>(kr + t * 16), *reinterpret_cast<const unsigned*>(kr + t * 16 + 8));\n}}\n"
        ));
    }
    // 2. Scale and masks per element: e = 0, 1 on row gr, e = 2, 3 on row gr + 8; key n * 8 + tq * 2 + (e & 1).
    b.push_str(&format!(
        "#pragma unroll\nfor (int n = 0; n < {s_tiles}; n++)\n#pragma unroll\nfor (int e = 0; e < 4; e++) {{\nconst unsigned r = q0 + gr + (e >> 1) * 8u, j = k0 + n * 8u + tq * 2u + (e & 1);\nfloat x = s[n][e] * {};\nif (j >= {sk}u) x = -__int_as_float(0x7f800000);\nelse if (r < {sq}u) {{\n",
        f32_lit(a.scale)
    ));
    let at = |row: i64, key: i64| {
        let mut t = Vec::new();
        if row != 0 {
            t.push(format!("r * {row}u"));
        }
        if key != 0 {
            t.push(format!("j * {key}u"));
        }
        if t.is_empty() {
            "0u".to_string()
        } else {
            t.join(" + ")
        }
    };
    if let (Some(fill), Some((buf, _, base, rs, ks))) = (a.keep_fill, &keep) {
        b.push_str(&format!("if (!{buf}[{base} + {}]) x = {};\n", at(*rs, *ks), f32_lit(fill)));
    }
    if let Some((buf, dt, base, rs, ks)) = &add {
        b.push_str(&format!("x += {};\n", super::kernel::ld(*dt, buf, &format!("{base} + {}", at(*rs, *ks)))));
    }
    b.push_str("}\ns[n][e] = x;\n}\n");
    // 3. Online softmax per row half h (rows gr and gr + 8): the quad's max, the rescale, P in place of S.
    b.push_str(&format!(
        "float alpha[2];\n#pragma unroll\nfor (int h = 0; h < 2; h++) {{\nfloat mx = -__int_as_float(0x7f800000);\n#pragma unroll\nfor (int n = 0; n < {s_tiles}; n++) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));\nmx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));\nmx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));\nconst float mn = fmaxf(m[h], mx);\n// A row with only -inf so far: exponentials against 0, so they are 0 rather than NaN.\nconst float base = mn == -__int_as_float(0x7f800000) ? 0.0f : mn;\nalpha[h] = expf(m[h] - base);\nfloat sum = 0.0f;\n#pragma unroll\nfor (int n = 0; n < {s_tiles}; n++)\n#pragma unroll\nfor (int e = 2 * h; e < 2 * h + 2; e++) {{\ns[n][e] = expf(s[n][e] - base);\nsum += s[n][e];\n}}\nl[h] = l[h] * alpha[h] + sum;\nm[h] = mn;\n}}\n#pragma unroll\nfor (int n = 0; n < {o_tiles}; n++) {{\nacc[n][0] *= alpha[0];\nacc[n][1] *= alpha[0];\nacc[n][2] *= alpha[1];\nacc[n][3] *= alpha[1];\n}}\n"
    ));
    // 4. P V: step t covers keys t * 16.. (score tiles 2t and 2t + 1 as one A fragment); V's B fragments for
    // output tiles n and n + 1 by one ldmatrix.x4.trans (lanes 8i..8i+7 address rows of matrix i: keys
    // t * 16 + (i & 1) * 8 + row, columns n * 8 + (i >> 1) * 8).
    b.push_str(&format!(
        "#pragma unroll\nfor (int t = 0; t < {}; t++) {{\nunsigned pa[4] = {{tsr_pack_float2<{t}>(s[2 * t][0], s[2 * t][1]), tsr_pack_float2<{t}>(s[2 * t][2], s[2 * t][3]), tsr_pack_float2<{t}>(s[2 * t + 1][0], s[2 * t + 1][1]), tsr_pack_float2<{t}>(s[2 * t + 1][2], s[2 * t + 1][3])}};\n#pragma unroll\nfor (int n = 0; n < {o_tiles}; n += 2) {{\nunsigned vb4[4];\ntsr_ldmatrix_x4_trans(vb4, Vs + (t * 16u + ((lane >> 3) & 1u) * 8u + (lane & 7u)) * {ldv}u + n * 8u + (lane >> 4) * 8u);\ntsr_mma16816<{t}>(acc[n], pa, vb4[0], vb4[1]);\ntsr_mma16816<{t}>(acc[n + 1], pa, vb4[2], vb4[3]);\n}}\n}}\n__syncthreads();\n}}\n",
        bk / 16
    ));
    if tiles.split > 1 {
        b.push_str(&combine(tiles, o_tiles, Layout::partial_floats(dvp)));
    }
    // The rows' outputs: the quad's sum of l, then acc / l (0 / 0 = NaN for a row of -inf scores).
    b.push_str(&format!(
        "#pragma unroll\nfor (int h = 0; h < 2; h++) {{\nl[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);\nl[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);\nconst unsigned r = q0 + gr + h * 8u;\nif (ks == 0u && r < {sq}u) {{\n#pragma unroll\nfor (int n = 0; n < {o_tiles}; n++)\n#pragma unroll\nfor (int e = 0; e < 2; e++) {{\nconst unsigned c = n * 8u + tq * 2u + e;\nif (c < {dv}u) {}[yb + {} + {}] = {};\n}}\n}}\n}}\n",
        out.buf,
        times("r", out.rows),
        times("c", out.cols),
        super::kernel::st(g.ty(nd.outputs[0]).dtype, "acc[n][2 * h + e] / l[h]")
    ));
    k.body.push_str(&b);
    k.grid = [blocks as u32, 1, 1];
    k.block = [threads, 1, 1];
    k.shared_bytes = lay.bytes(tiles) as u32;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_are_valid_and_chosen_by_problem_size() {
        let t = |warps, bk, split| MmaTiles { warps, bk, split };
        assert!(t(4, 64, 1).check().is_ok() && t(1, 32, 4).check().is_ok() && t(2, 64, 4).check().is_ok());
        assert!(t(0, 64, 1).check().is_err());
        assert!(t(4, 40, 1).check().is_err(), "bk not a multiple of 16");
        assert!(t(4, 64, 4).check().is_err(), "16 warps");
        assert!(t(1, 128, 4).check().is_err(), "512 keys a round");
        // BERT-base batch 8 (96 matrices of 128 rows) fills the GPU with two warps per block; batch 1 needs one,
        // its 128 keys split in four; a decode step (one query) splits its keys too.
        assert_eq!(MmaTiles::for_problem(96, 128, 128), t(2, 64, 1));
        assert_eq!(MmaTiles::for_problem(12, 128, 128), t(1, 32, 4));
        assert_eq!(MmaTiles::for_problem(12, 197, 197), t(1, 32, 4));
        assert_eq!(MmaTiles::for_problem(12, 1, 40), t(1, 32, 2));
        assert_eq!(MmaTiles::for_problem(12 * 64, 512, 512).warps, 4);
        assert_eq!(t(1, 32, 4).threads(), 128);
    }

    #[test]
    fn applies_to_fp16_and_bf16_with_small_head_dims_only() {
        for h in [[DType::F16; 3], [DType::BF16; 3]] {
            assert!(applies(h, 64, 64) && applies(h, 5, 3) && applies(h, 128, 128));
            assert!(!applies(h, 129, 64) && !applies(h, 64, 256) && !applies(h, 0, 64));
        }
        assert!(!applies([DType::F32, DType::F16, DType::F16], 64, 64));
        assert!(!applies([DType::BF16, DType::F16, DType::F16], 64, 64), "one type throughout");
    }

    #[test]
    fn shared_layout_is_aligned_and_sized() {
        for (d, dv) in [(64, 64), (5, 3), (80, 80), (128, 128)] {
            for transposed in [false, true] {
                let t = MmaTiles { warps: 1, bk: 32, split: 4 };
                let l = Layout::new(t, d, dv, transposed);
                assert!(l.dp >= d && l.dp % 16 == 0 && l.dvp >= dv && l.dvp % 16 == 0);
                // Rows 16-byte aligned (ldmatrix, cp.async), V and the second stage too.
                for at in [l.ldk, l.ldv, l.v_at, l.stage] {
                    assert_eq!(at % 8, 0, "{d} {dv} {transposed}: {l:?}");
                }
                assert!(l.bytes(t) <= 227 * 1024, "{d} {dv}: {} bytes", l.bytes(t));
                // The slices' partial results fit where the stages were.
                assert!(l.bytes(t) == 2 * l.stage * 2 || dv > 64, "{d} {dv}: {l:?}");
            }
        }
        // Two stages of K (64 keys x 64 dims, rows padded to 72) and V (the same).
        let t = MmaTiles { warps: 4, bk: 64, split: 1 };
        assert_eq!(Layout::new(t, 64, 64, false).bytes(t), 2 * 2 * (64 * 72 + 64 * 72));
        // K transposed: 64 dims x 64 keys, rows padded to 72.
        assert_eq!(Layout::new(t, 64, 64, true).bytes(t), 2 * 2 * (64 * 72 + 64 * 72));
        // Four slices of 32 keys: rounds of 128 keys; three slices' partials (32 lanes x 36 floats each).
        let t = MmaTiles { warps: 1, bk: 32, split: 4 };
        assert_eq!(Layout::new(t, 64, 64, false).bytes(t), 2 * 2 * (128 * 72 + 128 * 72));
        assert_eq!(Layout::partial_bytes(t, 64), 3 * 32 * 36 * 4);
    }
}
