//! Attention, computed the way the unfused graph computes it: the scores `Q Kᵀ` by the same f32 GEMM as
//! MatMul, scaled in f32, the keep mask and the additive mask applied elementwise in f32, the interpreter's
//! Softmax (f64 exp and sum, probabilities rounded to f32), then the probabilities times V by the same GEMM.
//! So the fused op agrees with the graph it replaces up to the rounding of a folded scale (one f32 multiply
//! instead of a Div, or of two Muls on the operands), and shares its NaN behaviour: a row of all -inf scores
//! is 0/0 = NaN, `Sk = 0` is an empty sum, 0.

use super::layout::{broadcast_strides, broadcast_to, for_each_index};
use super::linalg::{sgemm, Mat};
use super::reduce::softmax;
use super::view::{bools, floats, from_floats};
use super::OpError;
use crate::ir::{attention_dims, AttentionAttrs, DType, Tensor};

/// Leading dims of `shape` (all but the last two).
fn lead(shape: &[usize]) -> &[usize] {
    &shape[..shape.len() - 2]
}

/// Flat element offset of each batch matrix of `shape` (`rows x cols` each) for every index of `batch`.
fn batch_offsets(shape: &[usize], batch: &[usize], rows: usize, cols: usize) -> Vec<usize> {
    let st = broadcast_strides(lead(shape), batch);
    let mut offs = Vec::new();
    for_each_index(batch, |i| {
        let o: isize = i.iter().zip(&st).map(|(&x, &s)| x as isize * s).sum();
        offs.push(o as usize * rows * cols);
    });
    offs
}

pub(super) fn attention(a: &AttentionAttrs, x: &[&Tensor]) -> Result<Tensor, OpError> {
    let types: Vec<_> = x.iter().map(|t| &t.ty).collect();
    let dims = attention_dims(a, &types).map_err(|e| OpError::new(e.0))?;
    let (sq, sk, d, dv) = (dims.sq, dims.sk, dims.d, dims.dv);
    let scores_shape = dims.scores_shape();
    let (q, k, v) = (floats(x[0]), floats(x[1]), floats(x[2]));
    let qo = batch_offsets(x[0].shape(), &dims.batch, sq, d);
    let ko = batch_offsets(x[1].shape(), &dims.batch, sk, d);
    let vo = batch_offsets(x[2].shape(), &dims.batch, sk, dv);

    // Scores, one GEMM per batch matrix. K as the right operand is `[D, Sk]`: row-major when transposed
    // already, else K `[Sk, D]` read with swapped strides.
    let mut s = vec![0f32; scores_shape.iter().product()];
    for (b, ((&oq, &ok), _)) in qo.iter().zip(&ko).zip(&vo).enumerate() {
        let kmat = if a.k_transposed { Mat::row_major(&k, ok, sk) } else { Mat { data: &k, offset: ok, rs: 1, cs: d } };
        sgemm(sq, d, sk, Mat::row_major(&q, oq, d), kmat, 0.0, &mut s, b * sq * sk);
    }
    for e in &mut s {
        *e *= a.scale;
    }
    if let (Some(i), Some(fill)) = (a.keep_index(), a.keep_fill) {
        let keep = bools(x[i]);
        let keep = broadcast_to(&keep, x[i].shape(), &scores_shape);
        for (e, &k) in s.iter_mut().zip(keep.iter()) {
            if !k {
                *e = fill;
            }
        }
    }
    if let Some(i) = a.mask_index() {
        let m = floats(x[i]);
        let m = broadcast_to(&m, x[i].shape(), &scores_shape);
        for (e, &m) in s.iter_mut().zip(m.iter()) {
            *e += m;
        }
    }
    let scores = from_floats(DType::F32, &scores_shape, &s)?;
    let p = softmax(&scores, scores_shape.len() - 1, false)?;
    let p = floats(&p);

    let mut out = vec![0f32; dims.out_shape().iter().product()];
    for (b, &ov) in vo.iter().enumerate() {
        sgemm(sq, sk, dv, Mat::row_major(&p, b * sq * sk, sk), Mat::row_major(&v, ov, dv), 0.0, &mut out, b * sq * dv);
    }
    from_floats(x[0].dtype(), &dims.out_shape(), &out)
}
