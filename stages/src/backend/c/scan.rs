//! CumSum as one loop per line along the axis: the tensor is `[outer, D, inner]`, and each of the
//! `outer * inner` lines is summed in order (from its end when `reverse`). Floats accumulate in double and
//! round once per element, as the reference does; integers accumulate in uint64_t, which wraps as the
//! reference's two's-complement arithmetic does (signed overflow would be undefined in C).

use crate::backend::lowering::cexpr::mem_type;
use super::func::Func;
use crate::ir::NodeId;

pub fn cumsum(f: &mut Func, node: NodeId, axis: usize, exclusive: bool, reverse: bool) {
    let nd = f.g.node(node);
    let (i, o) = (nd.inputs[0], nd.outputs[0]);
    let xs = f.g.ty(i).shape.clone();
    let dtype = f.g.ty(i).dtype;
    let outer: usize = xs[..axis].iter().product();
    let d = xs[axis];
    let inner: usize = xs[axis + 1..].iter().product();
    if outer * d * inner == 0 {
        return;
    }
    let t = mem_type(dtype);
    let acc = if dtype.is_float() { "double" } else { "uint64_t" };
    let (x, y) = (f.buf(i, false), f.buf(o, true));
    let j = if reverse { format!("{} - s", d - 1) } else { "s".to_string() };
    let step = if exclusive {
        format!("{y}[at] = ({t})acc;\nacc += ({acc}){x}[at];\n")
    } else {
        format!("acc += ({acc}){x}[at];\n{y}[at] = ({t})acc;\n")
    };
    f.body.push_str(&format!(
        "for (long o = 0; o < {outer}; o++) {{\nfor (long i = 0; i < {inner}; i++) {{\n{acc} acc = 0;\nfor (long s = 0; s < {d}; s++) {{\nlong at = (o * {d} + {j}) * {inner} + i;\n{step}}}\n}}\n}}\n"
    ));
}
