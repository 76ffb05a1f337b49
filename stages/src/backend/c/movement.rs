//! Data movement as index loops: Transpose, Slice, Split, Concat, Expand, Tile, Gather, GatherElements, Pad,
//! and the copies into outputs. Elements are moved in their own C type (bit-exact on every supported host).
//! Every strided copy is one coalesced nest; a contiguous inner run becomes a memcpy.

#![allow(clippy::needless_range_loop)]

use crate::backend::lowering::cexpr::mem_type;
use crate::backend::{refuse, Refusal};
use super::func::Func;
use crate::backend::lowering::nest::{broadcast, contiguous, Nest};
use crate::ir::{NodeId, PadMode, Tensor, ValueId};

/// `dst[dst_base + i·dst_st] = src[src_base + i·src_st]` over every multi-index `i` of `shape`.
#[allow(clippy::too_many_arguments)]
pub fn copy(shape: &[usize], dst: &str, dst_st: Vec<i64>, dst_base: &str, src: &str, src_st: Vec<i64>, src_base: &str, elem: &str) -> String {
    if shape.contains(&0) {
        return String::new();
    }
    let nest = Nest::new(shape, &[dst_st, src_st]);
    let n = nest.rank();
    let base = vec![dst_base.to_string(), src_base.to_string()];
    if n > 0 && nest.strides[0][n - 1] == 1 && nest.strides[1][n - 1] == 1 {
        let run = nest.dims[n - 1];
        return nest.emit_range(0, n - 1, "i", &base, |o| format!("memcpy({dst} + {}, {src} + {}, {run} * sizeof({elem}));\n", o[0], o[1]));
    }
    nest.emit_range(0, n, "i", &base, |o| format!("{dst}[{}] = {src}[{}];\n", o[0], o[1]))
}

fn ty(f: &Func, v: ValueId) -> &'static str {
    mem_type(f.g.ty(v).dtype)
}

/// A value copied whole into another buffer (outputs listed twice, inputs or constants returned as outputs).
pub fn copy_value(f: &mut Func, from: ValueId, to: &str) {
    let t = ty(f, from);
    let n = f.g.ty(from).numel();
    let s = f.buf(from, false);
    if n > 0 {
        f.body.push_str(&format!("memcpy({to}, {s}, {n} * sizeof({t}));\n"));
    }
}

pub fn transpose(f: &mut Func, node: NodeId, perm: &[usize]) {
    let nd = f.g.node(node);
    let (i, o) = (nd.inputs[0], nd.outputs[0]);
    let own = contiguous(&f.g.ty(i).shape);
    let shape = f.g.ty(o).shape.clone();
    let src_st: Vec<i64> = perm.iter().map(|&p| own[p]).collect();
    let t = ty(f, i);
    let (x, y) = (f.buf(i, false), f.buf(o, true));
    f.body.push_str(&copy(&shape, &y, contiguous(&shape), "0", &x, src_st, "0", t));
}

/// A strided window of the input (Slice, and each output of Split) into a contiguous output.
fn window(f: &mut Func, i: ValueId, o: ValueId, axes: &[usize], starts: &[i64], steps: &[i64]) {
    let own = contiguous(&f.g.ty(i).shape);
    let shape = f.g.ty(o).shape.clone();
    let mut st = own.clone();
    let mut base = 0i64;
    for (k, &a) in axes.iter().enumerate() {
        if shape[a] > 0 {
            base += starts[k] * own[a];
        }
        st[a] = own[a] * steps[k];
    }
    let t = ty(f, i);
    let (x, y) = (f.buf(i, false), f.buf(o, true));
    f.body.push_str(&copy(&shape, &y, contiguous(&shape), "0", &x, st, &base.to_string(), t));
}

pub fn slice(f: &mut Func, node: NodeId, axes: &[usize], starts: &[i64], steps: &[i64]) {
    let nd = f.g.node(node);
    window(f, nd.inputs[0], nd.outputs[0], axes, starts, steps);
}

pub fn split(f: &mut Func, node: NodeId, axis: usize, sizes: &[usize]) {
    let nd = f.g.node(node);
    let mut start = 0i64;
    for (k, &n) in sizes.iter().enumerate() {
        if f.plan.materialized[nd.outputs[k].index()] {
            window(f, nd.inputs[0], nd.outputs[k], &[axis], &[start], &[1]);
        }
        start += n as i64;
    }
}

pub fn concat(f: &mut Func, node: NodeId, axis: usize) {
    let nd = f.g.node(node);
    let o = nd.outputs[0];
    let oshape = f.g.ty(o).shape.clone();
    let ost = contiguous(&oshape);
    let t = ty(f, o);
    let y = f.buf(o, true);
    let mut at = 0usize;
    for &i in &nd.inputs {
        let shape = f.g.ty(i).shape.clone();
        let x = f.buf(i, false);
        let base = (at as i64 * ost[axis]).to_string();
        f.body.push_str(&copy(&shape, &y, ost.clone(), &base, &x, contiguous(&shape), "0", t));
        at += shape[axis];
    }
}

pub fn expand(f: &mut Func, node: NodeId) {
    let nd = f.g.node(node);
    let (i, o) = (nd.inputs[0], nd.outputs[0]);
    let shape = f.g.ty(o).shape.clone();
    let st = broadcast(&f.g.ty(i).shape, &shape);
    let t = ty(f, i);
    let (x, y) = (f.buf(i, false), f.buf(o, true));
    f.body.push_str(&copy(&shape, &y, contiguous(&shape), "0", &x, st, "0", t));
}

pub fn tile(f: &mut Func, node: NodeId, repeats: &[usize]) {
    let nd = f.g.node(node);
    let (i, o) = (nd.inputs[0], nd.outputs[0]);
    let xs = f.g.ty(i).shape.clone();
    let own = contiguous(&xs);
    // The tiled tensor is the view [r0, d0, r1, d1, ...] with stride 0 on every repeat axis, row-major.
    let mut view = Vec::new();
    let mut st = Vec::new();
    for (a, &r) in repeats.iter().enumerate() {
        view.extend([r, xs[a]]);
        st.extend([0, own[a]]);
    }
    let t = ty(f, i);
    let (x, y) = (f.buf(i, false), f.buf(o, true));
    f.body.push_str(&copy(&view, &y, contiguous(&view), "0", &x, st, "0", t));
}

/// Gather along `axis`: rows of `post` elements picked by index (negative counts from the end). An index
/// out of range (an error in the reference) yields zeros: compiled code has no error channel.
pub fn gather(f: &mut Func, node: NodeId, axis: usize) {
    let nd = f.g.node(node);
    let (i, idx, o) = (nd.inputs[0], nd.inputs[1], nd.outputs[0]);
    let xs = f.g.ty(i).shape.clone();
    let dim = xs[axis];
    let pre: usize = xs[..axis].iter().product();
    let post: usize = xs[axis + 1..].iter().product();
    let nidx = f.g.ty(idx).numel();
    let t = ty(f, i);
    let (x, ix, y) = (f.buf(i, false), f.buf(idx, false), f.buf(o, true));
    if pre * nidx * post == 0 {
        return;
    }
    f.body.push_str(&format!(
        "for (long p = 0; p < {pre}; p++) {{\nfor (long t = 0; t < {nidx}; t++) {{\nint64_t k = (int64_t){ix}[t];\nif (k < 0) k += {dim};\n{t}* dst = {y} + (p * {nidx} + t) * {post};\nif (k < 0 || k >= {dim}) memset(dst, 0, {post} * sizeof({t}));\nelse memcpy(dst, {x} + (p * {dim} + k) * {post}, {post} * sizeof({t}));\n}}\n}}\n"
    ));
}

/// GatherElements: every output element reads the data at its own coordinates, with the index replacing the
/// coordinate along `axis`.
pub fn gather_elements(f: &mut Func, node: NodeId, axis: usize) -> Result<(), Refusal> {
    let nd = f.g.node(node);
    let (i, idx, o) = (nd.inputs[0], nd.inputs[1], nd.outputs[0]);
    let xs = f.g.ty(i).shape.clone();
    let is = f.g.ty(idx).shape.clone();
    for (a, (&n, &d)) in is.iter().zip(&xs).enumerate() {
        if a != axis && n > d {
            return Err(refuse!("GatherElements: indices dimension {a} is {n}, data has {d}"));
        }
    }
    let own = contiguous(&xs);
    let mut xst = own.clone();
    xst[axis] = 0;
    let dim = xs[axis];
    let (x, ix, y) = (f.buf(i, false), f.buf(idx, false), f.buf(o, true));
    let nest = Nest::new(&is, &[contiguous(&is), xst]);
    f.body.push_str(&nest.emit("i", |off| {
        format!(
            "{{\nint64_t k = (int64_t){ix}[{0}];\nif (k < 0) k += {dim};\n{y}[{0}] = (k >= 0 && k < {dim}) ? {x}[{1} + k * {2}] : 0;\n}}\n",
            off[0], off[1], own[axis]
        )
    }));
    Ok(())
}

/// Pad: constant mode fills and copies the (possibly cropped) interior; edge and reflect map every output
/// coordinate through a per-axis table.
pub fn pad(f: &mut Func, node: NodeId, pads: &[i64], mode: PadMode, value: f32, lit: &dyn Fn(&Tensor) -> String) -> Result<(), Refusal> {
    let nd = f.g.node(node);
    let (i, o) = (nd.inputs[0], nd.outputs[0]);
    let xs = f.g.ty(i).shape.clone();
    let ys = f.g.ty(o).shape.clone();
    let r = xs.len();
    let d = f.g.ty(i).dtype;
    let t = ty(f, i);
    let (x, y) = (f.buf(i, false), f.buf(o, true));
    let (xst, yst) = (contiguous(&xs), contiguous(&ys));
    let n: usize = ys.iter().product();
    if mode == PadMode::Constant {
        let fill = lit(&Tensor::from_f64_as(d, Vec::new(), &[value as f64]));
        if n > 0 {
            f.body.push_str(&format!("for (long q = 0; q < {n}; q++) {y}[q] = {fill};\n"));
        }
        let mut shape = Vec::new();
        let (mut db, mut sb) = (0i64, 0i64);
        for a in 0..r {
            let begin = pads[a];
            let lo = begin.max(0);
            let hi = (ys[a] as i64).min(begin + xs[a] as i64);
            shape.push((hi - lo).max(0) as usize);
            db += lo * yst[a];
            sb += (lo - begin) * xst[a];
        }
        f.body.push_str(&copy(&shape, &y, yst, &db.to_string(), &x, xst, &sb.to_string(), t));
        return Ok(());
    }
    if n == 0 {
        return Ok(());
    }
    let mut c = String::new();
    for a in 0..r {
        let dim = xs[a] as i64;
        if dim == 0 {
            return Err(refuse!("Pad: {mode:?} mode cannot pad an empty dimension"));
        }
        let map: Vec<String> = (0..ys[a] as i64)
            .map(|oc| {
                let ic = oc - pads[a];
                let m = match mode {
                    PadMode::Edge => ic.clamp(0, dim - 1),
                    _ if dim == 1 => 0,
                    _ => {
                        let period = 2 * (dim - 1);
                        let m = ic.rem_euclid(period);
                        if m < dim {
                            m
                        } else {
                            period - m
                        }
                    }
                };
                (m * xst[a]).to_string()
            })
            .collect();
        c.push_str(&format!("static const long map{a}[{}] = {{{}}};\n", ys[a], map.join(", ")));
    }
    let terms: Vec<String> = (0..r).map(|a| format!("map{a}[o{a}]")).collect();
    let oi: Vec<String> = (0..r).map(|a| format!("o{a} * {}", yst[a])).collect();
    for a in 0..r {
        c.push_str(&format!("for (long o{a} = 0; o{a} < {}; o{a}++) {{\n", ys[a]));
    }
    c.push_str(&format!("{y}[{}] = {x}[{}];\n", if oi.is_empty() { "0".into() } else { oi.join(" + ") }, if terms.is_empty() { "0".into() } else { terms.join(" + ") }));
    for _ in 0..r {
        c.push_str("}\n");
    }
    f.body.push_str(&c);
    Ok(())
}
