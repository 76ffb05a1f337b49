//! Reduced precision: a model's graph rewritten to store its floats in fp16 or bf16 (the `precision=fp16` or
//! `precision=bf16` of a GPU target).
//!
//! Every f32 value inside the graph becomes the narrow type; the graph's interface does not change: an f32
//! input is cast to it as it enters and an f32 output cast back as it leaves, so callers feed and read f32
//! tensors whatever the precision (and the artifact is checked against the f32 reference model). f32
//! constants are converted once, here, at compile time, and stored by digest like any other constant.
//!
//! Conversion saturates: a finite constant beyond the narrow type's range becomes its largest finite value
//! rather than +-inf (f16: 65504; bf16, whose range is f32's: f32's lowest value would round to -inf).
//! Exporters write "minus infinity" masks as f32's lowest value (-3.4e38) and then multiply them by 0 for the
//! positions they keep (Hugging Face's `(1 - mask) * finfo.min`); rounded to -inf that product is NaN,
//! saturated it is 0, which is what the model means. Infinities and NaN stay what they are.
//!
//! Accumulation precision is the kernels' business, not the graph's: backends running f16 and bf16 graphs
//! keep fp32 accumulators in matmul, convolution, reductions, softmax and layer norm (both are storage types).

use crate::ir::{BuildError, DType, Graph, Op, Tensor, TensorType, ValueDef, ValueId};
use half::{bf16, f16};

/// The largest finite value of a narrow float type, and its bits (little-endian) from an f32.
fn narrow_format(d: DType) -> (f32, fn(f32) -> u16) {
    match d {
        DType::F16 => (f16::MAX.to_f32(), |x| f16::from_f32(x).to_bits()),
        DType::BF16 => (bf16::MAX.to_f32(), |x| bf16::from_f32(x).to_bits()),
        d => unreachable!("{d} is not a narrow float type"),
    }
}

/// An f32 tensor rounded to `to` (f16 or bf16; nearest even), finite values saturating at the type's largest
/// finite value.
pub fn to_narrow_saturating(t: &Tensor, to: DType) -> Tensor {
    let (max, bits_of) = narrow_format(to);
    let bits: Vec<u8> = t
        .to_f32_vec()
        .iter()
        .map(|&x| if x.is_finite() { x.clamp(-max, max) } else { x })
        .flat_map(|x| bits_of(x).to_le_bytes())
        .collect();
    Tensor::from_bytes(TensorType::new(to, t.shape().to_vec()), bits).expect("one 16-bit float per element")
}

/// `t` (f32) in `to`: itself for f32, else rounded and saturated.
fn convert(t: &Tensor, to: DType) -> Tensor {
    if to == DType::F32 {
        t.clone()
    } else {
        to_narrow_saturating(t, to)
    }
}

/// The op with every f32 it produces made `to` (Cast's target; everything else follows its inputs).
fn narrow_op(op: &Op, to: DType) -> Op {
    match op {
        Op::Cast { to: DType::F32 } => Op::Cast { to },
        other => other.clone(),
    }
}

/// `g` computing in f16 (see the module documentation). Graphs without f32 values come back unchanged.
pub fn to_half(g: &Graph) -> Result<Graph, BuildError> {
    to_narrow(g, DType::F16)
}

/// `g` computing in `narrow` (f16 or bf16; see the module documentation).
pub fn to_narrow(g: &Graph, narrow: DType) -> Result<Graph, BuildError> {
    to_narrow_keeping(g, narrow, &vec![false; g.nodes.len()], DType::F32)
}

/// `g` computing in `narrow` (f16 or bf16) except the nodes `keep` marks (by node index), which compute in
/// `kept` (f32, as in `g`, or bf16): their inputs are cast to `kept` just before them (from f32 where the
/// value is there in f32), and their outputs cast to `narrow` where a narrow node reads them. What
/// `-overflow=keep-fp32` and `-overflow=bf16` make of the nodes whose values leave f16's range
/// (`crate::stages::precision`). With no node kept, the graph is exactly what `to_half` made before nodes could be
/// kept (same nodes, names and order: the frozen fixtures' fp16 artifacts check it byte for byte).
pub fn to_narrow_keeping(g: &Graph, narrow: DType, keep: &[bool], kept: DType) -> Result<Graph, BuildError> {
    let mut h = Graph::new(g.name.clone());
    let n = g.values.len();
    // Each f32 value of `g` as the narrow nodes read it, as the kept nodes read it, and in f32 where it is
    // there (an input; a value kept nodes compute in f32). For f32, `at_kept` and `at_f32` are the same.
    let mut at_narrow: Vec<Option<ValueId>> = vec![None; n];
    let mut at_kept: Vec<Option<ValueId>> = vec![None; n];
    let mut at_f32: Vec<Option<ValueId>> = vec![None; n];
    // Each value as its producer made it here (an input, a constant, a node's output): what an output is
    // taken from, so it keeps its name.
    let mut computed: Vec<Option<ValueId>> = vec![None; n];
    let is_output: Vec<bool> = {
        let mut o = vec![false; n];
        for v in &g.outputs {
            o[v.index()] = true;
        }
        o
    };
    let producer_kept: Vec<bool> = {
        let mut k = vec![false; n];
        for (i, node) in g.nodes.iter().enumerate() {
            for &o in &node.outputs {
                k[o.index()] = keep[i];
            }
        }
        k
    };
    // Who reads each value: a narrow node, a kept node.
    let (mut read_narrow, mut read_kept) = (vec![false; n], vec![false; n]);
    for (i, node) in g.nodes.iter().enumerate() {
        for &v in &node.inputs {
            if keep[i] { read_kept[v.index()] = true } else { read_narrow[v.index()] = true }
        }
    }
    let is_f32 = |v: ValueId| g.ty(v).dtype == DType::F32;
    // The type an f32 value of `g` is computed in here.
    let computed_in = |v: ValueId| if producer_kept[v.index()] { kept } else { narrow };
    // A value that leaves the graph as f32 but is computed in another type is renamed inside; the cast back
    // takes its name.
    let inner_name = |v: ValueId| -> String {
        let val = g.value(v);
        if is_output[v.index()] && val.ty.dtype == DType::F32 && computed_in(v) != DType::F32 {
            format!("{}.{}", val.name, computed_in(v).name())
        } else {
            val.name.clone()
        }
    };
    // A cast of `v` to `to`, its value named `{name}.{to}`; an f32 copy of an output is the output itself, so it
    // takes the interface's name (the cast back at the end then has nothing to do).
    let cast = |h: &mut Graph, v: ValueId, from: ValueId, to: DType| -> Result<ValueId, BuildError> {
        let name = &g.value(v).name;
        let value = if to == DType::F32 && is_output[v.index()] { name.clone() } else { format!("{name}.{}", to.name()) };
        Ok(h.add_node_named(format!("{name}.to_{}", to.name()), Op::Cast { to }, &[from], vec![value])?[0])
    };
    for &v in &g.inputs {
        let val = g.value(v);
        let id = h.add_input(val.name.clone(), val.ty.clone());
        (at_f32[v.index()], at_narrow[v.index()], at_kept[v.index()], computed[v.index()]) = (Some(id), Some(id), Some(id), Some(id));
        if val.ty.dtype == DType::F32 {
            at_kept[v.index()] = (kept == DType::F32).then_some(id);
            if read_narrow[v.index()] || !read_kept[v.index()] {
                at_narrow[v.index()] = Some(cast(&mut h, v, id, narrow)?);
            } else {
                at_narrow[v.index()] = None;
            }
        }
    }
    // The constants' narrow copies, converted at once (BERT-base's 110M weights are most of this pass's time).
    let mut narrowed: Vec<Option<Tensor>> = {
        use rayon::prelude::*;
        g.values
            .par_iter()
            .enumerate()
            .map(|(i, val)| match &val.def {
                ValueDef::Const(t) if t.dtype() == DType::F32 && (read_narrow[i] || !read_kept[i]) => Some(to_narrow_saturating(t, narrow)),
                _ => None,
            })
            .collect()
    };
    for (i, val) in g.values.iter().enumerate() {
        if let ValueDef::Const(t) = &val.def {
            if t.dtype() != DType::F32 {
                let id = h.add_const(val.name.clone(), t.clone());
                (at_narrow[i], at_kept[i], at_f32[i], computed[i]) = (Some(id), Some(id), Some(id), Some(id));
                continue;
            }
            // Converted once, here; a copy in the kept type only where a kept node reads the constant.
            if let Some(t) = narrowed[i].take() {
                at_narrow[i] = Some(h.add_const(val.name.clone(), t));
            }
            if read_kept[i] {
                let name = if at_narrow[i].is_some() { format!("{}.{}", val.name, kept.name()) } else { val.name.clone() };
                at_kept[i] = Some(h.add_const(name, convert(t, kept)));
            }
            computed[i] = if kept == DType::F32 { at_kept[i].or(at_narrow[i]) } else { at_narrow[i].or(at_kept[i]) };
        }
    }
    for (ni, node) in g.nodes.iter().enumerate() {
        let (is_kept, ty) = if keep[ni] { (true, kept) } else { (false, narrow) };
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for &v in &node.inputs {
            let i = v.index();
            let have = if is_kept { at_kept[i] } else { at_narrow[i] };
            let id = match have {
                Some(id) => id,
                // Computed in the other type: cast just before the reader, from f32 where the value is there
                // in f32 (so a kept bf16 node reading an input is not rounded through f16 first).
                None if is_f32(v) => {
                    let from = at_f32[i].or(if is_kept { at_narrow[i] } else { at_kept[i] }).expect("graph nodes are in topological order");
                    let id = cast(&mut h, v, from, ty)?;
                    if is_kept { at_kept[i] = Some(id) } else { at_narrow[i] = Some(id) }
                    if ty == DType::F32 {
                        at_f32[i] = Some(id);
                    }
                    id
                }
                None => at_narrow[i].or(at_kept[i]).expect("graph nodes are in topological order"),
            };
            inputs.push(id);
        }
        let names: Vec<String> = node.outputs.iter().map(|&o| inner_name(o)).collect();
        let op = if ty == DType::F32 { node.op.clone() } else { narrow_op(&node.op, ty) };
        let outs = h.add_node_named(node.name.clone(), op, &inputs, names)?;
        for (&o, id) in node.outputs.iter().zip(outs) {
            let i = o.index();
            computed[i] = Some(id);
            if !is_f32(o) {
                (at_narrow[i], at_kept[i], at_f32[i]) = (Some(id), Some(id), Some(id));
            } else if is_kept {
                at_kept[i] = Some(id);
                if kept == DType::F32 {
                    at_f32[i] = Some(id);
                }
            } else {
                at_narrow[i] = Some(id);
            }
        }
    }
    for &v in &g.outputs {
        let want = g.ty(v).dtype;
        let i = v.index();
        let mut id = computed[i].expect("outputs are defined");
        if h.ty(id).dtype != want && want == DType::F32 {
            // Already cast up for a node kept in f32 (named as the output: see `cast`).
            id = at_f32[i].unwrap_or(id);
        }
        if h.ty(id).dtype != want {
            let val = g.value(v);
            id = h.add_node_named(format!("{}.to_{}", val.name, want.name()), Op::Cast { to: want }, &[id], vec![val.name.clone()])?[0];
        }
        h.outputs.push(id);
    }
    Ok(h)
}

#[cfg(test)]
#[path = "precision_tests.rs"]
mod tests;
