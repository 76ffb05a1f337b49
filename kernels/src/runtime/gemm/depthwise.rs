//! Direct 2-D depthwise convolution: one input channel per group, so each output plane is one input plane
//! correlated with one small filter. Planes run in parallel; within a plane, output rows are outer and taps
//! inner, so a row stays in L1 while every tap adds into it, and along the row each tap is one contiguous
//! slice loop over its valid range (no per-element bounds tests). With a column stride above 1 the input row
//! is first split into its `stride` phases (every `stride`-th element from each offset), so a tap's inputs
//! are contiguous too and the loop vectorizes (a stride-2 layer otherwise gathers element by element). The
//! plane function is compiled for AVX-512, AVX2 and the baseline and chosen at run time (`multiversion`), so
//! the same binary runs 16 floats wide where the machine can. The epilogue runs on each plane as soon as it
//! is done.

use super::epilogue::{self, Op};
use super::im2col::valid_range;
use multiversion::multiversion;
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

/// One kernel column: its valid output columns, and where its inputs start in the phase-split row
/// (`phase`, then `first` within that phase).
struct Tap {
    range: std::ops::Range<usize>,
    phase: usize,
    first: usize,
}

/// `out` holds `batch * channels * multiplier` planes; `base` is the epilogue's flat index of `out[0]`.
pub fn depthwise(x: &[f32], w: &[f32], out: &mut [f32], g: &Geometry, ops: &[Op], base: u64) {
    let [ih, iw] = g.input;
    let [kh, kw] = g.kernel;
    let [oh, ow] = g.output;
    let sw = g.strides[1];
    let (isz, taps, ps) = (ih * iw, kh * kw, oh * ow);
    if ps == 0 {
        return;
    }
    let planes_per_sample = g.channels * g.multiplier;
    // Per kernel column: its valid output column range and the position of its first input.
    let cols: Vec<Tap> = (0..kw)
        .map(|j| {
            let off = (j * g.dilations[1]) as i64 - g.pads_begin[1] as i64;
            let range = valid_range(ow, sw, off, iw);
            // The first valid output column's input lies inside the row, so this is not negative.
            let at = if range.is_empty() { 0 } else { ((range.start * sw) as i64 + off) as usize };
            Tap { range, phase: at % sw, first: at / sw }
        })
        .collect();
    let phase_len = iw.div_ceil(sw);
    out.par_chunks_mut(ps).enumerate().for_each_init(
        || vec![0f32; phase_len * sw],
        |split, (p, plane)| {
            let (b, co) = (p / planes_per_sample, p % planes_per_sample);
            let ci = co / g.multiplier;
            let xp = &x[(b * g.channels + ci) * isz..][..isz];
            let wp = &w[co * taps..][..taps];
            plane_rows(xp, wp, plane, g, &cols, split);
            epilogue::apply(ops, plane, base + (p * ps) as u64);
        },
    );
}

/// One output plane. `split` holds `stride` phases of `iw.div_ceil(stride)` elements (unused at stride 1).
#[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq+avx512bw", "x86_64+avx2+fma", "aarch64+neon"))]
fn plane_rows(xp: &[f32], wp: &[f32], plane: &mut [f32], g: &Geometry, cols: &[Tap], split: &mut [f32]) {
    let [ih, iw] = g.input;
    let [kh, kw] = g.kernel;
    let ow = g.output[1];
    let [sh, sw] = g.strides;
    let phase_len = iw.div_ceil(sw);
    for (r, orow) in plane.chunks_mut(ow).enumerate() {
        orow.fill(0.0);
        for i in 0..kh {
            let y = (r * sh + i * g.dilations[0]) as i64 - g.pads_begin[0] as i64;
            if y < 0 || y >= ih as i64 {
                continue;
            }
            let xrow = &xp[y as usize * iw..][..iw];
            let src_row: &[f32] = if sw == 1 {
                xrow
            } else {
                for (k, &v) in xrow.iter().enumerate() {
                    split[(k % sw) * phase_len + k / sw] = v;
                }
                split
            };
            for (j, tap) in cols.iter().enumerate() {
                if tap.range.is_empty() {
                    continue;
                }
                let wv = wp[i * kw + j];
                let dst = &mut orow[tap.range.clone()];
                let src = &src_row[tap.phase * phase_len + tap.first..][..dst.len()];
                for (o, v) in dst.iter_mut().zip(src) {
                    *o += wv * v;
                }
            }
        }
    }
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
