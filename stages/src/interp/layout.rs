//! Strided views: the one copying kernel behind Transpose, Slice, Expand, Tile, Split and broadcasting.
//!
//! A view is (shape, offset, strides in elements); gathering it yields a contiguous row-major vector.
//! Adjacent dimensions that are contiguous with each other are merged first, so the inner loop is as
//! long as the data allows (a slice copy when the innermost stride is 1, a fill when it is 0).

use super::par;
use std::borrow::Cow;
use std::mem::MaybeUninit;

/// Row-major strides, in elements, of a contiguous tensor of `shape`.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut s = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for i in (0..shape.len()).rev() {
        s[i] = acc;
        acc *= shape[i] as isize;
    }
    s
}

/// Drops size-1 dimensions and merges neighbours whose strides make them one run.
fn coalesce(shape: &[usize], strides: &[isize]) -> (Vec<usize>, Vec<isize>) {
    let mut sh: Vec<usize> = Vec::with_capacity(shape.len());
    let mut st: Vec<isize> = Vec::with_capacity(shape.len());
    for (&d, &s) in shape.iter().zip(strides) {
        if d == 1 {
            continue;
        }
        if let (Some(&pd), Some(&ps)) = (sh.last(), st.last()) {
            if ps == s * d as isize {
                let k = sh.len() - 1;
                sh[k] = pd * d;
                st[k] = s;
                continue;
            }
        }
        sh.push(d);
        st.push(s);
    }
    (sh, st)
}

/// Copies the view `src[offset + Σ i_k · strides[k]]` over every multi-index `i` of `shape`, row-major.
/// The caller guarantees every addressed element lies inside `src`. A large view is copied in parallel,
/// in blocks of its leading (coalesced) dimensions.
pub(crate) fn gather_strided<T: Copy + Send + Sync>(src: &[T], shape: &[usize], offset: isize, strides: &[isize]) -> Vec<T> {
    let numel: usize = shape.iter().product();
    if numel == 0 {
        return Vec::new();
    }
    let (sh, st) = coalesce(shape, strides);
    if sh.is_empty() {
        return vec![src[offset as usize]];
    }
    // Leading dimensions whose indices name the blocks: enough blocks for a few per thread.
    let mut lead = 0;
    let mut blocks = 1;
    while par::worth(numel) && lead + 1 < sh.len() && blocks < 64 {
        blocks *= sh[lead];
        lead += 1;
    }
    let block: usize = sh[lead..].iter().product();
    par::fill_chunks(numel, block, |b, dst| {
        let mut base = offset;
        let mut rest = b;
        for d in (0..lead).rev() {
            base += (rest % sh[d]) as isize * st[d];
            rest /= sh[d];
        }
        gather_into(src, &sh[lead..], &st[lead..], base, dst);
    })
}

/// Writes the view (coalesced, at least one dimension) into `dst`, row-major.
fn gather_into<T: Copy>(src: &[T], sh: &[usize], st: &[isize], mut base: isize, dst: &mut [MaybeUninit<T>]) {
    let (&n, outer) = sh.split_last().expect("a view of at least one dimension");
    let s = st[st.len() - 1];
    let outer_strides = &st[..st.len() - 1];
    let mut idx = vec![0usize; outer.len()];
    let mut at = 0;
    loop {
        let row = &mut dst[at..at + n];
        match s {
            1 => row.iter_mut().zip(&src[base as usize..base as usize + n]).for_each(|(d, &v)| {
                d.write(v);
            }),
            0 => row.iter_mut().for_each(|d| {
                d.write(src[base as usize]);
            }),
            _ => row.iter_mut().enumerate().for_each(|(i, d)| {
                d.write(src[(base + i as isize * s) as usize]);
            }),
        }
        at += n;
        // Odometer over the outer dimensions, keeping `base` in step.
        let mut k = outer.len();
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            idx[k] += 1;
            base += outer_strides[k];
            if idx[k] < outer[k] {
                break;
            }
            base -= outer_strides[k] * outer[k] as isize;
            idx[k] = 0;
        }
    }
}

/// Strides that read a tensor of `shape` as if broadcast (NumPy rules) to `out` (0 on broadcast axes).
/// The caller has checked that the shapes broadcast.
pub(crate) fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<isize> {
    let own = contiguous_strides(shape);
    let lead = out.len() - shape.len();
    (0..out.len())
        .map(|i| if i < lead || shape[i - lead] == 1 { 0 } else { own[i - lead] })
        .collect()
}

/// The data of a tensor of `shape` broadcast to `out`: borrowed when nothing changes.
pub(crate) fn broadcast_to<'a, T: Copy + Send + Sync>(x: &'a [T], shape: &[usize], out: &[usize]) -> Cow<'a, [T]> {
    if shape == out {
        Cow::Borrowed(x)
    } else {
        Cow::Owned(gather_strided(x, out, 0, &broadcast_strides(shape, out)))
    }
}

/// Calls `f` with every multi-index of `shape` in row-major order (for the few kernels that need
/// coordinates rather than a strided copy).
pub(crate) fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0usize; shape.len()];
    loop {
        f(&idx);
        let mut k = shape.len();
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            idx[k] += 1;
            if idx[k] < shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
