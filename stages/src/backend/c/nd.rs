//! GatherND and ScatterND as loops over index tuples: each tuple is resolved (negative entries count from
//! the end) into the offset of one contiguous slice, which is copied with memcpy. An entry out of range (an
//! error in the reference) gathers zeros and scatters nothing: compiled code has no error channel. ScatterND
//! copies data to the output, then applies the tuples in order, so a repeated tuple takes the later update,
//! as in the reference.

use crate::backend::lowering::cexpr::mem_type;
use super::func::Func;
use crate::backend::lowering::nest::contiguous;
use crate::ir::NodeId;

/// C statements that set `long off` (the element offset, inside a block of shape `block`, of the slice the
/// k-tuple at `ix[tuple * k ..]` names) and `int ok` (every entry in range).
pub fn tuple_offset(ix: &str, tuple: &str, block: &[usize], k: usize) -> String {
    let strides = contiguous(block);
    let mut c = String::from("long off = 0;\nint ok = 1;\n");
    for (j, (&d, st)) in block[..k].iter().zip(&strides).enumerate() {
        c.push_str(&format!(
            "{{\nint64_t v = (int64_t){ix}[({tuple}) * {k} + {j}];\nif (v < 0) v += {d};\nif (v < 0 || v >= {d}) ok = 0;\noff += (long)v * {st};\n}}\n"
        ));
    }
    c
}

pub fn gather_nd(f: &mut Func, node: NodeId, batch_dims: usize) {
    let nd = f.g.node(node);
    let (i, idx, o) = (nd.inputs[0], nd.inputs[1], nd.outputs[0]);
    let xs = f.g.ty(i).shape.clone();
    let is = f.g.ty(idx).shape.clone();
    let k = is[is.len() - 1];
    let batches: usize = xs[..batch_dims].iter().product();
    let block: usize = xs[batch_dims..].iter().product();
    let slice: usize = xs[batch_dims + k..].iter().product();
    let per: usize = is[batch_dims..is.len() - 1].iter().product();
    if batches * per * slice == 0 {
        return;
    }
    let t = mem_type(f.g.ty(i).dtype);
    let (x, ix, y) = (f.buf(i, false), f.buf(idx, false), f.buf(o, true));
    let off = tuple_offset(&ix, &format!("b * {per} + n"), &xs[batch_dims..], k);
    f.body.push_str(&format!(
        "for (long b = 0; b < {batches}; b++) {{\nfor (long n = 0; n < {per}; n++) {{\n{off}{t}* dst = {y} + (b * {per} + n) * {slice};\nif (!ok) memset(dst, 0, {slice} * sizeof({t}));\nelse memcpy(dst, {x} + b * {block} + off, {slice} * sizeof({t}));\n}}\n}}\n"
    ));
}

pub fn scatter_nd(f: &mut Func, node: NodeId) {
    let nd = f.g.node(node);
    let (i, idx, u, o) = (nd.inputs[0], nd.inputs[1], nd.inputs[2], nd.outputs[0]);
    let xs = f.g.ty(i).shape.clone();
    let is = f.g.ty(idx).shape.clone();
    let k = is[is.len() - 1];
    let numel: usize = xs.iter().product();
    let slice: usize = xs[k..].iter().product();
    let tuples: usize = is[..is.len() - 1].iter().product();
    if numel == 0 {
        return;
    }
    let t = mem_type(f.g.ty(i).dtype);
    let (x, ix, up, y) = (f.buf(i, false), f.buf(idx, false), f.buf(u, false), f.buf(o, true));
    f.body.push_str(&format!("memcpy({y}, {x}, {numel} * sizeof({t}));\n"));
    if tuples * slice == 0 {
        return;
    }
    let off = tuple_offset(&ix, "n", &xs, k);
    f.body.push_str(&format!(
        "for (long n = 0; n < {tuples}; n++) {{\n{off}if (ok) memcpy({y} + off, {up} + n * {slice}, {slice} * sizeof({t}));\n}}\n"
    ));
}
