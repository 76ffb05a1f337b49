//! CumSum, one thread per line along the axis: the tensor is `[outer, D, inner]` and thread `i` sums line
//! `(i / inner, :, i % inner)` in order (from its end when `reverse`). Floats (fp16 storage included)
//! accumulate in double and round once per element, as the reference does; integers accumulate in
//! unsigned 64-bit arithmetic, which wraps as the reference's two's complement does.

use super::kernel::{ld, mem_type, st, Kernel};
use crate::ir::NodeId;

pub fn cumsum(k: &mut Kernel, node: NodeId, axis: usize, exclusive: bool, reverse: bool) {
    let nd = k.g.node(node);
    let (i, o) = (nd.inputs[0], nd.outputs[0]);
    let xs = k.g.ty(i).shape.clone();
    let dtype = k.g.ty(i).dtype;
    let outer: usize = xs[..axis].iter().product();
    let d = xs[axis];
    let inner: usize = xs[axis + 1..].iter().product::<usize>().max(1);
    let (x, y) = (k.buf(i, false), k.buf(o, true));
    let float = dtype.is_float();
    let acc = if float { "double" } else { "unsigned long long" };
    let read = format!("({acc}){}", ld(dtype, &x, "at"));
    let write = if float { format!("{y}[at] = {};\n", st(dtype, "(float)acc")) } else { format!("{y}[at] = ({})acc;\n", mem_type(dtype)) };
    let j = if reverse { format!("{}u - s", d - 1) } else { "s".to_string() };
    let step = if exclusive { format!("{write}acc += {read};\n") } else { format!("acc += {read};\n{write}") };
    k.body.push_str(&format!(
        "const unsigned o = i / {inner}u;\nconst unsigned r = i % {inner}u;\n{acc} acc = 0;\nfor (unsigned s = 0; s < {d}u; s++) {{\n\
            const unsigned at = (o * {d}u + {j}) * {inner}u + r;\n{step}}}\n"
    ));
    k.per_element(outer * inner);
}
