//! GatherND and ScatterND: ops addressed by index tuples (`indices[.., :k]` names one slice of data).
//!
//! Both move elements bit for bit (exact for every dtype). Each tuple is resolved against the data's
//! dimensions (negative entries count from the end) into the element offset of its slice; an entry out of
//! range is an error naming the value. ScatterND applies its tuples in row-major order, so a repeated tuple
//! (undefined in ONNX) takes the later update, as the `c` and `cuda` kernels do.

use super::layout::contiguous_strides;
use super::view::{ints, pod, with_elem, from_pod};
use super::OpError;
use crate::ir::Tensor;

/// The element offset, inside a block of shape `dims`, of the slice each k-tuple of `tuples` names.
fn tuple_offsets(tuples: &[i64], k: usize, dims: &[usize], op: &str) -> Result<Vec<usize>, OpError> {
    let strides = contiguous_strides(dims);
    tuples
        .chunks(k)
        .map(|t| {
            let mut at = 0usize;
            for (j, &i) in t.iter().enumerate() {
                let dim = dims[j] as i64;
                let r = if i < 0 { i + dim } else { i };
                if r < 0 || r >= dim {
                    return Err(OpError::new(format!("{op}: index {i} is out of range for dimension {j} of size {dim}")));
                }
                at += r as usize * strides[j] as usize;
            }
            Ok(at)
        })
        .collect()
}

pub(super) fn gather_nd(x: &Tensor, idx: &Tensor, batch_dims: usize, out_shape: &[usize]) -> Result<Tensor, OpError> {
    let k = *idx.shape().last().expect("inference checked rank >= 1");
    let per_batch = &x.shape()[batch_dims..];
    let block: usize = per_batch.iter().product();
    let slice: usize = per_batch[k..].iter().product();
    let batches: usize = x.shape()[..batch_dims].iter().product();
    let offsets = tuple_offsets(&ints(idx), k, per_batch, "GatherND")?;
    let per = offsets.len().checked_div(batches).unwrap_or(0);
    with_elem!(x.dtype(), T => {
        let data = pod::<T>(x.bytes());
        let mut out: Vec<T> = Vec::with_capacity(offsets.len() * slice);
        for (n, &o) in offsets.iter().enumerate() {
            let at = (n / per.max(1)) * block + o;
            out.extend_from_slice(&data[at..at + slice]);
        }
        from_pod(x.dtype(), out_shape, &out)
    })
}

pub(super) fn scatter_nd(x: &Tensor, idx: &Tensor, upd: &Tensor) -> Result<Tensor, OpError> {
    let k = *idx.shape().last().expect("inference checked rank >= 1");
    let slice: usize = x.shape()[k..].iter().product();
    let offsets = tuple_offsets(&ints(idx), k, x.shape(), "ScatterND")?;
    with_elem!(x.dtype(), T => {
        let mut out = pod::<T>(x.bytes()).into_owned();
        let u = pod::<T>(upd.bytes());
        for (n, &o) in offsets.iter().enumerate() {
            out[o..o + slice].copy_from_slice(&u[n * slice..(n + 1) * slice]);
        }
        from_pod(x.dtype(), x.shape(), &out)
    })
}
