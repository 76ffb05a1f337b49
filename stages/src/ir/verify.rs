//! The verifier: structural invariants every pass must preserve.

use super::graph::{Graph, ValueDef, ValueId};
use super::infer::infer_op;

/// A broken invariant, naming the node or value at fault.
#[derive(Debug, thiserror::Error)]
#[error("graph '{graph}' is invalid: {msg}")]
pub struct VerifyError {
    pub graph: String,
    pub msg: String,
}

/// Checks: value ids in range; value definitions agree with nodes and the input list; nodes in topological
/// order; every node's output types equal what inference gives; outputs defined; constants match their types.
pub fn verify(g: &Graph) -> Result<(), VerifyError> {
    let fail = |msg: String| Err(VerifyError { graph: g.name.clone(), msg });
    let nv = g.values.len();
    let in_range = |v: ValueId| v.index() < nv;
    for (pos, &v) in g.inputs.iter().enumerate() {
        if !in_range(v) {
            return fail(format!("input {pos} refers to missing value {v}"));
        }
        if !matches!(g.value(v).def, ValueDef::Input(p) if p == pos) {
            return fail(format!("input {pos} ('{}') is not defined as graph input {pos}", g.value(v).name));
        }
    }
    for (i, val) in g.values.iter().enumerate() {
        match &val.def {
            ValueDef::Input(p) => {
                if g.inputs.get(*p).map(|v| v.index()) != Some(i) {
                    return fail(format!("value '{}' claims to be input {p} but is not listed there", val.name));
                }
            }
            ValueDef::Const(t) => {
                if t.ty != val.ty {
                    return fail(format!("constant '{}' has data of type {} but is declared {}", val.name, t.ty, val.ty));
                }
            }
            ValueDef::Node { node, output } => {
                let ok = g.nodes.get(node.index()).and_then(|n| n.outputs.get(*output)).map(|v| v.index()) == Some(i);
                if !ok {
                    return fail(format!("value '{}' claims to be output {output} of node {} but is not", val.name, node.0));
                }
            }
        }
    }
    let mut defined = vec![false; nv];
    for (i, val) in g.values.iter().enumerate() {
        if !matches!(val.def, ValueDef::Node { .. }) {
            defined[i] = true;
        }
    }
    for (ni, n) in g.nodes.iter().enumerate() {
        for &v in &n.inputs {
            if !in_range(v) {
                return fail(format!("node '{}' ({}) uses missing value {v}", n.name, n.op.name()));
            }
            if !defined[v.index()] {
                return fail(format!(
                    "node '{}' ({}) uses '{}' before it is defined (nodes out of topological order or a cycle)",
                    n.name,
                    n.op.name(),
                    g.value(v).name
                ));
            }
        }
        let in_types: Vec<_> = n.inputs.iter().map(|&v| g.ty(v)).collect();
        let out_types = match infer_op(&n.op, &in_types) {
            Ok(t) => t,
            Err(e) => return fail(format!("node '{}' ({}): {e}", n.name, n.op.name())),
        };
        if out_types.len() != n.outputs.len() {
            return fail(format!("node '{}' ({}) has {} outputs, op gives {}", n.name, n.op.name(), n.outputs.len(), out_types.len()));
        }
        for (k, (&o, t)) in n.outputs.iter().zip(&out_types).enumerate() {
            if !in_range(o) {
                return fail(format!("node '{}' output {k} refers to missing value {o}", n.name));
            }
            if !matches!(g.value(o).def, ValueDef::Node { node, output } if node.index() == ni && output == k) {
                return fail(format!("node '{}' output {k} ('{}') is not defined by it", n.name, g.value(o).name));
            }
            if g.ty(o) != t {
                return fail(format!("node '{}' ({}) output '{}' is declared {} but infers to {}", n.name, n.op.name(), g.value(o).name, g.ty(o), t));
            }
            defined[o.index()] = true;
        }
    }
    if g.outputs.is_empty() {
        return fail("graph has no outputs".into());
    }
    for (pos, &o) in g.outputs.iter().enumerate() {
        if !in_range(o) {
            return fail(format!("graph output refers to missing value {o}"));
        }
        // Outputs are bound and written by name (the artifact's output list, `tessera run --out`): two
        // different values under one name would overwrite each other. (One value listed twice is an alias.)
        let name = &g.value(o).name;
        if let Some(first) = g.outputs[..pos].iter().position(|&p| p != o && g.value(p).name == *name) {
            return fail(format!("graph outputs {first} and {pos} are different values both named '{name}'"));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;
