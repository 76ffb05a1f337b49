//! Attention on tensor cores for fp16 and bf16 operands: FlashAttention-2's structure with `mma.sync`
//! m16n8k16 (fp16 or bf16 inputs, fp32 accumulation; the fragment layouts are the same for both), so the `Sq x Sk` scores never touch global memory and both products
//! run on the tensor cores. The fp32 path and head dims above [`MAX_HEAD_DIM`] keep the SIMT kernel of
//! [`super::attention`], whose semantics this one follows exactly (masks, NaN rows, empty key axes).
//!
//! The kernel's main loop is `tsr_attention::mma` in `attention.cuh`, which describes it (query rows per warp,
//! key slices and their combine, the two-stage cp.async pipeline, the fragment layouts, P kept in registers,
//! the NaN semantics). This file chooses the tile ([`MmaTiles`]) and the shared-memory [`Layout`], decides which
//! tiles can be copied 16 bytes at a time, and generates what is specific to the partition: which batch matrix
//! and query rows a block owns, lambdas addressing Q, K and V through the views the plan reads them by, the
//! masks, and the store of the output through its view.

use crate::backend::{refuse, Refusal};
use super::kernel::{coords, is_half, mem_type, offset, Kernel};
use crate::backend::lowering::cexpr::f32_lit;
use crate::backend::lowering::nest::broadcast;
use crate::backend::lowering::plan::Storage;
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
    pub fn check(&self) -> Result<(), Refusal> {
        let split_ok = (1..=8).contains(&self.split) && self.warps * self.split <= 8 && self.round_keys() <= 256;
        if (1..=8).contains(&self.warps) && self.bk > 0 && self.bk % 16 == 0 && self.bk <= 128 && split_ok {
            Ok(())
        } else {
            Err(refuse!("tensor-core attention tile {self:?}: 1 to 8 warps in all, bk a multiple of 16 up to 128, at most 256 keys a round"))
        }
    }

    /// The default for `batch` matrices of `sq` query rows and `sk` keys: the most warps per block (they share
    /// each K/V tile) whose blocks still fill the GPU ([`super::gemm::FILL_BLOCKS`]); else one warp of rows
    /// with the keys split in up to four slices, 32 keys a tile (batch-1 inference: BERT-base at 128 tokens is
    /// 12 heads x 8 warps of rows, each row computed by four warps over 32 keys each). Rounds of 128 keys keep a
    /// block's two stages at 72 KiB for 64-dim heads, so three blocks fit an SM.
    pub fn for_problem(batch: usize, sq: usize, sk: usize) -> MmaTiles {
        [4, 2]
            .into_iter()
            .map(|warps| MmaTiles { warps, bk: 64, split: 1 })
            .find(|t| t.blocks(batch, sq) >= super::gemm::FILL_BLOCKS)
            .unwrap_or_else(|| MmaTiles::split_keys(sk))
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

/// The lambda `name(row0, r, col0, c)` giving element `(row0 + r, col0 + c)` of a tile of `buf` whose batch
/// matrix starts at `base`, rows `stride` and columns `col_stride` apart: its address when the tile is copied
/// 16 bytes at a time (`copy16`: columns contiguous), else the element.
fn tile_at(name: &str, buf: &str, base: &str, stride: i64, col_stride: i64, copy16: bool) -> String {
    let row = times("row0 + r", stride);
    let at = if copy16 {
        format!("{buf} + {base} + {row} + col0 + c")
    } else {
        format!("{buf}[{base} + {row} + {}]", times("col0 + c", col_stride))
    };
    format!("auto {name} = [&](unsigned row0, unsigned r, unsigned col0, unsigned c) {{ return {at}; }};\n")
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

/// The attention node `node` as one tensor-core kernel in `k` with tile `tiles`; the caller has checked
/// [`applies`], a non-empty output and `Sk > 0`.
pub fn attention(k: &mut Kernel, node: NodeId, a: &AttentionAttrs, tiles: MmaTiles) -> Result<(), Refusal> {
    tiles.check()?;
    let g = k.g;
    let nd = g.node(node);
    let types: Vec<_> = nd.inputs.iter().map(|&v| g.ty(v)).collect();
    let dims = attention_dims(a, &types).map_err(|e| e.0)?;
    let (sq, sk, d, dv) = (dims.sq, dims.sk, dims.d, dims.dv);
    if !applies([types[0].dtype, types[1].dtype, types[2].dtype], d, dv) {
        return Err(refuse!("the tensor-core attention kernel takes fp16 or bf16 operands with head dims up to {MAX_HEAD_DIM} (got {d}, {dv})"));
    }
    // The operands' element type: what shared memory holds, what the mma instructions multiply.
    let dt = types[0].dtype;
    let t = mem_type(dt);
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
        return Err(refuse!("{blocks} attention blocks (at most 2^31 - 1)"));
    }
    let Layout { dvp, ldk, ldv, v_at, stage, .. } = lay;
    // Tiles go by cp.async, 16 bytes at a time, when every group is either whole or out of range and aligned:
    // columns contiguous, the columns and the row stride multiples of 8 halves, every batch matrix's start too
    // in a buffer aligned to 16 bytes (`Operand::aligned`; a tile's first column is a multiple of 16).
    let k_async = if k_staged_transposed {
        kp.aligned && sk % 8 == 0 && dim_stride % 8 == 0
    } else {
        kp.aligned && dim_stride == 1 && d % 8 == 0 && key_stride % 8 == 0
    };
    let v_async = v.aligned && v.cols == 1 && dv % 8 == 0 && v.rows % 8 == 0;
    let scores_shape = dims.scores_shape();
    // Block `blockIdx.x` owns batch matrix `bi` and query rows `q0..` (each warp 16 of them).
    let rows = tiles.rows();
    let mut b = format!("const unsigned bi = blockIdx.x / {q_tiles}u, q0 = (blockIdx.x % {q_tiles}u) * {rows}u;\n");
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
    // The template's lambdas: the offset of Q's element (r, c + dc); K's and V's tile elements for
    // `stage_tile` (K's in its staged layout), addresses where the tile is copied 16 bytes at a time; the masks
    // of a score; the store.
    b.push_str(&format!("auto q_at = [&](unsigned r, unsigned c, unsigned dc) {{ return qb + {} + {}; }};\n", times("r", q.rows), times("c + dc", q.cols)));
    let (k_rows, k_cols) = if k_staged_transposed { (dim_stride, 1) } else { (key_stride, dim_stride) };
    b.push_str(&tile_at("k_at", &kp.buf, "kb", k_rows, k_cols, k_async));
    b.push_str(&tile_at("v_at", &v.buf, "vb", v.rows, v.cols, v_async));
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
    let mut masks = String::new();
    if let (Some(fill), Some((buf, _, base, rs, ks))) = (a.keep_fill, &keep) {
        masks.push_str(&format!(" if (!{buf}[{base} + {}]) x = {};", at(*rs, *ks), f32_lit(fill)));
    }
    if let Some((buf, dt, base, rs, ks)) = &add {
        masks.push_str(&format!(" x += {};", super::kernel::ld(*dt, buf, &format!("{base} + {}", at(*rs, *ks)))));
    }
    b.push_str(&format!("auto mask = [&](unsigned r, unsigned j, float& x) {{{masks} }};\n"));
    b.push_str(&format!(
        "auto store = [&](unsigned r, unsigned c, float val) {{ {}[yb + {} + {}] = {}; }};\n",
        out.buf,
        times("r", out.rows),
        times("c", out.cols),
        super::kernel::st(g.ty(nd.outputs[0]).dtype, "val")
    ));
    let MmaTiles { warps, bk, split } = tiles;
    let partial = Layout::partial_floats(dvp);
    b.push_str(&format!(
        "tsr_attention::mma<{t}, {warps}, {split}, {bk}, {sq}, {sk}, {d}, {dv}, {ldk}, {ldv}, {v_at}, {stage}, {partial}, \
         {k_staged_transposed}, {k_async}, {v_async}, {}>(q0, {}, {}, q_at, {}, k_at, {}, v_at, mask, store);\n",
        a.nan_to_zero,
        f32_lit(a.scale),
        q.buf,
        kp.buf,
        v.buf
    ));
    k.body.push_str(&b);
    k.grid = [blocks as u32, 1, 1];
    k.block = [tiles.threads(), 1, 1];
    k.shared_bytes = lay.bytes(tiles) as u32;
    Ok(())
}

#[cfg(test)]
#[path = "attention_mma_tests.rs"]
mod tests;
