//! Epilogues: the elementwise ops fused into a GEMM or depthwise step, applied to its output in one pass while
//! it is hot: the output is cut into L1-sized tiles and every op runs over a tile before the next tile (tiles
//! run in parallel on large outputs; each element depends only on itself, so the result does not depend on
//! the thread count).
//!
//! Each op computes what the reference interpreter computes for the IR op it was fused from: Relu, Clip and
//! Add in f32 exactly, and the transcendental ones (Sigmoid, GELU, HardSwish) in f64 rounded once to f32.
//! GELU uses an erfc fit of fractional error below 1.2e-7 instead of libm's `erf` (see [`gelu_erf`]), so it
//! agrees with the reference to an ulp or two rather than to the last bit.

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

/// Applies `ops` in order to `out`, whose first element has flat index `base` in the fused tensor.
pub fn apply(ops: &[Op], out: &mut [f32], base: u64) {
    if ops.is_empty() {
        return;
    }
    if out.len() >= PARALLEL_MIN {
        out.par_chunks_mut(TILE).enumerate().for_each(|(t, tile)| apply_tile(ops, tile, base + (t * TILE) as u64));
    } else {
        for (t, tile) in out.chunks_mut(TILE).enumerate() {
            apply_tile(ops, tile, base + (t * TILE) as u64);
        }
    }
}

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
            Op::GeluErf => map_f64(out, gelu_erf),
            Op::GeluTanh => map_f64(out, gelu_tanh),
            Op::Sigmoid => map_f64(out, |a| 1.0 / (1.0 + (-a).exp())),
            Op::HardSwish => map_f64(out, |a| if a.is_nan() { a } else { a * (a / 6.0 + 0.5).clamp(0.0, 1.0) }),
        }
    }
}

fn map_f64(out: &mut [f32], f: impl Fn(f64) -> f64) {
    for a in out {
        *a = f(*a as f64) as f32;
    }
}

/// GELU, erf form, at a cost that does not depend on `a` (the C backend's `tsr_gelu_erf`, same formula:
/// Numerical Recipes' erfc fit, fractional error below 1.2e-7, one `exp`). libm's `erf` branches on the
/// magnitude (no `exp` below 0.84, two above), so a fused MatMul+GELU measured on random inputs, whose
/// products are large, cost twice what it costs on a model's small activations, and the partitioner's
/// measurements misled it.
pub fn gelu_erf(a: f64) -> f64 {
    let z = a.abs() * std::f64::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = -1.26551223
        + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    let half_erfc = 0.5 * t * (p - z * z).exp();
    a * if a >= 0.0 { 1.0 - half_erfc } else { half_erfc }
}

pub fn gelu_tanh(a: f64) -> f64 {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * a * (1.0 + (k * (a + 0.044715 * a * a * a)).tanh())
}

/// `out[i] += src[((base + i) / inner) % src.len()]`, in runs where the source index is constant
/// (`inner > 1`) or consecutive (`inner == 1`), so the inner loops are plain slice loops.
fn add_broadcast(out: &mut [f32], src: &[f32], base: u64, inner: u64) {
    let count = src.len() as u64;
    let mut flat = base;
    let mut i = 0;
    while i < out.len() {
        let idx = ((flat / inner) % count) as usize;
        let left = out.len() - i;
        let run = if inner == 1 {
            let run = left.min(src.len() - idx);
            for (o, s) in out[i..i + run].iter_mut().zip(&src[idx..idx + run]) {
                *o += *s;
            }
            run
        } else {
            let run = left.min((inner - flat % inner) as usize);
            let v = src[idx];
            out[i..i + run].iter_mut().for_each(|o| *o += v);
            run
        };
        i += run;
        flat += run as u64;
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
            apply(&[Op::Add { src: &src, inner }], a, base);
            apply(&[Op::Add { src: &src, inner }], b, base + split as u64);
            for (i, v) in out.iter().enumerate() {
                let want = 0.5 + src[(((base + i as u64) / inner) % count as u64) as usize];
                prop_assert_eq!(*v, want, "element {}", i);
            }
        }
    }

    /// The data-independent GELU stays within 2e-7 relative of x * erfc(-x/sqrt2) / 2 (libm's erfc: accurate
    /// where 1 + erf cancels) on a dense grid of [-20, 20], and keeps NaN and infinities.
    #[test]
    fn gelu_fit_matches_the_exact_erf_form() {
        let exact = |a: f64| 0.5 * a * libm::erfc(-a * std::f64::consts::FRAC_1_SQRT_2);
        let mut worst = 0.0f64;
        for i in -200_000..=200_000 {
            let a = i as f64 * 1e-4;
            let (e, g) = (exact(a), gelu_erf(a));
            if e != 0.0 {
                worst = worst.max(((g - e) / e).abs());
            }
        }
        assert!(worst < 2e-7, "worst relative error {worst:e}");
        assert!(gelu_erf(f64::NAN).is_nan());
        assert_eq!(gelu_erf(f64::INFINITY), f64::INFINITY);
    }

    #[test]
    fn parallel_tiles_give_the_same_result() {
        let src: Vec<f32> = (0..7).map(|i| i as f32).collect();
        let input: Vec<f32> = (0..(PARALLEL_MIN + 123)).map(|i| (i % 97) as f32 / 13.0 - 3.0).collect();
        let ops = [Op::Add { src: &src, inner: 3 }, Op::GeluErf, Op::Clip { min: -0.1, max: 2.5 }];
        let mut par = input.clone();
        apply(&ops, &mut par, 5);
        let mut seq = input.clone();
        for (t, tile) in seq.chunks_mut(1000).enumerate() {
            apply(&ops, tile, 5 + t as u64 * 1000);
        }
        assert_eq!(par, seq);
    }

    #[test]
    fn nan_passes_through_relu_clip_and_hardswish() {
        let mut v = [f32::NAN, -1.0, 7.0];
        apply(&[Op::Relu], &mut v, 0);
        assert!(v[0].is_nan() && v[1] == 0.0 && v[2] == 7.0);
        apply(&[Op::Clip { min: 0.0, max: 6.0 }, Op::HardSwish], &mut v, 0);
        assert!(v[0].is_nan() && v[1] == 0.0 && v[2] == 6.0);
    }
}
