use super::*;
use proptest::prelude::*;

/// One `matrixmultiply::sgemm` call over all of C: what [`sgemm`] did before it split C into blocks.
#[allow(clippy::too_many_arguments)]
fn one_call(m: usize, k: usize, n: usize, a: Mat, b: Mat, beta: f32, c: &mut [f32], c_off: usize) {
    assert!(a.fits(m, k) && b.fits(k, n) && c_off + m * n <= c.len());
    // SAFETY: as in `sgemm_in_blocks`, every addressed element is inside the slices.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.data.as_ptr().add(a.offset),
            a.rs as isize,
            a.cs as isize,
            b.data.as_ptr().add(b.offset),
            b.rs as isize,
            b.cs as isize,
            beta,
            c.as_mut_ptr().add(c_off),
            n as isize,
            1,
        );
    }
}

/// Values of mixed signs and magnitudes (so that rounding depends on the summation order).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let mant = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            mant * [1.0, 3.0e-3, 7.0e2, 1.0][(s >> 20) as usize % 4]
        })
        .collect()
}

/// A `rows x cols` operand inside a larger buffer: row-major (`layout` 0) or column-major (1), each line
/// `pad` elements longer than it needs, starting 3 elements in.
fn operand(rows: usize, cols: usize, layout: u8, pad: usize, seed: u64) -> (Vec<f32>, usize, usize, usize) {
    let (rs, cs) = if layout == 0 { (cols + pad, 1) } else { (1, rows + pad) };
    let len = 3 + (rows - 1) * rs + (cols - 1) * cs + 1;
    (values(len, seed), 3, rs, cs)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap()
}

/// Cut into at most `blocks` blocks (down to one per 64 x 64 tile), or as `sgemm` cuts it (None);
/// strided and transposed operands, beta = 0, 1 and others, k over several of matrixmultiply's kc chunks
/// (256): every bit as in one call, on 1 thread and on 4.
#[allow(clippy::too_many_arguments)]
fn check(m: usize, k: usize, n: usize, la: u8, lb: u8, pad: usize, beta: f32, seed: u64, blocks: Option<usize>) -> Result<(), TestCaseError> {
    let (av, ao, ars, acs) = operand(m, k, la, pad, seed);
    let (bv, bo, brs, bcs) = operand(k, n, lb, pad, seed ^ 1);
    let a = Mat { data: &av, offset: ao, rs: ars, cs: acs };
    let b = Mat { data: &bv, offset: bo, rs: brs, cs: bcs };
    let c0 = values(m * n + 7, seed ^ 2);
    let mut want = c0.clone();
    one_call(m, k, n, a, b, beta, &mut want, 5);
    for threads in [1, 4] {
        let mut got = c0.clone();
        pool(threads).install(|| match blocks {
            Some(most) => sgemm_in_blocks(m, k, n, a, b, beta, &mut got, 5, 1, most),
            None => sgemm(m, k, n, a, b, beta, &mut got, 5),
        });
        prop_assert_eq!(bits(&got), bits(&want), "{}x{}x{} layouts {}/{} pad {} beta {} on {} threads", m, k, n, la, lb, pad, beta, threads);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn blocks_give_the_bits_of_one_call(
        m in 1usize..200, k in 1usize..600, n in 1usize..200,
        la in 0u8..2, lb in 0u8..2, pad in 0usize..3, beta in prop::sample::select(vec![0.0f32, 1.0, 0.5, -1.25]),
        seed in any::<u64>(), most in prop::sample::select(vec![2usize, 3, 7, 1000]),
    ) {
        check(m, k, n, la, lb, pad, beta, seed, Some(most))?;
    }
}

/// Cuts into about as many blocks as allowed, and the fewest packed elements among those.
#[test]
fn blocks_follow_the_threads_and_the_shape() {
    assert_eq!(gemm_blocks(1024, 768, 3072, GEMM_TASK, 1), (1, 1));
    assert_eq!(gemm_blocks(1024, 768, 3072, GEMM_TASK, 16), (2, 8));
    assert_eq!(gemm_blocks(64, 147, 12544, GEMM_TASK, 16), (1, 16));
    assert_eq!(gemm_blocks(512, 4608, 49, GEMM_TASK, 16), (8, 1));
    assert_eq!(gemm_blocks(128, 64, 128, GEMM_TASK, 16), (1, 1));
    assert_eq!(gemm_blocks(130, 5, 300, 1, 1000), (3, 5));
}

/// The default split of large odd shapes (tall, wide, deep), as MatMul and Conv call it.
#[test]
fn default_blocks_of_large_odd_shapes_give_the_bits_of_one_call() {
    for (m, k, n) in [(1031, 300, 517), (67, 1100, 1300), (2000, 77, 130), (5, 3000, 2049)] {
        check(m, k, n, 0, 0, 0, 0.0, m as u64, None).unwrap();
        check(m, k, n, 1, 0, 1, 1.0, k as u64, None).unwrap();
    }
}
