//! Attention on the GPU as one FlashAttention-style kernel (fp32, SIMT): the `Sq x Sk` scores never touch
//! global memory. fp16 operands take the tensor-core kernel of [`super::attention_mma`] instead (when their head
//! dims fit it); this one runs fp32 and the rest.
//!
//! A block owns one batch matrix (batch and head) and [`AttnTiles::bq`] query rows, which it stages in
//! shared memory once. It then walks the keys in tiles of [`AttnTiles::bk`]: the tile's K (stored
//! transposed, `Ks[d][j]`, so a warp reads 32 consecutive keys) and V (`Vs[j][c]`) are staged in shared
//! memory, and each warp, owning `bq / warps` query rows, computes
//! 1. the rows' scores against the tile, each lane `bk / 32` keys, reading Q four head dims at a time
//!    (float4 broadcasts) — then the scale, the keep mask and the additive mask, read through their
//!    broadcast strides;
//! 2. the online softmax: the tile's row maxima and exp-sums by warp shuffles, the running max `m` and sum
//!    `l` updated and the output accumulator rescaled by `exp(m_old - m_new)`;
//! 3. the probabilities (through the warp's rows of `Ps` in shared memory) times the tile's V, each lane
//!    accumulating `ceil(Dv / 32)` output columns of every row in registers.
//!
//! The output is `acc / l`. NaN semantics are the reference's: a row of -inf scores keeps `m = -inf`, its
//! exponentials are taken against 0 instead (so they are 0, not NaN from -inf - -inf), and the result is
//! `0 / 0 = NaN`; a NaN or +inf score makes `l` NaN. `Sk = 0` stores zeros (the empty sum).
//!
//! Keys past `Sk` in the last tile score -inf against zero V rows; query rows past `Sq` compute on zero Q
//! rows and are not stored, so any `Sq` and `Sk` work with any tile.

use super::kernel::{coords, offset, Kernel};
use crate::backend::c::cexpr::f32_lit;
use crate::backend::c::nest::broadcast;
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
    pub fn check(&self) -> Result<(), String> {
        let ok = self.threads % 32 == 0
            && (32..=1024).contains(&self.threads)
            && self.bk % 32 == 0
            && self.bk > 0
            && self.bq > 0
            && self.bq % self.warps() == 0;
        if ok {
            Ok(())
        } else {
            Err(format!("attention tile {self:?}: threads must be whole warps (32..=1024), bk a multiple of 32, bq a multiple of the warps"))
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

const COMPONENTS: [&str; 4] = ["x", "y", "z", "w"];

/// The attention node `node` as one kernel in `k` with the default tile for its shape; `Ok(false)` when the
/// output is empty and no kernel is needed.
pub fn attention(k: &mut Kernel, node: NodeId, a: &AttentionAttrs) -> Result<bool, String> {
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
pub fn attention_with(k: &mut Kernel, node: NodeId, a: &AttentionAttrs, tiles: AttnTiles) -> Result<bool, String> {
    tiles.check()?;
    let g = k.g;
    let nd = g.node(node);
    if let Some(&v) = nd.inputs.iter().chain(&nd.outputs).find(|&&v| !matches!(g.ty(v).dtype, DType::F32 | DType::F16 | DType::BF16 | DType::Bool)) {
        return Err(format!("Attention on {} is not supported by the cuda backend", g.ty(v).dtype));
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
        return Err(format!("head dims {d} and {dv}: the attention kernel takes at most {MAX_HEAD_DIM}"));
    }
    let lay = Layout::new(tiles, d, dv);
    if lay.bytes() > MAX_SHARED_BYTES as usize {
        return Err(format!("attention tile {tiles:?} with head dims {d}, {dv} needs {} bytes of shared memory (at most {MAX_SHARED_BYTES})", lay.bytes()));
    }
    let q_tiles = sq.div_ceil(tiles.bq as usize);
    let blocks = batch * q_tiles;
    if blocks >= 1 << 31 {
        return Err(format!("{blocks} attention blocks (at most 2^31 - 1)"));
    }
    let (bq, bk, threads) = (tiles.bq as usize, tiles.bk as usize, tiles.threads);
    let (rw, kl) = (tiles.rows_per_warp() as usize, tiles.keys_per_lane() as usize);
    let dvl = lay.dvp / 32;
    let Layout { dq, ks, dvp, .. } = lay;
    let nb = dims.batch.len();
    let scores_shape = dims.scores_shape();
    let dt = g.ty(nd.inputs[0]).dtype;

    let ops: Vec<String> = (0..3).map(|i| k.buf(nd.inputs[i], false)).collect();
    let (q, kp, v) = (&ops[0], &ops[1], &ops[2]);
    let mut b = format!(
        "extern __shared__ float4 tsr_smem[];\nfloat* const Qs = (float*)tsr_smem;\nfloat* const Ks = Qs + {};\nfloat* const Vs = Qs + {};\nfloat* const Ps = Qs + {};\n",
        lay.k_at, lay.v_at, lay.p_at
    );
    b.push_str(&format!("const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\nconst unsigned bi = blockIdx.x / {q_tiles}u, q0 = (blockIdx.x % {q_tiles}u) * {bq}u;\n"));
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

    // Q rows of the block (zero past Sq and in the head dim's pad), and the pad rows of Ks (zero for good).
    b.push_str(&format!(
        "for (unsigned e = threadIdx.x; e < {}u; e += {threads}u) {{\nconst unsigned r = e / {dq}u, t = e % {dq}u;\nQs[e] = (q0 + r < {sq}u && t < {d}u) ? {} : 0.0f;\n}}\n",
        bq * dq,
        load(dt, q, &format!("qb + (q0 + r) * {d}u + t"))
    ));
    if dq > d {
        b.push_str(&format!("for (unsigned e = threadIdx.x; e < {}u; e += {threads}u) Ks[{}u + e] = 0.0f;\n", (dq - d) * ks, d * ks));
    }
    b.push_str(&format!(
        "float m[{rw}], l[{rw}], acc[{rw}][{dvl}];\n#pragma unroll\nfor (int i = 0; i < {rw}; i++) {{\nm[i] = -__int_as_float(0x7f800000);\nl[i] = 0.0f;\n#pragma unroll\nfor (int c = 0; c < {dvl}; c++) acc[i][c] = 0.0f;\n}}\n"
    ));
    b.push_str(&format!("for (unsigned k0 = 0; k0 < {sk}u; k0 += {bk}u) {{\n__syncthreads();\n"));
    // Stage the key tile transposed and the value tile, zero past Sk (and past Dv in V's pad).
    let (kidx, ksplit) = if a.k_transposed {
        (format!("kb + t * {sk}u + k0 + j"), format!("const unsigned t = e / {bk}u, j = e % {bk}u;"))
    } else {
        (format!("kb + (k0 + j) * {d}u + t"), format!("const unsigned j = e / {d}u, t = e % {d}u;"))
    };
    b.push_str(&format!(
        "for (unsigned e = threadIdx.x; e < {}u; e += {threads}u) {{\n{ksplit}\nKs[t * {ks}u + j] = k0 + j < {sk}u ? {} : 0.0f;\n}}\n",
        bk * d,
        load(dt, kp, &kidx)
    ));
    b.push_str(&format!(
        "for (unsigned e = threadIdx.x; e < {}u; e += {threads}u) {{\nconst unsigned j = e / {dvp}u, c = e % {dvp}u;\nVs[e] = (k0 + j < {sk}u && c < {dv}u) ? {} : 0.0f;\n}}\n__syncthreads();\n",
        bk * dvp,
        load(dt, v, &format!("vb + (k0 + j) * {dv}u + c"))
    ));
    // 1. Scores of the warp's rows: four head dims per step, Q as float4 broadcasts.
    b.push_str(&format!("float s[{rw}][{kl}];\n#pragma unroll\nfor (int i = 0; i < {rw}; i++)\n#pragma unroll\nfor (int c = 0; c < {kl}; c++) s[i][c] = 0.0f;\n"));
    b.push_str(&format!(
        "const float* const qw = Qs + warp * {}u;\n#pragma unroll 2\nfor (unsigned t = 0; t < {dq}u; t += 4) {{\nfloat4 qv[{rw}];\n#pragma unroll\nfor (int i = 0; i < {rw}; i++) qv[i] = *reinterpret_cast<const float4*>(qw + i * {dq} + t);\n",
        rw * dq
    ));
    for c in 0..kl {
        for (u, comp) in COMPONENTS.iter().enumerate() {
            b.push_str(&format!(
                "{{\nconst float kv = Ks[(t + {u}u) * {ks}u + lane + {}u];\n#pragma unroll\nfor (int i = 0; i < {rw}; i++) s[i][{c}] = fmaf(qv[i].{comp}, kv, s[i][{c}]);\n}}\n",
                32 * c
            ));
        }
    }
    b.push_str("}\n");
    // 2. Scale and masks, then the online softmax per row.
    b.push_str(&format!("#pragma unroll\nfor (int i = 0; i < {rw}; i++) {{\nconst unsigned r = q0 + warp * {rw}u + i;\nfloat mx = -__int_as_float(0x7f800000);\n#pragma unroll\nfor (int c = 0; c < {kl}; c++) {{\nconst unsigned j = k0 + lane + 32u * c;\nfloat x = s[i][c] * {};\n", f32_lit(a.scale)));
    b.push_str(&format!("if (j >= {sk}u) x = -__int_as_float(0x7f800000);\nelse if (r < {sq}u) {{\n"));
    if let (Some(fill), Some((buf, base, idx))) = (a.keep_fill, &keep) {
        b.push_str(&format!("if (!{buf}[{base} + {idx}]) x = {};\n", f32_lit(fill)));
    }
    if let Some((buf, base, idx)) = &add {
        b.push_str(&format!("x += {};\n", load(dt, buf, &format!("{base} + {idx}"))));
    }
    b.push_str("}\ns[i][c] = x;\nmx = fmaxf(mx, x);\n}\n");
    b.push_str("#pragma unroll\nfor (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));\n");
    b.push_str("const float mn = fmaxf(m[i], mx);\n// A row with only -inf so far: exponentials against 0, so they are 0 rather than NaN.\nconst float base = mn == -__int_as_float(0x7f800000) ? 0.0f : mn;\nconst float alpha = expf(m[i] - base);\n");
    b.push_str(&format!("float sum = 0.0f;\n#pragma unroll\nfor (int c = 0; c < {kl}; c++) {{\nconst float p = expf(s[i][c] - base);\nPs[(warp * {rw}u + i) * {bk}u + lane + 32u * c] = p;\nsum += p;\n}}\n"));
    b.push_str("#pragma unroll\nfor (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);\n");
    b.push_str(&format!("l[i] = l[i] * alpha + sum;\nm[i] = mn;\n#pragma unroll\nfor (int c = 0; c < {dvl}; c++) acc[i][c] *= alpha;\n}}\n__syncwarp();\n"));
    // 3. Probabilities times V, four keys per step; the last tile stops after its valid keys.
    b.push_str(&format!(
        "const float* const pw = Ps + warp * {}u;\nconst unsigned kn = min({bk}u, {sk}u - k0);\n#pragma unroll 2\nfor (unsigned j = 0; j < kn; j += 4) {{\nfloat4 pv[{rw}];\n#pragma unroll\nfor (int i = 0; i < {rw}; i++) pv[i] = *reinterpret_cast<const float4*>(pw + i * {bk} + j);\n",
        rw * bk
    ));
    for (u, comp) in COMPONENTS.iter().enumerate() {
        b.push_str(&format!(
            "{{\nfloat vv[{dvl}];\n#pragma unroll\nfor (int c = 0; c < {dvl}; c++) vv[c] = Vs[(j + {u}u) * {dvp}u + lane + 32u * c];\n#pragma unroll\nfor (int i = 0; i < {rw}; i++)\n#pragma unroll\nfor (int c = 0; c < {dvl}; c++) acc[i][c] = fmaf(pv[i].{comp}, vv[c], acc[i][c]);\n}}\n"
        ));
    }
    b.push_str("}\n}\n");
    // The rows' outputs: acc / l (0 / 0 = NaN for a row of -inf scores, as the reference).
    b.push_str(&format!(
        "#pragma unroll\nfor (int i = 0; i < {rw}; i++) {{\nconst unsigned r = q0 + warp * {rw}u + i;\nif (r < {sq}u) {{\n#pragma unroll\nfor (int c = 0; c < {dvl}; c++) {{\nconst unsigned col = lane + 32u * c;\nif (col < {dv}u) {y}[bi * {}u + r * {dv}u + col] = {};\n}}\n}}\n}}\n",
        sq * dv,
        super::kernel::st(g.ty(nd.outputs[0]).dtype, "acc[i][c] / l[i]")
    ));
    k.body.push_str(&b);
    k.grid = [blocks as u32, 1, 1];
    k.block = [threads, 1, 1];
    k.shared_bytes = lay.bytes() as u32;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_are_valid_and_chosen_by_problem_size() {
        for t in [AttnTiles::default(), MID_TILES, SMALL_TILES] {
            t.check().unwrap();
        }
        assert!(AttnTiles { bq: 60, bk: 64, threads: 256 }.check().is_err(), "bq not a multiple of the warps");
        assert!(AttnTiles { bq: 64, bk: 48, threads: 256 }.check().is_err(), "bk not a multiple of 32");
        assert!(AttnTiles { bq: 64, bk: 64, threads: 100 }.check().is_err(), "threads not whole warps");
        // Large batches take the large tile; BERT-base batch 1 (12 heads x 128) takes the smallest.
        assert_eq!(AttnTiles::for_problem(8 * 12, 512), AttnTiles::default());
        assert_eq!(AttnTiles::for_problem(12, 128), SMALL_TILES);
        // A single query row never takes a tile of 64 rows, however many matrices.
        assert_eq!(AttnTiles::for_problem(100_000, 1), SMALL_TILES);
    }

    #[test]
    fn shared_layout_is_aligned_and_sized() {
        for (t, d, dv) in [(AttnTiles::default(), 64, 64), (SMALL_TILES, 80, 80), (MID_TILES, 5, 3), (AttnTiles::default(), 128, 128)] {
            let l = Layout::new(t, d, dv);
            assert_eq!(l.dq % 4, 0);
            assert!(l.dq >= d && l.dvp >= dv && l.dvp % 32 == 0);
            assert_eq!(l.k_at, t.bq as usize * l.dq);
            assert!(l.v_at >= l.k_at + l.dq * l.ks && l.p_at == l.v_at + t.bk as usize * l.dvp);
            for off in [l.k_at, l.v_at, l.p_at] {
                assert_eq!(off % 4, 0, "float4 alignment of {off}");
            }
            assert!(l.bytes() <= MAX_SHARED_BYTES as usize, "{t:?} {d} {dv}: {}", l.bytes());
        }
        // D = Dv = 64 at the default tile: Q 16 KiB, K 16.25 KiB, V 16 KiB, P 16 KiB.
        assert_eq!(Layout::new(AttnTiles::default(), 64, 64).bytes(), 4 * (64 * 64 + 64 * 65 + 64 * 64 + 64 * 64));
    }

    #[test]
    fn mask_offsets_skip_broadcast_axes() {
        assert_eq!(at2(0, 1), "j * 1u");
        assert_eq!(at2(9, 0), "r * 9u");
        assert_eq!(at2(0, 0), "0u");
        assert_eq!(matrix_strides(&[2, 1, 5, 4], &[2, 3]), vec![20, 0]);
        assert_eq!(matrix_strides(&[5, 4], &[2, 3]), vec![0, 0]);
    }
}
