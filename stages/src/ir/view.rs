//! Strided views: where each element of a value made by pure data movement lives in the flat, contiguous
//! buffer of the value it was moved from.
//!
//! Exporters spell the heads of an attention as chains of movement: torchvision's ViT takes Q, K and V out of
//! one `[S, B, 3 * E]` projection by a Reshape, an Unsqueeze, a 5-D Transpose, a Squeeze, a Gather of a constant
//! index, a Reshape and a Transpose each; GPT-2 splits its projection and moves each third into heads. Each of
//! those steps only renames where elements are, so the chain composes into one affine map (an offset and a
//! stride per dimension, like numpy's `as_strided`): [`movement_view`] finds it, and a kernel that reads through
//! the view addresses the source directly, so none of the movement runs as a kernel of its own.

use super::{Graph, Op, ValueId};

/// Element `i` (a multi-index over `shape`) is element `offset + sum(i[d] * strides[d])` of the source's flat,
/// contiguous buffer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StridedView {
    pub offset: i64,
    pub shape: Vec<usize>,
    pub strides: Vec<i64>,
}

/// Row-major strides of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<i64> {
    let mut st = vec![1i64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        st[d] = st[d + 1] * shape[d + 1] as i64;
    }
    st
}

impl StridedView {
    /// A value read as it is stored.
    pub fn contiguous(shape: &[usize]) -> StridedView {
        StridedView { offset: 0, shape: shape.to_vec(), strides: contiguous_strides(shape) }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Where element `index` lives.
    pub fn at(&self, index: &[usize]) -> i64 {
        self.offset + index.iter().zip(&self.strides).map(|(&i, &s)| i as i64 * s).sum::<i64>()
    }

    /// Whether the view reads its elements in storage order from `offset` on (size-1 dims may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let want = contiguous_strides(&self.shape);
        self.numel() == 0 || self.shape.iter().zip(self.strides.iter().zip(&want)).all(|(&n, (s, w))| n == 1 || s == w)
    }

    /// Output dim `k` is input dim `perm[k]`.
    pub fn transpose(&self, perm: &[usize]) -> StridedView {
        StridedView { offset: self.offset, shape: perm.iter().map(|&p| self.shape[p]).collect(), strides: perm.iter().map(|&p| self.strides[p]).collect() }
    }

    /// Dim `axis` fixed at `index` (in range) and dropped.
    pub fn select(&self, axis: usize, index: usize) -> StridedView {
        let mut v = self.clone();
        v.offset += index as i64 * self.strides[axis];
        v.shape.remove(axis);
        v.strides.remove(axis);
        v
    }

    /// Dim `axis` as `len` elements from `start`, `step` apart (`step` may be negative; the range is in bounds).
    pub fn slice(&self, axis: usize, start: i64, step: i64, len: usize) -> StridedView {
        let mut v = self.clone();
        if len > 0 {
            v.offset += start * self.strides[axis];
        }
        v.strides[axis] *= step;
        v.shape[axis] = len;
        v
    }

    /// The same elements in row-major order as `shape`, if strides can say it (as `torch.Tensor.view` decides:
    /// every group of old dims that the new shape splits or merges must be contiguous within itself).
    pub fn reshape(&self, shape: &[usize]) -> Option<StridedView> {
        let n: usize = shape.iter().product();
        if n != self.numel() {
            return None;
        }
        // No element, or one: any strides address it.
        if n <= 1 {
            return Some(StridedView { offset: self.offset, shape: shape.to_vec(), strides: contiguous_strides(shape) });
        }
        let (old, os) = (&self.shape, &self.strides);
        let mut strides = vec![0i64; shape.len()];
        let mut view_d = shape.len() as isize - 1;
        // Walk the old dims from the innermost, one contiguous chunk at a time: a chunk ends where the next
        // outer (non-unit) dim is not laid out right after it.
        let mut chunk_stride = *os.last().expect("more than one element has a dim");
        let (mut tensor_numel, mut view_numel) = (1usize, 1usize);
        for d in (0..old.len()).rev() {
            tensor_numel *= old[d];
            let chunk_ends = d == 0 || (old[d - 1] != 1 && os[d - 1] != tensor_numel as i64 * chunk_stride);
            if chunk_ends {
                while view_d >= 0 && (view_numel < tensor_numel || shape[view_d as usize] == 1) {
                    strides[view_d as usize] = view_numel as i64 * chunk_stride;
                    view_numel *= shape[view_d as usize];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if d > 0 {
                    chunk_stride = os[d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        // Trailing unit dims of the new shape (outermost) take any stride.
        while view_d >= 0 {
            if shape[view_d as usize] != 1 {
                return None;
            }
            strides[view_d as usize] = 0;
            view_d -= 1;
        }
        Some(StridedView { offset: self.offset, shape: shape.to_vec(), strides })
    }
}

/// `index` of an axis of `dim` elements, negative counting from the end (ONNX Gather), if in range.
fn normalized(index: i64, dim: usize) -> Option<usize> {
    let i = if index < 0 { index + dim as i64 } else { index };
    (0..dim as i64).contains(&i).then_some(i as usize)
}

/// The view of output `v` of its movement node, given the view `input` of that node's data input; `None`
/// when `v` is not made by pure movement, or the step cannot be said by strides over `input`.
fn step(g: &Graph, v: ValueId, input: &StridedView) -> Option<StridedView> {
    let n = g.producer(v)?;
    let node = g.node(n);
    let out = &g.ty(v).shape;
    match &node.op {
        Op::Identity => Some(input.clone()),
        Op::Reshape { shape } => input.reshape(shape),
        Op::Transpose { perm } => Some(input.transpose(perm)),
        Op::Gather { axis } => {
            let idx = g.constant(node.inputs[1])?;
            let dim = input.shape[*axis];
            let values = idx.to_i64_vec();
            match idx.shape() {
                [] => Some(input.select(*axis, normalized(values[0], dim)?)),
                // A run of indices evenly spaced is a slice along the axis.
                [len] if *len > 0 => {
                    let first = normalized(values[0], dim)?;
                    let stride = if values.len() > 1 { normalized(values[1], dim)? as i64 - first as i64 } else { 1 };
                    let ok = values.iter().enumerate().all(|(i, &x)| normalized(x, dim).map(|x| x as i64) == Some(first as i64 + i as i64 * stride));
                    ok.then(|| input.slice(*axis, first as i64, stride, *len))
                }
                _ => None,
            }
        }
        Op::Slice { axes, starts, steps, .. } => {
            let mut w = input.clone();
            for ((&a, &st), &sp) in axes.iter().zip(starts).zip(steps) {
                w = w.slice(a, st, sp, out[a]);
            }
            Some(w)
        }
        Op::Split { axis, sizes } => {
            let o = node.outputs.iter().position(|&x| x == v)?;
            let start: usize = sizes[..o].iter().sum();
            Some(input.slice(*axis, start as i64, 1, sizes[o]))
        }
        _ => None,
    }
    .filter(|w| w.shape == *out)
}

/// Whether `v` is made by one of the movement ops [`step`] composes.
fn is_movement(g: &Graph, v: ValueId) -> bool {
    g.producer(v).is_some_and(|n| matches!(g.node(n).op, Op::Identity | Op::Reshape { .. } | Op::Transpose { .. } | Op::Gather { .. } | Op::Slice { .. } | Op::Split { .. }))
}

/// `v` as a view of the furthest value it is moved out of: `(source, view)` with every element of `v` at
/// `view` in `source`'s contiguous buffer. Walks back through Identity, Reshape, Transpose, Gather of constant
/// indices (one index, or evenly spaced ones), Slice and Split; where a step cannot be said by strides over
/// the source found so far, its input becomes the source. A value not made by movement is its own source.
pub fn movement_view(g: &Graph, v: ValueId) -> (ValueId, StridedView) {
    let mut chain = vec![v];
    while let Some(&cur) = chain.last() {
        match g.producer(cur).filter(|_| is_movement(g, cur)) {
            Some(n) => chain.push(g.node(n).inputs[0]),
            None => break,
        }
    }
    let mut source = chain.pop().expect("the chain holds v");
    let mut view = StridedView::contiguous(&g.ty(source).shape);
    while let Some(next) = chain.pop() {
        view = match step(g, next, &view) {
            Some(w) => w,
            None => {
                let input = g.node(g.producer(next).expect("a movement value has a producer")).inputs[0];
                match step(g, next, &StridedView::contiguous(&g.ty(input).shape)) {
                    Some(w) => {
                        source = input;
                        w
                    }
                    None => {
                        source = next;
                        StridedView::contiguous(&g.ty(next).shape)
                    }
                }
            }
        };
    }
    (source, view)
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
