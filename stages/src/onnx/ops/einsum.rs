//! Einsum, lowered at import to ops the IR has: Transpose, Reshape, Slice (diagonals), MatMul, ReduceSum, Mul.
//!
//! The equation follows NumPy's `einsum` (ONNX's reference is `np.einsum`): terms of letters `a-zA-Z` and at
//! most one `...` each, separated by `,`, one per input; whitespace is ignored. With `->` the output is
//! explicit (letters at most once each; `...` required when the inputs' ellipses cover any dimension); without
//! it, the output is the ellipsis dimensions followed by the letters that occur exactly once in the whole
//! equation, in ASCII order (upper case first). Sizes of one label broadcast NumPy's way across operands
//! (equal, or 1); ellipsis dimensions align from the right.
//!
//! Lowering, each step exact in real arithmetic:
//! 1. A letter repeated within one operand takes that operand's diagonal: the two axes are moved last, merged
//!    into one of n·n elements, and every (n+1)-th is kept (a Slice with step n+1).
//! 2. The operands are contracted left to right, pairwise. Before each contraction, a label of one side that
//!    neither the other side nor anything later (the remaining operands, the output) uses is summed out
//!    (ReduceSum); so is a shared label that nothing later uses and that one side broadcasts (size 1: that
//!    side's axis is dropped by a Reshape). Shared labels that something later uses are batch dimensions;
//!    the other shared labels are contracted: the two sides are transposed and reshaped to `[batch.., M, K]`
//!    and `[batch.., K, N]` and multiplied by one batched MatMul (broadcasting batch dimensions of size 1).
//!    With nothing to contract the pair is an outer product: a broadcast Mul.
//! 3. Labels of the result that the output lacks are summed out; a Transpose puts the rest in output order.
//!
//! A malformed equation, a term that does not fit its operand's rank or sizes that do not broadcast is an
//! error naming the node (by the importer) and the equation.

use super::one;
use crate::ir::{Op, ReduceKind, ValueId};
use crate::onnx::error::{NResult, NodeError};
use crate::onnx::importer::{Importer, NodeCx};
use crate::onnx::ImportErrorKind;
use crate::onnx::ops::Converter;
use std::collections::BTreeSet;

pub const OPS: &[&str] = &["Einsum"];

pub fn converter(op: &str) -> Option<Converter> {
    (op == "Einsum").then_some(einsum as Converter)
}

/// One subscript as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sub {
    Letter(u8),
    Ellipsis,
}

/// One dimension's label once the ellipses are expanded: a letter, or dimension `k` of the broadcast
/// ellipsis (counted from the left of the widest one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Label {
    Letter(u8),
    Ell(usize),
}

impl std::fmt::Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Label::Letter(c) => write!(f, "'{}'", *c as char),
            Label::Ell(k) => write!(f, "ellipsis dimension {k}"),
        }
    }
}

/// The parsed equation: the input terms and the explicit output, if any.
#[derive(Debug)]
struct Equation {
    inputs: Vec<Vec<Sub>>,
    output: Option<Vec<Sub>>,
}

fn parse_term(text: &str, offset: usize) -> Result<Vec<Sub>, String> {
    let b = text.as_bytes();
    let mut subs = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            c if c.is_ascii_alphabetic() => subs.push(Sub::Letter(c)),
            b'.' => {
                if b.get(i..i + 3) != Some(b"...") {
                    return Err(format!("a '.' at position {} is not part of '...'", offset + i));
                }
                if subs.contains(&Sub::Ellipsis) {
                    return Err(format!("a second '...' in one term (position {})", offset + i));
                }
                subs.push(Sub::Ellipsis);
                i += 2;
            }
            _ => {
                let ch = text[i..].chars().next().unwrap_or('?');
                return Err(format!("'{ch}' at position {} is not a letter, '...', ',' or '->'", offset + i));
            }
        }
        i += 1;
    }
    Ok(subs)
}

fn parse(equation: &str) -> Result<Equation, String> {
    // Positions in messages count in the equation without its whitespace.
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => {
            if r.contains("->") {
                return Err("more than one '->'".into());
            }
            (l, Some(r))
        }
        None => (eq.as_str(), None),
    };
    let mut inputs = Vec::new();
    let mut offset = 0;
    for term in lhs.split(',') {
        inputs.push(parse_term(term, offset)?);
        offset += term.len() + 1;
    }
    let output = match rhs {
        None => None,
        Some(r) => {
            if r.contains(',') {
                return Err("the output (after '->') is one term, without ','".into());
            }
            Some(parse_term(r, lhs.len() + 2)?)
        }
    };
    Ok(Equation { inputs, output })
}

/// An operand being contracted: its value and one label per axis.
#[derive(Clone)]
struct Operand {
    v: ValueId,
    labels: Vec<Label>,
}

/// The lowering of one Einsum node, with the equation for error messages.
struct Lower<'a, 'b, 'c> {
    im: &'a mut Importer<'b>,
    n: &'a NodeCx<'c>,
    eq: &'a str,
}

impl Lower<'_, '_, '_> {
    fn err(&self, msg: impl std::fmt::Display) -> NodeError {
        NodeError::attr("equation", format!("'{}': {msg}", self.eq))
    }

    /// Adds the equation to an error of an op the lowering emitted.
    fn emit(&mut self, op: Op, inputs: &[ValueId]) -> NResult<ValueId> {
        let eq = self.eq;
        self.im.emit(self.n, op, inputs).map_err(|e| with_equation(e, eq))
    }

    fn dims(&self, o: &Operand) -> Vec<usize> {
        self.im.shape(o.v)
    }

    fn size(&self, o: &Operand, l: Label) -> usize {
        let at = o.labels.iter().position(|&x| x == l).expect("the label is the operand's");
        self.dims(o)[at]
    }

    /// `o` with its axes in the order of `labels` (a permutation of its own).
    fn permute(&mut self, o: Operand, labels: &[Label]) -> NResult<Operand> {
        let perm: Vec<usize> = labels.iter().map(|l| o.labels.iter().position(|x| x == l).expect("a permutation")).collect();
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(Operand { v: o.v, labels: labels.to_vec() });
        }
        let v = self.emit(Op::Transpose { perm }, &[o.v])?;
        Ok(Operand { v, labels: labels.to_vec() })
    }

    fn reshape(&mut self, v: ValueId, shape: Vec<usize>) -> NResult<ValueId> {
        if self.im.shape(v) == shape {
            return Ok(v);
        }
        self.emit(Op::Reshape { shape }, &[v])
    }

    /// `o` summed over the axes of `drop`.
    fn sum_out(&mut self, o: Operand, drop: &BTreeSet<Label>) -> NResult<Operand> {
        let axes: Vec<usize> = o.labels.iter().enumerate().filter(|(_, l)| drop.contains(l)).map(|(i, _)| i).collect();
        if axes.is_empty() {
            return Ok(o);
        }
        let v = self.emit(Op::Reduce { kind: ReduceKind::Sum, axes, keepdims: false }, &[o.v])?;
        Ok(Operand { v, labels: o.labels.into_iter().filter(|l| !drop.contains(l)).collect() })
    }

    /// `o` with its size-1 axes of `drop` removed (a Reshape).
    fn squeeze(&mut self, o: Operand, drop: &BTreeSet<Label>) -> NResult<Operand> {
        if drop.is_empty() {
            return Ok(o);
        }
        let dims = self.dims(&o);
        let keep: Vec<usize> = (0..o.labels.len()).filter(|&i| !drop.contains(&o.labels[i])).collect();
        let v = self.reshape(o.v, keep.iter().map(|&i| dims[i]).collect())?;
        Ok(Operand { v, labels: keep.iter().map(|&i| o.labels[i]).collect() })
    }

    /// The operand with each repeated label reduced to its diagonal.
    fn diagonals(&mut self, mut o: Operand, index: usize) -> NResult<Operand> {
        loop {
            let Some((p, q)) = (0..o.labels.len()).find_map(|p| (p + 1..o.labels.len()).find(|&q| o.labels[q] == o.labels[p]).map(|q| (p, q))) else {
                return Ok(o);
            };
            let l = o.labels[p];
            let dims = self.dims(&o);
            if dims[p] != dims[q] {
                return Err(self.err(format!("label {l} repeats in input {index} over dimensions of sizes {} and {}; a diagonal needs equal sizes", dims[p], dims[q])));
            }
            let n = dims[p];
            let others: Vec<usize> = (0..o.labels.len()).filter(|&i| i != p && i != q).collect();
            let mut order: Vec<Label> = others.iter().map(|&i| o.labels[i]).collect();
            // Move the pair last (a permutation of distinct positions, so labels are mapped by position).
            let perm: Vec<usize> = others.iter().copied().chain([p, q]).collect();
            let v = if perm.iter().enumerate().all(|(i, &x)| i == x) { o.v } else { self.emit(Op::Transpose { perm }, &[o.v])? };
            let mut shape: Vec<usize> = others.iter().map(|&i| dims[i]).collect();
            shape.push(n * n);
            let flat = self.reshape(v, shape)?;
            let last = others.len();
            let diag = self.emit(Op::Slice { axes: vec![last], starts: vec![0], ends: vec![(n * n) as i64], steps: vec![n as i64 + 1] }, &[flat])?;
            order.push(l);
            o = Operand { v: diag, labels: order };
        }
    }

    /// Contracts `a` with `b`; `later` holds the labels something after this pair uses.
    fn contract(&mut self, a: Operand, b: Operand, later: &BTreeSet<Label>) -> NResult<Operand> {
        let in_a: BTreeSet<Label> = a.labels.iter().copied().collect();
        let in_b: BTreeSet<Label> = b.labels.iter().copied().collect();
        let a = self.sum_out(a, &in_a.iter().filter(|l| !in_b.contains(l) && !later.contains(l)).copied().collect())?;
        let b = self.sum_out(b, &in_b.iter().filter(|l| !in_a.contains(l) && !later.contains(l)).copied().collect())?;
        // A shared label to contract that one side broadcasts: sum the other side over it, drop it from this one.
        let (mut sum_a, mut sum_b, mut sq_a, mut sq_b) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        for &l in a.labels.iter().filter(|l| in_b.contains(l) && !later.contains(l)) {
            let (sa, sb) = (self.size(&a, l), self.size(&b, l));
            if sa == 1 && sb != 1 {
                sq_a.insert(l);
                sum_b.insert(l);
            } else if sb == 1 && sa != 1 {
                sq_b.insert(l);
                sum_a.insert(l);
            }
        }
        let a = self.sum_out(a, &sum_a)?;
        let a = self.squeeze(a, &sq_a)?;
        let b = self.sum_out(b, &sum_b)?;
        let b = self.squeeze(b, &sq_b)?;
        let in_b: BTreeSet<Label> = b.labels.iter().copied().collect();
        let in_a: BTreeSet<Label> = a.labels.iter().copied().collect();
        let batch: Vec<Label> = a.labels.iter().copied().filter(|l| in_b.contains(l) && later.contains(l)).collect();
        let summed: Vec<Label> = a.labels.iter().copied().filter(|l| in_b.contains(l) && !later.contains(l)).collect();
        let a_free: Vec<Label> = a.labels.iter().copied().filter(|l| !in_b.contains(l)).collect();
        let b_free: Vec<Label> = b.labels.iter().copied().filter(|l| !in_a.contains(l)).collect();
        let cat = |xs: &[&[Label]]| xs.concat();
        if summed.is_empty() {
            // An outer product over the free labels, batched: [batch, a_free, 1..] * [batch, 1.., b_free].
            let a = self.permute(a, &cat(&[&batch, &a_free]))?;
            let b = self.permute(b, &cat(&[&batch, &b_free]))?;
            let (da, db) = (self.dims(&a), self.dims(&b));
            let mut sa = da.clone();
            sa.extend(std::iter::repeat_n(1, b_free.len()));
            let mut sb = db[..batch.len()].to_vec();
            sb.extend(std::iter::repeat_n(1, a_free.len()));
            sb.extend(&db[batch.len()..]);
            let av = self.reshape(a.v, sa)?;
            let bv = self.reshape(b.v, sb)?;
            let v = self.emit(Op::Binary(crate::ir::BinaryOp::Mul), &[av, bv])?;
            return Ok(Operand { v, labels: cat(&[&batch, &a_free, &b_free]) });
        }
        let a = self.permute(a, &cat(&[&batch, &a_free, &summed]))?;
        let b = self.permute(b, &cat(&[&batch, &summed, &b_free]))?;
        let (da, db) = (self.dims(&a), self.dims(&b));
        let nb = batch.len();
        let m: usize = da[nb..nb + a_free.len()].iter().product();
        let k: usize = da[nb + a_free.len()..].iter().product();
        let nn: usize = db[nb + summed.len()..].iter().product();
        let mut sa = da[..nb].to_vec();
        sa.extend([m, k]);
        let mut sb = db[..nb].to_vec();
        sb.extend([k, nn]);
        let av = self.reshape(a.v, sa)?;
        let bv = self.reshape(b.v, sb)?;
        let mm = self.emit(Op::MatMul, &[av, bv])?;
        let mut shape = self.im.shape(mm)[..nb].to_vec();
        shape.extend(&da[nb..nb + a_free.len()]);
        shape.extend(&db[nb + summed.len()..]);
        let v = self.reshape(mm, shape)?;
        Ok(Operand { v, labels: cat(&[&batch, &a_free, &b_free]) })
    }
}

/// `e` with the equation in its message.
fn with_equation(mut e: NodeError, eq: &str) -> NodeError {
    let add = |s: &mut String| *s = format!("equation '{eq}': {s}");
    match &mut e.kind {
        ImportErrorKind::Invalid(s) | ImportErrorKind::BadAttribute(s) | ImportErrorKind::Missing(s) | ImportErrorKind::NotStatic(s) => add(s),
        ImportErrorKind::Unsupported { detail, .. } => add(detail),
        _ => {}
    }
    e
}

fn einsum(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let Some(eq) = n.attrs.string("equation")? else {
        return Err(NodeError::attr("equation", "required attribute is absent"));
    };
    let xs = im.inputs(n)?;
    let mut lw = Lower { im, n, eq: &eq };
    let parsed = parse(&eq).map_err(|m| lw.err(m))?;
    if parsed.inputs.len() != xs.len() {
        return Err(lw.err(format!("{} terms for {} inputs", parsed.inputs.len(), xs.len())));
    }
    // Expand the ellipses: each covers the dimensions its operand's letters leave; all align from the right.
    let mut widths = Vec::new();
    for (i, (term, &x)) in parsed.inputs.iter().zip(&xs).enumerate() {
        let letters = term.iter().filter(|s| matches!(s, Sub::Letter(_))).count();
        let rank = lw.im.rank(x);
        let has_ell = term.contains(&Sub::Ellipsis);
        if rank < letters || (!has_ell && rank != letters) {
            return Err(lw.err(format!("input {i} has rank {rank}, but its term has {letters} letters{}", if has_ell { " and '...'" } else { "" })));
        }
        widths.push(rank - letters);
    }
    let width = widths.iter().copied().max().unwrap_or(0);
    let expand = |term: &[Sub], w: usize| -> Vec<Label> {
        term.iter()
            .flat_map(|s| match s {
                Sub::Letter(c) => vec![Label::Letter(*c)],
                Sub::Ellipsis => (width - w..width).map(Label::Ell).collect(),
            })
            .collect()
    };
    let labels: Vec<Vec<Label>> = parsed.inputs.iter().zip(&widths).map(|(t, &w)| expand(t, w)).collect();
    // Sizes broadcast: every label's sizes are one n, or 1.
    let mut sizes: std::collections::BTreeMap<Label, (usize, usize)> = Default::default();
    for (i, (ls, &x)) in labels.iter().zip(&xs).enumerate() {
        for (&l, &d) in ls.iter().zip(&lw.im.shape(x)) {
            let e = sizes.entry(l).or_insert((d, i));
            if e.0 == 1 && d != 1 {
                *e = (d, i);
            } else if d != 1 && d != e.0 {
                return Err(lw.err(format!("label {l} has size {} in input {} and {d} in input {i}, which do not broadcast", e.0, e.1)));
            }
        }
    }
    let out: Vec<Label> = match &parsed.output {
        Some(term) => {
            let mut seen = BTreeSet::new();
            for s in term {
                if let Sub::Letter(c) = s {
                    if !seen.insert(*c) {
                        return Err(lw.err(format!("the output repeats '{}'", *c as char)));
                    }
                    if !sizes.contains_key(&Label::Letter(*c)) {
                        return Err(lw.err(format!("the output's '{}' is in no input", *c as char)));
                    }
                }
            }
            if width > 0 && !term.contains(&Sub::Ellipsis) {
                return Err(lw.err(format!("the inputs' '...' cover {width} dimension(s), but the output has no '...'")));
            }
            expand(term, width)
        }
        None => {
            let mut count: std::collections::BTreeMap<u8, usize> = Default::default();
            for s in parsed.inputs.iter().flatten() {
                if let Sub::Letter(c) = s {
                    *count.entry(*c).or_default() += 1;
                }
            }
            // BTreeMap order over bytes is ASCII order: upper case first, as NumPy does.
            (0..width).map(Label::Ell).chain(count.into_iter().filter(|&(_, k)| k == 1).map(|(c, _)| Label::Letter(c))).collect()
        }
    };
    let mut ops = Vec::new();
    for (i, (ls, &x)) in labels.into_iter().zip(&xs).enumerate() {
        let o = lw.diagonals(Operand { v: x, labels: ls }, i)?;
        ops.push(o);
    }
    let output_set: BTreeSet<Label> = out.iter().copied().collect();
    let mut ops = ops.into_iter();
    let Some(mut acc) = ops.next() else {
        return Err(lw.err("Einsum needs at least one input"));
    };
    let rest: Vec<Operand> = ops.collect();
    for k in 0..rest.len() {
        let mut later = output_set.clone();
        for o in &rest[k + 1..] {
            later.extend(o.labels.iter().copied());
        }
        acc = lw.contract(acc, rest[k].clone(), &later)?;
    }
    let extra: BTreeSet<Label> = acc.labels.iter().copied().filter(|l| !output_set.contains(l)).collect();
    let acc = lw.sum_out(acc, &extra)?;
    let acc = lw.permute(acc, &out)?;
    // An equation that leaves its input as it is ("ij->ij", "->") still gives the node's output a node.
    let v = if xs.contains(&acc.v) { lw.emit(Op::Identity, &[acc.v])? } else { acc.v };
    one(v)
}

#[cfg(test)]
#[path = "einsum_tests.rs"]
mod tests;
