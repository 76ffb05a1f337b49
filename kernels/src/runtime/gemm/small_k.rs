//! GEMMs with a short inner dimension and a narrow output (`k <= 32`, `n <= 256`, many rows): the channels-last
//! pointwise convolutions at the start of MobileNet-style networks (112x112 and 56x56 pixels, 16 to 32 input
//! channels). They move far more bytes than they compute, and the gemm crate's call pays twice for that:
//! it writes C, then the epilogue reads and writes it again (on MobileNetV2's 12544x96x16 expansion the
//! separate bias + ReLU6 pass was 38% of the layer, one thread). Here B is copied once into a small
//! row-major panel (its `k x n` elements, padded to whole vectors), and each tile of rows is computed in
//! registers, stored, and given its epilogue while it is still in L1.
//!
//! A tile is `ROWS` rows by two vectors of columns: 16 independent accumulators, so the multiply-adds of
//! one step of `k` overlap instead of waiting on each other; each step loads two vectors of B and broadcasts
//! `ROWS` elements of A. The kernel is AVX-512 only; without it these GEMMs go to the gemm crate.

use super::epilogue::{self, Op};

/// Inner dimensions up to this take this path.
pub const MAX_K: usize = 32;
/// Output widths up to this (the panel of B is at most `MAX_K x MAX_N`: 32 KiB).
pub const MAX_N: usize = 256;
/// Rows at least: below, the gemm crate's own call is as good and the panel is not worth copying.
pub const MIN_M: usize = 256;

/// Columns per vector, and rows per tile.
const V: usize = 16;
const ROWS: usize = 8;
/// Rows per parallel task at most: a whole number of tiles. With many threads tasks get smaller, down to 4
/// tiles, so that a 784-row GEMM gives 16 threads work (at 256 rows it ran on 4).
const TASK_ROWS: usize = 32 * ROWS;

/// Whether a GEMM of this shape takes this path: on x86-64 CPUs with AVX-512 (elsewhere the gemm crate runs
/// it, with the epilogue after).
pub fn fits(m: usize, n: usize, k: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    let simd = std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    let simd = false;
    simd && (1..=MAX_K).contains(&k) && (1..=MAX_N).contains(&n) && m >= MIN_M
}

/// `c (m x n, row-major) = a · b` then `ops` (`base`: the epilogue's flat index of `c[0]`), with `a[i, p]` at
/// `a + i * a_rs + p * a_cs` and `b[p, j]` at `b + p * b_rs + j * b_cs`; rows in tasks over the pool's
/// threads if `parallel`.
///
/// # Safety
/// `a` and `b` point at live operands of these sizes and strides, disjoint from `c`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm(c: &mut [f32], m: usize, n: usize, k: usize, a: *const f32, a_rs: isize, a_cs: isize, b: *const f32, b_rs: isize, b_cs: isize, ops: &[Op], base: u64, parallel: bool) {
    debug_assert!(fits(m, n, k) && c.len() == m * n);
    // B as a row-major panel, rows padded to whole pairs of vectors with zeros.
    let np = n.next_multiple_of(2 * V);
    let mut panel = vec![0f32; k * np];
    for p in 0..k {
        for j in 0..n {
            panel[p * np + j] = *b.offset(p as isize * b_rs + j as isize * b_cs);
        }
    }
    let a = SharedA(a);
    let threads = if parallel { rayon::current_num_threads().max(1) } else { 1 };
    let task_rows = m.div_ceil(4 * threads).next_multiple_of(ROWS).clamp(4 * ROWS, TASK_ROWS);
    let task = |(t, rows): (usize, &mut [f32])| {
        let r0 = t * task_rows;
        let a = a.get();
        // SAFETY: `fits` found AVX-512F; rows r0 .. r0 + rows.len() / n of A, inside the operand the caller
        // vouched for.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            rows_of(rows, r0, n, np, k, a, a_rs, a_cs, &panel)
        };
        epilogue::apply_on(ops, rows, base + (r0 * n) as u64, false);
    };
    if parallel && m > task_rows {
        use rayon::prelude::*;
        c.par_chunks_mut(task_rows * n).enumerate().for_each(task);
    } else {
        c.chunks_mut(task_rows * n).enumerate().for_each(task);
    }
}

/// A's base pointer, read by every task.
#[derive(Clone, Copy)]
struct SharedA(*const f32);
// SAFETY: A is only read while `gemm` runs, and the caller keeps it alive and unwritten meanwhile.
unsafe impl Send for SharedA {}
unsafe impl Sync for SharedA {}

impl SharedA {
    fn get(self) -> *const f32 {
        self.0
    }
}

/// Rows `r0 ..` of C (`out`, whole rows of `n`) from A and the panel (rows of `np` elements, `np` a multiple of
/// two vectors).
///
/// Written with AVX-512 intrinsics: the portable form (arrays of lanes) was vectorized by LLVM across a tile's
/// rows, with gathers, and ran at 2-4 GFLOP/s.
///
/// # Safety
/// The CPU has AVX-512F; A holds rows `r0 .. r0 + out.len() / n` at these strides, `k` columns each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_of(out: &mut [f32], r0: usize, n: usize, np: usize, k: usize, a: *const f32, a_rs: isize, a_cs: isize, panel: &[f32]) {
    use std::arch::x86_64::*;
    debug_assert!(np % (2 * V) == 0 && panel.len() >= k * np);
    let rows = out.len() / n;
    let mut i = 0;
    while i < rows {
        let tile = ROWS.min(rows - i);
        // Rows past the tile's end repeat its last row; they are never stored.
        let arows: [*const f32; ROWS] = std::array::from_fn(|q| a.wrapping_offset((r0 + i + q.min(tile - 1)) as isize * a_rs));
        let mut j = 0;
        while j < n {
            if n - j <= V {
                // One vector of columns left (all of a 16-wide output): half the accumulators.
                let mut acc = [_mm512_setzero_ps(); ROWS];
                for p in 0..k {
                    let w0 = _mm512_loadu_ps(panel.as_ptr().add(p * np + j));
                    for q in 0..ROWS {
                        acc[q] = _mm512_fmadd_ps(_mm512_set1_ps(*arows[q].wrapping_offset(p as isize * a_cs)), w0, acc[q]);
                    }
                }
                let mask = if n - j >= V { 0xffff } else { ((1u32 << (n - j)) - 1) as u16 };
                for q in 0..tile {
                    _mm512_mask_storeu_ps(out.as_mut_ptr().add((i + q) * n + j), mask, acc[q]);
                }
                break;
            }
            let mut acc0 = [_mm512_setzero_ps(); ROWS];
            let mut acc1 = [_mm512_setzero_ps(); ROWS];
            for p in 0..k {
                let w = panel.as_ptr().add(p * np + j);
                let (w0, w1) = (_mm512_loadu_ps(w), _mm512_loadu_ps(w.add(V)));
                for q in 0..ROWS {
                    let x = _mm512_set1_ps(*arows[q].wrapping_offset(p as isize * a_cs));
                    acc0[q] = _mm512_fmadd_ps(x, w0, acc0[q]);
                    acc1[q] = _mm512_fmadd_ps(x, w1, acc1[q]);
                }
            }
            let width = (n - j).min(2 * V);
            let mask = |w: usize| if w >= V { 0xffff } else { ((1u32 << w) - 1) as u16 };
            for q in 0..tile {
                let dst = out.as_mut_ptr().add((i + q) * n + j);
                _mm512_mask_storeu_ps(dst, mask(width), acc0[q]);
                if width > V {
                    _mm512_mask_storeu_ps(dst.add(V), mask(width - V), acc1[q]);
                }
            }
            j += 2 * V;
        }
        i += tile;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_definition_with_its_epilogue() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        for (m, n, k, a_t) in [(300, 96, 16, false), (257, 16, 32, true), (512, 40, 7, false), (1000, 144, 24, true), (256, 1, 1, false)] {
            let val = |i: usize| ((i * 7919) % 23) as f32 * 0.25 - 2.5;
            let a: Vec<f32> = (0..m * k).map(val).collect();
            let b: Vec<f32> = (0..k * n).map(|i| val(i + 3)).collect();
            // A row-major (m x k) or stored transposed; B column-major (a transposed weight).
            let (a_rs, a_cs) = if a_t { (1, m as isize) } else { (k as isize, 1) };
            let at = |i: usize, p: usize| a[if a_t { p * m + i } else { i * k + p }];
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.5).collect();
            let ops = [Op::Add { src: &bias, inner: 1 }, Op::Clip { min: -3.0, max: 6.0 }];
            let mut want: Vec<f32> = (0..m * n).map(|e| (0..k).map(|p| at(e / n, p) * b[(e % n) * k + p]).sum()).collect();
            epilogue::apply_on(&ops, &mut want, 0, false);
            for parallel in [false, true] {
                let mut got = vec![f32::NAN; m * n];
                // SAFETY: operands of these sizes and strides, C its own buffer.
                pool.install(|| unsafe { gemm(&mut got, m, n, k, a.as_ptr(), a_rs, a_cs, b.as_ptr(), 1, k as isize, &ops, 0, parallel) });
                // Multiples of 0.25 with few terms: sums are exact in any order.
                assert_eq!(got, want, "{m}x{n}x{k}, parallel {parallel}");
            }
        }
    }
}

