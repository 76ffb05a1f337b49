//! MatMul (NumPy semantics: batched, broadcast, rank-1 operands promoted) and the GEMM that Conv and
//! ConvTranspose share.
//!
//! Float GEMMs go through `matrixmultiply::sgemm` (packed, SIMD): f32 accumulation with FMA, as ONNX
//! Runtime's MLAS does, so the oracle agrees with ORT to float rounding. Large products run as blocks of
//! the output on rayon tasks, one single-threaded call each, aligned so that the results are those of one
//! call (see [`sgemm`]); batched products run their matrices in parallel. Nothing splits the k loop, so
//! results do not depend on the thread count.
//! Integer MatMul is a plain wrapping i64 triple loop (it only ever appears on small shape data).

use super::layout::broadcast_strides;
use super::par::{Shared, SharedMut};
use super::view::{floats, from_floats, from_ints, ints};
use super::OpError;
use crate::ir::{broadcast_shapes, Tensor};
use rayon::prelude::*;

/// A row-major-or-strided matrix operand: data, offset of element (0, 0), row stride, column stride.
#[derive(Clone, Copy)]
pub(super) struct Mat<'a> {
    pub data: &'a [f32],
    pub offset: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> Mat<'a> {
    pub fn row_major(data: &'a [f32], offset: usize, cols: usize) -> Self {
        Mat { data, offset, rs: cols, cs: 1 }
    }

    /// Whether an `rows x cols` matrix at this offset with these strides lies inside `data`.
    fn fits(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || self.offset + (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
}

/// A parallel GEMM cuts C into blocks of rows and columns that start at multiples of this, so every block
/// is a whole number of the micro-tiles one `matrixmultiply::sgemm` call over all of C computes (its MR and
/// NR are 4, 8 or 16 whatever kernel it picks, its row panels MC = 64 rows): each element of C gets the same
/// tile, packed panels and kc-chunked k loop, hence the same bits, as in the single call.
const GEMM_ALIGN: usize = 64;
/// Multiply-adds per GEMM block at least (about 0.1 ms of one core).
const GEMM_TASK: usize = 1 << 22;

/// C (m x n, row-major at `c[c_off..]`) = A (m x k) · B (k x n) + beta · C.
///
/// One `matrixmultiply::sgemm` call (single-threaded: the crate's own 4-thread pool is not used) per block
/// of C, a block per thread of the caller's rayon pool where the product is large enough. Each element's
/// result depends on its micro-tile only (see [`GEMM_ALIGN`]), never on the blocks, so the bits are those of
/// one call over all of C whatever the thread count; on one thread it is that call.
#[allow(clippy::too_many_arguments)] // the BLAS signature, spelled out
pub(super) fn sgemm(m: usize, k: usize, n: usize, a: Mat, b: Mat, beta: f32, c: &mut [f32], c_off: usize) {
    sgemm_in_blocks(m, k, n, a, b, beta, c, c_off, GEMM_TASK, rayon::current_num_threads())
}

/// About how many multiply-adds packing one element of A or B costs (measured: matrixmultiply's AVX-512
/// kernel, BERT's shapes).
const PACK_COST: usize = 32;

/// How [`sgemm`] cuts an `m x k x n` product into at most `max_blocks` blocks of at least `min_task`
/// multiply-adds: (row blocks, column blocks). The blocks run at once, so it takes the cut whose largest
/// block costs least: its `r · c` multiply-adds and the packing of its `r` rows of A and `c` columns of B,
/// per step of k (the blocks pack A and B anew: many thin ones would pack A or B many times over).
fn gemm_blocks(m: usize, k: usize, n: usize, min_task: usize, max_blocks: usize) -> (usize, usize) {
    let (um, un) = (m.div_ceil(GEMM_ALIGN), n.div_ceil(GEMM_ALIGN));
    let tasks = (m.saturating_mul(n).saturating_mul(k) / min_task.max(1)).clamp(1, max_blocks.max(1));
    let span = |units: usize, parts: usize, len: usize| (units.div_ceil(parts) * GEMM_ALIGN).min(len);
    (1..=um.min(tasks))
        .map(|rows| (rows, un.min(tasks / rows)))
        .min_by_key(|&(rows, cols)| {
            let (r, c) = (span(um, rows, m), span(un, cols, n));
            r * c + PACK_COST * (r + c)
        })
        .unwrap_or((1, 1))
}

/// [`sgemm`] cut into at most `max_blocks` blocks of at least `min_task` multiply-adds (tests force fine
/// cuts).
#[allow(clippy::too_many_arguments)]
pub(super) fn sgemm_in_blocks(
    m: usize,
    k: usize,
    n: usize,
    a: Mat,
    b: Mat,
    beta: f32,
    c: &mut [f32],
    c_off: usize,
    min_task: usize,
    max_blocks: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(a.fits(m, k) && b.fits(k, n) && c_off + m * n <= c.len(), "sgemm: operand out of bounds");
    if k == 0 {
        for v in &mut c[c_off..c_off + m * n] {
            *v *= beta;
        }
        return;
    }
    let (um, un) = (m.div_ceil(GEMM_ALIGN), n.div_ceil(GEMM_ALIGN));
    let (rows, cols) = gemm_blocks(m, k, n, min_task, max_blocks);
    let (ap, bp, cp) = (Shared(a.data.as_ptr()), Shared(b.data.as_ptr()), SharedMut(c.as_mut_ptr()));
    // Block `t`'s rows and columns: unit boundaries `u * i / parts` (each block at least one unit), in
    // elements, clipped to the matrix.
    let block = move |t: usize| {
        let (i, j) = (t / cols, t % cols);
        let r = (um * i / rows * GEMM_ALIGN)..(um * (i + 1) / rows * GEMM_ALIGN).min(m);
        let cl = (un * j / cols * GEMM_ALIGN)..(un * (j + 1) / cols * GEMM_ALIGN).min(n);
        // SAFETY: the assertion above proves every element of A, B and C that any block addresses lies
        // inside the slices, which outlive the call (the tasks end before it returns). The blocks partition
        // C, so no two tasks write the same element, and C's strides (n, 1) do not alias.
        unsafe {
            matrixmultiply::sgemm(
                r.len(),
                k,
                cl.len(),
                1.0,
                ap.get().add(a.offset + r.start * a.rs),
                a.rs as isize,
                a.cs as isize,
                bp.get().add(b.offset + cl.start * b.cs),
                b.rs as isize,
                b.cs as isize,
                beta,
                cp.get().add(c_off + r.start * n + cl.start),
                n as isize,
                1,
            );
        }
    };
    if rows * cols == 1 {
        block(0);
    } else {
        (0..rows * cols).into_par_iter().for_each(block);
    }
}

/// Shapes of a MatMul after NumPy's rank-1 promotion: batch dims, m, k, n and the output shape.
struct MatMulDims {
    batch_a: Vec<usize>,
    batch_b: Vec<usize>,
    batch: Vec<usize>,
    m: usize,
    k: usize,
    n: usize,
    out: Vec<usize>,
}

fn dims(a: &[usize], b: &[usize]) -> Result<MatMulDims, OpError> {
    let a2: Vec<usize> = if a.len() == 1 { vec![1, a[0]] } else { a.to_vec() };
    let b2: Vec<usize> = if b.len() == 1 { vec![b[0], 1] } else { b.to_vec() };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let n = b2[b2.len() - 1];
    let batch_a = a2[..a2.len() - 2].to_vec();
    let batch_b = b2[..b2.len() - 2].to_vec();
    let batch = broadcast_shapes(&batch_a, &batch_b).map_err(|e| OpError::new(e.to_string()))?;
    let mut out = batch.clone();
    if a.len() > 1 {
        out.push(m);
    }
    if b.len() > 1 {
        out.push(n);
    }
    Ok(MatMulDims { batch_a, batch_b, batch, m, k, n, out })
}

/// For each output batch (row-major), the matrix offsets into A and B (broadcast batches repeat).
/// With no batch dims there is exactly one (the empty index).
fn batch_offsets(d: &MatMulDims) -> Vec<(usize, usize)> {
    let sa = broadcast_strides(&d.batch_a, &d.batch);
    let sb = broadcast_strides(&d.batch_b, &d.batch);
    let mut offs = Vec::new();
    super::layout::for_each_index(&d.batch, |i| {
        let oa: isize = i.iter().zip(&sa).map(|(&x, &s)| x as isize * s).sum();
        let ob: isize = i.iter().zip(&sb).map(|(&x, &s)| x as isize * s).sum();
        offs.push((oa as usize * d.m * d.k, ob as usize * d.k * d.n));
    });
    offs
}

pub(super) fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor, OpError> {
    let d = dims(a.shape(), b.shape())?;
    let (m, k, n) = (d.m, d.k, d.n);
    if a.dtype().is_int() {
        let (av, bv) = (ints(a), ints(b));
        let mut out = Vec::with_capacity(d.out.iter().product());
        for (oa, ob) in batch_offsets(&d) {
            for i in 0..m {
                for j in 0..n {
                    let mut s = 0i64;
                    for p in 0..k {
                        s = s.wrapping_add(av[oa + i * k + p].wrapping_mul(bv[ob + p * n + j]));
                    }
                    out.push(s);
                }
            }
        }
        return from_ints(a.dtype(), &d.out, &out);
    }
    let (av, bv) = (floats(a), floats(b));
    let mut out = vec![0f32; d.out.iter().product()];
    if d.batch_b.iter().product::<usize>() == 1 && d.batch_a.iter().product::<usize>() == d.batch.iter().product::<usize>() {
        // One B for every batch of A (a layer's weight): the batches of A stack into one tall GEMM.
        let rows = m * d.batch.iter().product::<usize>();
        sgemm(rows, k, n, Mat::row_major(&av, 0, k), Mat::row_major(&bv, 0, n), 0.0, &mut out, 0);
    } else {
        // One matrix per task (each may split further), as many per task as make one GEMM task of work.
        let offs = batch_offsets(&d);
        let per = m * n * k;
        let gemm = |bi: usize, c: &mut [f32]| {
            let (oa, ob) = offs[bi];
            sgemm(m, k, n, Mat::row_major(&av, oa, k), Mat::row_major(&bv, ob, n), 0.0, c, 0);
        };
        if offs.len() > 1 && per.saturating_mul(offs.len()) >= 2 * GEMM_TASK && m * n > 0 {
            out.par_chunks_mut(m * n).with_min_len(GEMM_TASK.div_ceil(per.max(1))).enumerate().for_each(|(bi, c)| gemm(bi, c));
        } else if m * n > 0 {
            out.chunks_mut(m * n).enumerate().for_each(|(bi, c)| gemm(bi, c));
        }
    }
    from_floats(a.dtype(), &d.out, &out)
}

#[cfg(test)]
#[path = "linalg_tests.rs"]
mod tests;
