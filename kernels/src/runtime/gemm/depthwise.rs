//! Direct 2-D depthwise convolution: one input channel per group, so each output plane is one input plane
//! correlated with one small filter. Planes run in parallel; within a plane, output rows are outer and taps
//! inner, so a row stays in L1 while every tap adds into it, and along the row each tap is one slice loop over
//! its valid range (no per-element bounds tests). The epilogue runs on each plane as soon as it is done.

use super::epilogue::{self, Op};
use super::im2col::valid_range;
use rayon::prelude::*;

/// Geometry, in elements (`[height, width]` pairs).
pub struct Geometry {
    pub channels: usize,
    pub multiplier: usize,
    pub input: [usize; 2],
    pub kernel: [usize; 2],
    pub output: [usize; 2],
    pub strides: [usize; 2],
    pub pads_begin: [usize; 2],
    pub dilations: [usize; 2],
}

/// `out` holds `batch * channels * multiplier` planes; `base` is the epilogue's flat index of `out[0]`.
pub fn depthwise(x: &[f32], w: &[f32], out: &mut [f32], g: &Geometry, ops: &[Op], base: u64) {
    let [ih, iw] = g.input;
    let [kh, kw] = g.kernel;
    let [oh, ow] = g.output;
    let [sh, sw] = g.strides;
    let (isz, taps, ps) = (ih * iw, kh * kw, oh * ow);
    if ps == 0 {
        return;
    }
    let planes_per_sample = g.channels * g.multiplier;
    // Per kernel column: its valid output column range and input column offset.
    let cols: Vec<(std::ops::Range<usize>, i64)> = (0..kw)
        .map(|j| {
            let off = (j * g.dilations[1]) as i64 - g.pads_begin[1] as i64;
            (valid_range(ow, sw, off, iw), off)
        })
        .collect();
    out.par_chunks_mut(ps).enumerate().for_each(|(p, plane)| {
        let (b, co) = (p / planes_per_sample, p % planes_per_sample);
        let ci = co / g.multiplier;
        let xp = &x[(b * g.channels + ci) * isz..][..isz];
        let wp = &w[co * taps..][..taps];
        for (r, orow) in plane.chunks_mut(ow).enumerate() {
            orow.fill(0.0);
            for i in 0..kh {
                let y = (r * sh + i * g.dilations[0]) as i64 - g.pads_begin[0] as i64;
                if y < 0 || y >= ih as i64 {
                    continue;
                }
                let xrow = &xp[y as usize * iw..][..iw];
                for (j, (range, off)) in cols.iter().enumerate() {
                    if range.is_empty() {
                        continue;
                    }
                    let wv = wp[i * kw + j];
                    let first = (range.start * sw) as i64 + off;
                    let dst = &mut orow[range.clone()];
                    if sw == 1 {
                        let src = &xrow[first as usize..][..dst.len()];
                        for (o, v) in dst.iter_mut().zip(src) {
                            *o += wv * v;
                        }
                    } else {
                        for (k, o) in dst.iter_mut().enumerate() {
                            *o += wv * xrow[first as usize + k * sw];
                        }
                    }
                }
            }
        }
        epilogue::apply(ops, plane, base + (p * ps) as u64);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_direct_loop() {
        let g = Geometry {
            channels: 3,
            multiplier: 2,
            input: [7, 6],
            kernel: [3, 2],
            output: [4, 3],
            strides: [2, 2],
            pads_begin: [1, 0],
            dilations: [1, 2],
        };
        let batch = 2;
        let x: Vec<f32> = (0..batch * 3 * 42).map(|i| (i % 11) as f32 - 5.0).collect();
        let w: Vec<f32> = (0..6 * 6).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect();
        let mut out = vec![f32::NAN; batch * 6 * 12];
        depthwise(&x, &w, &mut out, &g, &[Op::Relu], 0);
        for b in 0..batch {
            for co in 0..6 {
                for r in 0..4 {
                    for c in 0..3 {
                        let mut s = 0f32;
                        for i in 0..3 {
                            for j in 0..2 {
                                let (y, xx) = ((r * 2 + i) as i64 - 1, (c * 2 + j * 2) as i64);
                                if (0..7).contains(&y) && (0..6).contains(&xx) {
                                    s += w[co * 6 + i * 2 + j] * x[(b * 3 + co / 2) * 42 + y as usize * 6 + xx as usize];
                                }
                            }
                        }
                        assert_eq!(out[((b * 6 + co) * 4 + r) * 3 + c], s.max(0.0));
                    }
                }
            }
        }
    }
}
