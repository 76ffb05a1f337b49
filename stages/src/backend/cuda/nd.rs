//! GatherND and ScatterND, one thread per moved element. Each thread resolves its index tuple (negative
//! entries count from the end) into the offset of its slice; an entry out of range (an error in the
//! reference) gathers a zero and scatters nothing: compiled code has no error channel.
//!
//! ScatterND is two kernels of one item: the data copied to the output, then one thread per update
//! element. When two tuples are equal (ONNX leaves the result undefined; the reference and the `c` backend
//! take the later update) a thread whose tuple appears again later writes nothing, so the result is the
//! reference's whatever the thread order. Constant indices are checked at compile time and that scan is
//! left out when every tuple is distinct.

use super::kernel::{zero, Kernel};
use crate::backend::lowering::nest::contiguous;
use crate::ir::{NodeId, ValueId};

/// Statements that set `long long {name}` (the element offset, inside a block of shape `block`, of the
/// slice the k-tuple number `tuple` of `ix` names) and `bool {name}_ok` (every entry in range).
fn tuple_offset(ix: &str, tuple: &str, block: &[usize], k: usize, name: &str) -> String {
    let strides = contiguous(block);
    let mut c = format!("long long {name} = 0;\nbool {name}_ok = true;\n");
    for (j, (&d, st)) in block[..k].iter().zip(&strides).enumerate() {
        c.push_str(&format!(
            "{{\nlong long v = (long long){ix}[(unsigned)({tuple}) * {k}u + {j}u];\nif (v < 0) v += {d};\nif (v < 0 || v >= {d}) {name}_ok = false;\n\
                {name} += v * {st};\n}}\n"
        ));
    }
    c
}

pub fn gather_nd(k: &mut Kernel, node: NodeId, batch_dims: usize) {
    let nd = k.g.node(node);
    let (i, idx, o) = (nd.inputs[0], nd.inputs[1], nd.outputs[0]);
    let xs = k.g.ty(i).shape.clone();
    let is = k.g.ty(idx).shape.clone();
    let kk = is[is.len() - 1];
    let block: usize = xs[batch_dims..].iter().product();
    let slice: usize = xs[batch_dims + kk..].iter().product::<usize>().max(1);
    let per: usize = is[batch_dims..is.len() - 1].iter().product::<usize>().max(1);
    let z = zero(k.g.ty(o).dtype);
    let (x, ix, y) = (k.buf(i, false), k.buf(idx, false), k.buf(o, true));
    let off = tuple_offset(&ix, "t", &xs[batch_dims..], kk, "off");
    k.body.push_str(&format!(
        "const unsigned e = i % {slice}u;\nconst unsigned t = i / {slice}u;\nconst unsigned b = t / {per}u;\n\
            {off}{y}[i] = off_ok ? {x}[(long long)b * {block} + off + e] : {z};\n"
    ));
    k.per_element(k.g.ty(o).numel());
}

/// Kernel 1 of ScatterND: the data into the output.
pub fn scatter_nd_copy(k: &mut Kernel, node: NodeId) {
    let nd = k.g.node(node);
    let (i, o) = (nd.inputs[0], nd.outputs[0]);
    let (x, y) = (k.buf(i, false), k.buf(o, true));
    k.body.push_str(&format!("{y}[i] = {x}[i];\n"));
    k.per_element(k.g.ty(o).numel());
}

/// Whether the tuples of `idx` may repeat: unknown at run time, checked for a constant.
fn may_repeat(k: &Kernel, idx: ValueId, dims: &[usize]) -> bool {
    let Some(t) = k.g.constant(idx) else { return true };
    let kk = dims.len();
    let mut seen: Vec<Vec<i64>> = t
        .to_i64_vec()
        .chunks(kk.max(1))
        .map(|c| c.iter().zip(dims).map(|(&v, &d)| if v < 0 { v + d as i64 } else { v }).collect())
        .collect();
    let n = seen.len();
    seen.sort();
    seen.dedup();
    seen.len() != n
}

/// Kernel 2 of ScatterND: one thread per update element (the caller skips it when there are none).
pub fn scatter_nd_updates(k: &mut Kernel, node: NodeId) {
    let nd = k.g.node(node);
    let (i, idx, u, o) = (nd.inputs[0], nd.inputs[1], nd.inputs[2], nd.outputs[0]);
    let xs = k.g.ty(i).shape.clone();
    let is = k.g.ty(idx).shape.clone();
    let kk = is[is.len() - 1];
    let slice: usize = xs[kk..].iter().product::<usize>().max(1);
    let tuples: usize = is[..is.len() - 1].iter().product();
    let repeat = may_repeat(k, idx, &xs[..kk]);
    let (ix, up, y) = (k.buf(idx, false), k.buf(u, false), k.buf(o, true));
    let mut b = format!("const unsigned e = i % {slice}u;\nconst unsigned n = i / {slice}u;\n{}", tuple_offset(&ix, "n", &xs, kk, "off"));
    b.push_str("if (!off_ok) return;\n");
    if repeat {
        b.push_str(&format!(
            "for (unsigned m = n + 1; m < {tuples}u; m++) {{\n{}if (later_ok && later == off) return;\n}}\n",
            tuple_offset(&ix, "m", &xs, kk, "later")
        ));
    }
    b.push_str(&format!("{y}[off + e] = {up}[i];\n"));
    k.body.push_str(&b);
    k.per_element(tuples * slice);
}
