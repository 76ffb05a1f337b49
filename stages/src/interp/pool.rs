//! MaxPool and AveragePool over any number of spatial dims, with explicit pads, dilations and ceil_mode
//! (the output size, ceil_mode included, comes from shape inference).
//!
//! MaxPool ignores padding and propagates NaN. AveragePool sums in f64 and divides, like ONNX Runtime, by
//! the number of taps inside the input (count_include_pad = false) or inside the padded input
//! (count_include_pad = true): a window that ceil_mode lets run past the end padding is not charged for
//! the part beyond it.

use super::layout::{contiguous_strides, for_each_index};
use super::view::{floats, from_floats};
use super::{par, OpError};
use crate::ir::{PoolAttrs, Tensor};

/// One kernel tap of one window: the input offset it reads (None in padding) and whether it lies inside
/// the padded extent.
#[derive(Clone, Copy)]
struct Tap {
    at: Option<usize>,
    in_padded: bool,
}

/// The taps of every window, output positions row-major, `prod(kernel)` taps each. The table is the
/// same for every (batch, channel) plane, so it is built once.
fn tap_table(p: &PoolAttrs, input: &[usize], output: &[usize]) -> Vec<Tap> {
    let nd = input.len();
    let in_strides = contiguous_strides(input);
    let mut taps = Vec::new();
    for_each_index(output, |op| {
        for_each_index(&p.kernel, |kp| {
            let mut at = 0isize;
            let mut inside = true;
            let mut in_padded = true;
            for d in 0..nd {
                let i = (op[d] * p.strides[d] + kp[d] * p.dilations[d]) as i64 - p.pads[d] as i64;
                if i < 0 || i >= input[d] as i64 {
                    inside = false;
                    if i < -(p.pads[d] as i64) || i >= (input[d] + p.pads[nd + d]) as i64 {
                        in_padded = false;
                    }
                } else {
                    at += i as isize * in_strides[d];
                }
            }
            taps.push(Tap { at: inside.then_some(at as usize), in_padded });
        });
    });
    taps
}

/// Applies `window(plane data, taps of one window)` at every output position of every plane.
/// Planes in parallel where large.
fn pool(x: &Tensor, p: &PoolAttrs, out_shape: &[usize], window: impl Fn(&[f32], &[Tap]) -> f32 + Sync + Send) -> Result<Tensor, OpError> {
    let v = floats(x);
    let input = &x.shape()[2..];
    let isz: usize = input.iter().product();
    let kk: usize = p.kernel.iter().product();
    let ops: usize = out_shape[2..].iter().product();
    let table = tap_table(p, input, &out_shape[2..]);
    let mut out = vec![0f32; out_shape.iter().product()];
    par::split(&mut out, ops, kk, |plane, out| {
        let xs = &v[plane * isz..(plane + 1) * isz];
        for (o, taps) in out.iter_mut().zip(table.chunks_exact(kk.max(1))) {
            *o = window(xs, taps);
        }
    });
    from_floats(x.dtype(), out_shape, &out)
}

pub(super) fn max_pool(x: &Tensor, p: &PoolAttrs, out_shape: &[usize]) -> Result<Tensor, OpError> {
    pool(x, p, out_shape, |xs, taps| {
        // ONNX Runtime starts from the lowest finite value, so a window entirely in padding gives it.
        let mut m = f32::MIN;
        for t in taps {
            if let Some(i) = t.at {
                let v = xs[i];
                if v.is_nan() || m.is_nan() {
                    m = f32::NAN;
                } else if v > m {
                    m = v;
                }
            }
        }
        m
    })
}

pub(super) fn average_pool(x: &Tensor, p: &PoolAttrs, count_include_pad: bool, out_shape: &[usize]) -> Result<Tensor, OpError> {
    pool(x, p, out_shape, |xs, taps| {
        let sum: f64 = taps.iter().filter_map(|t| t.at).map(|i| xs[i] as f64).sum();
        let count = taps.iter().filter(|t| if count_include_pad { t.in_padded } else { t.at.is_some() }).count();
        // A window with no counted tap (possible only with unusual dilations) averages nothing: 0.
        if count == 0 {
            0.0
        } else {
            (sum / count as f64) as f32
        }
    })
}
