//! Reductions and normalizations: Reduce{Sum,Mean,Max,Min}, Softmax, LogSoftmax, LayerNorm, BatchNorm,
//! GlobalAveragePool. Every float sum, mean and variance accumulates in f64 and is rounded once.

use super::layout::{broadcast_to, contiguous_strides, gather_strided};
use super::view::{floats, from_floats, from_ints, ints};
use super::{par, OpError};
use crate::ir::{ReduceKind, Tensor};

/// Moves the reduced axes last (a strided copy unless they already are) and returns the data as
/// `outer` rows of `inner` elements, one row per output element.
fn rows_last<T: Copy + Send + Sync>(x: &[T], shape: &[usize], axes: &[usize]) -> (Vec<T>, usize) {
    let kept: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
    let perm: Vec<usize> = kept.iter().chain(axes).copied().collect();
    let inner: usize = axes.iter().map(|&a| shape[a]).product();
    let own = contiguous_strides(shape);
    let data = if perm.iter().enumerate().all(|(i, &p)| i == p) {
        x.to_vec()
    } else {
        let s: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        let st: Vec<isize> = perm.iter().map(|&p| own[p]).collect();
        gather_strided(x, &s, 0, &st)
    };
    (data, inner)
}

fn output_shape(shape: &[usize], axes: &[usize], keepdims: bool) -> Vec<usize> {
    let mut s = Vec::new();
    for (i, &d) in shape.iter().enumerate() {
        if !axes.contains(&i) {
            s.push(d);
        } else if keepdims {
            s.push(1);
        }
    }
    s
}

/// `f` of each of the `outer` rows of `inner` elements (an empty reduction still has `outer` empty rows), in
/// parallel where large.
fn per_row<T: Sync, R: Send>(data: &[T], inner: usize, outer: usize, f: impl Fn(&[T]) -> R + Sync + Send) -> Vec<R> {
    par::tabulate(outer, inner, |o| f(&data[o * inner..(o + 1) * inner]))
}

pub(super) fn reduce(x: &Tensor, kind: ReduceKind, axes: &[usize], keepdims: bool) -> Result<Tensor, OpError> {
    let shape = output_shape(x.shape(), axes, keepdims);
    let outer: usize = shape.iter().product();
    if x.dtype().is_int() {
        let (data, inner) = rows_last(&ints(x), x.shape(), axes);
        let v: Vec<i64> = per_row(&data, inner, outer, |r| match kind {
                ReduceKind::Sum => r.iter().fold(0i64, |a, &b| a.wrapping_add(b)),
                // Integer mean truncates, as ONNX Runtime's integer ReduceMean does (0 for an empty row).
                ReduceKind::Mean => {
                    let s = r.iter().fold(0i64, |a, &b| a.wrapping_add(b));
                    if r.is_empty() {
                        0
                    } else {
                        s / r.len() as i64
                    }
                }
                ReduceKind::Max => r.iter().copied().max().unwrap_or(i64::MIN),
                ReduceKind::Min => r.iter().copied().min().unwrap_or(i64::MAX),
            });
        return from_ints(x.dtype(), &shape, &v);
    }
    let (data, inner) = rows_last(&floats(x), x.shape(), axes);
    let v: Vec<f32> = per_row(&data, inner, outer, |r| match kind {
            ReduceKind::Sum => r.iter().map(|&a| a as f64).sum::<f64>() as f32,
            ReduceKind::Mean => (r.iter().map(|&a| a as f64).sum::<f64>() / r.len() as f64) as f32,
            // NaN wins, as in NumPy and ONNX Runtime; an empty row gives the identity (∓inf).
            ReduceKind::Max => r.iter().fold(f32::NEG_INFINITY, |a, &b| if a.is_nan() || b.is_nan() { f32::NAN } else { a.max(b) }),
            ReduceKind::Min => r.iter().fold(f32::INFINITY, |a, &b| if a.is_nan() || b.is_nan() { f32::NAN } else { a.min(b) }),
        });
    from_floats(x.dtype(), &shape, &v)
}

/// Softmax (or LogSoftmax) over one axis: the tensor is seen as [outer, D, inner] and each of the
/// outer*inner lines of D elements is normalized; max-subtraction keeps exp in range, sums are f64.
pub(super) fn softmax(x: &Tensor, axis: usize, log: bool) -> Result<Tensor, OpError> {
    let s = x.shape();
    let outer: usize = s[..axis].iter().product();
    let d = s[axis];
    let inner: usize = s[axis + 1..].iter().product();
    let v = floats(x);
    let mut out = vec![0f32; v.len()];
    softmax_into(&v, &mut out, outer, d, inner, log);
    from_floats(x.dtype(), s, &out)
}

/// [`softmax`] of `v` seen as [outer, D, inner] into `out` (as long), the outer blocks in parallel where large
/// (each line computes alone, so the split changes no bit).
pub(super) fn softmax_into(v: &[f32], out: &mut [f32], outer: usize, d: usize, inner: usize, log: bool) {
    let block = d * inner;
    if block == 0 {
        return;
    }
    debug_assert_eq!(out.len(), outer * block);
    par::chunks_mut(out, block, |o, out| {
        let v = &v[o * block..(o + 1) * block];
        let mut line = vec![0f64; d];
        for i in 0..inner {
            let at = |k: usize| k * inner + i;
            let mut m = f64::NEG_INFINITY;
            for k in 0..d {
                line[k] = v[at(k)] as f64;
                m = if line[k].is_nan() || m.is_nan() { f64::NAN } else { m.max(line[k]) };
            }
            let mut sum = 0f64;
            for e in line.iter_mut() {
                *e = (*e - m).exp();
                sum += *e;
            }
            for k in 0..d {
                out[at(k)] = if log {
                    (v[at(k)] as f64 - m - sum.ln()) as f32
                } else {
                    (line[k] / sum) as f32
                };
            }
        }
    });
}

/// LayerNormalization over axes `axis..rank`: mean and variance (two passes, f64), then
/// (x - mean) / sqrt(var + eps) * scale + bias with scale and bias broadcast to the normalized shape.
/// Rows in parallel where large.
pub(super) fn layer_norm(x: &Tensor, scale: &Tensor, bias: Option<&Tensor>, axis: usize, eps: f32) -> Result<Tensor, OpError> {
    let norm_shape = &x.shape()[axis..];
    let inner: usize = norm_shape.iter().product();
    let sv = floats(scale);
    let sv = broadcast_to(&sv, scale.shape(), norm_shape);
    let bv: Option<Vec<f32>> = bias.map(|b| broadcast_to(&floats(b), b.shape(), norm_shape).into_owned());
    let v = floats(x);
    let mut out = vec![0f32; v.len()];
    par::chunks_mut(&mut out, inner, |o, out| {
        let row = &v[o * inner..(o + 1) * inner];
        let mean = row.iter().map(|&a| a as f64).sum::<f64>() / inner as f64;
        let var = row.iter().map(|&a| (a as f64 - mean).powi(2)).sum::<f64>() / inner as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for k in 0..inner {
            let mut y = (row[k] as f64 - mean) * inv * sv[k] as f64;
            if let Some(b) = &bv {
                y += b[k] as f64;
            }
            out[k] = y as f32;
        }
    });
    from_floats(x.dtype(), x.shape(), &out)
}

/// Inference BatchNormalization: per channel, y = (x - mean) / sqrt(var + eps) * scale + bias, folded
/// into one f64 multiply-add per element.
pub(super) fn batch_norm(x: &Tensor, params: [&Tensor; 4], eps: f32) -> Result<Tensor, OpError> {
    let [scale, bias, mean, var] = params.map(floats);
    let c = x.shape()[1];
    let n = x.shape()[0];
    let spatial: usize = x.shape()[2..].iter().product();
    let coef: Vec<(f64, f64)> = (0..c)
        .map(|k| {
            let a = scale[k] as f64 / (var[k] as f64 + eps as f64).sqrt();
            (a, bias[k] as f64 - mean[k] as f64 * a)
        })
        .collect();
    let v = floats(x);
    let mut out = vec![0f32; v.len()];
    if spatial > 0 && c > 0 {
        // One (batch, channel) plane per chunk, in parallel where large.
        par::chunks_mut(&mut out[..n * c * spatial], spatial, |p, out| {
            let (a, off) = coef[p % c];
            let at = p * spatial;
            for (o, &x) in out.iter_mut().zip(&v[at..at + spatial]) {
                *o = (x as f64 * a + off) as f32;
            }
        });
    }
    from_floats(x.dtype(), x.shape(), &out)
}

pub(super) fn global_average_pool(x: &Tensor) -> Result<Tensor, OpError> {
    let axes: Vec<usize> = (2..x.shape().len()).collect();
    reduce(x, ReduceKind::Mean, &axes, true)
}
