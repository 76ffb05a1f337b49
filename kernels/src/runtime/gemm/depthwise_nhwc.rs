//! Direct 2-D depthwise convolution in the channels-last layout (NHWC input and output, one input channel per
//! output channel): each output pixel's channels are one contiguous run, so a block of 16 channels is one
//! vector and a tap is one vector multiply-add, whatever the stride or the plane's size.
//!
//! The channel-first kernel ([`super::depthwise`]) vectorizes along a plane's rows. On MobileNetV2 at batch 1
//! most planes are 7x7 to 28x28, where that kernel spends its time re-laying rows (stride-2 phase planes,
//! padding, copying out): a profile of the 14x14 -> 7x7 stride-2 layer had the row gathers at 3x the
//! multiply-adds. Here nothing is re-laid: a task is one output row of one image (or a slab of its
//! channels), and for each block of channels the filter's taps stay in registers across the row's pixels.
//! Columns whose taps all fall inside the input run without bounds checks; the few border columns check
//! each tap.
//!
//! The row loops are compiled for AVX-512, AVX2 and the baseline and chosen at run time (`multiversion`);
//! 3x3 and 5x5 filters get loops with the taps unrolled, other sizes a generic loop.

use super::depthwise::Geometry;
use super::epilogue::{self, Op};
use multiversion::multiversion;
use rayon::prelude::*;

/// Channels per vector block: an AVX-512 register of f32. A channel count that is not a multiple of it ends
/// with blocks of 8, then single channels.
const LANES: usize = 16;

/// Parallel tasks per thread at least, when rows are few (7x7 planes at batch 1): rows are then cut into
/// slabs of channels too, so two threads do not split 7 rows 4:3.
const TASKS_PER_THREAD: usize = 4;

/// Output elements per parallel task at least, so a task pays for its scheduling.
const MIN_TASK_OUTPUTS: usize = 1024;

/// `out` (NHWC, `images` images) = depthwise convolution of `x` (NHWC) with `w` (OIHW, `[channels, 1, kh, kw]`),
/// then the epilogue; `base` is the epilogue's flat index of `out[0]`. Rows run on the pool's threads if
/// `parallel`, else on the calling thread. `g.multiplier` must be 1.
pub fn depthwise_nhwc(x: &[f32], w: &[f32], out: &mut [f32], g: &Geometry, ops: &[Op], base: u64, parallel: bool) {
    debug_assert_eq!(g.multiplier, 1, "the channels-last kernel has one output channel per input channel");
    let c = g.channels;
    let [oh, ow] = g.output;
    let row = ow * c;
    if row == 0 || oh == 0 {
        return;
    }
    let rows = out.len() / row;
    // The filter tap-major (`[kh * kw, channels]`), so a block's weights for one tap are one contiguous
    // vector: gathered per block and row instead, they took most of a 7x7 layer's time.
    let taps = g.kernel[0] * g.kernel[1];
    let mut wt = vec![0f32; taps * c];
    for (ch, wc) in w.chunks_exact(taps).take(c).enumerate() {
        for (t, &v) in wc.iter().enumerate() {
            wt[t * c + ch] = v;
        }
    }
    let threads = if parallel { rayon::current_num_threads().max(1) } else { 1 };
    // Slabs of whole vector blocks per row, enough for every thread to have a few tasks.
    let blocks = c.div_ceil(LANES);
    let wanted = if threads == 1 { 1 } else { (TASKS_PER_THREAD * threads).div_ceil(rows) };
    let wanted = wanted.min(blocks).min(row / MIN_TASK_OUTPUTS).max(1);
    let slab = blocks.div_ceil(wanted) * LANES;
    let slabs = c.div_ceil(slab);
    let out_ptr = SharedOut(out.as_mut_ptr());
    let task = |t: usize| {
        let (r, s) = (t / slabs, t % slabs);
        let (image, y) = (r / oh, r % oh);
        let channels = s * slab..((s + 1) * slab).min(c);
        let xi = &x[image * g.input[0] * g.input[1] * c..][..g.input[0] * g.input[1] * c];
        // SAFETY: task (r, s) writes only row r's channels `channels` of every pixel: disjoint from every
        // other task's elements, and inside `out`, which outlives the tasks.
        let orow = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(r * row), row) };
        compute_row(xi, &wt, orow, g, y, channels.clone());
        let row_base = base + (r * row) as u64;
        if slabs == 1 {
            epilogue::apply_on(ops, orow, row_base, false);
        } else {
            for p in 0..ow {
                let at = p * c + channels.start;
                epilogue::apply_on(ops, &mut orow[at..at + channels.len()], row_base + at as u64, false);
            }
        }
    };
    let tasks = rows * slabs;
    if threads > 1 && tasks > 1 {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// The output's base pointer, shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: each task derives a slice of elements no other task touches (see `depthwise_nhwc`).
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Output row `y` (all `ow` pixels, channels `channels`) of one image `x` into `orow`; `wt` is the filter
/// tap-major.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq+avx512bw", "x86_64+avx2+fma", "aarch64+neon"))]
fn compute_row(x: &[f32], w: &[f32], orow: &mut [f32], g: &Geometry, y: usize, channels: std::ops::Range<usize>) {
    use multiversion::target::selected_target;
    // Fused multiply-adds where the target has them (a software `fma` call would be far slower), and blocks
    // of 16 channels only where a vector holds them: with 8-wide vectors a 3x3 filter's taps would not fit
    // in the 16 registers.
    const FMA: bool = selected_target!().supports_feature_str("fma");
    const WIDE: bool = selected_target!().supports_feature_str("avx512f");
    let (fma, wide) = (FMA, WIDE);
    // Strides 1 and 2 without dilation (every depthwise layer of the usual networks) get loops with the
    // column step known, so a tap's offset is a constant multiple of the channel count.
    let fast = g.dilations[1] == 1 && matches!(g.strides[1], 1 | 2);
    let mut cb = channels.start;
    while cb < channels.end {
        let left = channels.end - cb;
        let width = if left >= LANES && wide { LANES } else if left >= 8 { 8 } else { 1 };
        let s2 = g.strides[1] == 2;
        match (width, g.kernel, fast, s2) {
            (LANES, [3, 3], true, false) => block::<LANES, 3, 3, 1>(x, w, orow, g, y, cb, fma),
            (LANES, [3, 3], true, true) => block::<LANES, 3, 3, 2>(x, w, orow, g, y, cb, fma),
            (LANES, [5, 5], true, false) => block::<LANES, 5, 5, 1>(x, w, orow, g, y, cb, fma),
            (LANES, [5, 5], true, true) => block::<LANES, 5, 5, 2>(x, w, orow, g, y, cb, fma),
            (8, [3, 3], true, false) => block::<8, 3, 3, 1>(x, w, orow, g, y, cb, fma),
            (8, [3, 3], true, true) => block::<8, 3, 3, 2>(x, w, orow, g, y, cb, fma),
            (8, [5, 5], true, false) => block::<8, 5, 5, 1>(x, w, orow, g, y, cb, fma),
            (8, [5, 5], true, true) => block::<8, 5, 5, 2>(x, w, orow, g, y, cb, fma),
            (LANES, ..) => block_any::<LANES>(x, w, orow, g, y, cb, fma),
            (8, ..) => block_any::<8>(x, w, orow, g, y, cb, fma),
            _ => block_any::<1>(x, w, orow, g, y, cb, fma),
        }
        cb += width;
    }
}

/// The output columns whose every tap lies inside the input row: `lo..hi` (empty when none does).
fn interior(g: &Geometry, kw: usize) -> (usize, usize) {
    let (iw, ow, sw, pl, dw) = (g.input[1], g.output[1], g.strides[1], g.pads_begin[1], g.dilations[1]);
    let lo = pl.div_ceil(sw).min(ow);
    let span = (kw - 1) * dw + 1;
    let hi = if iw + pl >= span { ((iw + pl - span) / sw + 1).min(ow) } else { 0 };
    (lo, hi.max(lo))
}

/// Input row of filter row `i` for output row `y`, if it lies inside the input.
#[inline(always)]
fn input_row(g: &Geometry, y: usize, i: usize) -> Option<usize> {
    let r = (y * g.strides[0] + i * g.dilations[0]).checked_sub(g.pads_begin[0])?;
    (r < g.input[0]).then_some(r)
}

/// `acc += w * v`, lane by lane (fused if `fma`).
#[inline(always)]
fn madd<const L: usize>(acc: &mut [f32; L], w: &[f32; L], v: &[f32; L], fma: bool) {
    for l in 0..L {
        acc[l] = if fma { w[l].mul_add(v[l], acc[l]) } else { acc[l] + w[l] * v[l] };
    }
}

/// Interior output pixels computed together: their accumulators are independent, so the multiply-adds of
/// one tap overlap instead of waiting on each other's latency (one pixel at a time ran at a fifth of the rate).
const GROUP: usize = 4;

/// Input columns of a pixel group at most: `(GROUP - 1) * 2 + 5`, stride 2 and a 5-wide filter.
const MAX_COLS: usize = (GROUP - 1) * 2 + 5;

/// One block of `L` channels from `cb` of output row `y`, for a `KH x KW` filter with column stride `SW` and no
/// column dilation: the taps' weights are loaded once, as `L`-wide vectors, and held across the row.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn block<const L: usize, const KH: usize, const KW: usize, const SW: usize>(x: &[f32], w: &[f32], orow: &mut [f32], g: &Geometry, y: usize, cb: usize, fma: bool) {
    debug_assert!(g.strides[1] == SW && g.dilations[1] == 1);
    let (c, ow) = (g.channels, g.output[1]);
    let wv: [[[f32; L]; KW]; KH] = std::array::from_fn(|i| std::array::from_fn(|j| w[(i * KW + j) * c + cb..][..L].try_into().unwrap()));
    let rows: [Option<usize>; KH] = std::array::from_fn(|i| input_row(g, y, i));
    let (lo, hi) = interior(g, KW);
    // Interior pixels in whole groups (every column a group reads lies inside the input row: no checks), the
    // rest (borders, a last partial group) in groups whose columns outside the row read as zeros.
    let first = lo.next_multiple_of(GROUP).min(hi);
    let mut p = 0;
    while p < ow {
        let interior = p >= first && p + GROUP <= hi;
        let count = GROUP.min(ow - p);
        let acc = if interior { group::<L, KH, KW, SW, false>(x, g, &rows, &wv, p, cb, fma) } else { group::<L, KH, KW, SW, true>(x, g, &rows, &wv, p, cb, fma) };
        for (q, a) in acc.iter().enumerate().take(count) {
            orow[(p + q) * c + cb..][..L].copy_from_slice(a);
        }
        // Pixels up to the first whole interior group go one group at a time from 0: groups may overlap the
        // interior's start, never skip a pixel.
        p += if p < first && p + GROUP > first { first - p } else { count };
    }
}

/// Output pixels `p .. p + GROUP` of one channel block and output row: each input column the group reads is
/// loaded once per filter row and used by every tap that reads it. With `CHECKED`, columns outside the input
/// row (padding, or past a last partial group) are zeros; without, the caller guarantees every column lies
/// inside.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn group<const L: usize, const KH: usize, const KW: usize, const SW: usize, const CHECKED: bool>(
    x: &[f32],
    g: &Geometry,
    rows: &[Option<usize>; KH],
    wv: &[[[f32; L]; KW]; KH],
    p: usize,
    cb: usize,
    fma: bool,
) -> [[f32; L]; GROUP] {
    let (c, iw, pl) = (g.channels, g.input[1], g.pads_begin[1]);
    let cols = (GROUP - 1) * SW + KW;
    debug_assert!(cols <= MAX_COLS);
    let mut acc = [[0f32; L]; GROUP];
    for i in 0..KH {
        let Some(r) = rows[i] else { continue };
        let row = r * iw * c + cb;
        let mut v = [[0f32; L]; MAX_COLS];
        for (t, vt) in v.iter_mut().enumerate().take(cols) {
            if CHECKED {
                if let Some(col) = (p * SW + t).checked_sub(pl).filter(|&col| col < iw) {
                    *vt = x[row + col * c..][..L].try_into().unwrap();
                }
            } else {
                let at = row + (p * SW + t - pl) * c;
                assert!(at + L <= x.len(), "interior columns lie inside the input");
                // SAFETY: just checked; the compiler hoists nothing here that the check does not cover.
                *vt = unsafe { std::ptr::read_unaligned(x.as_ptr().add(at) as *const [f32; L]) };
            }
        }
        for j in 0..KW {
            for (q, a) in acc.iter_mut().enumerate() {
                madd(a, &wv[i][j], &v[q * SW + j], fma);
            }
        }
    }
    acc
}

/// [`block`] for a filter of any size, its weights read per tap.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn block_any<const L: usize>(x: &[f32], w: &[f32], orow: &mut [f32], g: &Geometry, y: usize, cb: usize, fma: bool) {
    let (c, iw, ow) = (g.channels, g.input[1], g.output[1]);
    let ([kh, kw], sw, pl, dw) = (g.kernel, g.strides[1], g.pads_begin[1], g.dilations[1]);
    for p in 0..ow {
        let mut acc = [0f32; L];
        for i in 0..kh {
            let Some(r) = input_row(g, y, i) else { continue };
            for j in 0..kw {
                let Some(col) = (p * sw + j * dw).checked_sub(pl).filter(|&col| col < iw) else { continue };
                let v: &[f32; L] = x[(r * iw + col) * c + cb..][..L].try_into().unwrap();
                madd(&mut acc, w[(i * kw + j) * c + cb..][..L].try_into().unwrap(), v, fma);
            }
        }
        orow[p * c + cb..][..L].copy_from_slice(&acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition, one output element at a time, in NHWC.
    fn direct(x: &[f32], w: &[f32], g: &Geometry, images: usize) -> Vec<f32> {
        let ([ih, iw], [kh, kw], [oh, ow], c) = (g.input, g.kernel, g.output, g.channels);
        let mut out = vec![0f32; images * oh * ow * c];
        for n in 0..images {
            for y in 0..oh {
                for p in 0..ow {
                    for ch in 0..c {
                        let mut acc = 0f32;
                        for i in 0..kh {
                            for j in 0..kw {
                                let r = (y * g.strides[0] + i * g.dilations[0]) as i64 - g.pads_begin[0] as i64;
                                let col = (p * g.strides[1] + j * g.dilations[1]) as i64 - g.pads_begin[1] as i64;
                                if (0..ih as i64).contains(&r) && (0..iw as i64).contains(&col) {
                                    acc += w[ch * kh * kw + i * kw + j] * x[((n * ih + r as usize) * iw + col as usize) * c + ch];
                                }
                            }
                        }
                        out[((n * oh + y) * ow + p) * c + ch] = acc;
                    }
                }
            }
        }
        out
    }

    fn data(len: usize, seed: u32) -> Vec<f32> {
        (0..len).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0).collect()
    }

    fn geometry(c: usize, input: [usize; 2], kernel: [usize; 2], strides: [usize; 2], pads: [usize; 2], dil: [usize; 2]) -> Geometry {
        let out = |d: usize| (input[d] + 2 * pads[d]).saturating_sub((kernel[d] - 1) * dil[d] + 1) / strides[d] + 1;
        Geometry { channels: c, multiplier: 1, input, kernel, output: [out(0), out(1)], strides, pads_begin: pads, dilations: dil }
    }

    fn check(g: &Geometry, images: usize, ops: &[Op], parallel: bool) -> Result<(), TestCaseError> {
        let x = data(images * g.input[0] * g.input[1] * g.channels, 3);
        let w = data(g.channels * g.kernel[0] * g.kernel[1], 7);
        let mut want = direct(&x, &w, g, images);
        epilogue::apply_on(ops, &mut want, 5, false);
        let mut got = vec![f32::NAN; want.len()];
        depthwise_nhwc(&x, &w, &mut got, g, ops, 5, parallel);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            prop_assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "element {i}: {a} vs {b}");
        }
        Ok(())
    }

    #[test]
    fn mobilenet_layers_match_the_definition() {
        let bias: Vec<f32> = (0..96).map(|i| i as f32 * 0.01).collect();
        let ops = [Op::Add { src: &bias, inner: 1 }, Op::Clip { min: 0.0, max: 6.0 }];
        for (c, side, stride) in [(96, 14, 2), (96, 7, 1), (32, 12, 1), (48, 9, 2)] {
            let g = geometry(c, [side, side], [3, 3], [stride; 2], [1, 1], [1, 1]);
            for parallel in [false, true] {
                check(&g, 2, &ops, parallel).unwrap();
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any channel count (vector blocks, blocks of 8, single channels), filter, stride, padding and
        /// dilation, on one thread or the pool, equals the definition.
        #[test]
        fn matches_the_definition(
            c in 1usize..40, ih in 1usize..12, iw in 1usize..12, kh in 1usize..6, kw in 1usize..6,
            sh in 1usize..3, sw in 1usize..3, ph in 0usize..3, pw in 0usize..3, dh in 1usize..3, dw in 1usize..3,
            images in 1usize..3, parallel in any::<bool>(),
        ) {
            let g = geometry(c, [ih, iw], [kh, kw], [sh, sw], [ph, pw], [dh, dw]);
            prop_assume!(ih + 2 * ph >= (kh - 1) * dh + 1 && iw + 2 * pw >= (kw - 1) * dw + 1);
            let scale: Vec<f32> = (0..c).map(|i| 1.0 + i as f32 * 0.1).collect();
            check(&g, images, &[Op::Add { src: &scale, inner: 1 }, Op::Relu], parallel)?;
        }
    }
}


