//! CumSum: running sums along one axis.
//!
//! The tensor is seen as `[outer, D, inner]`; each of the `outer * inner` lines of D elements is summed in
//! order (from the end when `reverse`), each output the sum of the elements before it (`exclusive`) or up to
//! and including it. Floats accumulate in f64 and each output is rounded once to the dtype; integers wrap
//! (two's complement), as every integer op of the interpreter does.

use super::view::{floats, from_floats, from_ints, ints};
use super::OpError;
use crate::ir::Tensor;

/// The running sums of one line of `values`, read at `at(j)` for j in 0..d, in the order the flags say.
fn scan<T: Copy>(d: usize, exclusive: bool, reverse: bool, zero: T, add: impl Fn(T, T) -> T, read: impl Fn(usize) -> T, mut write: impl FnMut(usize, T)) {
    let mut acc = zero;
    for step in 0..d {
        let j = if reverse { d - 1 - step } else { step };
        let x = read(j);
        if exclusive {
            write(j, acc);
            acc = add(acc, x);
        } else {
            acc = add(acc, x);
            write(j, acc);
        }
    }
}

pub(super) fn cumsum(x: &Tensor, axis: usize, exclusive: bool, reverse: bool) -> Result<Tensor, OpError> {
    let s = x.shape();
    let outer: usize = s[..axis].iter().product();
    let d = s[axis];
    let inner: usize = s[axis + 1..].iter().product();
    let at = |o: usize, j: usize, i: usize| (o * d + j) * inner + i;
    if x.dtype().is_int() {
        let v = ints(x);
        let mut out = vec![0i64; v.len()];
        for o in 0..outer {
            for i in 0..inner {
                scan(d, exclusive, reverse, 0i64, i64::wrapping_add, |j| v[at(o, j, i)], |j, y| out[at(o, j, i)] = y);
            }
        }
        return from_ints(x.dtype(), s, &out);
    }
    let v = floats(x);
    let mut out = vec![0f32; v.len()];
    for o in 0..outer {
        for i in 0..inner {
            scan(d, exclusive, reverse, 0f64, |a, b| a + b, |j| v[at(o, j, i)] as f64, |j, y| out[at(o, j, i)] = y as f32);
        }
    }
    from_floats(x.dtype(), s, &out)
}
