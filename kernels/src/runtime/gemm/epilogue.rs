//! Epilogues: the elementwise ops fused into a GEMM or depthwise step, applied to its output in one pass while
//! it is hot: the output is cut into L1-sized tiles and every op runs over a tile before the next tile (tiles
//! run in parallel on large outputs; each element depends only on itself, so the result does not depend on
//! the thread count).
//!
//! Each op computes what the reference interpreter computes for the IR op it was fused from: Relu, Clip and
//! Add in f32 exactly, HardSwish in f64 rounded once, and Sigmoid and GELU in branch-free f32 ([`super::fmath`],
//! the `c` backend's formulas: within a few ulps of the reference), so their loops vectorize. A tile's ops are
//! compiled for AVX-512, AVX2 and the baseline and chosen at run time (`multiversion`).

use super::fmath;
use multiversion::multiversion;
use rayon::prelude::*;

/// One epilogue op, with its operand resolved to a slice.
#[derive(Clone, Copy, Debug)]
pub enum Op<'a> {
    /// `out[i] += src[((base + i) / inner) % src.len()]`.
    Add { src: &'a [f32], inner: u64 },
    Relu,
    Clip { min: f32, max: f32 },
    GeluErf,
    GeluTanh,
    Sigmoid,
    HardSwish,
}

/// Elements per tile: 16 KiB, a third of a typical L1 data cache.
const TILE: usize = 4096;
/// Outputs at least this large are processed by several threads.
const PARALLEL_MIN: usize = 1 << 16;

/// Applies `ops` in order to `out`, whose first element has flat index `base` in the fused tensor; large
/// outputs on the pool's threads if `parallel`, else on the calling thread.
pub fn apply_on(ops: &[Op], out: &mut [f32], base: u64, parallel: bool) {
    if ops.is_empty() {
        return;
    }
    if parallel && out.len() >= PARALLEL_MIN {
        out.par_chunks_mut(TILE).enumerate().for_each(|(t, tile)| apply_tile(ops, tile, base + (t * TILE) as u64));
    } else {
        for (t, tile) in out.chunks_mut(TILE).enumerate() {
            apply_tile(ops, tile, base + (t * TILE) as u64);
        }
    }
}

#[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq+avx512bw", "x86_64+avx2+fma", "aarch64+neon"))]
fn apply_tile(ops: &[Op], out: &mut [f32], base: u64) {
    for op in ops {
        match *op {
            Op::Add { src, inner } => add_broadcast(out, src, base, inner),
            // `a < 0` is false for NaN, so NaN passes through, as in the interpreter.
            Op::Relu => out.iter_mut().for_each(|a| *a = if *a < 0.0 { 0.0 } else { *a }),
            Op::Clip { min, max } => out.iter_mut().for_each(|a| {
                if !a.is_nan() {
                    *a = a.max(min).min(max)
                }
            }),
            Op::GeluErf => out.iter_mut().for_each(|a| *a = fmath::gelu_erf(*a)),
            Op::GeluTanh => out.iter_mut().for_each(|a| *a = fmath::gelu_tanh(*a)),
            Op::Sigmoid => out.iter_mut().for_each(|a| *a = fmath::sigmoid(*a)),
            Op::HardSwish => map_f64(out, |a| if a.is_nan() { a } else { a * (a / 6.0 + 0.5).clamp(0.0, 1.0) }),
        }
    }
}

fn map_f64(out: &mut [f32], f: impl Fn(f64) -> f64) {
    for a in out {
        *a = f(*a as f64) as f32;
    }
}

/// `out[i] += src[((base + i) / inner) % src.len()]`, in runs where the source index is constant
/// (`inner > 1`) or consecutive (`inner == 1`), so the inner loops are plain slice loops. The source index
/// and the position within a run of `inner` are carried from run to run: one division per call, not per run
/// (a channels-last bias over 16 channels is a run every 16 elements, and a 64-bit division per run cost
/// more than the adds). Inlined into each of `apply_tile`'s versions: as a function of its own it was
/// compiled for the baseline only (5% of MobileNetV2's time in a profile).
#[inline(always)]
fn add_broadcast(out: &mut [f32], src: &[f32], base: u64, inner: u64) {
    let count = src.len();
    let mut idx = ((base / inner) % count as u64) as usize;
    let mut pos = base % inner;
    let mut i = 0;
    while i < out.len() {
        let left = out.len() - i;
        if inner == 1 {
            let run = left.min(count - idx);
            for (o, s) in out[i..i + run].iter_mut().zip(&src[idx..idx + run]) {
                *o += *s;
            }
            i += run;
            idx += run;
        } else {
            let run = left.min((inner - pos) as usize);
            let v = src[idx];
            out[i..i + run].iter_mut().for_each(|o| *o += v);
            i += run;
            pos += run as u64;
            if pos == inner {
                pos = 0;
                idx += 1;
            }
        }
        if idx == count {
            idx = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The run-based broadcast add equals the per-element formula, whatever the base, split and tiling.
        #[test]
        fn add_broadcast_matches_the_formula(
            count in 1usize..9, inner in 1u64..6, base in 0u64..200, len in 0usize..300, split in 0usize..300
        ) {
            let src: Vec<f32> = (0..count).map(|i| i as f32 * 10.0).collect();
            let mut out = vec![0.5f32; len];
            let split = split.min(len);
            let (a, b) = out.split_at_mut(split);
            apply_on(&[Op::Add { src: &src, inner }], a, base, true);
            apply_on(&[Op::Add { src: &src, inner }], b, base + split as u64, true);
            for (i, v) in out.iter().enumerate() {
                let want = 0.5 + src[(((base + i as u64) / inner) % count as u64) as usize];
                prop_assert_eq!(*v, want, "element {}", i);
            }
        }
    }

    #[test]
    fn parallel_tiles_give_the_same_result() {
        let src: Vec<f32> = (0..7).map(|i| i as f32).collect();
        let input: Vec<f32> = (0..(PARALLEL_MIN + 123)).map(|i| (i % 97) as f32 / 13.0 - 3.0).collect();
        let ops = [Op::Add { src: &src, inner: 3 }, Op::GeluErf, Op::Clip { min: -0.1, max: 2.5 }];
        let mut par = input.clone();
        apply_on(&ops, &mut par, 5, true);
        let mut seq = input.clone();
        for (t, tile) in seq.chunks_mut(1000).enumerate() {
            apply_on(&ops, tile, 5 + t as u64 * 1000, true);
        }
        assert_eq!(par, seq);
        let mut one_thread = input.clone();
        apply_on(&ops, &mut one_thread, 5, false);
        assert_eq!(par, one_thread);
    }

    #[test]
    fn nan_passes_through_relu_clip_and_hardswish() {
        let mut v = [f32::NAN, -1.0, 7.0];
        apply_on(&[Op::Relu], &mut v, 0, true);
        assert!(v[0].is_nan() && v[1] == 0.0 && v[2] == 7.0);
        apply_on(&[Op::Clip { min: 0.0, max: 6.0 }, Op::HardSwish], &mut v, 0, true);
        assert!(v[0].is_nan() && v[1] == 0.0 && v[2] == 6.0);
    }
}
