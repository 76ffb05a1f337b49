//! im2col for any number of spatial dimensions: each channel's receptive fields become rows
//! `(channel, kernel tap)` of a dense `[channels * taps, output positions]` matrix, runs of rows laid out in
//! parallel; along the last spatial dimension the valid output range of each tap is computed once, so the
//! inner loop is a plain copy (stride 1) or gather (stride 2 vectorized), and padding is written as zeros
//! (scratch is reused, never assumed zero).

use multiversion::multiversion;
use rayon::prelude::*;

/// Geometry of one sliding window over N spatial dimensions, in elements.
pub struct Window<'a> {
    pub input: &'a [usize],
    pub kernel: &'a [usize],
    pub output: &'a [usize],
    pub strides: &'a [usize],
    pub pads_begin: &'a [usize],
    pub dilations: &'a [usize],
}

/// The output positions `o` in `0..out` whose input coordinate `o * stride + off` lies in `0..size`.
pub fn valid_range(out: usize, stride: usize, off: i64, size: usize) -> std::ops::Range<usize> {
    let s = stride as i64;
    let lo = if off >= 0 { 0 } else { (-off + s - 1) / s };
    let last = size as i64 - 1 - off;
    let hi = if last < 0 { 0 } else { last / s + 1 };
    let lo = lo.clamp(0, out as i64) as usize;
    let hi = hi.clamp(0, out as i64) as usize;
    lo..hi.max(lo)
}

/// Advances a row-major multi-index over `dims`; false after the last one.
fn next(idx: &mut [usize], dims: &[usize]) -> bool {
    for d in (0..dims.len()).rev() {
        idx[d] += 1;
        if idx[d] < dims[d] {
            return true;
        }
        idx[d] = 0;
    }
    false
}

/// Rows `(channel, tap)` per parallel task, so a task has enough work to pay for itself.
const MIN_TASK_ELEMS: usize = 1 << 15;

/// Writes the column matrix of `x` (`channels` planes of shape `w.input`) into `dst`. Tasks are runs of rows
/// `(channel, tap)`, not whole channels: a stem convolution has three channels, which left one of two threads
/// idle half the time.
pub fn im2col(x: &[f32], channels: usize, w: &Window, dst: &mut [f32]) {
    let isz: usize = w.input.iter().product();
    let taps: usize = w.kernel.iter().product();
    let ps: usize = w.output.iter().product();
    if ps == 0 || taps == 0 || channels == 0 {
        return;
    }
    let group = MIN_TASK_ELEMS.div_ceil(ps).max(1);
    dst[..channels * taps * ps].par_chunks_mut(ps * group).enumerate().for_each(|(t, chunk)| {
        let (nd, last) = (w.input.len(), w.input.len() - 1);
        // Row-major strides of the input plane.
        let mut in_strides = vec![1usize; nd];
        for d in (0..last).rev() {
            in_strides[d] = in_strides[d + 1] * w.input[d + 1];
        }
        let mut kp = vec![0usize; nd];
        for (j, row) in chunk.chunks_mut(ps).enumerate() {
            let mut op = vec![0usize; last];
            let r = t * group + j;
            let (c, mut tap) = (r / taps, r % taps);
            for d in (0..nd).rev() {
                kp[d] = tap % w.kernel[d];
                tap /= w.kernel[d];
            }
            tap_row(&x[c * isz..(c + 1) * isz], w, &in_strides, &kp, &mut op, row);
        }
    });
}

/// The columns of output rows `rows` of a 2-D window only (rows of the first output dimension): a dense
/// `[channels * taps, rows.len() * output[1]]` matrix at `dst`, on the calling thread. The blocked
/// convolution builds one such block per task, small enough to stay in cache for the GEMM that reads it.
pub fn im2col_rows(x: &[f32], channels: usize, w: &Window, rows: std::ops::Range<usize>, dst: &mut [f32]) {
    debug_assert_eq!(w.input.len(), 2);
    let (isz, taps) = (w.input[0] * w.input[1], w.kernel[0] * w.kernel[1]);
    let len = rows.len() * w.output[1];
    if len == 0 {
        return;
    }
    let in_strides = [w.input[1], 1];
    for (r, row) in dst[..channels * taps * len].chunks_exact_mut(len).enumerate() {
        let (c, tap) = (r / taps, r % taps);
        let kp = [tap / w.kernel[1], tap % w.kernel[1]];
        tap_row(&x[c * isz..(c + 1) * isz], w, &in_strides, &kp, &mut [rows.start], row);
    }
}

/// The row of kernel tap `kp` over one channel plane `x`: `ps` outputs, in output rows of the last dimension.
/// `op` starts at the outer output index of the row's first element (all zeros for a whole row).
fn tap_row(x: &[f32], w: &Window, in_strides: &[usize], kp: &[usize], op: &mut [usize], row: &mut [f32]) {
    let last = w.input.len() - 1;
    let ow = w.output[last];
    let (s_last, i_last) = (w.strides[last], w.input[last]);
    let off_last = (kp[last] * w.dilations[last]) as i64 - w.pads_begin[last] as i64;
    let range = valid_range(ow, s_last, off_last, i_last);
    let outer = &w.output[..last];
    for seg in row.chunks_mut(ow.max(1)) {
        // The input row this output row reads for this tap, if it is inside the plane.
        let mut base = 0usize;
        let mut inside = true;
        for d in 0..last {
            let i = (op[d] * w.strides[d] + kp[d] * w.dilations[d]) as i64 - w.pads_begin[d] as i64;
            if i < 0 || i >= w.input[d] as i64 {
                inside = false;
                break;
            }
            base += i as usize * in_strides[d];
        }
        if !inside || range.is_empty() {
            seg.fill(0.0);
        } else {
            seg[..range.start].fill(0.0);
            seg[range.end..].fill(0.0);
            // First input element read: base + range.start * s_last + off_last (non-negative by the range).
            let first = (base as i64 + (range.start * s_last) as i64 + off_last) as usize;
            let dst = &mut seg[range.clone()];
            gather(dst, &x[first..], s_last);
        }
        if !next(op, outer) {
            break;
        }
    }
}

/// `dst[i] = src[i * stride]`. Stride 2 (every stride-2 layer) is its own loop over pairs, which LLVM
/// vectorizes as wide loads and permutes; an iterator's `step_by` stays one element at a time.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq+avx512bw", "x86_64+avx2+fma", "aarch64+neon"))]
pub(super) fn gather(dst: &mut [f32], src: &[f32], stride: usize) {
    match stride {
        1 => dst.copy_from_slice(&src[..dst.len()]),
        2 => {
            // Blocks of 16 outputs from 32 inputs, fixed sizes: LLVM turns each into wide loads and a permute.
            // A loop over `src[2 * i]` kept a bounds check per element and one scalar store per element.
            // Whole blocks only where all 32 inputs exist: the last output needs just one of its pair.
            let blocks = (dst.len() / 16).min(src.len() / 32);
            for (o, s) in dst.chunks_exact_mut(16).zip(src.chunks_exact(32)) {
                let (o, s): (&mut [f32; 16], &[f32; 32]) = (o.try_into().unwrap(), s.try_into().unwrap());
                for i in 0..16 {
                    o[i] = s[2 * i];
                }
            }
            // The rest (all of a row shorter than 16, e.g. ResNet-50's 7- and 14-wide rows) one at a time.
            let (dst, src) = (&mut dst[16 * blocks..], &src[32 * blocks..]);
            if let Some(last) = dst.len().checked_sub(1) {
                let src = &src[..2 * last + 1];
                for (i, o) in dst.iter_mut().enumerate() {
                    *o = src[2 * i];
                }
            }
        }
        _ => dst.iter_mut().zip(src.iter().step_by(stride)).for_each(|(o, v)| *o = *v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, one element at a time.
    fn naive(x: &[f32], channels: usize, w: &Window) -> Vec<f32> {
        let nd = w.input.len();
        let isz: usize = w.input.iter().product();
        let taps: usize = w.kernel.iter().product();
        let ps: usize = w.output.iter().product();
        let mut out = vec![f32::NAN; channels * taps * ps];
        for c in 0..channels {
            let mut kp = vec![0; nd];
            for t in 0..taps {
                let mut op = vec![0; nd];
                for p in 0..ps {
                    let mut at = 0i64;
                    let mut inside = true;
                    for d in 0..nd {
                        let i = (op[d] * w.strides[d] + kp[d] * w.dilations[d]) as i64 - w.pads_begin[d] as i64;
                        inside &= i >= 0 && i < w.input[d] as i64;
                        at = at * w.input[d] as i64 + i;
                    }
                    out[(c * taps + t) * ps + p] = if inside { x[c * isz + at as usize] } else { 0.0 };
                    next(&mut op, w.output);
                }
                next(&mut kp, w.kernel);
            }
        }
        out
    }

    /// Every length around the 16-output blocks, with the source exactly as long as the last output needs
    /// (where the stride-2 blocks must stop one short) and longer.
    #[test]
    fn gather_matches_the_definition() {
        for stride in 1usize..4 {
            for n in 0..70 {
                for extra in [0usize, 1, 40] {
                    let src: Vec<f32> = (0..(n * stride + extra).saturating_sub(stride - 1)).map(|i| i as f32).collect();
                    if n > 0 && src.len() < (n - 1) * stride + 1 {
                        continue;
                    }
                    let mut dst = vec![f32::NAN; n];
                    gather(&mut dst, &src, stride);
                    let want: Vec<f32> = (0..n).map(|i| (i * stride) as f32).collect();
                    assert_eq!(dst, want, "stride {stride}, {n} outputs, {} inputs", src.len());
                }
            }
        }
    }

    #[test]
    fn matches_the_definition_in_1d_2d_3d() {
        // input, kernel, strides, pads_begin, dilations (output: pads_end = pads_begin + 1)
        type Case = (Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>);
        let cases: Vec<Case> = vec![
            (vec![7], vec![3], vec![2], vec![1], vec![1]),
            (vec![5, 6], vec![3, 2], vec![1, 1], vec![1, 0], vec![1, 2]),
            (vec![6, 5], vec![3, 3], vec![2, 3], vec![2, 1], vec![2, 1]),
            (vec![3, 4, 5], vec![2, 3, 2], vec![1, 2, 1], vec![0, 1, 1], vec![1, 1, 2]),
        ];
        for (input, kernel, strides, pads, dil) in cases {
            let output: Vec<usize> = (0..input.len())
                .map(|d| (input[d] + 2 * pads[d] + 1 - dil[d] * (kernel[d] - 1) - 1) / strides[d] + 1)
                .collect();
            let w = Window { input: &input, kernel: &kernel, output: &output, strides: &strides, pads_begin: &pads, dilations: &dil };
            let channels = 3;
            let isz: usize = input.iter().product();
            let x: Vec<f32> = (0..channels * isz).map(|i| i as f32 + 1.0).collect();
            let want = naive(&x, channels, &w);
            let mut got = vec![f32::NAN; want.len()];
            im2col(&x, channels, &w, &mut got);
            assert_eq!(got, want, "input {input:?} kernel {kernel:?}");
        }
    }

    /// Outputs large enough for several tasks, whose runs of rows cross channels (4 rows per task, 9 per
    /// channel), at stride 2 and 1.
    /// Blocks of output rows, stacked per row, are the whole matrix's columns (padding, stride 2, one row).
    #[test]
    fn blocks_of_rows_match_the_whole_matrix() {
        for (input, kernel, stride, pad) in [([9usize, 7usize], [3usize, 3usize], 2usize, 1usize), ([6, 8], [3, 2], 1, 0), ([5, 5], [7, 7], 1, 3)] {
            let output = [(input[0] + 2 * pad - kernel[0]) / stride + 1, (input[1] + 2 * pad - kernel[1]) / stride + 1];
            let w = Window { input: &input, kernel: &kernel, output: &output, strides: &[stride; 2], pads_begin: &[pad; 2], dilations: &[1, 1] };
            let channels = 3;
            let x: Vec<f32> = (0..channels * input[0] * input[1]).map(|i| i as f32 + 1.0).collect();
            let rows_k = channels * kernel[0] * kernel[1];
            let ps = output[0] * output[1];
            let whole = naive(&x, channels, &w);
            for block in 1..=output[0] {
                for r0 in (0..output[0]).step_by(block) {
                    let r1 = (r0 + block).min(output[0]);
                    let nb = (r1 - r0) * output[1];
                    let mut got = vec![f32::NAN; rows_k * nb];
                    im2col_rows(&x, channels, &w, r0..r1, &mut got);
                    for k in 0..rows_k {
                        assert_eq!(&got[k * nb..(k + 1) * nb], &whole[k * ps + r0 * output[1]..k * ps + r1 * output[1]], "rows {r0}..{r1}, row {k}");
                    }
                }
            }
        }
    }

    #[test]
    fn tasks_of_rows_across_channels_match_the_definition() {
        for stride in [2, 1] {
            let (input, kernel, pads, dil) = ([130usize, 260], [3usize, 3], [1usize, 1], [1usize, 1]);
            let output: Vec<usize> = (0..2).map(|d| (input[d] + 2 * pads[d] - dil[d] * (kernel[d] - 1) - 1) / stride + 1).collect();
            let strides = [stride; 2];
            let w = Window { input: &input, kernel: &kernel, output: &output, strides: &strides, pads_begin: &pads, dilations: &dil };
            let channels = 3;
            let x: Vec<f32> = (0..channels * input[0] * input[1]).map(|i| (i % 1013) as f32 - 7.0).collect();
            let want = naive(&x, channels, &w);
            let mut got = vec![f32::NAN; want.len()];
            im2col(&x, channels, &w, &mut got);
            assert!(got == want, "stride {stride}");
        }
    }
}
