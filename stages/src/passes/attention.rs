//! Recognizes scaled dot-product attention written out by exporters and replaces it with one
//! [`Op::Attention`]:
//!
//! ```text
//! s = MatMul(q', kt')                 q' = q | Mul(q, c) | Div(q, c)      kt' likewise on kt
//! s = Div(s, c) | Mul(s, c)           (any number, each c a scalar constant; BERT, GPT-2 divide, ViT multiplies)
//! s = Where(keep, s, fill)            optional (GPT-2's causal mask); or Where(drop, fill, s) (masked_fill)
//! s = Add(s, mask)                    optional, up to 3 (BERT's and GPT-2's attention mask, SDPA's float mask,
//!                                     T5's and Swin's position bias then a mask): the masks are summed first
//! p = Softmax(s, axis = last)
//! p = Where(IsNaN(p), 0, p)           optional: the NaN guard PyTorch's exporters write for SDPA
//! y = MatMul(p, v)
//! ```
//!
//! `kt` is used as K in the `[.., D, Sk]` layout unless it is a Transpose of the last two axes, which is
//! then absorbed (K read as `[.., Sk, D]`). Every scale is a one-element float constant and the scales
//! fold into one (their product, in f64, rounded once to f32); `fill` is a one-element float constant.
//! Every intermediate must be used only inside the pattern and no broadcast may widen it (the mask and the
//! keep mask broadcast to the scores), so the rewrite is exact in real arithmetic: the reference interpreter
//! gives the same outputs before and after up to the rounding of the folded scale.

use super::pattern::{is_binary, producer_if, scalar, split_scalar, Uses};
use crate::ir::{attention_dims, broadcast_shapes, AttentionAttrs, BinaryOp, Graph, NodeId, Op, UnaryOp, ValueId};
use std::collections::BTreeMap;

/// One matched pattern: what to build and what it replaces.
struct Match {
    q: ValueId,
    k: ValueId,
    v: ValueId,
    k_transposed: bool,
    /// A Transpose of `k` to build first (K's natural layout from the producer of Kᵀ); `k` is its input.
    k_perm: Option<Vec<usize>>,
    scale: f64,
    mask: Option<ValueId>,
    /// The Where's condition, whether it selects the fill where true (masked_fill) rather than where false,
    /// and the fill.
    keep: Option<(ValueId, bool, f32)>,
    /// The Softmax's output went through the NaN guard.
    nan_to_zero: bool,
    /// Further additive masks, added to `mask` in order (the graph added them to the scores one by one).
    extra_masks: Vec<ValueId>,
    root: ValueId,
    name: String,
}

/// The scores side of the pattern: from the value the Softmax (or the mask's Add) reads, up to the MatMul.
struct Scores {
    q: ValueId,
    kt: ValueId,
    scale: f64,
    keep: Option<(ValueId, bool, f32)>,
}

/// If `v` is `x * c` or `x / c` for a one-element float constant `c` that does not widen `x`, returns `x`
/// and the factor (`c` or `1/c`).
fn scaled(g: &Graph, v: ValueId) -> Option<(ValueId, f64)> {
    let n = g.producer(v)?;
    let node = g.node(n);
    let (x, factor) = match node.op {
        Op::Binary(BinaryOp::Div) => (node.inputs[0], 1.0 / scalar(g, node.inputs[1])?),
        Op::Binary(BinaryOp::Mul) => {
            let (c, x) = split_scalar(g, n, |g, c| scalar(g, c).is_some())?;
            (x, scalar(g, c)?)
        }
        _ => return None,
    };
    (g.ty(x) == g.ty(v) && factor.is_finite() && factor != 0.0).then_some((x, factor))
}

/// True when `perm` swaps the last two axes and keeps the others.
fn swaps_last_two(perm: &[usize]) -> bool {
    let r = perm.len();
    r >= 2 && perm[r - 2] == r - 1 && perm[r - 1] == r - 2 && perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p)
}

fn scores(g: &Graph, uses: &Uses, mut s: ValueId) -> Option<Scores> {
    let ty = g.ty(s).clone();
    let mut keep = None;
    if !uses.single(s) {
        return None;
    }
    if let Some(w) = producer_if(g, s, |op| matches!(op, Op::Where)) {
        let ins = &g.node(w).inputs;
        let (cond, inner, fill, selects_fill) = match (scalar(g, ins[2]), scalar(g, ins[1])) {
            (Some(f), _) => (ins[0], ins[1], f, false),
            (None, Some(f)) => (ins[0], ins[2], f, true),
            _ => return None,
        };
        if g.ty(inner) != &ty || !uses.single(inner) {
            return None;
        }
        keep = Some((cond, selects_fill, fill as f32));
        s = inner;
    }
    let mut scale = 1.0f64;
    while let Some((x, f)) = scaled(g, s).filter(|_| uses.single(s)) {
        scale *= f;
        s = x;
    }
    let mm = producer_if(g, s, |op| matches!(op, Op::MatMul)).filter(|_| uses.single(s))?;
    let (mut q, mut kt) = (g.node(mm).inputs[0], g.node(mm).inputs[1]);
    if g.ty(q).rank() < 2 || g.ty(kt).rank() < 2 {
        return None;
    }
    // Scalar scales on the operands (SDPA's decomposition scales q and kᵀ by sqrt(scale) each).
    for x in [&mut q, &mut kt] {
        if let Some((inner, f)) = scaled(g, *x).filter(|_| uses.single(*x)) {
            scale *= f;
            *x = inner;
        }
    }
    Some(Scores { q, kt, scale, keep })
}

/// If the probabilities `p` are read only by the NaN guard `Where(IsNaN(p), 0, p)` (and its IsNaN), the
/// guarded value.
fn nan_guard(g: &Graph, uses: &Uses, p: ValueId) -> Option<ValueId> {
    let readers = &uses.consumers[p.index()];
    if uses.is_output(p) || uses.counts[p.index()] != 2 || readers.len() != 2 {
        return None;
    }
    let isnan = *readers.iter().find(|&&n| matches!(g.node(n).op, Op::Unary(UnaryOp::IsNaN)))?;
    let select = *readers.iter().find(|&&n| matches!(g.node(n).op, Op::Where))?;
    let cond = g.node(isnan).outputs[0];
    let ins = &g.node(select).inputs;
    let zero = scalar(g, ins[1]).is_some_and(|z| z == 0.0);
    (uses.single(cond) && ins[0] == cond && ins[2] == p && zero && g.ty(g.node(select).outputs[0]) == g.ty(p))
        .then(|| g.node(select).outputs[0])
}

/// Additive masks that may be summed in front of the Softmax (T5's and Swin's position bias, then a mask).
const MAX_MASKS: usize = 3;

/// The scores side of `x` and the additive masks added to it, innermost first: `x` is the scores chain, or an
/// Add of one to a mask of the same float type (whichever operand is not the chain), any number of times.
fn masked_scores(g: &Graph, uses: &Uses, x: ValueId, depth: usize) -> Option<(Scores, Vec<ValueId>)> {
    let xt = g.ty(x);
    if let Some(add) = producer_if(g, x, |op| is_binary(op, BinaryOp::Add)).filter(|_| depth < MAX_MASKS && (depth == 0 || uses.single(x))) {
        let ins = &g.node(add).inputs;
        for (s, m) in [(ins[0], ins[1]), (ins[1], ins[0])] {
            if g.ty(s) == xt && g.ty(m).dtype == xt.dtype {
                if let Some((sc, mut masks)) = masked_scores(g, uses, s, depth + 1) {
                    masks.push(m);
                    return Some((sc, masks));
                }
            }
        }
    }
    Some((scores(g, uses, x)?, Vec::new()))
}

fn match_at(g: &Graph, uses: &Uses, softmax: NodeId) -> Option<Match> {
    let node = g.node(softmax);
    let Op::Softmax { axis } = node.op else { return None };
    let x = node.inputs[0];
    let xt = g.ty(x);
    if !xt.dtype.is_float() || xt.rank() < 2 || axis != xt.rank() - 1 || !uses.single(x) {
        return None;
    }
    let (probs, nan_to_zero) = match nan_guard(g, uses, node.outputs[0]) {
        Some(guarded) => (guarded, true),
        None => (node.outputs[0], false),
    };
    let mm = uses.sole_consumer(probs).filter(|&m| matches!(g.node(m).op, Op::MatMul) && g.node(m).inputs[0] == probs)?;
    let v = g.node(mm).inputs[1];
    if g.ty(v).rank() < 2 {
        return None;
    }
    let (sc, masks) = masked_scores(g, uses, x, 0)?;
    let mask = masks.first().copied();
    let extra_masks = masks.get(1..).unwrap_or_default().to_vec();
    if extra_masks.iter().any(|&m| broadcast_shapes(&xt.shape, &g.ty(m).shape).ok().as_deref() != Some(&xt.shape[..])) {
        return None;
    }
    // Summing the masks first differs from adding them one by one only in rounding, and only where a large term
    // absorbs part of a small one; with a keep fill (-10000 say) in front of them that is every dropped score, and
    // a row whose every key is dropped takes its softmax from exactly those roundings. Then they stay separate.
    if !extra_masks.is_empty() && sc.keep.is_some() {
        return None;
    }
    // K reaches the scores as Kᵀ. When a Transpose made it (used only here), read K in its natural `[.., Sk, D]`
    // layout instead: Kᵀ = Transpose(x, p) means K = Transpose(x, p with its last two swapped), which is x
    // itself when p swaps only the last two axes (BERT's `key.transpose(-1, -2)`), else one Transpose that
    // leaves the head dim innermost (GPT-2 and torchvision's ViT export `[B, S, H, D] -> [B, H, D, S]` in one
    // permutation): kernels read rows of K contiguously, and Sk need not be a multiple of anything.
    let (k, k_transposed, k_perm) = match producer_if(g, sc.kt, |op| matches!(op, Op::Transpose { .. })) {
        Some(t) if uses.single(sc.kt) => {
            let Op::Transpose { perm } = &g.node(t).op else { unreachable!("producer_if matched a Transpose") };
            let x = g.node(t).inputs[0];
            if swaps_last_two(perm) {
                (x, false, None)
            } else {
                let mut p = perm.clone();
                let r = p.len();
                p.swap(r - 2, r - 1);
                (x, false, Some(p))
            }
        }
        _ => (sc.kt, true, None),
    };
    if !(sc.scale as f32).is_finite() || sc.scale as f32 == 0.0 {
        return None;
    }
    let m = Match { q: sc.q, k, v, k_transposed, k_perm, scale: sc.scale, mask, keep: sc.keep, nan_to_zero, extra_masks, root: g.node(mm).outputs[0], name: node.name.clone() };
    // The op must accept these operands and give the replaced MatMul's type exactly (no broadcast widened);
    // checked with Kᵀ as the scores read it (a permuted K has the same dims by construction).
    let permuted = m.k_perm.is_some();
    let checked = Match { q: m.q, k: if permuted { sc.kt } else { m.k }, v: m.v, k_transposed: m.k_transposed || permuted, k_perm: None, scale: m.scale, mask: m.mask, keep: m.keep, nan_to_zero, extra_masks: Vec::new(), root: m.root, name: String::new() };
    let (attrs, inputs) = op_of(&checked, m.keep.map(|(c, _, _)| c));
    let types: Vec<_> = inputs.iter().map(|&i| g.ty(i)).collect();
    let dims = attention_dims(&attrs, &types).ok()?;
    (dims.out_shape() == g.ty(m.root).shape && dims.scores_shape() == xt.shape).then_some(m)
}

/// The op and its inputs for a match, with `keep` the (possibly negated) keep mask.
fn op_of(m: &Match, keep: Option<ValueId>) -> (AttentionAttrs, Vec<ValueId>) {
    let attrs = AttentionAttrs { scale: m.scale as f32, k_transposed: m.k_transposed, mask: m.mask.is_some(), keep_fill: m.keep.map(|(_, _, f)| f), nan_to_zero: m.nan_to_zero };
    let mut inputs = vec![m.q, m.k, m.v];
    inputs.extend(m.mask);
    inputs.extend(keep);
    (attrs, inputs)
}

/// Replaces every recognized attention; returns how many.
pub fn fuse_attention(g: &mut Graph) -> usize {
    let uses = Uses::new(g);
    let found: Vec<Match> = (0..g.nodes.len()).map(|i| NodeId(i as u32)).filter_map(|n| match_at(g, &uses, n)).collect();
    let mut count = 0;
    // A match may read another's result (stacked attention): read it through the replacement.
    let mut replaced: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    for mut m in found {
        for v in [&mut m.q, &mut m.k, &mut m.v].into_iter().chain(m.mask.as_mut()).chain(&mut m.extra_masks).chain(m.keep.as_mut().map(|k| &mut k.0)) {
            if let Some(&r) = replaced.get(v) {
                *v = r;
            }
        }
        // The masks summed first (exact in real arithmetic: the scores plus their sum), so the op adds one.
        if let Some(first) = m.mask {
            let mut sum = Ok(first);
            for (i, &extra) in m.extra_masks.iter().enumerate() {
                sum = sum.and_then(|s| g.add(format!("{}/attention_mask{i}", m.name), Op::Binary(BinaryOp::Add), &[s, extra]));
            }
            match sum {
                Ok(s) => m.mask = Some(s),
                Err(_) => continue,
            }
        }
        let keep = match m.keep {
            Some((cond, true, _)) => match g.add(format!("{}/attention_keep", m.name), Op::Unary(UnaryOp::Not), &[cond]) {
                Ok(k) => Some(k),
                Err(_) => continue,
            },
            Some((cond, false, _)) => Some(cond),
            None => None,
        };
        if let Some(perm) = m.k_perm.take() {
            match g.add(format!("{}/attention_k", m.name), Op::Transpose { perm }, &[m.k]) {
                Ok(k) => m.k = k,
                Err(_) => continue,
            }
        }
        let (attrs, inputs) = op_of(&m, keep);
        // Checked in `match_at`; a failure here leaves the graph as it was.
        let Ok(y) = g.add(format!("{}/attention", m.name), Op::Attention(attrs), &inputs) else { continue };
        g.replace_uses(m.root, y);
        replaced.insert(m.root, y);
        count += 1;
    }
    count
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
