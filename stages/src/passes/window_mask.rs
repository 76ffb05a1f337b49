//! A mask added in a view that splits the leading axis, brought back to the unsplit shape. Swin's shifted
//! windows add their mask per window as torchvision writes it,
//!
//! ```text
//! y = Reshape(Add(Reshape(x, [a, b, r..]), m), [a * b, r..])      x: [a * b, r..] (windows x heads, scores)
//! ```
//!
//! so the Softmax after it reads a Reshape instead of the scores plus a mask, and the attention is not
//! recognised. Rewritten as `y = Add(x, m')` with `m' = Reshape(Expand(m, [a, b, m..]), [a * b, m..])`: `m`
//! broadcast over the split axes only (not over the rest, which broadcast in the Add as before), the split
//! merged. `m'[i] = m[i / b, i % b]` wherever `m` does not broadcast, which is the element the split view
//! added, so the rewrite is exact. A constant `m` (Swin's mask is one once shapes are static) becomes a
//! constant `m'`, evaluated here by the reference interpreter; at batch 1 (`a = 1`) it has `m`'s size.

use super::pattern::{is_binary, producer_if, Uses};
use crate::interp::eval_op;
use crate::ir::{broadcast_shapes, BinaryOp, Graph, Op, ValueId};

struct Match {
    x: ValueId,
    m: ValueId,
    /// `[a, b]` then `m`'s trailing dims, and the merged shape `[a * b]` then the same.
    expanded: Vec<usize>,
    merged: Vec<usize>,
    root: ValueId,
    name: String,
}

fn match_at(g: &Graph, uses: &Uses, outer: crate::ir::NodeId) -> Option<Match> {
    let node = g.node(outer);
    let Op::Reshape { shape: back } = &node.op else { return None };
    let sum = node.inputs[0];
    let add = producer_if(g, sum, |op| is_binary(op, BinaryOp::Add)).filter(|_| uses.single(sum))?;
    let ins = &g.node(add).inputs;
    for (split, m) in [(ins[0], ins[1]), (ins[1], ins[0])] {
        let Some(inner) = producer_if(g, split, |op| matches!(op, Op::Reshape { .. })).filter(|_| uses.single(split)) else { continue };
        let x = g.node(inner).inputs[0];
        let (xs, ss) = (&g.ty(x).shape, &g.ty(split).shape);
        // The split view: x's leading axis as two, the rest unchanged; the outer Reshape undoes it.
        let splits = xs.len() >= 1 && ss.len() == xs.len() + 1 && ss[0] * ss[1] == xs[0] && ss[2..] == xs[1..];
        if !splits || back != xs || g.ty(m).dtype != g.ty(x).dtype || g.ty(sum) != g.ty(split) {
            continue;
        }
        // m broadcasts to the split view without widening it.
        let ms = &g.ty(m).shape;
        if ms.len() > ss.len() || broadcast_shapes(ss, ms).ok().as_deref() != Some(&ss[..]) {
            continue;
        }
        let mut m_full = vec![1; ss.len() - ms.len()];
        m_full.extend(ms);
        let mut expanded = vec![ss[0], ss[1]];
        expanded.extend(&m_full[2..]);
        let mut merged = vec![ss[0] * ss[1]];
        merged.extend(&m_full[2..]);
        return Some(Match { x, m, expanded, merged, root: node.outputs[0], name: node.name.clone() });
    }
    None
}

/// Rewrites every such Add; returns how many.
pub fn unsplit_masked_adds(g: &mut Graph) -> usize {
    let uses = Uses::new(g);
    let found: Vec<Match> = (0..g.nodes.len()).filter_map(|i| match_at(g, &uses, crate::ir::NodeId(i as u32))).collect();
    let mut count = 0;
    for f in found {
        let m = match g.constant(f.m) {
            Some(c) => {
                let expand = Op::Expand { shape: f.expanded.clone() };
                let Ok(mut t) = eval_op(&expand, &[c]) else { continue };
                g.add_const(format!("{}/mask", f.name), t.remove(0).reshaped(f.merged.clone()))
            }
            None => {
                let e = g.add(format!("{}/mask_expand", f.name), Op::Expand { shape: f.expanded.clone() }, &[f.m]);
                match e.and_then(|e| g.add(format!("{}/mask", f.name), Op::Reshape { shape: f.merged.clone() }, &[e])) {
                    Ok(v) => v,
                    Err(_) => continue,
                }
            }
        };
        let Ok(y) = g.add(format!("{}/unsplit", f.name), Op::Binary(BinaryOp::Add), &[f.x, m]) else { continue };
        if g.ty(y) != g.ty(f.root) {
            continue;
        }
        g.replace_uses(f.root, y);
        count += 1;
    }
    count
}

#[cfg(test)]
#[path = "window_mask_tests.rs"]
mod tests;
