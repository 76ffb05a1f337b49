//! Conv and ConvTranspose for any number of spatial dimensions, as GEMMs per (batch, group).
//!
//! Conv: im2col lays each group's receptive fields out as a [C/g · prod(kernel), prod(out)] matrix and
//! the weights [M/g, C/g · prod(kernel)] multiply it (a 1x1, stride-1, unpadded conv multiplies the input
//! in place). ConvTranspose: Wᵀ · X gives every (output channel, kernel tap, input position) product, and
//! col2im scatters them into the output, summing in f64.

use super::layout::{contiguous_strides, for_each_index};
use super::linalg::{sgemm, Mat};
use super::view::{floats, from_floats};
use super::{par, OpError};
use crate::ir::{ConvAttrs, ConvTransposeAttrs, Tensor};
use rayon::prelude::*;

/// The output positions `o` in `0..out` whose input coordinate `o * stride + off` lies in `0..size`.
fn valid_range(out: usize, stride: usize, off: i64, size: usize) -> std::ops::Range<usize> {
    let s = stride as i64;
    // o >= ceil(-off / s)
    let lo = if off >= 0 { 0 } else { (-off + s - 1) / s };
    // o <= floor((size - 1 - off) / s)
    let last = size as i64 - 1 - off;
    let hi = if last < 0 { 0 } else { last / s + 1 };
    let lo = lo.clamp(0, out as i64) as usize;
    let hi = hi.clamp(0, out as i64) as usize;
    lo..hi.max(lo)
}

/// Geometry of one sliding-window op over N spatial dims.
pub(super) struct Window<'a> {
    pub input: &'a [usize],
    pub output: &'a [usize],
    pub kernel: &'a [usize],
    pub strides: &'a [usize],
    pub pads_begin: &'a [usize],
    pub dilations: &'a [usize],
}

/// im2col of `channels` consecutive channel planes of `x` starting at `x_off`: row (c, kernel tap),
/// column (output position); taps falling in the padding stay 0.
fn im2col(x: &[f32], x_off: usize, channels: usize, w: &Window) -> Vec<f32> {
    let ps: usize = w.output.iter().product();
    let kk: usize = w.kernel.iter().product();
    let isz: usize = w.input.iter().product();
    let nd = w.input.len();
    let last = nd - 1;
    let in_strides = contiguous_strides(w.input);
    let mut cols = vec![0f32; channels * kk * ps];
    // One channel's kk rows per chunk, in parallel where large.
    par::chunks_mut(&mut cols, kk * ps, |c, cols| {
        let mut row = 0;
        let xc = (x_off + c * isz) as isize;
        for_each_index(w.kernel, |kp| {
            let dst = &mut cols[row * ps..(row + 1) * ps];
            let off_last = (kp[last] * w.dilations[last]) as i64 - w.pads_begin[last] as i64;
            let (ow, s_last) = (w.output[last], w.strides[last]);
            let range = valid_range(ow, s_last, off_last, w.input[last]);
            let mut col = 0;
            for_each_index(&w.output[..last], |op| {
                let mut base = xc;
                let mut inside = true;
                for d in 0..last {
                    let i = (op[d] * w.strides[d] + kp[d] * w.dilations[d]) as i64 - w.pads_begin[d] as i64;
                    if i < 0 || i >= w.input[d] as i64 {
                        inside = false;
                        break;
                    }
                    base += i as isize * in_strides[d];
                }
                if inside {
                    for o in range.clone() {
                        dst[col + o] = x[(base + (o * s_last) as isize + off_last as isize) as usize];
                    }
                }
                col += ow;
            });
            row += 1;
        });
    });
    cols
}

pub(super) fn conv(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, a: &ConvAttrs, out_shape: &[usize]) -> Result<Tensor, OpError> {
    let (xv, wv) = (floats(x), floats(w));
    let nd = x.shape().len() - 2;
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let m = w.shape()[0];
    let g = a.group;
    let (cg, mg) = (c / g, m / g);
    let kernel = &w.shape()[2..];
    let kk: usize = kernel.iter().product();
    let isz: usize = x.shape()[2..].iter().product();
    let ps: usize = out_shape[2..].iter().product();
    let win = Window {
        input: &x.shape()[2..],
        output: &out_shape[2..],
        kernel,
        strides: &a.strides,
        pads_begin: &a.pads[..nd],
        dilations: &a.dilations,
    };
    let pointwise = kk == 1 && a.strides.iter().all(|&s| s == 1) && a.pads.iter().all(|&p| p == 0);
    let mut out = vec![0f32; n * m * ps];
    let bv = bias.map(floats);
    let beta = if bv.is_some() { 1.0 } else { 0.0 };
    // One task per (batch, group): its output channels' planes, bias first, then its GEMM (which may split
    // further); tasks in parallel where there are several and enough work.
    let task = |t: usize, out: &mut [f32]| {
        let (b, gi) = (t / g, t % g);
        if let Some(bv) = &bv {
            for (j, plane) in out.chunks_exact_mut(ps).enumerate() {
                plane.fill(bv[gi * mg + j]);
            }
        }
        let x_off = (b * c + gi * cg) * isz;
        let wm = Mat::row_major(&wv, gi * mg * cg * kk, cg * kk);
        if pointwise {
            sgemm(mg, cg, ps, wm, Mat::row_major(&xv, x_off, isz), beta, out, 0);
        } else {
            let cols = im2col(&xv, x_off, cg, &win);
            sgemm(mg, cg * kk, ps, wm, Mat::row_major(&cols, 0, ps), beta, out, 0);
        }
    };
    let per = mg * ps;
    if per > 0 {
        let work = per * cg * kk;
        if n * g > 1 && par::worth(work.saturating_mul(n * g) / 64) {
            out.par_chunks_mut(per).with_min_len((4 * par::GRAIN).div_ceil(work.max(1))).enumerate().for_each(|(t, o)| task(t, o));
        } else {
            out.chunks_mut(per).enumerate().for_each(|(t, o)| task(t, o));
        }
    }
    from_floats(x.dtype(), out_shape, &out)
}

pub(super) fn conv_transpose(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    a: &ConvTransposeAttrs,
    out_shape: &[usize],
) -> Result<Tensor, OpError> {
    let (xv, wv) = (floats(x), floats(w));
    let nd = x.shape().len() - 2;
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let g = a.group;
    let cg = c / g;
    let mg = w.shape()[1];
    let m = mg * g;
    let kernel = &w.shape()[2..];
    let kk: usize = kernel.iter().product();
    let in_sp = &x.shape()[2..];
    let out_sp = &out_shape[2..];
    let isz: usize = in_sp.iter().product();
    let osz: usize = out_sp.iter().product();
    let out_strides = contiguous_strides(out_sp);
    let mut acc = vec![0f64; n * m * osz];
    let mut cols = vec![0f32; mg * kk * isz];
    for b in 0..n {
        for gi in 0..g {
            // cols [mg*kk, isz] = W_gᵀ · X_g, with W_g [cg, mg*kk] read transposed through its strides.
            let wt = Mat { data: &wv, offset: gi * cg * mg * kk, rs: 1, cs: mg * kk };
            let xm = Mat::row_major(&xv, (b * c + gi * cg) * isz, isz);
            sgemm(mg * kk, cg, isz, wt, xm, 0.0, &mut cols, 0);
            let mut row = 0;
            for co in 0..mg {
                let plane = (b * m + gi * mg + co) * osz;
                for_each_index(kernel, |kp| {
                    let mut i = 0;
                    for_each_index(in_sp, |ip| {
                        let mut at = 0isize;
                        let mut inside = true;
                        for d in 0..nd {
                            let o = (ip[d] * a.strides[d] + kp[d] * a.dilations[d]) as i64 - a.pads[d] as i64;
                            if o < 0 || o >= out_sp[d] as i64 {
                                inside = false;
                                break;
                            }
                            at += o as isize * out_strides[d];
                        }
                        if inside {
                            acc[plane + at as usize] += cols[row * isz + i] as f64;
                        }
                        i += 1;
                    });
                    row += 1;
                });
            }
        }
    }
    if let Some(bias) = bias {
        let bv = floats(bias);
        for (i, plane) in acc.chunks_exact_mut(osz.max(1)).enumerate().take(n * m) {
            for v in plane {
                *v += bv[i % m] as f64;
            }
        }
    }
    let out: Vec<f32> = acc.into_iter().map(|v| v as f32).collect();
    from_floats(x.dtype(), out_shape, &out)
}
