//! im2col for any number of spatial dimensions: each channel's receptive fields become rows
//! `(channel, kernel tap)` of a dense `[channels * taps, output positions]` matrix. Channels are laid out in
//! parallel; along the last spatial dimension the valid output range of each tap is computed once, so the
//! inner loop is a plain copy (stride 1) or gather, and padding is written as zeros (scratch is reused, never
//! assumed zero).

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

/// Channels per parallel task, so a task has enough work to pay for itself.
const MIN_TASK_ELEMS: usize = 1 << 15;

/// Writes the column matrix of `x` (`channels` planes of shape `w.input`) into `dst`.
pub fn im2col(x: &[f32], channels: usize, w: &Window, dst: &mut [f32]) {
    let isz: usize = w.input.iter().product();
    let taps: usize = w.kernel.iter().product();
    let ps: usize = w.output.iter().product();
    let per_channel = taps * ps;
    if per_channel == 0 || channels == 0 {
        return;
    }
    let group = MIN_TASK_ELEMS.div_ceil(per_channel).max(1);
    dst[..channels * per_channel].par_chunks_mut(per_channel * group).enumerate().for_each(|(t, chunk)| {
        for (j, rows) in chunk.chunks_mut(per_channel).enumerate() {
            let c = t * group + j;
            channel(&x[c * isz..(c + 1) * isz], w, rows);
        }
    });
}

/// The `taps x ps` rows of one channel plane.
fn channel(x: &[f32], w: &Window, rows: &mut [f32]) {
    let nd = w.input.len();
    let last = nd - 1;
    let ps: usize = w.output.iter().product();
    let ow = w.output[last];
    let (s_last, i_last) = (w.strides[last], w.input[last]);
    // Row-major strides of the input plane.
    let mut in_strides = vec![1usize; nd];
    for d in (0..last).rev() {
        in_strides[d] = in_strides[d + 1] * w.input[d + 1];
    }
    let outer = &w.output[..last];
    let mut kp = vec![0usize; nd];
    let mut op = vec![0usize; last];
    for row in rows.chunks_mut(ps.max(1)) {
        let off_last = (kp[last] * w.dilations[last]) as i64 - w.pads_begin[last] as i64;
        let range = valid_range(ow, s_last, off_last, i_last);
        op.iter_mut().for_each(|v| *v = 0);
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
                if s_last == 1 {
                    dst.copy_from_slice(&x[first..first + dst.len()]);
                } else {
                    for (k, o) in dst.iter_mut().enumerate() {
                        *o = x[first + k * s_last];
                    }
                }
            }
            if !next(&mut op, outer) {
                break;
            }
        }
        next(&mut kp, w.kernel);
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
}
