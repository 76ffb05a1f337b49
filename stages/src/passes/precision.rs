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
/// (`crate::precision`). With no node kept, the graph is exactly what `to_half` made before nodes could be
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
mod tests {
    use super::*;
    use crate::interp::{random_inputs, run_graph};
    use crate::ir::BinaryOp;

    fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
        let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
        let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
        a.iter().zip(&b).map(|(x, y)| if x.is_nan() || y.is_nan() { f64::INFINITY } else { (x - y).abs() / scale }).fold(0.0, f64::max)
    }

    #[test]
    fn saturates_finite_values_and_keeps_infinities() {
        let t = Tensor::from_f32([5], &[-3.4e38, 1e6, 1.5, f32::NEG_INFINITY, f32::NAN]);
        let h = to_narrow_saturating(&t, DType::F16).to_f32_vec();
        assert_eq!(&h[..4], &[-65504.0, 65504.0, 1.5, f32::NEG_INFINITY]);
        assert!(h[4].is_nan());
    }

    #[test]
    fn interface_stays_f32_and_inside_is_f16() {
        let mut g = Graph::new("m");
        let x = g.add_input("x", TensorType::f32([2, 3]));
        let ids = g.add_input("ids", TensorType::new(DType::I64, [2]));
        let w = g.add_const("w", Tensor::from_f32([3, 3], &[0.5; 9]));
        let y = g.add("mm", Op::MatMul, &[x, w]).unwrap();
        let c = g.add("c", Op::Cast { to: DType::F32 }, &[ids]).unwrap();
        let z = g.add("z", Op::Unary(crate::ir::UnaryOp::Relu), &[y]).unwrap();
        g.outputs = vec![z, c, ids];
        let h = to_half(&g).unwrap();
        crate::ir::verify(&h).unwrap();
        let tys: Vec<DType> = h.outputs.iter().map(|&o| h.ty(o).dtype).collect();
        assert_eq!(tys, [DType::F32, DType::F32, DType::I64]);
        let names: Vec<&str> = h.outputs.iter().map(|&o| h.value(o).name.as_str()).collect();
        assert_eq!(names, ["z", "c", "ids"]);
        assert_eq!(h.inputs.len(), 2);
        assert_eq!(h.ty(h.inputs[0]).dtype, DType::F32);
        let mm = h.nodes.iter().find(|n| n.name == "mm").unwrap();
        assert!(mm.inputs.iter().chain(&mm.outputs).all(|&v| h.ty(v).dtype == DType::F16));
        let inputs = random_inputs(&g, 7);
        let (want, got) = (run_graph(&g, &inputs).unwrap(), run_graph(&h, &inputs).unwrap());
        for (a, b) in got.iter().zip(&want) {
            assert_eq!(a.ty, b.ty);
            assert!(rel_err(a, b) < 1e-2, "{}", rel_err(a, b));
        }
    }

    /// A node kept in f32 computes in f32 between casts, its value beyond f16's range survives, and the
    /// graph's result is finite where the all-f16 graph's is not.
    #[test]
    fn kept_nodes_compute_in_f32_between_casts() {
        let mut g = Graph::new("m");
        let x = g.add_input("x", TensorType::f32([4]));
        let w = g.add_const("w", Tensor::from_f32([4], &[3e4; 4]));
        let inv = g.add_const("inv", Tensor::from_f32([4], &[1e-4; 4]));
        let big = g.add("big", Op::Binary(BinaryOp::Mul), &[x, w]).unwrap(); // up to ~1e5: beyond f16
        let twice = g.add("twice", Op::Binary(BinaryOp::Add), &[big, big]).unwrap();
        let small = g.add("small", Op::Binary(BinaryOp::Mul), &[twice, inv]).unwrap();
        let out = g.add("out", Op::Unary(crate::ir::UnaryOp::Relu), &[small]).unwrap();
        g.outputs = vec![out, twice];
        let inputs = vec![Tensor::from_f32([4], &[2.0, -3.0, 1.0, 0.5])];
        let want = run_graph(&g, &inputs).unwrap();
        let all_half = run_graph(&to_half(&g).unwrap(), &inputs).unwrap();
        assert!(all_half[0].to_f32_vec().iter().any(|v| !v.is_finite()) || rel_err(&all_half[0], &want[0]) > 1e-2, "f16 alone overflows here");
        // Keep every node touching a value beyond the range: big, twice, and small (which reads twice).
        let keep = [true, true, true, false];
        let h = to_narrow_keeping(&g, DType::F16, &keep, DType::F32).unwrap();
        crate::ir::verify(&h).unwrap();
        let node = |name: &str| h.nodes.iter().find(|n| n.name == name).unwrap();
        assert!(node("twice").outputs.iter().all(|&v| h.ty(v).dtype == DType::F32));
        assert!(node("out").outputs.iter().all(|&v| h.ty(v).dtype == DType::F16));
        let got = run_graph(&h, &inputs).unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert_eq!(a.ty, b.ty);
            assert!(rel_err(a, b) < 1e-2, "{}", rel_err(a, b));
        }
        let names: Vec<&str> = h.outputs.iter().map(|&o| h.value(o).name.as_str()).collect();
        assert_eq!(names, ["out", "twice"], "outputs keep their names");
    }

    #[test]
    fn bf16_saturates_f32_extremes_that_would_round_to_infinity() {
        // f32's largest values round up past bf16's largest (3.3895e38) to infinity; saturated they stay finite.
        let t = Tensor::from_f32([5], &[f32::MIN, f32::MAX, 1e6, f32::INFINITY, f32::NAN]);
        let b = to_narrow_saturating(&t, DType::BF16);
        assert_eq!(b.dtype(), DType::BF16);
        let v = b.to_f32_vec();
        assert_eq!(&v[..4], &[-bf16::MAX.to_f32(), bf16::MAX.to_f32(), 999424.0, f32::INFINITY], "1e6 rounds to 8 bits of mantissa");
        assert!(v[4].is_nan());
    }

    /// The same rewrite in bf16: f32 interface, bf16 inside, results within bf16's rounding of the reference,
    /// and values far beyond f16's range computed as they are.
    #[test]
    fn bf16_keeps_the_interface_and_fp32_range() {
        let mut g = Graph::new("m");
        let x = g.add_input("x", TensorType::f32([2, 3]));
        let w = g.add_const("w", Tensor::from_f32([3, 3], &[3e5; 9]));
        let y = g.add("mm", Op::MatMul, &[x, w]).unwrap();
        let z = g.add("z", Op::Unary(crate::ir::UnaryOp::Relu), &[y]).unwrap();
        g.outputs = vec![z];
        let h = to_narrow(&g, DType::BF16).unwrap();
        crate::ir::verify(&h).unwrap();
        assert_eq!(h.ty(h.outputs[0]).dtype, DType::F32);
        assert_eq!(h.value(h.outputs[0]).name, "z");
        assert!(h.nodes.iter().any(|n| n.name == "z" && h.ty(n.outputs[0]).dtype == DType::BF16 && h.value(n.outputs[0]).name == "z.bf16"));
        assert!(h.nodes.iter().all(|n| h.ty(n.outputs[0]).dtype != DType::F16));
        let inputs = random_inputs(&g, 3);
        let (want, got) = (run_graph(&g, &inputs).unwrap(), run_graph(&h, &inputs).unwrap());
        assert!(want[0].to_f32_vec().iter().any(|v| v.abs() > 65504.0), "the reference leaves f16's range");
        assert!(rel_err(&got[0], &want[0]) < 1e-2, "{}", rel_err(&got[0], &want[0]));
    }

    /// `-overflow=bf16`: the kept nodes compute in bf16 between casts (their inputs cast from f32 where the
    /// value is an input, so not rounded through f16 first), the rest in f16.
    #[test]
    fn kept_nodes_can_compute_in_bf16() {
        let mut g = Graph::new("m");
        let x = g.add_input("x", TensorType::f32([4]));
        let w = g.add_const("w", Tensor::from_f32([4], &[3e4; 4]));
        let inv = g.add_const("inv", Tensor::from_f32([4], &[1e-4; 4]));
        let big = g.add("big", Op::Binary(BinaryOp::Mul), &[x, w]).unwrap();
        let twice = g.add("twice", Op::Binary(BinaryOp::Add), &[big, big]).unwrap();
        let small = g.add("small", Op::Binary(BinaryOp::Mul), &[twice, inv]).unwrap();
        let out = g.add("out", Op::Unary(crate::ir::UnaryOp::Relu), &[small]).unwrap();
        g.outputs = vec![out, twice];
        let h = to_narrow_keeping(&g, DType::F16, &[true, true, true, false], DType::BF16).unwrap();
        crate::ir::verify(&h).unwrap();
        let node = |name: &str| h.nodes.iter().find(|n| n.name == name).unwrap_or_else(|| panic!("no node {name}"));
        for kept in ["big", "twice", "small"] {
            assert!(node(kept).outputs.iter().all(|&v| h.ty(v).dtype == DType::BF16), "{kept}");
        }
        assert_eq!(h.ty(node("out").outputs[0]).dtype, DType::F16);
        // x enters the kept node as bf16 cast from the f32 input; the constants are converted once, to bf16.
        assert_eq!(node("big").inputs.iter().map(|&v| h.ty(v).dtype).collect::<Vec<_>>(), [DType::BF16, DType::BF16]);
        assert!(h.nodes.iter().any(|n| n.name == "x.to_bf16" && h.ty(n.inputs[0]).dtype == DType::F32));
        let inputs = vec![Tensor::from_f32([4], &[2.0, -3.0, 1.0, 0.5])];
        let want = run_graph(&g, &inputs).unwrap();
        let got = run_graph(&h, &inputs).unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert_eq!(a.ty, b.ty);
            assert!(rel_err(a, b) < 1e-2, "{}", rel_err(a, b));
        }
        let names: Vec<&str> = h.outputs.iter().map(|&o| h.value(o).name.as_str()).collect();
        assert_eq!(names, ["out", "twice"], "outputs keep their names");
    }

    /// An output computed in f16 that a kept (f32) node also reads is cast up once, and the cast carries the
    /// output's name: the interface keeps its names and no node name is used twice.
    #[test]
    fn an_output_read_by_a_kept_node_keeps_its_name() {
        let mut g = Graph::new("m");
        let x = g.add_input("x", TensorType::f32([4]));
        let y = g.add("y", Op::Unary(crate::ir::UnaryOp::Relu), &[x]).unwrap();
        let z = g.add("z", Op::Binary(BinaryOp::Add), &[y, y]).unwrap();
        g.outputs = vec![y, z];
        for kept in [DType::F32, DType::BF16] {
            let h = to_narrow_keeping(&g, DType::F16, &[false, true], kept).unwrap();
            crate::ir::verify(&h).unwrap();
            let names: Vec<&str> = h.outputs.iter().map(|&o| h.value(o).name.as_str()).collect();
            assert_eq!(names, ["y", "z"], "{kept}");
            assert!(h.outputs.iter().all(|&o| h.ty(o).dtype == DType::F32), "{kept}");
            let mut node_names: Vec<&str> = h.nodes.iter().map(|n| n.name.as_str()).collect();
            node_names.sort();
            let n = node_names.len();
            node_names.dedup();
            assert_eq!(node_names.len(), n, "{kept}: {node_names:?}");
            let inputs = vec![Tensor::from_f32([4], &[2.0, -3.0, 1.0, 0.5])];
            let (want, got) = (run_graph(&g, &inputs).unwrap(), run_graph(&h, &inputs).unwrap());
            for (a, b) in got.iter().zip(&want) {
                assert!(rel_err(a, b) < 1e-2, "{kept}: {}", rel_err(a, b));
            }
        }
    }

    #[test]
    fn masked_lowest_times_zero_stays_zero() {
        // (1 - mask) * f32::MIN + scores: rounded to -inf, 0 * -inf would be NaN.
        let mut g = Graph::new("m");
        let s = g.add_input("s", TensorType::f32([4]));
        let keep = g.add_const("keep", Tensor::from_f32([4], &[0.0, 0.0, 1.0, 0.0]));
        let low = g.add_const("low", Tensor::from_f32([1], &[f32::MIN]));
        let m = g.add("m", Op::Binary(BinaryOp::Mul), &[keep, low]).unwrap();
        let y = g.add("y", Op::Binary(BinaryOp::Add), &[s, m]).unwrap();
        g.outputs = vec![y];
        let h = to_half(&g).unwrap();
        let out = run_graph(&h, &random_inputs(&g, 1)).unwrap();
        let v = out[0].to_f32_vec();
        assert!(v.iter().all(|x| !x.is_nan()), "{v:?}");
        assert!(v[2] <= -65000.0 && v[0].abs() <= 1.0, "{v:?}");
        // bf16 would round f32::MIN to -inf: saturated, it is bf16's lowest, and 0 times it is 0.
        let b = to_narrow(&g, DType::BF16).unwrap();
        let v = run_graph(&b, &random_inputs(&g, 1)).unwrap()[0].to_f32_vec();
        assert!(v.iter().all(|x| !x.is_nan()), "{v:?}");
        assert!(v[2] <= -3e38 && v[0].abs() <= 1.0, "{v:?}");
    }
}
