//! Fused elementwise groups: the per-element code of a group, and the loop that runs a group on its own.
//!
//! The per-element code is shared by the standalone loop and by GEMM/conv epilogues: it loads each external
//! operand once, computes every member as a C local (`v<id>`), and stores only the members the plan
//! materializes. A one-element constant becomes a literal in the expression.

use crate::backend::lowering::cexpr::{self, f32_lit, int_lit, mem_type};
use crate::backend::Refusal;
use super::func::{Func, PARALLEL_GRAIN};
use crate::backend::lowering::nest::{broadcast, contiguous, Nest};
use crate::backend::lowering::plan::{group_externals, Group};
use crate::ir::{DType, Graph, ValueId};

/// How the element code reaches the group's external operands.
pub enum Operand {
    /// A literal (one-element constant).
    Literal(String),
    /// Loaded from a buffer: operand number among the loaded ones.
    Loaded(usize),
}

/// External operands of a group and, for the loaded ones, their values in order.
pub fn operands(g: &Graph, grp: &Group) -> (Vec<(ValueId, Operand)>, Vec<ValueId>) {
    let mut loaded = Vec::new();
    let ops = group_externals(g, grp)
        .into_iter()
        .map(|v| {
            if let Some(t) = g.constant(v) {
                if t.numel() == 1 {
                    let lit = match t.dtype() {
                        DType::F32 => f32_lit(t.to_f32_vec()[0]),
                        d => int_lit(t.to_i64_vec()[0], d),
                    };
                    return (v, Operand::Literal(lit));
                }
            }
            loaded.push(v);
            (v, Operand::Loaded(loaded.len() - 1))
        })
        .collect();
    (ops, loaded)
}

/// Statements computing one element of the group. `index(k)` is the offset of loaded operand `k`;
/// `anchor` the anchor's value for this element (a C expression); `out` the element's flat index in the
/// domain, where materialized members are stored.
pub fn element(
    f: &mut Func,
    grp: &Group,
    ops: &[(ValueId, Operand)],
    index: &dyn Fn(usize) -> String,
    anchor: Option<&str>,
    out: &str,
) -> Result<String, Refusal> {
    let g = f.g;
    let mut code = String::new();
    let mut local: Vec<(ValueId, String)> = Vec::new();
    for (v, op) in ops {
        let name = format!("x{}", v.0);
        let d = g.ty(*v).dtype;
        let e = match op {
            Operand::Literal(l) => l.clone(),
            Operand::Loaded(k) => {
                let p = f.buf(*v, false);
                cexpr::load(d, &p, &index(*k))
            }
        };
        code.push_str(&format!("const {} {name} = {e};\n", mem_type(d)));
        local.push((*v, name));
    }
    let mut stores: Vec<ValueId> = Vec::new();
    if let (Some(a), Some(expr)) = (grp.anchor, anchor) {
        let m = g.node(a).outputs[0];
        code.push_str(&format!("const float v{} = {expr};\n", m.0));
        local.push((m, format!("v{}", m.0)));
        stores.push(m);
    }
    for &n in &grp.nodes {
        let node = g.node(n);
        let args: Vec<String> = node
            .inputs
            .iter()
            .map(|i| local.iter().find(|(v, _)| v == i).map(|(_, s)| s.clone()).ok_or_else(|| format!("operand {i} of node '{}' not in scope", node.name)))
            .collect::<Result<_, _>>()?;
        let dts: Vec<DType> = node.inputs.iter().map(|&i| g.ty(i).dtype).collect();
        let o = node.outputs[0];
        let od = g.ty(o).dtype;
        let e = cexpr::elementwise(&node.op, &args, &dts, od).map_err(|e| format!("node '{}': {e}", node.name))?;
        code.push_str(&format!("const {} v{} = {e};\n", mem_type(od), o.0));
        local.push((o, format!("v{}", o.0)));
        stores.push(o);
    }
    for v in stores {
        if f.plan.materialized[v.index()] {
            let p = f.buf(v, true);
            code.push_str(&format!("{p}[{out}] = v{};\n", v.0));
        }
    }
    Ok(code)
}

/// Elements per range of a one-dimensional parallel loop (a multiple of every vector width).
const CHUNK: usize = 4096;

/// A group with no anchor as one loop nest over its domain; from 2 x [`PARALLEL_GRAIN`] elements on, in
/// parallel ranges: of the outermost loop, or, for a nest of one loop, of blocks of [`CHUNK`] elements.
pub fn standalone(f: &mut Func, grp: &Group) -> Result<(), Refusal> {
    let g = f.g;
    let (ops, loaded) = operands(g, grp);
    let d = &grp.domain;
    let mut strides: Vec<Vec<i64>> = loaded.iter().map(|&v| broadcast(&g.ty(v).shape, d)).collect();
    strides.push(contiguous(d));
    let nest = Nest::new(d, &strides);
    let nl = loaded.len();
    let mut err = None;
    let mut elem = |f: &mut Func, offs: &[String]| {
        let idx = |k: usize| offs[k].clone();
        match element(f, grp, &ops, &idx, None, &offs[nl]) {
            Ok(c) => c,
            Err(e) => {
                err = Some(e);
                String::new()
            }
        }
    };
    let n = nest.numel();
    let code = if nest.rank() == 0 || n < 2 * PARALLEL_GRAIN {
        nest.emit("i", |offs| elem(f, offs))
    } else if nest.rank() == 1 {
        let offs: Vec<String> = (0..strides.len()).map(|o| nest.offset(o, 0, 1, "i", "0")).collect();
        let body = format!(
            "const long e0 = ic * {CHUNK}, e1 = e0 + {CHUNK} < {n} ? e0 + {CHUNK} : {n};\nfor (long i0 = e0; i0 < e1; i0++) {{\n{}}}\n",
            elem(f, &offs)
        );
        f.parallel_for(n.div_ceil(CHUNK), PARALLEL_GRAIN.div_ceil(CHUNK), "ic", &body)
    } else {
        let base: Vec<String> = (0..strides.len()).map(|o| nest.offset(o, 0, 1, "i", "0")).collect();
        let body = nest.emit_range(1, nest.rank(), "i", &base, |offs| elem(f, offs));
        f.parallel_for(nest.dims[0], PARALLEL_GRAIN.div_ceil(n / nest.dims[0]), "i0", &body)
    };
    if let Some(e) = err {
        return Err(e);
    }
    f.body.push_str(&code);
    Ok(())
}
