//! Attention on the GPU as one FlashAttention-style kernel (fp32, SIMT): the `Sq x Sk` scores never touch
//! global memory. fp16 operands take the tensor-core kernel of [`super::attention_mma`] instead (when their head
//! dims fit it); this one runs fp32 and the rest.
//!
//! The kernel's main loop is `tsr_attention::simt` in `attention.cuh` (which describes it: Q staged in shared
//! memory once per block, the keys walked in tiles of [`AttnTiles::bk`], an online softmax per query row, the
//! reference's NaN semantics). This file chooses the tile and the shared-memory [`Layout`], and generates what
//! is specific to the partition: which batch matrix and query rows a block owns, and lambdas reading Q, K, V
//! and the masks through their (broadcast) strides and storing the output. `Sk = 0` stores zeros (the empty
//! sum) without the template.

use crate::backend::{refuse, Refusal};
use super::kernel::{coords, offset, Kernel};
use crate::backend::lowering::cexpr::f32_lit;
use crate::backend::lowering::nest::broadcast;
use crate::ir::{attention_dims, AttentionAttrs, DType, NodeId};
use tessera_kernels::runtime::cuda::format::MAX_SHARED_BYTES;

/// Tile shape of the attention kernel: the knobs the tune stage will search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnTiles {
    /// Query rows per block (a multiple of the warp count: each warp owns `bq / warps` rows).
    pub bq: u32,
    /// Keys per shared-memory tile (a multiple of 32: each lane scores `bk / 32` keys).
    pub bk: u32,
    /// Threads per block (whole warps).
    pub threads: u32,
}

impl Default for AttnTiles {
    fn default() -> AttnTiles {
        AttnTiles { bq: 64, bk: 64, threads: 256 }
    }
}

/// Half the rows per block, for problems whose default blocks would leave SMs idle.
pub const MID_TILES: AttnTiles = AttnTiles { bq: 32, bk: 64, threads: 128 };
/// The smallest tile (4 rows per warp): short query sequences and small batches.
pub const SMALL_TILES: AttnTiles = AttnTiles { bq: 16, bk: 64, threads: 128 };

/// The largest head dims (`D`, `Dv`) the kernel takes: its registers and shared memory grow with them.
pub const MAX_HEAD_DIM: usize = 256;

impl AttnTiles {
    pub fn warps(&self) -> u32 {
        self.threads / 32
    }

    /// Query rows of one warp.
    pub fn rows_per_warp(&self) -> u32 {
        self.bq / self.warps()
    }

    /// Keys of one lane in a tile.
    pub fn keys_per_lane(&self) -> u32 {
        self.bk / 32
    }

    /// Why the tile is not valid, if it is not. (`%` rather than `is_multiple_of`, which needs Rust 1.87; the
    /// README promises 1.85. The thread checks come first, so the warp count is not 0 when it divides.)
    #[allow(clippy::manual_is_multiple_of)]
    pub fn check(&self) -> Result<(), Refusal> {
        let ok = self.threads % 32 == 0
            && (32..=1024).contains(&self.threads)
            && self.bk % 32 == 0
            && self.bk > 0
            && self.bq > 0
            && self.bq % self.warps() == 0;
        if ok {
            Ok(())
        } else {
            Err(refuse!("attention tile {self:?}: threads must be whole warps (32..=1024), bk a multiple of 32, bq a multiple of the warps"))
        }
    }

    /// Blocks for `batch` matrices of `sq` query rows.
    pub fn blocks(&self, batch: usize, sq: usize) -> usize {
        batch * sq.div_ceil(self.bq as usize)
    }

    /// The default tile for `batch` matrices of `sq` query rows: the largest whose blocks fill the GPU
    /// ([`super::gemm::FILL_BLOCKS`]), else the smallest (batch-1 inference rarely fills it at all: BERT-base
    /// at 128 tokens is 12 heads x 2 tiles of 64 rows).
    pub fn for_problem(batch: usize, sq: usize) -> AttnTiles {
        [AttnTiles::default(), MID_TILES]
            .into_iter()
            .find(|t| t.blocks(batch, sq) >= super::gemm::FILL_BLOCKS && sq > t.bq as usize / 2)
            .unwrap_or(SMALL_TILES)
    }
}

/// Shared-memory layout of one block, in floats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Head dim rounded up to 4 (Q rows and K's dims are read as float4 groups; the pad is zero).
    pub dq: usize,
    /// Row stride of `Ks[d][j]` (`bk + 1`: a warp's writes along d hit 32 different banks).
    pub ks: usize,
    /// Row stride of `Vs[j][c]` and columns of the output a warp covers: `Dv` rounded up to 32.
    pub dvp: usize,
    /// Offsets of `Ks`, `Vs` and `Ps` (each a multiple of 4, for float4 reads of `Ps`).
    pub k_at: usize,
    pub v_at: usize,
    pub p_at: usize,
    pub floats: usize,
}

impl Layout {
    pub fn new(t: AttnTiles, d: usize, dv: usize) -> Layout {
        let (bq, bk) = (t.bq as usize, t.bk as usize);
        let dq = d.next_multiple_of(4);
        let ks = bk + 1;
        let dvp = dv.div_ceil(32).max(1) * 32;
        let k_at = bq * dq;
        let v_at = k_at + (dq * ks).next_multiple_of(4);
        let p_at = v_at + bk * dvp;
        Layout { dq, ks, dvp, k_at, v_at, p_at, floats: p_at + bq * bk }
    }

    pub fn bytes(&self) -> usize {
        self.floats * 4
    }
}

/// The expression reading element `index` of the tensor at `ptr` (of dtype `d`) as a float: the one place
/// that knows the storage type (fp16 storage changes only this).
fn load(d: DType, ptr: &str, index: &str) -> String {
    super::kernel::ld(d, ptr, index)
}

/// Strides over the batch dims of an operand `[lead.., rows, cols]`, in elements.
fn matrix_strides(shape: &[usize], batch: &[usize]) -> Vec<i64> {
    let r = shape.len();
    let size = (shape[r - 2] * shape[r - 1]) as i64;
    broadcast(&shape[..r - 2], batch).iter().map(|s| s * size).collect()
}

/// `r * row + j * key` over the non-zero strides, as unsigned arithmetic.
fn at2(row: i64, key: i64) -> String {
    let mut t = Vec::new();
    if row != 0 {
        t.push(format!("r * {row}u"));
    }
    if key != 0 {
        t.push(format!("j * {key}u"));
    }
    if t.is_empty() {
        "0u".into()
    } else {
        t.join(" + ")
    }
}

/// The attention node `node` as one kernel in `k` with the default tile for its shape; `Ok(false)` when the
/// output is empty and no kernel is needed.
pub fn attention(k: &mut Kernel, node: NodeId, a: &AttentionAttrs) -> Result<bool, Refusal> {
    let g = k.g;
    let nd = g.node(node);
    let types: Vec<_> = nd.inputs.iter().map(|&v| g.ty(v)).collect();
    let dims = attention_dims(a, &types).map_err(|e| e.0)?;
    let batch: usize = dims.batch.iter().product();
    if on_tensor_cores(g, node, a) {
        let tiles = match k.knobs.attention {
            super::gemm::AttentionChoice::Auto => super::attention_mma::MmaTiles::for_problem(batch, dims.sq, dims.sk),
            super::gemm::AttentionChoice::Warps(warps) => super::attention_mma::MmaTiles { warps, bk: 64, split: 1 },
            super::gemm::AttentionChoice::SplitKeys => super::attention_mma::MmaTiles::split_keys(dims.sk),
        };
        super::attention_mma::attention(k, node, a, tiles)?;
        return Ok(true);
    }
    let tiles = AttnTiles::for_problem(batch, dims.sq);
    attention_with(k, node, a, tiles)
}

/// Whether attention node `node` runs on the tensor-core kernel: fp16 or bf16 operands whose head dims it
/// holds (an empty output or key axis keeps the trivial kernels of [`attention_with`]).
pub fn on_tensor_cores(g: &crate::ir::Graph, node: NodeId, a: &AttentionAttrs) -> bool {
    let nd = g.node(node);
    let types: Vec<_> = nd.inputs.iter().map(|&v| g.ty(v)).collect();
    let Ok(dims) = attention_dims(a, &types) else { return false };
    let batch: usize = dims.batch.iter().product();
    super::attention_mma::applies([types[0].dtype, types[1].dtype, types[2].dtype], dims.d, dims.dv) && dims.sk > 0 && batch * dims.sq * dims.dv > 0
}

/// The attention kernel with an explicit tile.
pub fn attention_with(k: &mut Kernel, node: NodeId, a: &AttentionAttrs, tiles: AttnTiles) -> Result<bool, Refusal> {
    tiles.check()?;
    let g = k.g;
    let nd = g.node(node);
    if let Some(&v) = nd.inputs.iter().chain(&nd.outputs).find(|&&v| !matches!(g.ty(v).dtype, DType::F32 | DType::F16 | DType::BF16 | DType::Bool)) {
        return Err(refuse!("Attention on {} is not supported by the cuda backend", g.ty(v).dtype));
    }
    let types: Vec<_> = nd.inputs.iter().map(|&v| g.ty(v)).collect();
    let dims = attention_dims(a, &types).map_err(|e| e.0)?;
    let (sq, sk, d, dv) = (dims.sq, dims.sk, dims.d, dims.dv);
    let batch: usize = dims.batch.iter().product();
    let out_numel = batch * sq * dv;
    if out_numel == 0 {
        return Ok(false);
    }
    let y = k.buf(nd.outputs[0], true);
    if sk == 0 {
        // No keys: every output is an empty sum.
        k.body.push_str(&format!("{y}[i] = {};\n", super::kernel::st(g.ty(nd.outputs[0]).dtype, "0.0f")));
        k.per_element(out_numel);
        return Ok(true);
    }
    if d > MAX_HEAD_DIM || dv > MAX_HEAD_DIM {
        return Err(refuse!("head dims {d} and {dv}: the attention kernel takes at most {MAX_HEAD_DIM}"));
    }
    let lay = Layout::new(tiles, d, dv);
    if lay.bytes() > MAX_SHARED_BYTES as usize {
        return Err(refuse!("attention tile {tiles:?} with head dims {d}, {dv} needs {} bytes of shared memory (at most {MAX_SHARED_BYTES})", lay.bytes()));
    }
    let q_tiles = sq.div_ceil(tiles.bq as usize);
    let blocks = batch * q_tiles;
    if blocks >= 1 << 31 {
        return Err(refuse!("{blocks} attention blocks (at most 2^31 - 1)"));
    }
    let (bq, bk, threads) = (tiles.bq, tiles.bk, tiles.threads);
    let Layout { dq, ks, dvp, .. } = lay;
    let nb = dims.batch.len();
    let scores_shape = dims.scores_shape();
    let dt = g.ty(nd.inputs[0]).dtype;

    let ops: Vec<String> = (0..3).map(|i| k.buf(nd.inputs[i], false)).collect();
    let (q, kp, v) = (&ops[0], &ops[1], &ops[2]);
    // Block `blockIdx.x` owns batch matrix `bi` and query rows `q0..`.
    let mut b = format!("const unsigned bi = blockIdx.x / {q_tiles}u, q0 = (blockIdx.x % {q_tiles}u) * {bq}u;\n");
    b.push_str(&coords(&dims.batch, "bi", "z", &vec![true; nb]));
    for (i, name) in ["qb", "kb", "vb"].into_iter().enumerate() {
        b.push_str(&format!("const unsigned {name} = {};\n", offset("z", &matrix_strides(&g.ty(nd.inputs[i]).shape, &dims.batch))));
    }
    // The masks: pointer, offset of the batch matrix, and (row, key) strides of their broadcast.
    let mut mask_expr = |i: Option<usize>, name: &str, b: &mut String| {
        i.map(|i| {
            let st = broadcast(&g.ty(nd.inputs[i]).shape, &scores_shape);
            b.push_str(&format!("const unsigned {name} = {};\n", offset("z", &st[..nb])));
            (k.buf(nd.inputs[i], false), name.to_string(), at2(st[nb], st[nb + 1]))
        })
    };
    let add = mask_expr(a.mask_index(), "mb", &mut b);
    let keep = mask_expr(a.keep_index(), "kpb", &mut b);
    // The template's lambdas: Q row q0 + r, K and V key k0 + j (t, c: head dims); the masks of a score; the store.
    let kidx = if a.k_transposed { format!("kb + t * {sk}u + k0 + j") } else { format!("kb + (k0 + j) * {d}u + t") };
    b.push_str(&format!("auto q_at = [&](unsigned q0, unsigned r, unsigned t) {{ return {}; }};\n", load(dt, q, &format!("qb + (q0 + r) * {d}u + t"))));
    b.push_str(&format!("auto k_at = [&](unsigned k0, unsigned j, unsigned t) {{ return {}; }};\n", load(dt, kp, &kidx)));
    b.push_str(&format!("auto v_at = [&](unsigned k0, unsigned j, unsigned c) {{ return {}; }};\n", load(dt, v, &format!("vb + (k0 + j) * {dv}u + c"))));
    let mut mask = String::new();
    if let (Some(fill), Some((buf, base, idx))) = (a.keep_fill, &keep) {
        mask.push_str(&format!(" if (!{buf}[{base} + {idx}]) x = {};", f32_lit(fill)));
    }
    if let Some((buf, base, idx)) = &add {
        mask.push_str(&format!(" x += {};", load(dt, buf, &format!("{base} + {idx}"))));
    }
    b.push_str(&format!("auto mask = [&](unsigned r, unsigned j, float& x) {{{mask} }};\n"));
    b.push_str(&format!(
        "auto store = [&](unsigned r, unsigned c, float val) {{ {y}[bi * {}u + r * {dv}u + c] = {}; }};\n",
        sq * dv,
        super::kernel::st(g.ty(nd.outputs[0]).dtype, "val")
    ));
    b.push_str(&format!(
        "tsr_attention::simt<{bq}, {bk}, {threads}, {sq}, {sk}, {d}, {dv}, {dq}, {ks}, {dvp}, {}, {}, {}, {}, {}>\
         (q0, {}, q_at, k_at, v_at, mask, store);\n",
        lay.k_at,
        lay.v_at,
        lay.p_at,
        a.k_transposed,
        a.nan_to_zero,
        f32_lit(a.scale)
    ));
    k.body.push_str(&b);
    k.grid = [blocks as u32, 1, 1];
    k.block = [threads, 1, 1];
    k.shared_bytes = lay.bytes() as u32;
    Ok(true)
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
