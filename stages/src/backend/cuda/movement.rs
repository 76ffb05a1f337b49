//! Data movement, one thread per output element: every element reads its source at an offset computed
//! from its coordinates (Transpose, Slice, Split, Concat, Expand, Tile, copies into outputs) or through an
//! index (Gather, GatherElements), or maps each coordinate through the padding rule (Pad). Elements move in
//! their own type, bit-exact.

use crate::backend::{refuse, Refusal};
use super::kernel::{coords, offset, scalar_literal, st, zero, Kernel};
use crate::backend::lowering::cexpr::f32_lit;
use crate::backend::lowering::nest::{broadcast, contiguous, Nest};
use crate::ir::{DType, NodeId, PadMode, Tensor, ValueId};

/// `dst[dst_base + c·dst_st] = src[src_base + c·src_st]` for every coordinate `c` of `shape`, as one kernel.
#[allow(clippy::too_many_arguments)]
fn strided(k: &mut Kernel, shape: &[usize], dst: &str, dst_st: Vec<i64>, dst_base: i64, src: &str, src_st: Vec<i64>, src_base: i64) {
    let n: usize = shape.iter().product();
    let nest = Nest::new(shape, &[dst_st, src_st]);
    let used = vec![true; nest.dims.len()];
    let mut b = coords(&nest.dims, "i", "c", &used);
    let at = |base: i64, st: &[i64]| {
        let o = offset("c", st);
        if base == 0 {
            o
        } else {
            format!("(unsigned)({base}) + {o}")
        }
    };
    b.push_str(&format!("{dst}[{}] = {src}[{}];\n", at(dst_base, &nest.strides[0]), at(src_base, &nest.strides[1])));
    k.body.push_str(&b);
    k.per_element(n);
}

/// A value copied whole into partition output `j`.
pub fn copy_value(k: &mut Kernel, from: ValueId, j: usize) {
    let n = k.g.ty(from).numel();
    let s = k.buf(from, false);
    let d = k.output(j);
    k.body.push_str(&format!("{d}[i] = {s}[i];\n"));
    k.per_element(n);
}

pub fn transpose(k: &mut Kernel, node: NodeId, perm: &[usize]) {
    let nd = k.g.node(node);
    let (i, o) = (nd.inputs[0], nd.outputs[0]);
    let own = contiguous(&k.g.ty(i).shape);
    let shape = k.g.ty(o).shape.clone();
    let src_st: Vec<i64> = perm.iter().map(|&p| own[p]).collect();
    let (x, y) = (k.buf(i, false), k.buf(o, true));
    strided(k, &shape, &y, contiguous(&shape), 0, &x, src_st, 0);
}

/// A strided window of the input (Slice, one output of Split) into a contiguous output.
fn window(k: &mut Kernel, i: ValueId, o: ValueId, axes: &[usize], starts: &[i64], steps: &[i64]) {
    let own = contiguous(&k.g.ty(i).shape);
    let shape = k.g.ty(o).shape.clone();
    let mut st = own.clone();
    let mut base = 0i64;
    for (n, &a) in axes.iter().enumerate() {
        if shape[a] > 0 {
            base += starts[n] * own[a];
        }
        st[a] = own[a] * steps[n];
    }
    let (x, y) = (k.buf(i, false), k.buf(o, true));
    strided(k, &shape, &y, contiguous(&shape), 0, &x, st, base);
}

pub fn slice(k: &mut Kernel, node: NodeId, axes: &[usize], starts: &[i64], steps: &[i64]) {
    let nd = k.g.node(node);
    window(k, nd.inputs[0], nd.outputs[0], axes, starts, steps);
}

/// Split output `out` (the caller makes one kernel per materialized output).
pub fn split_one(k: &mut Kernel, node: NodeId, axis: usize, sizes: &[usize], out: usize) {
    let nd = k.g.node(node);
    let start: usize = sizes[..out].iter().sum();
    window(k, nd.inputs[0], nd.outputs[out], &[axis], &[start as i64], &[1]);
}

/// Concat input `which` into its window of the output (the caller makes one kernel per input).
pub fn concat_one(k: &mut Kernel, node: NodeId, axis: usize, which: usize) {
    let nd = k.g.node(node);
    let o = nd.outputs[0];
    let ost = contiguous(&k.g.ty(o).shape);
    let at: usize = nd.inputs[..which].iter().map(|&i| k.g.ty(i).shape[axis]).sum();
    let i = nd.inputs[which];
    let shape = k.g.ty(i).shape.clone();
    let (x, y) = (k.buf(i, false), k.buf(o, true));
    strided(k, &shape, &y, ost.clone(), at as i64 * ost[axis], &x, contiguous(&shape), 0);
}

pub fn expand(k: &mut Kernel, node: NodeId) {
    let nd = k.g.node(node);
    let (i, o) = (nd.inputs[0], nd.outputs[0]);
    let shape = k.g.ty(o).shape.clone();
    let st = broadcast(&k.g.ty(i).shape, &shape);
    let (x, y) = (k.buf(i, false), k.buf(o, true));
    strided(k, &shape, &y, contiguous(&shape), 0, &x, st, 0);
}

pub fn tile(k: &mut Kernel, node: NodeId, repeats: &[usize]) {
    let nd = k.g.node(node);
    let (i, o) = (nd.inputs[0], nd.outputs[0]);
    let xs = k.g.ty(i).shape.clone();
    let own = contiguous(&xs);
    // The tiled tensor is the view [r0, d0, r1, d1, ...] with stride 0 on every repeat axis, row-major.
    let (mut view, mut st) = (Vec::new(), Vec::new());
    for (a, &r) in repeats.iter().enumerate() {
        view.extend([r, xs[a]]);
        st.extend([0, own[a]]);
    }
    let (x, y) = (k.buf(i, false), k.buf(o, true));
    strided(k, &view, &y, contiguous(&view), 0, &x, st, 0);
}

/// Gather along `axis`; a negative index counts from the end, one out of range (an error in the reference)
/// yields zeros: compiled code has no error channel.
pub fn gather(k: &mut Kernel, node: NodeId, axis: usize) {
    let nd = k.g.node(node);
    let (i, idx, o) = (nd.inputs[0], nd.inputs[1], nd.outputs[0]);
    let xs = k.g.ty(i).shape.clone();
    let dim = xs[axis];
    let pre: usize = xs[..axis].iter().product();
    let post: usize = xs[axis + 1..].iter().product();
    let nidx = k.g.ty(idx).numel();
    let (x, ix, y) = (k.buf(i, false), k.buf(idx, false), k.buf(o, true));
    let n = pre * nidx * post;
    let z = zero(k.g.ty(o).dtype);
    k.body.push_str(&format!(
        "const unsigned q = i % {post}u;\nconst unsigned t = (i / {post}u) % {nidx}u;\nconst unsigned p = i / {};\n\
            long long j = (long long){ix}[t];\nif (j < 0) j += {dim};\n\
            {y}[i] = (j >= 0 && j < {dim}) ? {x}[(p * {dim}u + (unsigned)j) * {post}u + q] : {z};\n",
        (nidx * post).max(1)
    ));
    k.per_element(n);
}

/// GatherElements: each output element reads the data at its own coordinates, the index replacing the
/// coordinate along `axis`.
pub fn gather_elements(k: &mut Kernel, node: NodeId, axis: usize) -> Result<(), Refusal> {
    let nd = k.g.node(node);
    let (i, idx, o) = (nd.inputs[0], nd.inputs[1], nd.outputs[0]);
    let xs = k.g.ty(i).shape.clone();
    let is = k.g.ty(idx).shape.clone();
    for (a, (&n, &d)) in is.iter().zip(&xs).enumerate() {
        if a != axis && n > d {
            return Err(refuse!("GatherElements: indices dimension {a} is {n}, data has {d}"));
        }
    }
    let own = contiguous(&xs);
    let mut xst = own.clone();
    xst[axis] = 0;
    let dim = xs[axis];
    let (x, ix, y) = (k.buf(i, false), k.buf(idx, false), k.buf(o, true));
    let used = vec![true; is.len()];
    let mut b = coords(&is, "i", "c", &used);
    b.push_str(&format!(
        "long long j = (long long){ix}[i];\nif (j < 0) j += {dim};\n{y}[i] = (j >= 0 && j < {dim}) ? {x}[{} + (unsigned)j * {}u] : {};\n",
        offset("c", &xst),
        own[axis],
        zero(k.g.ty(o).dtype)
    ));
    k.body.push_str(&b);
    k.per_element(is.iter().product());
    Ok(())
}

/// Pad: every output coordinate maps to an input coordinate by the mode (constant: outside means the fill
/// value; edge: clamped; reflect: mirrored without repeating the edge).
pub fn pad(k: &mut Kernel, node: NodeId, pads: &[i64], mode: PadMode, value: f32) -> Result<(), Refusal> {
    let nd = k.g.node(node);
    let (i, o) = (nd.inputs[0], nd.outputs[0]);
    let xs = k.g.ty(i).shape.clone();
    let ys = k.g.ty(o).shape.clone();
    let d = k.g.ty(i).dtype;
    let xst = contiguous(&xs);
    let (x, y) = (k.buf(i, false), k.buf(o, true));
    let used = vec![true; ys.len()];
    let mut b = coords(&ys, "i", "c", &used);
    b.push_str("bool inside = true;\nlong long src = 0;\n");
    for a in 0..xs.len() {
        let dim = xs[a] as i64;
        if dim == 0 && mode != PadMode::Constant {
            return Err(refuse!("Pad: {mode:?} mode cannot pad an empty dimension"));
        }
        b.push_str(&format!("{{\nlong long s = (long long)c{a} - ({});\n", pads[a]));
        match mode {
            PadMode::Constant => b.push_str(&format!("if (s < 0 || s >= {dim}) inside = false;\n")),
            PadMode::Edge => b.push_str(&format!("s = s < 0 ? 0 : (s >= {dim} ? {} : s);\n", dim - 1)),
            PadMode::Reflect if dim == 1 => b.push_str("s = 0;\n"),
            PadMode::Reflect => {
                let period = 2 * (dim - 1);
                b.push_str(&format!("s %= {period};\nif (s < 0) s += {period};\nif (s >= {dim}) s = {period} - s;\n"));
            }
        }
        b.push_str(&format!("src += s * {};\n}}\n", xst[a]));
    }
    let fill = match d {
        // The fill as stored: an f16 (bf16) buffer holds the value rounded to f16 (bf16).
        DType::F16 | DType::BF16 => st(d, &f32_lit(value)),
        d => scalar_literal(&Tensor::from_f64_as(d, Vec::new(), &[value as f64])),
    };
    b.push_str(&format!("{y}[i] = inside ? {x}[src] : {fill};\n"));
    k.body.push_str(&b);
    k.per_element(ys.iter().product());
    Ok(())
}
