//! Fused elementwise groups: the per-element code of a group (shared with GEMM epilogues) and the
//! one-thread-per-element kernel that runs a group on its own. Every member is a register; only the members
//! the plan materializes are stored.

use crate::backend::Refusal;
use super::kernel::{compute_dtype, coords, ld, offset, scalar_literal, st, Kernel};
use crate::backend::lowering::cexpr;
use crate::backend::lowering::nest::{broadcast, contiguous, Nest};
use crate::backend::lowering::plan::{group_externals, Group};
use crate::ir::{DType, ValueId};

/// Statements computing one element of `grp`: `operand(k)` is loaded operand `k`'s element offset (an
/// expression), `anchor` the anchor's value for this element, `out` the element's flat index in the domain.
pub fn element(k: &mut Kernel, grp: &Group, loaded: &[ValueId], operand: &dyn Fn(usize) -> String, anchor: Option<&str>, out: &str) -> Result<String, Refusal> {
    let g = k.g;
    let mut code = String::new();
    let mut local: Vec<(ValueId, String)> = Vec::new();
    for v in group_externals(g, grp) {
        let d = g.ty(v).dtype;
        let e = match g.constant(v).filter(|t| t.numel() == 1) {
            Some(t) => scalar_literal(t),
            None => {
                let at = loaded.iter().position(|&l| l == v).ok_or_else(|| format!("operand {v} is not loaded"))?;
                let p = k.buf(v, false);
                ld(d, &p, &operand(at))
            }
        };
        code.push_str(&format!("const {} x{} = {e};\n", cexpr::mem_type(compute_dtype(d)), v.0));
        local.push((v, format!("x{}", v.0)));
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
        // f16 values are floats in registers: ops (and casts between f16 and f32) see fp32.
        let dts: Vec<DType> = node.inputs.iter().map(|&i| compute_dtype(g.ty(i).dtype)).collect();
        let o = node.outputs[0];
        let od = compute_dtype(g.ty(o).dtype);
        let op = match &node.op {
            crate::ir::Op::Cast { to } => crate::ir::Op::Cast { to: compute_dtype(*to) },
            op => op.clone(),
        };
        let e = cexpr::elementwise(&op, &args, &dts, od).map_err(|e| format!("node '{}': {e}", node.name))?;
        code.push_str(&format!("const {} v{} = {e};\n", cexpr::mem_type(od), o.0));
        local.push((o, format!("v{}", o.0)));
        stores.push(o);
    }
    for v in stores {
        if k.plan.materialized[v.index()] {
            let p = k.buf(v, true);
            code.push_str(&format!("{p}[{out}] = {};\n", st(g.ty(v).dtype, &format!("v{}", v.0))));
        }
    }
    Ok(code)
}

/// The operands of `grp` read from memory (one-element constants become literals), in order.
pub fn loaded_operands(k: &Kernel, grp: &Group) -> Vec<ValueId> {
    group_externals(k.g, grp).into_iter().filter(|&v| k.g.constant(v).is_none_or(|t| t.numel() != 1)).collect()
}

/// Statements giving, for the element at flat index `flat` of `domain`, each loaded operand's offset as
/// `o<k>` (broadcast operands by their broadcast strides), over the domain's coalesced dims.
pub fn operand_offsets(k: &Kernel, domain: &[usize], loaded: &[ValueId], flat: &str) -> String {
    let g = k.g;
    let mut strides: Vec<Vec<i64>> = loaded.iter().map(|&v| broadcast(&g.ty(v).shape, domain)).collect();
    strides.push(contiguous(domain));
    let nest = Nest::new(domain, &strides);
    let nl = loaded.len();
    // An operand read contiguously over the whole domain uses the flat index itself.
    let contiguous_all = |st: &[i64]| st == nest.strides[nl].as_slice();
    let used: Vec<bool> = (0..nest.dims.len()).map(|d| (0..nl).any(|o| nest.strides[o][d] != 0 && !contiguous_all(&nest.strides[o]))).collect();
    let mut s = coords(&nest.dims, flat, "c", &used);
    for o in 0..nl {
        let e = if contiguous_all(&nest.strides[o]) { flat.to_string() } else { offset("c", &nest.strides[o]) };
        s.push_str(&format!("const unsigned o{o} = {e};\n"));
    }
    s
}

/// A group without an anchor: one thread per element of its domain.
pub fn standalone(k: &mut Kernel, grp: &Group) -> Result<(), Refusal> {
    let loaded = loaded_operands(k, grp);
    let n: usize = grp.domain.iter().product();
    let mut body = operand_offsets(k, &grp.domain, &loaded, "i");
    body.push_str(&element(k, grp, &loaded, &|o| format!("o{o}"), None, "i")?);
    k.body.push_str(&body);
    k.per_element(n);
    Ok(())
}
