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
    let mut h = Graph::new(g.name.clone());
    let mut map: Vec<Option<ValueId>> = vec![None; g.values.len()];
    let is_output: Vec<bool> = {
        let mut o = vec![false; g.values.len()];
        for v in &g.outputs {
            o[v.index()] = true;
        }
        o
    };
    // A value that leaves the graph as f32 is renamed inside; the cast back takes its name.
    let inner_name = |v: ValueId| -> String {
        let val = g.value(v);
        if is_output[v.index()] && val.ty.dtype == DType::F32 {
            format!("{}.f16", val.name)
        } else {
            val.name.clone()
        }
    };
    for &v in &g.inputs {
        let val = g.value(v);
        let id = h.add_input(val.name.clone(), val.ty.clone());
        map[v.index()] = Some(if val.ty.dtype == DType::F32 {
            h.add_node_named(format!("{}.to_f16", val.name), Op::Cast { to: DType::F16 }, &[id], vec![format!("{}.f16", val.name)])?[0]
        } else {
            id
        });
    }
    for (i, val) in g.values.iter().enumerate() {
        if let ValueDef::Const(t) = &val.def {
            let t = if t.dtype() == DType::F32 { to_f16_saturating(t) } else { t.clone() };
            map[i] = Some(h.add_const(val.name.clone(), t));
        }
    }
    for node in &g.nodes {
        let inputs: Vec<ValueId> = node.inputs.iter().map(|v| map[v.index()].expect("graph nodes are in topological order")).collect();
        let names: Vec<String> = node.outputs.iter().map(|&o| inner_name(o)).collect();
        let outs = h.add_node_named(node.name.clone(), half_op(&node.op), &inputs, names)?;
        for (&o, n) in node.outputs.iter().zip(outs) {
            map[o.index()] = Some(n);
        }
    }
    for &v in &g.outputs {
        let mut id = map[v.index()].expect("outputs are defined");
        let want = g.ty(v).dtype;
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
