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
