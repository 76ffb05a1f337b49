//! Data movement: Reshape, Transpose, Concat, Split, Slice, Gather, GatherElements, Expand, Tile, Pad, Where.
//!
//! These ops never compute on values, so they work on raw elements of the dtype's size and are exact for
//! every dtype. Attributes were validated by shape inference before a kernel runs (see `eval_op`); the
//! only data-dependent failures are out-of-range gather indices, reported with the offending value.

use super::layout::{broadcast_strides, broadcast_to, contiguous_strides, for_each_index, gather_strided};
use super::view::{bools, from_pod, ints, pod, with_elem};
use super::{par, OpError};
use crate::ir::{PadMode, Tensor};

pub(super) fn reshape(x: &Tensor, shape: &[usize]) -> Result<Tensor, OpError> {
    // Same bytes, new shape: no copy.
    Ok(x.reshaped(shape.to_vec()))
}

pub(super) fn transpose(x: &Tensor, perm: &[usize]) -> Result<Tensor, OpError> {
    let own = contiguous_strides(x.shape());
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape()[p]).collect();
    let strides: Vec<isize> = perm.iter().map(|&p| own[p]).collect();
    with_elem!(x.dtype(), T => {
        let out = gather_strided(&pod::<T>(x.bytes()), &shape, 0, &strides);
        from_pod(x.dtype(), &shape, &out)
    })
}

/// The view of `x` along `axes` from `starts` by `steps`, `lens` long (shared by Slice and Split).
fn strided_window(x: &Tensor, axes: &[usize], starts: &[i64], steps: &[i64], lens: &[usize]) -> Result<Tensor, OpError> {
    let own = contiguous_strides(x.shape());
    let mut shape = x.shape().to_vec();
    let mut strides = own.clone();
    let mut offset = 0isize;
    for (i, &a) in axes.iter().enumerate() {
        shape[a] = lens[i];
        if lens[i] > 0 {
            offset += starts[i] as isize * own[a];
        }
        strides[a] = own[a] * steps[i] as isize;
    }
    with_elem!(x.dtype(), T => {
        let out = if shape.contains(&0) { Vec::new() } else { gather_strided(&pod::<T>(x.bytes()), &shape, offset, &strides) };
        from_pod(x.dtype(), &shape, &out)
    })
}

/// Slice with the normalized attributes of `Op::Slice`: start and end already clamped to the dimension
/// (end -1 for a negative step that runs through index 0).
pub(super) fn slice(x: &Tensor, axes: &[usize], starts: &[i64], ends: &[i64], steps: &[i64]) -> Result<Tensor, OpError> {
    let lens: Vec<usize> = (0..axes.len())
        .map(|i| {
            let (st, en, sp) = (starts[i], ends[i], steps[i]);
            let len = if sp > 0 { ((en - st).max(0) + sp - 1) / sp } else { ((st - en).max(0) - sp - 1) / -sp };
            len as usize
        })
        .collect();
    strided_window(x, axes, starts, steps, &lens)
}

pub(super) fn split(x: &Tensor, axis: usize, sizes: &[usize]) -> Result<Vec<Tensor>, OpError> {
    let mut start = 0i64;
    let mut out = Vec::with_capacity(sizes.len());
    for &n in sizes {
        out.push(strided_window(x, &[axis], &[start], &[1], &[n])?);
        start += n as i64;
    }
    Ok(out)
}

pub(super) fn concat(xs: &[&Tensor], axis: usize) -> Result<Tensor, OpError> {
    let first = xs[0];
    let outer: usize = first.shape()[..axis].iter().product();
    let mut shape = first.shape().to_vec();
    shape[axis] = xs.iter().map(|t| t.shape()[axis]).sum();
    with_elem!(first.dtype(), T => {
        let parts: Vec<_> = xs.iter().map(|t| pod::<T>(t.bytes())).collect();
        let chunks: Vec<usize> = xs.iter().map(|t| t.shape()[axis..].iter().product()).collect();
        let mut out: Vec<T> = Vec::with_capacity(shape.iter().product());
        for o in 0..outer {
            for (p, &c) in parts.iter().zip(&chunks) {
                out.extend_from_slice(&p[o * c..(o + 1) * c]);
            }
        }
        from_pod(first.dtype(), &shape, &out)
    })
}

/// An index into a dimension of size `dim`; negative counts from the end (ONNX Gather semantics).
fn resolve_index(i: i64, dim: usize, op: &str) -> Result<usize, OpError> {
    let j = if i < 0 { i + dim as i64 } else { i };
    if j < 0 || j >= dim as i64 {
        return Err(OpError::new(format!("{op}: index {i} is out of range for a dimension of size {dim}")));
    }
    Ok(j as usize)
}

pub(super) fn gather(x: &Tensor, idx: &Tensor, axis: usize) -> Result<Tensor, OpError> {
    let dim = x.shape()[axis];
    let pre: usize = x.shape()[..axis].iter().product();
    let post: usize = x.shape()[axis + 1..].iter().product();
    let indices: Vec<usize> = ints(idx).iter().map(|&i| resolve_index(i, dim, "Gather")).collect::<Result<_, _>>()?;
    let mut shape = x.shape()[..axis].to_vec();
    shape.extend_from_slice(idx.shape());
    shape.extend_from_slice(&x.shape()[axis + 1..]);
    with_elem!(x.dtype(), T => {
        let data = pod::<T>(x.bytes());
        // One gathered slice per chunk, in parallel where large.
        let out: Vec<T> = par::fill_chunks(pre * indices.len() * post, post, |r, dst| {
            let at = ((r / indices.len()) * dim + indices[r % indices.len()]) * post;
            for (d, &v) in dst.iter_mut().zip(&data[at..at + post]) {
                d.write(v);
            }
        });
        from_pod(x.dtype(), &shape, &out)
    })
}

pub(super) fn gather_elements(x: &Tensor, idx: &Tensor, axis: usize) -> Result<Tensor, OpError> {
    let dim = x.shape()[axis];
    let xs = contiguous_strides(x.shape());
    let indices = ints(idx);
    // ONNX allows index tensors smaller than the data on the other axes: they address data coordinates
    // directly, so each must lie inside the data's dimension.
    for (a, (&n, &d)) in idx.shape().iter().zip(x.shape()).enumerate() {
        if a != axis && n > d {
            return Err(OpError::new(format!("GatherElements: indices dimension {a} is {n}, data has {d}")));
        }
    }
    let mut offsets = Vec::with_capacity(indices.len());
    let mut k = 0;
    let mut err = None;
    for_each_index(idx.shape(), |c| {
        let mut at = 0isize;
        for (a, &ci) in c.iter().enumerate() {
            let coord = if a == axis {
                match resolve_index(indices[k], dim, "GatherElements") {
                    Ok(j) => j,
                    Err(e) => {
                        err.get_or_insert(e);
                        0
                    }
                }
            } else {
                ci
            };
            at += coord as isize * xs[a];
        }
        offsets.push(at as usize);
        k += 1;
    });
    if let Some(e) = err {
        return Err(e);
    }
    with_elem!(x.dtype(), T => {
        let data = pod::<T>(x.bytes());
        let out: Vec<T> = offsets.iter().map(|&o| data[o]).collect();
        from_pod(x.dtype(), idx.shape(), &out)
    })
}

pub(super) fn expand(x: &Tensor, out_shape: &[usize]) -> Result<Tensor, OpError> {
    with_elem!(x.dtype(), T => {
        let out = broadcast_to(&pod::<T>(x.bytes()), x.shape(), out_shape).into_owned();
        from_pod(x.dtype(), out_shape, &out)
    })
}

pub(super) fn tile(x: &Tensor, repeats: &[usize]) -> Result<Tensor, OpError> {
    // Tile is a broadcast of the view [r0, d0, r1, d1, ...] with stride 0 on every repeat axis: read
    // row-major, it is exactly the tiled tensor of shape [r0*d0, r1*d1, ...].
    let own = contiguous_strides(x.shape());
    let mut view_shape = Vec::with_capacity(2 * repeats.len());
    let mut view_strides = Vec::with_capacity(2 * repeats.len());
    for (a, &r) in repeats.iter().enumerate() {
        view_shape.extend([r, x.shape()[a]]);
        view_strides.extend([0, own[a]]);
    }
    let shape: Vec<usize> = x.shape().iter().zip(repeats).map(|(d, r)| d * r).collect();
    with_elem!(x.dtype(), T => {
        let out = gather_strided(&pod::<T>(x.bytes()), &view_shape, 0, &view_strides);
        from_pod(x.dtype(), &shape, &out)
    })
}

/// For one axis, the input coordinate each output coordinate reads (`None`: the pad value).
fn pad_axis_map(dim: usize, begin: i64, out: usize, mode: PadMode) -> Result<Vec<Option<usize>>, OpError> {
    if dim == 0 && out > 0 && mode != PadMode::Constant {
        return Err(OpError::new(format!("Pad: {mode:?} mode cannot pad an empty dimension")));
    }
    Ok((0..out as i64)
        .map(|o| {
            let i = o - begin;
            let n = dim as i64;
            match mode {
                PadMode::Constant => (0..n).contains(&i).then_some(i as usize),
                PadMode::Edge => Some(i.clamp(0, n - 1) as usize),
                PadMode::Reflect => {
                    // Mirror without repeating the edge (NumPy 'reflect'), periodic for pads wider than
                    // the dimension.
                    if n == 1 {
                        return Some(0);
                    }
                    let period = 2 * (n - 1);
                    let m = i.rem_euclid(period);
                    Some(if m < n { m } else { period - m } as usize)
                }
            }
        })
        .collect())
}

pub(super) fn pad(x: &Tensor, pads: &[i64], mode: PadMode, value: f32) -> Result<Tensor, OpError> {
    let r = x.shape().len();
    let shape: Vec<usize> = (0..r).map(|a| (x.shape()[a] as i64 + pads[a] + pads[r + a]) as usize).collect();
    let maps: Vec<Vec<Option<usize>>> =
        (0..r).map(|a| pad_axis_map(x.shape()[a], pads[a], shape[a], mode)).collect::<Result<_, _>>()?;
    let own = contiguous_strides(x.shape());
    // The pad value in the tensor's own dtype (truncated for integers, non-zero for bool).
    let fill = Tensor::from_f64_as(x.dtype(), Vec::new(), &[value as f64]);
    with_elem!(x.dtype(), T => {
        let data = pod::<T>(x.bytes());
        let fill = pod::<T>(fill.bytes())[0];
        let mut out: Vec<T> = Vec::with_capacity(shape.iter().product());
        for_each_index(&shape, |c| {
            let mut at = 0isize;
            for (a, &ci) in c.iter().enumerate() {
                match maps[a][ci] {
                    Some(i) => at += i as isize * own[a],
                    None => {
                        out.push(fill);
                        return;
                    }
                }
            }
            out.push(data[at as usize]);
        });
        from_pod(x.dtype(), &shape, &out)
    })
}

pub(super) fn where_(cond: &Tensor, x: &Tensor, y: &Tensor, out_shape: &[usize]) -> Result<Tensor, OpError> {
    let c = bools(cond);
    let c = broadcast_to(&c, cond.shape(), out_shape);
    with_elem!(x.dtype(), T => {
        let xv = pod::<T>(x.bytes());
        let yv = pod::<T>(y.bytes());
        let xv = gather_strided(&xv, out_shape, 0, &broadcast_strides(x.shape(), out_shape));
        let yv = gather_strided(&yv, out_shape, 0, &broadcast_strides(y.shape(), out_shape));
        let out: Vec<T> = par::tabulate(c.len(), 1, |i| if c[i] { xv[i] } else { yv[i] });
        from_pod(x.dtype(), out_shape, &out)
    })
}
