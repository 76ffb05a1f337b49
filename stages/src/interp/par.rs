//! Data parallelism for the kernels, on the caller's rayon pool (the global one unless the caller installs
//! another).
//!
//! Work is split only across independent outputs (elements, rows, lines, planes, matrices, blocks of a
//! GEMM's output), never inside one output's accumulation, so every result is bit for bit what the serial
//! loop computes, whatever the thread count (`tests.rs` runs kernels on one thread and on four and compares
//! the bits). Small tensors stay on the calling thread: below [`GRAIN`] elements a task costs more than it
//! saves.

use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Elements per task at least; a loop over fewer than twice this runs on the calling thread.
pub(crate) const GRAIN: usize = 1 << 14;

/// Whether a loop over `n` elements is worth splitting.
pub(crate) fn worth(n: usize) -> bool {
    n >= 2 * GRAIN
}

/// `f` of every element, in order (in chunks of [`GRAIN`], each a plain loop).
pub(crate) fn map<T: Sync, R: Send>(xs: &[T], f: impl Fn(&T) -> R + Sync + Send) -> Vec<R> {
    if !worth(xs.len()) {
        return xs.iter().map(f).collect();
    }
    fill_chunks(xs.len(), GRAIN, |i, dst| {
        for (d, x) in dst.iter_mut().zip(&xs[i * GRAIN..]) {
            d.write(f(x));
        }
    })
}

/// `f(a[i], b[i])` for every `i` (the slices have the same length).
pub(crate) fn zip<A: Sync, B: Sync, R: Send>(a: &[A], b: &[B], f: impl Fn(&A, &B) -> R + Sync + Send) -> Vec<R> {
    assert_eq!(a.len(), b.len());
    if !worth(a.len()) {
        return a.iter().zip(b).map(|(x, y)| f(x, y)).collect();
    }
    fill_chunks(a.len(), GRAIN, |i, dst| {
        for (d, (x, y)) in dst.iter_mut().zip(a[i * GRAIN..].iter().zip(&b[i * GRAIN..])) {
            d.write(f(x, y));
        }
    })
}

/// `f(i)` for every `i` in `0..n`, in order; `per` is the number of elements each `f` reads or computes
/// (what decides whether the loop is split, and how finely).
pub(crate) fn tabulate<R: Send>(n: usize, per: usize, f: impl Fn(usize) -> R + Sync + Send) -> Vec<R> {
    let per = per.max(1);
    if !worth(n.saturating_mul(per)) || n < 2 {
        return (0..n).map(f).collect();
    }
    let len = GRAIN.div_ceil(per);
    fill(n, len, per, |i, dst| {
        for (j, d) in dst.iter_mut().enumerate() {
            d.write(f(i * len + j));
        }
    })
}

/// Calls `f(i, chunk)` for the `i`-th `len`-element chunk of `out` (the last may be shorter; none when `out`
/// is empty).
pub(crate) fn chunks_mut<T: Send>(out: &mut [T], len: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
    split(out, len, 1, f)
}

/// [`chunks_mut`] where each element costs about `per` elements' work.
pub(crate) fn split<T: Send>(out: &mut [T], len: usize, per: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
    let len = len.max(1);
    if worth(out.len().saturating_mul(per)) && out.len() > len {
        out.par_chunks_mut(len).with_min_len(GRAIN.div_ceil(len.saturating_mul(per))).enumerate().for_each(|(i, c)| f(i, c));
    } else {
        out.chunks_mut(len).enumerate().for_each(|(i, c)| f(i, c));
    }
}

/// A vector of `n` elements, each `len`-element chunk of which `f(i, chunk)` writes in full (split like
/// [`chunks_mut`]): no pass to initialize memory that is about to be overwritten.
pub(crate) fn fill_chunks<T: Send>(n: usize, len: usize, f: impl Fn(usize, &mut [MaybeUninit<T>]) + Sync + Send) -> Vec<T> {
    fill(n, len, 1, f)
}

fn fill<T: Send>(n: usize, len: usize, per: usize, f: impl Fn(usize, &mut [MaybeUninit<T>]) + Sync + Send) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(n);
    split(&mut out.spare_capacity_mut()[..n], len, per, f);
    // SAFETY: the chunks cover `0..n` and `f` wrote every element of its chunk (the callers' contract); a
    // panic in `f` leaves the length 0, so nothing unwritten is ever read or dropped.
    unsafe { out.set_len(n) };
    out
}

/// A raw pointer that tasks may share: each task writes a region of the pointee no other task touches.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut<T>(pub *mut T);

// SAFETY: only handed to tasks that write disjoint elements (see the users), while the owner waits.
unsafe impl<T: Send> Send for SharedMut<T> {}
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// The pointer (a method, so closures capture the whole `Send` wrapper, not its field).
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

/// The same, for reading.
#[derive(Clone, Copy)]
pub(crate) struct Shared<T>(pub *const T);

// SAFETY: only read, while the owner of the data waits for the tasks.
unsafe impl<T: Sync> Send for Shared<T> {}
unsafe impl<T: Sync> Sync for Shared<T> {}

impl<T> Shared<T> {
    pub(crate) fn get(self) -> *const T {
        self.0
    }
}
