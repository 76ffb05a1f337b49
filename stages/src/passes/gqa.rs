//! Grouped-query attention reads its shared K and V heads in place. Hugging Face's `repeat_kv` (Llama, Qwen2,
//! Mistral and every GQA or MQA decoder) repeats each key/value head for its group of query heads before the
//! attention, and the exporters write it out:
//!
//! ```text
//! K = Reshape(Expand(u, [B, Hkv, G, Sk, D]), [B, Hkv * G, Sk, D])     u: [B, Hkv, 1, Sk, D] (k unsqueezed)
//! ```
//!
//! (V likewise; K may be `[.., D, Sk]`, transposed). After [`super::attention`] made the attention one op,
//! such an `Attention(q, K, V, masks)` becomes
//!
//! ```text
//! y = Reshape(Attention(Reshape(q, [B, Hkv, G, Sq, D]), u, v_u, masks viewed alike), [B, H, Sq, Dv])
//! ```
//!
//! whose batch dims `[B, Hkv, G]` broadcast u's group dim of 1: every query head of a group reads its key/value
//! head where it is, and the G-fold copies of K and V are never made. Head `h` of the repeated K is head
//! `h / G` of u, which is query head `h`'s place `(h / G, h % G)` in the view, so the outputs are the same
//! elements: the rewrite is exact. A mask with one head (`[.., 1, Sq, Sk]`) gets a group dim of 1 too, one with
//! H heads is split like q.

use super::pattern::producer_if;
use crate::ir::{attention_dims, Graph, NodeId, Op, ValueId};

/// The unexpanded source of a repeated K or V operand: `u` and `(Hkv, G)`.
fn repeated(g: &Graph, v: ValueId) -> Option<(ValueId, usize, usize)> {
    let r = producer_if(g, v, |op| matches!(op, Op::Reshape { .. }))?;
    let e = producer_if(g, g.node(r).inputs[0], |op| matches!(op, Op::Expand { .. }))?;
    let u = g.node(e).inputs[0];
    let (us, es, vs) = (&g.ty(u).shape, &g.ty(g.node(e).outputs[0]).shape, &g.ty(v).shape);
    if us.len() != 5 || es.len() != 5 || vs.len() != 4 || us[2] != 1 || es[2] < 2 {
        return None;
    }
    let same = |i: usize| us[i] == es[i];
    let merged = vs[0] == es[0] && vs[1] == es[1] * es[2] && vs[2..] == es[3..];
    (same(0) && same(1) && same(3) && same(4) && merged).then_some((u, es[1], es[2]))
}

struct Match {
    node: NodeId,
    k: ValueId,
    v: ValueId,
    hkv: usize,
    group: usize,
}

fn match_at(g: &Graph, n: NodeId) -> Option<Match> {
    let node = g.node(n);
    let Op::Attention(_) = &node.op else { return None };
    let q = g.ty(node.inputs[0]);
    if q.rank() != 4 {
        return None;
    }
    let (k, hk, gk) = repeated(g, node.inputs[1])?;
    let (v, hv, gv) = repeated(g, node.inputs[2])?;
    (hk == hv && gk == gv && q.shape[1] == hk * gk && q.shape[0] == g.ty(k).shape[0]).then_some(Match { node: n, k, v, hkv: hk, group: gk })
}

/// A mask of the rank-4 attention as the rank-5 one reads it, or `None` where its head dim is neither 1 nor H.
fn mask_view(shape: &[usize], hkv: usize, group: usize) -> Option<Vec<usize>> {
    let mut m = vec![1; 4usize.saturating_sub(shape.len())];
    m.extend(shape);
    if m.len() != 4 {
        return None;
    }
    match m[1] {
        1 => Some(vec![m[0], 1, 1, m[2], m[3]]),
        h if h == hkv * group => Some(vec![m[0], hkv, group, m[2], m[3]]),
        _ => None,
    }
}

/// Rewrites every grouped-query attention; returns how many.
pub fn read_gqa_in_place(g: &mut Graph) -> usize {
    let found: Vec<Match> = (0..g.nodes.len()).filter_map(|i| match_at(g, NodeId(i as u32))).collect();
    let mut count = 0;
    for m in found {
        let node = g.node(m.node).clone();
        let Op::Attention(attrs) = &node.op else { continue };
        let q = node.inputs[0];
        let qs = g.ty(q).shape.clone();
        let mut inputs = Vec::with_capacity(node.inputs.len());
        let mut views: Vec<(ValueId, Vec<usize>)> = vec![(q, vec![qs[0], m.hkv, m.group, qs[2], qs[3]])];
        let mut ok = true;
        for &extra in &node.inputs[3..] {
            match mask_view(&g.ty(extra).shape, m.hkv, m.group) {
                Some(s) => views.push((extra, s)),
                None => ok = false,
            }
        }
        if !ok {
            continue;
        }
        let mut viewed = Vec::new();
        for (i, (v, shape)) in views.into_iter().enumerate() {
            match g.add(format!("{}/gqa_view{i}", node.name), Op::Reshape { shape }, &[v]) {
                Ok(r) => viewed.push(r),
                Err(_) => ok = false,
            }
        }
        if !ok {
            continue;
        }
        inputs.push(viewed[0]);
        inputs.extend([m.k, m.v]);
        inputs.extend(&viewed[1..]);
        let types: Vec<_> = inputs.iter().map(|&i| g.ty(i)).collect();
        if attention_dims(attrs, &types).is_err() {
            continue;
        }
        let Ok(y5) = g.add(format!("{}/gqa", node.name), Op::Attention(attrs.clone()), &inputs) else { continue };
        let out = node.outputs[0];
        let Ok(y) = g.add(format!("{}/gqa_heads", node.name), Op::Reshape { shape: g.ty(out).shape.clone() }, &[y5]) else { continue };
        if g.ty(y) != g.ty(out) {
            continue;
        }
        g.replace_uses(out, y);
        count += 1;
    }
    count
}

#[cfg(test)]
#[path = "gqa_tests.rs"]
mod tests;
