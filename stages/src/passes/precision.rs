//! Reduced precision: a model's graph rewritten to run in fp16 (the `precision=fp16` of a GPU target).
//!
//! Every f32 value inside the graph becomes f16; the graph's interface does not change: an f32 input is
//! cast to f16 as it enters and an f32 output cast back as it leaves, so callers feed and read f32 tensors
//! whatever the precision (and the artifact is checked against the f32 reference model). f32 constants are
//! converted once, here, at compile time, and stored by digest as f16 like any other constant.
//!
//! Conversion saturates: a finite constant beyond f16's range becomes +-65504 rather than +-inf. Exporters
//! write "minus infinity" masks as f32's lowest value (-3.4e38) and then multiply them by 0 for the positions
//! they keep (Hugging Face's `(1 - mask) * finfo.min`); rounded to -inf that product is NaN, saturated it is
//! 0, which is what the model means. Infinities and NaN stay what they are.
//!
//! Accumulation precision is the kernels' business, not the graph's: backends running f16 graphs keep fp32
//! accumulators in matmul, convolution, reductions, softmax and layer norm (f16 is a storage type).

use crate::ir::{BuildError, DType, Graph, Op, Tensor, TensorType, ValueDef, ValueId};
use half::f16;

/// The largest finite f16.
const F16_MAX: f32 = 65504.0;

/// An f32 tensor rounded to f16 (nearest even), finite values saturating at +-65504.
pub fn to_f16_saturating(t: &Tensor) -> Tensor {
    let bits: Vec<u8> = t
        .to_f32_vec()
        .iter()
        .map(|&x| if x.is_finite() { x.clamp(-F16_MAX, F16_MAX) } else { x })
        .flat_map(|x| f16::from_f32(x).to_bits().to_le_bytes())
        .collect();
    Tensor::from_bytes(TensorType::new(DType::F16, t.shape().to_vec()), bits).expect("one f16 per element")
}

/// The op with every f32 it produces made f16 (Cast's target; everything else follows its inputs).
fn half_op(op: &Op) -> Op {
    match op {
        Op::Cast { to: DType::F32 } => Op::Cast { to: DType::F16 },
        other => other.clone(),
    }
}

/// `g` computing in f16 (see the module documentation). Graphs without f32 values come back unchanged.
pub fn to_half(g: &Graph) -> Result<Graph, BuildError> {
    to_half_keeping(g, &vec![false; g.nodes.len()])
}

/// `g` computing in f16 except the nodes `keep_f32` marks (by node index), which compute in f32 as in `g`:
/// their f16 inputs are cast up just before them, and their outputs cast down where an f16 node reads
/// them. What `-overflow=keep-fp32` makes of the nodes whose values leave f16's range (`crate::precision`).
/// With no node kept, the graph is exactly what `to_half` made before nodes could be kept (same nodes, names and
/// order: the frozen fixtures' fp16 artifacts check it byte for byte).
pub fn to_half_keeping(g: &Graph, keep_f32: &[bool]) -> Result<Graph, BuildError> {
    let mut h = Graph::new(g.name.clone());
    let n = g.values.len();
    // Each value of `g` as the f16 graph reads it (`half`) and, where a kept node needs it, in f32 (`full`).
    let mut half: Vec<Option<ValueId>> = vec![None; n];
    let mut full: Vec<Option<ValueId>> = vec![None; n];
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
                k[o.index()] = keep_f32[i];
            }
        }
        k
    };
    // Who reads each value: an f16 node, a kept (f32) node.
    let (mut read_half, mut read_full) = (vec![false; n], vec![false; n]);
    for (i, node) in g.nodes.iter().enumerate() {
        for &v in &node.inputs {
            if keep_f32[i] { read_full[v.index()] = true } else { read_half[v.index()] = true }
        }
    }
    let is_f32 = |v: ValueId| g.ty(v).dtype == DType::F32;
    // A value that leaves the graph as f32 but is computed in f16 is renamed inside; the cast back takes its name.
    let inner_name = |v: ValueId| -> String {
        let val = g.value(v);
        if is_output[v.index()] && val.ty.dtype == DType::F32 && !producer_kept[v.index()] {
            format!("{}.f16", val.name)
        } else {
            val.name.clone()
        }
    };
    for &v in &g.inputs {
        let val = g.value(v);
        let id = h.add_input(val.name.clone(), val.ty.clone());
        full[v.index()] = Some(id);
        half[v.index()] = Some(if val.ty.dtype == DType::F32 && (read_half[v.index()] || !read_full[v.index()]) {
            h.add_node_named(format!("{}.to_f16", val.name), Op::Cast { to: DType::F16 }, &[id], vec![format!("{}.f16", val.name)])?[0]
        } else {
            id
        });
    }
    for (i, val) in g.values.iter().enumerate() {
        if let ValueDef::Const(t) = &val.def {
            if t.dtype() != DType::F32 {
                let id = h.add_const(val.name.clone(), t.clone());
                (half[i], full[i]) = (Some(id), Some(id));
                continue;
            }
            // Converted once, here; an f32 copy only where a kept node reads the constant.
            if read_half[i] || !read_full[i] {
                half[i] = Some(h.add_const(val.name.clone(), to_f16_saturating(t)));
            }
            if read_full[i] {
                let name = if half[i].is_some() { format!("{}.f32", val.name) } else { val.name.clone() };
                full[i] = Some(h.add_const(name, t.clone()));
            }
        }
    }
    for (ni, node) in g.nodes.iter().enumerate() {
        let keep = keep_f32[ni];
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for &v in &node.inputs {
            let i = v.index();
            let id = if keep && is_f32(v) {
                match full[i] {
                    Some(id) => id,
                    None => {
                        // Computed in f16, read by a kept node: cast up just before it.
                        let from = half[i].expect("graph nodes are in topological order");
                        let up = h.add_node_named(format!("{}.to_f32", g.value(v).name), Op::Cast { to: DType::F32 }, &[from], vec![format!("{}.f32", g.value(v).name)])?[0];
                        full[i] = Some(up);
                        up
                    }
                }
            } else if !keep && is_f32(v) {
                match half[i] {
                    Some(id) => id,
                    None => {
                        // Computed in f32 by a kept node, read in f16: cast down just before the reader.
                        let from = full[i].expect("graph nodes are in topological order");
                        let down = h.add_node_named(format!("{}.to_f16", g.value(v).name), Op::Cast { to: DType::F16 }, &[from], vec![format!("{}.f16", g.value(v).name)])?[0];
                        half[i] = Some(down);
                        down
                    }
                }
            } else {
                half[i].or(full[i]).expect("graph nodes are in topological order")
            };
            inputs.push(id);
        }
        let names: Vec<String> = node.outputs.iter().map(|&o| inner_name(o)).collect();
        let op = if keep { node.op.clone() } else { half_op(&node.op) };
        let outs = h.add_node_named(node.name.clone(), op, &inputs, names)?;
        for (&o, id) in node.outputs.iter().zip(outs) {
            if keep || !is_f32(o) {
                full[o.index()] = Some(id);
            }
            if !keep || !is_f32(o) {
                half[o.index()] = Some(id);
            }
        }
    }
    for &v in &g.outputs {
        let want = g.ty(v).dtype;
        let mut id = full[v.index()].or(half[v.index()]).expect("outputs are defined");
        if h.ty(id).dtype != want {
            let val = g.value(v);
            id = h.add_node_named(format!("{}.to_f32", val.name), Op::Cast { to: want }, &[id], vec![val.name.clone()])?[0];
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
        let h = to_f16_saturating(&t).to_f32_vec();
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
        let h = to_half_keeping(&g, &keep).unwrap();
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
    }
}
