use super::*;
use proptest::prelude::*;

/// The obvious per-element definition the fast kernel must agree with.
fn naive(src: &[u32], shape: &[usize], offset: isize, strides: &[isize]) -> Vec<u32> {
    let mut out = Vec::new();
    for_each_index(shape, |i| {
        let at = offset + i.iter().zip(strides).map(|(&a, &s)| a as isize * s).sum::<isize>();
        out.push(src[at as usize]);
    });
    out
}

#[test]
fn transpose_view() {
    let src: Vec<u32> = (0..6).collect(); // [[0,1,2],[3,4,5]]
    assert_eq!(gather_strided(&src, &[3, 2], 0, &[1, 3]), vec![0, 3, 1, 4, 2, 5]);
}

#[test]
fn negative_strides_and_broadcast() {
    let src: Vec<u32> = (0..4).collect();
    assert_eq!(gather_strided(&src, &[4], 3, &[-1]), vec![3, 2, 1, 0]);
    assert_eq!(broadcast_to(&src[..2], &[2, 1], &[2, 3]).into_owned(), vec![0, 0, 0, 1, 1, 1]);
    assert_eq!(broadcast_to(&src[..3], &[3], &[2, 3]).into_owned(), vec![0, 1, 2, 0, 1, 2]);
}

#[test]
fn scalar_and_empty() {
    assert_eq!(gather_strided(&[7u32], &[], 0, &[]), vec![7]);
    assert!(gather_strided(&[7u32], &[0, 3], 0, &[3, 1]).is_empty());
}

/// Views large enough to be copied in parallel blocks: permuted, broadcast (stride 0) and reversed.
#[test]
fn large_views_match_naive() {
    let src: Vec<u32> = (0..60 * 70 * 11).collect();
    let own = contiguous_strides(&[60, 70, 11]);
    for (shape, offset, strides) in [
        (vec![11, 60, 70], 0, vec![own[2], own[0], own[1]]),
        (vec![70, 3, 60, 11], 0, vec![own[1], 0, own[0], own[2]]),
        (vec![60, 70, 11], 60 * 70 * 11 - 1, vec![-own[0], -own[1], -own[2]]),
        (vec![2, 60 * 70 * 11], 0, vec![0, 1]),
    ] {
        assert_eq!(gather_strided(&src, &shape, offset, &strides), naive(&src, &shape, offset, &strides), "{shape:?} {strides:?}");
    }
}

proptest! {
    /// Any permutation of any small shape: the coalescing kernel equals the per-element definition.
    #[test]
    fn gather_matches_naive(dims in proptest::collection::vec(1usize..4, 0..5), seed in any::<u64>()) {
        let n: usize = dims.iter().product();
        let src: Vec<u32> = (0..n as u32).collect();
        let mut perm: Vec<usize> = (0..dims.len()).collect();
        // A seed-driven shuffle: deterministic per case.
        let mut s = seed;
        for i in (1..perm.len()).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            perm.swap(i, (s >> 33) as usize % (i + 1));
        }
        let own = contiguous_strides(&dims);
        let shape: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
        let strides: Vec<isize> = perm.iter().map(|&p| own[p]).collect();
        prop_assert_eq!(gather_strided(&src, &shape, 0, &strides), naive(&src, &shape, 0, &strides));
    }
}
