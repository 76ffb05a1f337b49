//! MatMul (NumPy semantics: batched, broadcast, rank-1 operands promoted) and the GEMM that Conv and
//! ConvTranspose share.
//!
//! Float GEMMs go through `matrixmultiply::sgemm` (packed, SIMD, threaded on large products): f32
//! accumulation with FMA, as ONNX Runtime's MLAS does, so the oracle agrees with ORT to float rounding.
//! Its threads split output blocks, never the k loop, so results do not depend on the thread count.
//! Integer MatMul is a plain wrapping i64 triple loop (it only ever appears on small shape data).

use super::layout::broadcast_strides;
use super::view::{floats, from_floats, from_ints, ints};
use super::OpError;
use crate::ir::{broadcast_shapes, Tensor};

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

/// C (m x n, row-major at `c[c_off..]`) = A (m x k) · B (k x n) + beta · C.
#[allow(clippy::too_many_arguments)] // the BLAS signature, spelled out
pub(super) fn sgemm(m: usize, k: usize, n: usize, a: Mat, b: Mat, beta: f32, c: &mut [f32], c_off: usize) {
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
    // SAFETY: the assertion above proves every element the kernel reads (A, B) or writes (C, with
    // strides n and 1, which do not alias) lies inside the slices, which outlive the call.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.data.as_ptr().add(a.offset),
            a.rs as isize,
            a.cs as isize,
            b.data.as_ptr().add(b.offset),
            b.rs as isize,
            b.cs as isize,
            beta,
            c.as_mut_ptr().add(c_off),
            n as isize,
            1,
        );
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
        for (bi, (oa, ob)) in batch_offsets(&d).into_iter().enumerate() {
            sgemm(m, k, n, Mat::row_major(&av, oa, k), Mat::row_major(&bv, ob, n), 0.0, &mut out, bi * m * n);
        }
    }
    from_floats(a.dtype(), &d.out, &out)
}
