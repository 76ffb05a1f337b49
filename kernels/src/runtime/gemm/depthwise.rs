//! Direct 2-D depthwise convolution: one input channel per group, so each output plane is one input plane
//! correlated with one small filter. Planes run in parallel, and each plane is computed as a few long
//! contiguous loops rather than one short loop per (output row, tap):
//!
//! 1. A plane is computed in *bands* of output rows sized so that everything a band touches stays in L1.
//!    The input rows a band reads are copied into `stride_h x stride_w` zero-padded *phase planes* (phase
//!    `(a, b)` holds the padded input's rows `a, a + sh, ..` and columns `b, b + sw, ..`), each `pw` columns
//!    wide, where `pw` is the output width plus the widest tap offset. The padding columns are written once
//!    per thread (they are the same for every band), padding rows per band.
//! 2. Then every output row is `pw` wide ("wide" rows): tap `(i, j)` reads one phase plane at a fixed flat
//!    offset, so for the whole band `wide[q] += w[i, j] * phase[offset + q]` over `q < rows * pw`: flat
//!    vector loops (a 3x3 kernel's nine taps in one pass, others three per pass). The `pw - ow` extra
//!    columns of each row read past the row and are dropped.
//! 3. The valid columns are copied into the output plane and the epilogue runs on them while they are in L1.
//!
//! Whole-plane phase planes (before the bands) were L2-bound on large planes: MobileNetV2's 112x112 stride-2
//! layer wrote and re-read 65 KB per plane, and ran at a fifth of ONNX Runtime's speed.
//! The previous loop ran one slice loop per output row and tap: at 7x7 or 14x14 (MobileNetV2's last 13
//! depthwise layers) those loops are shorter than one AVX-512 vector, and stride-2 layers re-split every
//! input row for every output row. The tap loop is compiled for AVX-512, AVX2 and the baseline and chosen at
//! run time (`multiversion`).

use super::epilogue::{self, Op};
use super::im2col::{gather, valid_range};
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

/// Where a band's phase planes and wide rows lie, for one geometry.
struct Layout {
    /// Output rows per band (the last band of a plane may have fewer).
    band: usize,
    /// Rows of each phase plane of a band (`band` plus the tallest tap offset), and its width (also the width
    /// of a wide output row).
    rows: usize,
    pw: usize,
    /// Elements per phase plane: `rows * pw`, plus the widest column offset (the last wide row's extra
    /// columns read that far past the plane).
    plane: usize,
    /// Per tap, row-major over the kernel: its first element in the phase planes.
    taps: Vec<usize>,
}

/// Elements (f32) of one band's phase planes and wide rows together: 16 KiB, half an L1 data cache, so a
/// band's input is split, accumulated and copied out without leaving L1.
const BAND_ELEMS: usize = 4096;

impl Layout {
    /// The layout of bands of at most `band_elems` elements (at least one output row each).
    fn new(g: &Geometry, band_elems: usize) -> Layout {
        let [kh, kw] = g.kernel;
        let [oh, ow] = g.output;
        let [sh, sw] = g.strides;
        let [dh, dw] = g.dilations;
        // Tap (i, j) reads padded row (r + oi) * sh + ph of output row r, with oi = i*dh / sh, ph = i*dh % sh.
        let (max_oi, max_oj) = ((kh - 1) * dh / sh, (kw - 1) * dw / sw);
        let pw = ow + max_oj;
        // Per output row of a band: one row of each phase plane and one wide row.
        let per_row = (sh * sw + 1) * pw;
        let fixed = sh * sw * (max_oi * pw + max_oj);
        let band = (band_elems.saturating_sub(fixed) / per_row).clamp(1, oh.max(1));
        let rows = band + max_oi;
        let plane = rows * pw + max_oj;
        let taps = (0..kh * kw)
            .map(|t| {
                let (i, j) = (t / kw * dh, t % kw * dw);
                ((i % sh) * sw + j % sw) * plane + (i / sh) * pw + j / sw
            })
            .collect();
        Layout { band, rows, pw, plane, taps }
    }

    /// Copies the rows of input plane `xp` that the band of output rows from `r0` reads into its phase
    /// planes; phase rows falling into the top or bottom padding are zeroed (a row that is padding in one
    /// band may have held data in the previous one). The padding columns are never written: they stay 0.
    fn split(&self, xp: &[f32], g: &Geometry, r0: usize, phases: &mut [f32]) {
        let [ih, iw] = g.input;
        let [sh, sw] = g.strides;
        let [pt, pl] = g.pads_begin;
        for (ph, dst) in phases.chunks_exact_mut(self.plane).enumerate() {
            let (a, b) = (ph / sw, ph % sw);
            let cols = valid_range(self.pw, sw, b as i64 - pl as i64, iw);
            // Phase rows of this band, as rows of the whole plane's phase plane: r0 .. r0 + rows.
            let ys = valid_range(r0 + self.rows, sh, a as i64 - pt as i64, ih);
            let ys = ys.start.max(r0)..ys.end.max(r0);
            dst[..(ys.start - r0) * self.pw].fill(0.0);
            dst[(ys.end - r0) * self.pw..self.rows * self.pw].fill(0.0);
            if cols.is_empty() {
                continue;
            }
            // The first valid column's input lies inside the row, so this is not negative.
            let x0 = cols.start * sw + b - pl;
            for y in ys {
                let src = &xp[(y * sh + a - pt) * iw..][..iw];
                gather(&mut dst[(y - r0) * self.pw..][cols.clone()], &src[x0..], sw);
            }
        }
    }
}

/// Output elements per parallel task at least (several small planes per task): 4096.
const MIN_TASK_OUTPUTS: usize = 4096;

/// `out` holds `batch * channels * multiplier` planes; `base` is the epilogue's flat index of `out[0]`.
/// Its planes run on the pool's threads if `parallel`, else all on the calling thread (one image of a batch
/// whose images run side by side).
pub fn depthwise(x: &[f32], w: &[f32], out: &mut [f32], g: &Geometry, ops: &[Op], base: u64, parallel: bool) {
    banded(x, w, out, g, ops, base, BAND_ELEMS, parallel)
}

/// [`depthwise`] in bands of at most `band_elems` elements (tests force many small bands).
#[allow(clippy::too_many_arguments)]
fn banded(x: &[f32], w: &[f32], out: &mut [f32], g: &Geometry, ops: &[Op], base: u64, band_elems: usize, parallel: bool) {
    let [ih, iw] = g.input;
    let [oh, ow] = g.output;
    let (isz, taps, ps) = (ih * iw, g.kernel[0] * g.kernel[1], oh * ow);
    if ps == 0 {
        return;
    }
    let planes_per_sample = g.channels * g.multiplier;
    let l = Layout::new(g, band_elems);
    let phases_len = l.plane * g.strides[0] * g.strides[1];
    // BLOCK elements of slack after each: a band's wide rows are accumulated to the next whole block.
    let init = || (vec![0f32; phases_len + BLOCK], vec![0f32; l.band * l.pw + BLOCK]);
    let plane_fn = |(phases, wide): &mut (Vec<f32>, Vec<f32>), (p, plane): (usize, &mut [f32])| {
        let (b, co) = (p / planes_per_sample, p % planes_per_sample);
        let ci = co / g.multiplier;
        let xp = &x[(b * g.channels + ci) * isz..][..isz];
        for (i, rows) in plane.chunks_mut(l.band * ow).enumerate() {
            let r0 = i * l.band;
            l.split(xp, g, r0, phases);
            let wide = &mut wide[..(rows.len() / ow * l.pw).next_multiple_of(BLOCK)];
            accumulate(&w[co * taps..][..taps], &l.taps, phases, wide);
            for (orow, wrow) in rows.chunks_exact_mut(ow).zip(wide.chunks_exact(l.pw)) {
                orow.copy_from_slice(&wrow[..ow]);
            }
            epilogue::apply_on(ops, rows, base + (p * ps + r0 * ow) as u64, false);
        }
    };
    if parallel {
        out.par_chunks_mut(ps).enumerate().with_min_len(MIN_TASK_OUTPUTS.div_ceil(ps)).for_each_init(init, plane_fn);
    } else {
        let mut bufs = init();
        out.chunks_mut(ps).enumerate().for_each(|item| plane_fn(&mut bufs, item));
    }
}

/// A band's wide rows are accumulated in whole blocks of this many elements, past their end into slack
/// that is dropped with the extra columns: the vector loops then have no remainder. Small planes are all
/// remainder otherwise (7x7: 63 wide elements, under one iteration of the AVX-512 loop, four vectors).
const BLOCK: usize = 64;

/// Flat-index chunk of the wide output accumulated by all taps before the next: 16 KiB (a band's wide rows
/// are at most this long unless a single output row is longer).
const CHUNK: usize = 4096;

/// `wide[q] = sum over taps t of wt[t] * phases[offsets[t] + q]`, by chunks: a long chunk of a 3x3 kernel (all
/// of MobileNetV2's) in one pass, nine loads and one store per element; others three taps per pass.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq+avx512bw", "x86_64+avx2+fma", "aarch64+neon"))]
fn accumulate(wt: &[f32], offsets: &[usize], phases: &[f32], wide: &mut [f32]) {
    for (c, out) in wide.chunks_mut(CHUNK).enumerate() {
        let q0 = c * CHUNK;
        let n = out.len();
        // Measured on MobileNetV2: 10% faster on its 28x28 to 112x112 planes, 30% slower on its 7x7 planes
        // (a 56-element plane leaves nine remainders), hence only on long chunks.
        if let (true, Ok(w), Ok(o)) = (n >= 256, <&[f32; 9]>::try_from(wt), <&[usize; 9]>::try_from(offsets)) {
            let [s0, s1, s2, s3, s4, s5, s6, s7, s8] = o.map(|o| &phases[o + q0..][..n]);
            for q in 0..n {
                out[q] = w[0] * s0[q]
                    + w[1] * s1[q]
                    + w[2] * s2[q]
                    + w[3] * s3[q]
                    + w[4] * s4[q]
                    + w[5] * s5[q]
                    + w[6] * s6[q]
                    + w[7] * s7[q]
                    + w[8] * s8[q];
            }
            continue;
        }
        out.fill(0.0);
        let mut t = 0;
        while t + 3 <= offsets.len() {
            let (w0, w1, w2) = (wt[t], wt[t + 1], wt[t + 2]);
            let s0 = &phases[offsets[t] + q0..][..n];
            let s1 = &phases[offsets[t + 1] + q0..][..n];
            let s2 = &phases[offsets[t + 2] + q0..][..n];
            for q in 0..n {
                out[q] += w0 * s0[q] + w1 * s1[q] + w2 * s2[q];
            }
            t += 3;
        }
        for t in t..offsets.len() {
            let (w0, s0) = (wt[t], &phases[offsets[t] + q0..][..n]);
            for (o, v) in out.iter_mut().zip(s0) {
                *o += w0 * v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition, one output element at a time, then the epilogue.
    fn direct(x: &[f32], w: &[f32], g: &Geometry, batch: usize, ops: &[Op], base: u64) -> Vec<f32> {
        let ([ih, iw], [kh, kw], [oh, ow]) = (g.input, g.kernel, g.output);
        let planes = g.channels * g.multiplier;
        let mut out = vec![0f32; batch * planes * oh * ow];
        for b in 0..batch {
            for co in 0..planes {
                for r in 0..oh {
                    for c in 0..ow {
                        let mut s = 0f64;
                        for i in 0..kh {
                            for j in 0..kw {
                                let y = (r * g.strides[0] + i * g.dilations[0]) as i64 - g.pads_begin[0] as i64;
                                let xx = (c * g.strides[1] + j * g.dilations[1]) as i64 - g.pads_begin[1] as i64;
                                if (0..ih as i64).contains(&y) && (0..iw as i64).contains(&xx) {
                                    let v = x[(b * g.channels + co / g.multiplier) * ih * iw + y as usize * iw + xx as usize];
                                    s += w[co * kh * kw + i * kw + j] as f64 * v as f64;
                                }
                            }
                        }
                        out[((b * planes + co) * oh + r) * ow + c] = s as f32;
                    }
                }
            }
        }
        epilogue::apply_on(ops, &mut out, base, false);
        out
    }

    fn data(len: usize, seed: u32) -> Vec<f32> {
        (0..len).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 16) as f32 / 32768.0 - 1.0).collect()
    }

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
        // Small integers and halves: every sum is exact in f32, whatever the order.
        let x: Vec<f32> = (0..2 * 3 * 42).map(|i| (i % 11) as f32 - 5.0).collect();
        let w: Vec<f32> = (0..6 * 6).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect();
        let mut out = vec![f32::NAN; 2 * 6 * 12];
        for parallel in [true, false] {
            depthwise(&x, &w, &mut out, &g, &[Op::Relu], 0, parallel);
            assert_eq!(out, direct(&x, &w, &g, 2, &[Op::Relu], 0), "parallel {parallel}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// Any geometry (kernel, strides, dilations, pads up to the dilated kernel's extent, multipliers), any
        /// band size (one row per band up to whole planes), and a fused per-channel bias and clip give the
        /// direct loop's result.
        #[test]
        fn random_geometries(
            batch in 1usize..3, channels in 1usize..5, multiplier in 1usize..3,
            input in prop::collection::vec(1usize..32, 2), kernel in prop::collection::vec(1usize..6, 2),
            strides in prop::collection::vec(1usize..4, 2), dilations in prop::collection::vec(1usize..3, 2),
            pads in prop::collection::vec(0usize..5, 4), three_by_three in any::<bool>(),
            band_elems in prop_oneof![Just(BAND_ELEMS), 1usize..400], parallel in any::<bool>(),
        ) {
            // Half the cases are 3x3, which takes the one-pass loop on planes of 256 wide elements and more.
            let kernel = if three_by_three { vec![3, 3] } else { kernel };
            let ext = |d: usize| dilations[d] * (kernel[d] - 1);
            let pads: Vec<usize> = (0..4).map(|i| pads[i].min(ext(i % 2))).collect();
            let span = |d: usize| input[d] + pads[d] + pads[d + 2];
            prop_assume!(span(0) > ext(0) && span(1) > ext(1));
            let out = |d: usize| (span(d) - ext(d) - 1) / strides[d] + 1;
            let g = Geometry {
                channels,
                multiplier,
                input: [input[0], input[1]],
                kernel: [kernel[0], kernel[1]],
                output: [out(0), out(1)],
                strides: [strides[0], strides[1]],
                pads_begin: [pads[0], pads[1]],
                dilations: [dilations[0], dilations[1]],
            };
            let planes = channels * multiplier;
            let x = data(batch * channels * input[0] * input[1], 1);
            let w = data(planes * kernel[0] * kernel[1], 2);
            let bias = data(planes, 3);
            let ops = [Op::Add { src: &bias, inner: (g.output[0] * g.output[1]) as u64 }, Op::Clip { min: -0.5, max: 0.75 }];
            let want = direct(&x, &w, &g, batch, &ops, 0);
            let mut got = vec![f32::NAN; want.len()];
            banded(&x, &w, &mut got, &g, &ops, 0, band_elems, parallel);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                prop_assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "element {}: got {}, want {}", i, a, b);
            }
        }
    }
}
