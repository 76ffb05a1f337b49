//! One-row GEMMs (`m = 1`: a classifier or LM head at batch 1) as matrix-vector products.
//!
//! The gemm crate packs B before multiplying, which for one row of A doubles the bytes a call moves:
//! MobileNetV2's classifier (1 x 1000 x 1280, 5 MB of weights) took 190-220 us on two EPYC cores where ONNX
//! Runtime takes 86. Here B is read once, in place: columns of B that are contiguous (a transposed weight, the
//! usual case) are dot products with four independent accumulators, so the multiply-adds do not wait on each
//! other; rows of B that are contiguous are scaled and added four rows at a time into the output, which
//! stays in L1.
//!
//! The loops are compiled for AVX-512, AVX2 and the baseline and chosen at run time (`multiversion`).

use multiversion::multiversion;

/// `c[j] = sum_p a[p * a_step] * b[p * b_rs + j * b_cs]` for `j < c.len()`, with `k` terms; one of `b_rs`,
/// `b_cs` is 1.
///
/// # Safety
/// `a` holds `k` elements at that step and `b` every element named, all live while this runs.
pub unsafe fn gemv(c: &mut [f32], k: usize, a: *const f32, a_step: isize, b: *const f32, b_rs: isize, b_cs: isize) {
    // A's row, contiguous (it is one row of an activation: usually already so).
    let row: Vec<f32> = (0..k).map(|p| *a.offset(p as isize * a_step)).collect();
    if b_rs == 1 {
        for (j, out) in c.iter_mut().enumerate() {
            *out = dot(&row, std::slice::from_raw_parts(b.offset(j as isize * b_cs), k));
        }
    } else {
        debug_assert_eq!(b_cs, 1);
        c.fill(0.0);
        let n = c.len();
        let rows = |p: usize| std::slice::from_raw_parts(b.offset(p as isize * b_rs), n);
        let mut p = 0;
        while p + 4 <= k {
            axpy4(c, [row[p], row[p + 1], row[p + 2], row[p + 3]], [rows(p), rows(p + 1), rows(p + 2), rows(p + 3)]);
            p += 4;
        }
        for p in p..k {
            axpy4(c, [row[p], 0.0, 0.0, 0.0], [rows(p), rows(p), rows(p), rows(p)]);
        }
    }
}

/// Elements per accumulator step: one AVX-512 vector.
const W: usize = 16;

#[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq+avx512bw", "x86_64+avx2+fma", "aarch64+neon"))]
fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [[0f32; W]; 4];
    let (xc, yc) = (x.chunks_exact(4 * W), y.chunks_exact(4 * W));
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (xs, ys) in xc.zip(yc) {
        for (q, a) in acc.iter_mut().enumerate() {
            for l in 0..W {
                a[l] += xs[q * W + l] * ys[q * W + l];
            }
        }
    }
    let mut sum = [0f32; W];
    for a in &acc {
        for l in 0..W {
            sum[l] += a[l];
        }
    }
    sum.iter().sum::<f32>() + xr.iter().zip(yr).map(|(a, b)| a * b).sum::<f32>()
}

#[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq+avx512bw", "x86_64+avx2+fma", "aarch64+neon"))]
fn axpy4(c: &mut [f32], s: [f32; 4], r: [&[f32]; 4]) {
    let n = c.len();
    let [r0, r1, r2, r3] = r.map(|r| &r[..n]);
    for j in 0..n {
        c[j] += s[0] * r0[j] + s[1] * r1[j] + s[2] * r2[j] + s[3] * r3[j];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_layouts_of_b_match_the_definition() {
        for (k, n) in [(1280, 1000), (7, 3), (64, 17), (1, 1), (130, 5)] {
            let a: Vec<f32> = (0..2 * k).map(|i| ((i * 37) % 11) as f32 * 0.25 - 1.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 53) % 13) as f32 * 0.125 - 0.75).collect();
            // A's row every other element; B row-major (k x n), then the same matrix column-major.
            let want: Vec<f64> = (0..n).map(|j| (0..k).map(|p| a[2 * p] as f64 * b[p * n + j] as f64).sum()).collect();
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            for (bm, rs, cs) in [(&b, n as isize, 1), (&bt, 1, k as isize)] {
                let mut c = vec![f32::NAN; n];
                // SAFETY: a holds 2k elements, bm k*n, read with these strides.
                unsafe { gemv(&mut c, k, a.as_ptr(), 2, bm.as_ptr(), rs, cs) };
                for (j, (got, want)) in c.iter().zip(&want).enumerate() {
                    assert!((*got as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()), "k {k} n {n} rs {rs}: column {j}: {got} vs {want}");
                }
            }
        }
    }
}
