//! Attention, computed the way the unfused graph computes it: the scores `Q Kᵀ` by the same f32 GEMM as
//! MatMul, scaled in f32, the keep mask and the additive mask applied elementwise in f32, the interpreter's
//! Softmax (f64 exp and sum, probabilities rounded to f32), then the probabilities times V by the same GEMM.
//! So the fused op agrees with the graph it replaces up to the rounding of a folded scale (one f32 multiply
//! instead of a Div, or of two Muls on the operands), and shares its NaN behaviour: a row of all -inf scores
//! is 0/0 = NaN (0 with `nan_to_zero`, as the guard `Where(IsNaN(p), 0, p)` it replaces), `Sk = 0` is an
//! empty sum, 0.

use super::layout::{broadcast_strides, broadcast_to, for_each_index};
use super::linalg::{sgemm, Mat};
use super::reduce::softmax_into;
use super::view::{bools, floats, from_floats};
use super::{par, OpError};
use crate::ir::{attention_dims, AttentionAttrs, Tensor};
use rayon::prelude::*;

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

    // The masks broadcast to the scores' shape once (borrowed where they have it already).
    let keep_src = a.keep_index().filter(|_| a.keep_fill.is_some()).map(|i| (bools(x[i]), x[i].shape()));
    let keep = keep_src.as_ref().map(|(t, shape)| broadcast_to(t, shape, &scores_shape));
    let fill = a.keep_fill.unwrap_or(0.0);
    let mask_src = a.mask_index().map(|i| (floats(x[i]), x[i].shape()));
    let mask = mask_src.as_ref().map(|(t, shape)| broadcast_to(t, shape, &scores_shape));

    // One task per batch matrix (batch x head): its scores, scaled and masked, their softmax and the
    // probabilities times V, each step as the unfused graph computes it, so the split changes no bit.
    let (ss, os) = (sq * sk, sq * dv);
    let mut out = vec![0f32; dims.out_shape().iter().product()];
    if ss > 0 && os > 0 {
        // Work per matrix: both GEMMs (the softmax's exps count as a few multiply-adds each).
        let per = ss * (d + dv + 8);
        let task = |b: usize, out: &mut [f32]| {
            // Scores: K as the right operand is `[D, Sk]`: row-major when transposed already, else K
            // `[Sk, D]` read with swapped strides.
            let mut s = vec![0f32; ss];
            let kmat = if a.k_transposed { Mat::row_major(&k, ko[b], sk) } else { Mat { data: &k, offset: ko[b], rs: 1, cs: d } };
            sgemm(sq, d, sk, Mat::row_major(&q, qo[b], d), kmat, 0.0, &mut s, 0);
            let at = b * ss;
            for e in &mut s {
                *e *= a.scale;
            }
            if let Some(keep) = &keep {
                for (e, &k) in s.iter_mut().zip(&keep[at..at + ss]) {
                    if !k {
                        *e = fill;
                    }
                }
            }
            if let Some(m) = &mask {
                for (e, &m) in s.iter_mut().zip(&m[at..at + ss]) {
                    *e += m;
                }
            }
            let mut p = vec![0f32; ss];
            softmax_into(&s, &mut p, sq, sk, 1, false);
            if a.nan_to_zero {
                p.iter_mut().filter(|x| x.is_nan()).for_each(|x| *x = 0.0);
            }
            sgemm(sq, sk, dv, Mat::row_major(&p, 0, sk), Mat::row_major(&v, vo[b], dv), 0.0, out, 0);
        };
        let nb = qo.len();
        if nb > 1 && par::worth(per.saturating_mul(nb) / 64) {
            out.par_chunks_mut(os).with_min_len((4 * par::GRAIN).div_ceil(per)).enumerate().for_each(|(b, o)| task(b, o));
        } else {
            out.chunks_mut(os).enumerate().for_each(|(b, o)| task(b, o));
        }
    }
    from_floats(x[0].dtype(), &dims.out_shape(), &out)
}
