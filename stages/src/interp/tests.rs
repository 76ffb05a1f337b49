//! Unit tests per op family against small hand-computed cases, plus a few cross-checks of the fast
//! kernels (GEMM, im2col, col2im) against direct loops.

use super::*;
use crate::ir::*;
use half::f16;

fn f(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_f32(shape.to_vec(), v)
}

fn i(shape: &[usize], v: &[i64]) -> Tensor {
    Tensor::from_i64(shape.to_vec(), v)
}

fn eval1(op: Op, inputs: &[&Tensor]) -> Tensor {
    let mut out = eval_op(&op, inputs).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.len(), 1);
    out.remove(0)
}

fn fv(t: &Tensor) -> Vec<f32> {
    t.to_f32_vec()
}

fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "length: got {got:?}, want {want:?}");
    for (k, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= tol * (1.0 + b.abs()), "element {k}: got {a}, want {b} (all: {got:?})");
    }
}

// ---- integer and shape ops (what constant folding and the importer need) ----

#[test]
fn gather_with_negative_indices_and_range_error() {
    let data = i(&[3, 2], &[10, 11, 20, 21, 30, 31]);
    let idx = i(&[2], &[2, -3]);
    let out = eval1(Op::Gather { axis: 0 }, &[&data, &idx]);
    assert_eq!(out.shape(), &[2, 2]);
    assert_eq!(out.to_i64_vec(), vec![30, 31, 10, 11]);
    // Scalar index drops the axis; axis 1.
    let out = eval1(Op::Gather { axis: 1 }, &[&data, &i(&[], &[1])]);
    assert_eq!((out.shape(), out.to_i64_vec()), (&[3][..], vec![11, 21, 31]));
    let e = eval_op(&Op::Gather { axis: 0 }, &[&data, &i(&[1], &[3])]).unwrap_err().to_string();
    assert!(e.contains("Gather") && e.contains("index 3"), "{e}");
}

#[test]
fn concat_reshape_transpose_split() {
    let a = i(&[2, 1], &[1, 2]);
    let b = i(&[2, 2], &[3, 4, 5, 6]);
    let c = eval1(Op::Concat { axis: 1 }, &[&a, &b]);
    assert_eq!((c.shape(), c.to_i64_vec()), (&[2, 3][..], vec![1, 3, 4, 2, 5, 6]));
    let r = eval1(Op::Reshape { shape: vec![3, 2] }, &[&c]);
    assert_eq!((r.shape(), r.to_i64_vec()), (&[3, 2][..], vec![1, 3, 4, 2, 5, 6]));
    let t = eval1(Op::Transpose { perm: vec![1, 0] }, &[&c]);
    assert_eq!((t.shape(), t.to_i64_vec()), (&[3, 2][..], vec![1, 2, 3, 5, 4, 6]));
    let parts = eval_op(&Op::Split { axis: 1, sizes: vec![1, 2] }, &[&c]).unwrap();
    assert_eq!(parts[0].to_i64_vec(), vec![1, 2]);
    assert_eq!((parts[1].shape(), parts[1].to_i64_vec()), (&[2, 2][..], vec![3, 4, 5, 6]));
    // Concat of a shape vector with a scalar-made-1D (the importer's typical shape computation).
    let s = eval1(Op::Concat { axis: 0 }, &[&i(&[1], &[1]), &i(&[2], &[128, 768])]);
    assert_eq!(s.to_i64_vec(), vec![1, 128, 768]);
}

#[test]
fn slice_steps_positive_and_negative() {
    let x = i(&[5], &[0, 1, 2, 3, 4]);
    let s = |st, en, sp| eval1(Op::Slice { axes: vec![0], starts: vec![st], ends: vec![en], steps: vec![sp] }, &[&x]).to_i64_vec();
    assert_eq!(s(4, -1, -2), vec![4, 2, 0]);
    assert_eq!(s(1, 5, 2), vec![1, 3]);
    assert_eq!(s(3, 1, -1), vec![3, 2]);
    assert_eq!(s(2, 2, 1), Vec::<i64>::new());
    let m = i(&[2, 3], &[1, 2, 3, 4, 5, 6]);
    let out = eval1(Op::Slice { axes: vec![1], starts: vec![2], ends: vec![-1], steps: vec![-1] }, &[&m]);
    assert_eq!((out.shape(), out.to_i64_vec()), (&[2, 3][..], vec![3, 2, 1, 6, 5, 4]));
}

#[test]
fn integer_arithmetic_broadcasts_and_rounds_like_onnx() {
    let a = i(&[2, 2], &[7, -7, 8, 9]);
    let b = i(&[2], &[2, -3]);
    let bin = |op, x: &Tensor, y: &Tensor| eval1(Op::Binary(op), &[x, y]).to_i64_vec();
    assert_eq!(bin(BinaryOp::Add, &a, &b), vec![9, -10, 10, 6]);
    assert_eq!(bin(BinaryOp::Sub, &a, &b), vec![5, -4, 6, 12]);
    assert_eq!(bin(BinaryOp::Mul, &a, &b), vec![14, 21, 16, -27]);
    // Division truncates toward zero.
    assert_eq!(bin(BinaryOp::Div, &a, &b), vec![3, 2, 4, -3]);
    // Mod takes the divisor's sign, FMod the dividend's.
    assert_eq!(bin(BinaryOp::Mod, &a, &b), vec![1, -1, 0, 0]);
    assert_eq!(bin(BinaryOp::Mod, &i(&[2], &[-7, 7]), &i(&[2], &[3, -3])), vec![2, -2]);
    assert_eq!(bin(BinaryOp::FMod, &i(&[2], &[-7, 7]), &i(&[2], &[3, -3])), vec![-1, 1]);
    assert_eq!(bin(BinaryOp::Pow, &i(&[2], &[3, 2]), &i(&[2], &[4, -1])), vec![81, 0]);
    let e = eval_op(&Op::Binary(BinaryOp::Div), &[&a, &i(&[1], &[0])]).unwrap_err().to_string();
    assert!(e.contains("by zero"), "{e}");
    // i32 wraps like i32 (computed in i64, narrowed).
    let big = Tensor::from_i32(vec![1], &[i32::MAX]);
    let one = Tensor::from_i32(vec![1], &[1]);
    assert_eq!(eval1(Op::Binary(BinaryOp::Add), &[&big, &one]).to_i64_vec(), vec![i32::MIN as i64]);
}

#[test]
fn comparisons_where_and_logic() {
    let a = i(&[3], &[1, 5, 3]);
    let eq = eval1(Op::Binary(BinaryOp::Equal), &[&a, &i(&[], &[3])]);
    assert_eq!(eq.dtype(), DType::Bool);
    assert_eq!(eq.to_i64_vec(), vec![0, 0, 1]);
    let lt = eval1(Op::Binary(BinaryOp::Less), &[&a, &i(&[], &[3])]);
    assert_eq!(lt.to_i64_vec(), vec![1, 0, 0]);
    let w = eval1(Op::Where, &[&eq, &i(&[1], &[-1]), &a]);
    assert_eq!(w.to_i64_vec(), vec![1, 5, -1]);
    // cond [2,1] x [3] -> [2,3]
    let c = Tensor::from_bool(vec![2, 1], &[true, false]);
    let w = eval1(Op::Where, &[&c, &f(&[3], &[1., 2., 3.]), &f(&[], &[0.])]);
    assert_eq!((w.shape(), fv(&w)), (&[2, 3][..], vec![1., 2., 3., 0., 0., 0.]));
    let t = Tensor::from_bool(vec![2], &[true, false]);
    let u = Tensor::from_bool(vec![2], &[true, true]);
    assert_eq!(eval1(Op::Binary(BinaryOp::And), &[&t, &u]).to_i64_vec(), vec![1, 0]);
    assert_eq!(eval1(Op::Binary(BinaryOp::Or), &[&t, &u]).to_i64_vec(), vec![1, 1]);
    assert_eq!(eval1(Op::Unary(UnaryOp::Not), &[&t]).to_i64_vec(), vec![0, 1]);
    // NaN compares unequal to everything.
    let n = f(&[1], &[f32::NAN]);
    assert_eq!(eval1(Op::Binary(BinaryOp::Equal), &[&n, &n]).to_i64_vec(), vec![0]);
}

#[test]
fn expand_tile_pad() {
    let x = i(&[2, 1], &[1, 2]);
    let e = eval1(Op::Expand { shape: vec![2, 3] }, &[&x]);
    assert_eq!(e.to_i64_vec(), vec![1, 1, 1, 2, 2, 2]);
    // Expand may also add leading dims and keep a larger input dim.
    let e = eval1(Op::Expand { shape: vec![2, 1, 1] }, &[&x]);
    assert_eq!((e.shape(), e.to_i64_vec()), (&[2, 2, 1][..], vec![1, 2, 1, 2]));
    let t = eval1(Op::Tile { repeats: vec![2, 2] }, &[&i(&[1, 2], &[1, 2])]);
    assert_eq!((t.shape(), t.to_i64_vec()), (&[2, 4][..], vec![1, 2, 1, 2, 1, 2, 1, 2]));
    let t = eval1(Op::Tile { repeats: vec![2, 1] }, &[&i(&[2, 2], &[1, 2, 3, 4])]);
    assert_eq!(t.to_i64_vec(), vec![1, 2, 3, 4, 1, 2, 3, 4]);

    let v = f(&[4], &[1., 2., 3., 4.]);
    let pad = |pads: Vec<i64>, mode| fv(&eval1(Op::Pad { pads, mode, value: 9.0 }, &[&v]));
    assert_eq!(pad(vec![2, 1], PadMode::Constant), vec![9., 9., 1., 2., 3., 4., 9.]);
    assert_eq!(pad(vec![2, 2], PadMode::Reflect), vec![3., 2., 1., 2., 3., 4., 3., 2.]);
    assert_eq!(pad(vec![2, 1], PadMode::Edge), vec![1., 1., 1., 2., 3., 4., 4.]);
    // Negative pads crop.
    assert_eq!(pad(vec![-1, 1], PadMode::Constant), vec![2., 3., 4., 9.]);
    let m = i(&[2, 2], &[1, 2, 3, 4]);
    let p = eval1(Op::Pad { pads: vec![1, 0, 0, 1], mode: PadMode::Constant, value: 0.0 }, &[&m]);
    assert_eq!((p.shape(), p.to_i64_vec()), (&[3, 3][..], vec![0, 0, 0, 1, 2, 0, 3, 4, 0]));
}

#[test]
fn gather_elements() {
    let data = f(&[2, 2], &[1., 2., 3., 4.]);
    let idx = i(&[2, 2], &[0, 0, 1, 0]);
    let out = eval1(Op::GatherElements { axis: 1 }, &[&data, &idx]);
    assert_eq!(fv(&out), vec![1., 1., 4., 3.]);
    let out = eval1(Op::GatherElements { axis: 0 }, &[&data, &i(&[1, 2], &[1, -2])]);
    assert_eq!(fv(&out), vec![3., 2.]);
}

#[test]
fn cast_truncates_rounds_and_wraps_like_onnx_runtime() {
    let x = f(&[5], &[-2.7, 2.7, f32::NAN, 0.0, 3e10]);
    assert_eq!(eval1(Op::Cast { to: DType::I64 }, &[&x]).to_i64_vec(), vec![-2, 2, i64::MIN, 0, 3e10f32 as i64]);
    assert_eq!(eval1(Op::Cast { to: DType::I32 }, &[&x]).to_i64_vec(), vec![-2, 2, i32::MIN as i64, 0, i32::MIN as i64]);
    assert_eq!(eval1(Op::Cast { to: DType::Bool }, &[&x]).to_i64_vec(), vec![1, 1, 1, 0, 1]);
    // i64 -> i32 wraps; -> f16 rounds to nearest even (2049 is a tie between 2048 and 2050).
    let n = i(&[2], &[(1i64 << 32) + 5, 2049]);
    assert_eq!(eval1(Op::Cast { to: DType::I32 }, &[&n]).to_i64_vec(), vec![5, 2049]);
    assert_eq!(fv(&eval1(Op::Cast { to: DType::F16 }, &[&n]))[1], 2048.0);
    let b = Tensor::from_bool(vec![2], &[true, false]);
    assert_eq!(fv(&eval1(Op::Cast { to: DType::F32 }, &[&b])), vec![1.0, 0.0]);
    // f32 -> bf16 -> f32 keeps 8 bits of mantissa.
    let y = eval1(Op::Cast { to: DType::BF16 }, &[&f(&[1], &[1.0 + 2f32.powi(-9)])]);
    assert_eq!(fv(&y), vec![1.0]);
}

#[test]
fn reductions_integer_and_float() {
    let x = i(&[2, 3], &[1, 2, 3, 4, 5, 6]);
    let r = |kind, axes: Vec<usize>, keepdims| eval1(Op::Reduce { kind, axes, keepdims }, &[&x]);
    assert_eq!(r(ReduceKind::Sum, vec![1], false).to_i64_vec(), vec![6, 15]);
    assert_eq!(r(ReduceKind::Sum, vec![0], true).shape(), &[1, 3]);
    assert_eq!(r(ReduceKind::Max, vec![0, 1], false).to_i64_vec(), vec![6]);
    assert_eq!(r(ReduceKind::Mean, vec![1], false).to_i64_vec(), vec![2, 5]);
    let y = f(&[2, 2, 2], &[1., 2., 3., 4., 5., 6., 7., 8.]);
    let mean = eval1(Op::Reduce { kind: ReduceKind::Mean, axes: vec![0, 2], keepdims: false }, &[&y]);
    assert_eq!(fv(&mean), vec![3.5, 5.5]);
    let min = eval1(Op::Reduce { kind: ReduceKind::Min, axes: vec![1], keepdims: true }, &[&y]);
    assert_eq!((min.shape(), fv(&min)), (&[2, 1, 2][..], vec![1., 2., 5., 6.]));
    // f64 accumulation: 1e8 + 1 - 1e8 in f32 would lose the 1.
    let z = f(&[3], &[1e8, 1.0, -1e8]);
    assert_eq!(fv(&eval1(Op::Reduce { kind: ReduceKind::Sum, axes: vec![0], keepdims: false }, &[&z])), vec![1.0]);
    let nan = f(&[2], &[f32::NAN, 1.0]);
    assert!(fv(&eval1(Op::Reduce { kind: ReduceKind::Max, axes: vec![0], keepdims: false }, &[&nan]))[0].is_nan());
}

#[test]
fn eval_op_rejects_bad_inputs_without_panicking() {
    let e = eval_op(&Op::MatMul, &[&f(&[2, 3], &[0.; 6])]).unwrap_err().to_string();
    assert!(e.starts_with("MatMul:"), "{e}");
    let e = eval_op(&Op::Reshape { shape: vec![4] }, &[&f(&[3], &[0.; 3])]).unwrap_err().to_string();
    assert!(e.contains("Reshape"), "{e}");
    let e = eval_op(&Op::Binary(BinaryOp::Add), &[&f(&[2], &[0.; 2]), &i(&[2], &[0; 2])]).unwrap_err().to_string();
    assert!(e.contains("Add"), "{e}");
}

// ---- float elementwise ----

#[test]
fn unary_activations() {
    let x = f(&[3], &[-1.0, 0.0, 2.0]);
    let u = |op| fv(&eval1(Op::Unary(op), &[&x]));
    assert_eq!(u(UnaryOp::Relu), vec![0.0, 0.0, 2.0]);
    assert_close(&u(UnaryOp::Sigmoid), &[0.26894142, 0.5, 0.880797], 1e-6);
    assert_close(&u(UnaryOp::Tanh), &[-0.7615942, 0.0, 0.9640276], 1e-6);
    assert_close(&u(UnaryOp::Erf), &[-0.8427008, 0.0, 0.9953223], 1e-6);
    assert_close(&u(UnaryOp::Exp), &[0.36787945, 1.0, 7.389056], 1e-6);
    assert_close(&u(UnaryOp::HardSwish), &[-1.0 / 3.0, 0.0, 5.0 / 3.0], 1e-6);
    assert_eq!(u(UnaryOp::Neg), vec![1.0, -0.0, -2.0]);
    assert_eq!(u(UnaryOp::Abs), vec![1.0, 0.0, 2.0]);
    assert_eq!(u(UnaryOp::Reciprocal), vec![-1.0, f32::INFINITY, 0.5]);
    let l = fv(&eval1(Op::Unary(UnaryOp::Log), &[&f(&[2], &[1.0, -1.0])]));
    assert_eq!(l[0], 0.0);
    assert!(l[1].is_nan());
    assert_eq!(fv(&eval1(Op::Unary(UnaryOp::Floor), &[&f(&[2], &[-1.5, 1.5])])), vec![-2.0, 1.0]);
    assert_eq!(fv(&eval1(Op::Unary(UnaryOp::Ceil), &[&f(&[2], &[-1.5, 1.5])])), vec![-1.0, 2.0]);
    assert_eq!(fv(&eval1(Op::Unary(UnaryOp::Sqrt), &[&f(&[1], &[2.25])])), vec![1.5]);
    assert_eq!(eval1(Op::Unary(UnaryOp::IsNaN), &[&f(&[2], &[f32::NAN, 1.0])]).to_i64_vec(), vec![1, 0]);
    assert_close(&fv(&eval1(Op::LeakyRelu { alpha: 0.1 }, &[&x])), &[-0.1, 0.0, 2.0], 1e-7);
    assert_close(&fv(&eval1(Op::HardSigmoid { alpha: 0.2, beta: 0.5 }, &[&x])), &[0.3, 0.5, 0.9], 1e-7);
    assert_eq!(fv(&eval1(Op::Clip { min: -0.5, max: 1.0 }, &[&x])), vec![-0.5, 0.0, 1.0]);
    assert_eq!(eval1(Op::Clip { min: 0.5, max: 3.5 }, &[&i(&[3], &[-2, 2, 9])]).to_i64_vec(), vec![1, 2, 3]);
    assert_eq!(eval1(Op::Unary(UnaryOp::Relu), &[&i(&[2], &[-2, 2])]).to_i64_vec(), vec![0, 2]);
}

/// The trigonometric and hyperbolic functions, Round, Softplus and Mish against values from the definitions
/// (NumPy / Python's math in double), rounded to f32.
#[test]
fn trigonometric_hyperbolic_round_softplus_mish() {
    let x = f(&[4], &[-0.75, 0.0, 0.5, 1.25]);
    let u = |op, x: &Tensor| fv(&eval1(Op::Unary(op), &[x]));
    assert_close(&u(UnaryOp::Cos, &x), &[0.7316889, 1.0, 0.87758255, 0.31532236], 1e-7);
    assert_close(&u(UnaryOp::Sin, &x), &[-0.6816388, 0.0, 0.47942555, 0.9489846], 1e-7);
    assert_close(&u(UnaryOp::Tan, &x), &[-0.9315965, 0.0, 0.5463025, 3.0095696], 1e-6);
    assert_close(&u(UnaryOp::Atan, &x), &[-0.6435011, 0.0, 0.4636476, 0.8960554], 1e-7);
    assert_close(&u(UnaryOp::Cosh, &x), &[1.2946833, 1.0, 1.127626, 1.8884239], 1e-6);
    assert_close(&u(UnaryOp::Sinh, &x), &[-0.8223167, 0.0, 0.5210953, 1.601919], 1e-6);
    assert_close(&u(UnaryOp::Asinh, &x), &[-std::f32::consts::LN_2, 0.0, 0.4812118, 1.047593], 1e-7);
    let unit = f(&[3], &[-0.5, 0.0, 0.75]);
    assert_close(&u(UnaryOp::Asin, &unit), &[-std::f32::consts::FRAC_PI_6, 0.0, 0.8480621], 1e-7);
    assert_close(&u(UnaryOp::Acos, &unit), &[2.0943951, 1.5707964, 0.7227342], 1e-7);
    assert_close(&u(UnaryOp::Atanh, &unit), &[-0.54930615, 0.0, 0.9729551], 1e-7);
    assert_close(&u(UnaryOp::Acosh, &f(&[3], &[1.0, 1.5, 10.0])), &[0.0, 0.9624237, 2.9932227], 1e-7);
    // Outside the domain: NaN; at the poles of atanh: ±inf.
    assert!(u(UnaryOp::Asin, &f(&[1], &[1.5]))[0].is_nan());
    assert!(u(UnaryOp::Acosh, &f(&[1], &[0.5]))[0].is_nan());
    assert_eq!(u(UnaryOp::Atanh, &f(&[2], &[-1.0, 1.0])), vec![f32::NEG_INFINITY, f32::INFINITY]);
    // Round: half to even, exact.
    let r = f(&[9], &[0.5, 1.5, 2.5, -0.5, -1.5, 2.4999998, -2.6, 8388609.0, f32::INFINITY]);
    assert_eq!(u(UnaryOp::Round, &r), vec![0.0, 2.0, 2.0, -0.0, -2.0, 2.0, -3.0, 8388609.0, f32::INFINITY]);
    // Softplus without overflow (log(1 + exp(100)) is 100, not inf) and Mish.
    let s = f(&[5], &[-100.0, -1.0, 0.0, 1.0, 100.0]);
    assert_close(&u(UnaryOp::Softplus, &s), &[3.72e-44, 0.31326166, std::f32::consts::LN_2, 1.3132616, 100.0], 1e-7);
    assert_close(&u(UnaryOp::Mish, &s), &[-3.72e-42, -0.30340144, 0.0, 0.86509836, 100.0], 1e-7);
    for op in [UnaryOp::Cos, UnaryOp::Round, UnaryOp::Softplus, UnaryOp::Mish] {
        assert!(u(op, &f(&[1], &[f32::NAN]))[0].is_nan(), "{op:?}");
    }
}

#[test]
fn gelu_erf_and_tanh() {
    let x = f(&[3], &[-1.0, 0.0, 1.0]);
    // 0.5 x (1 + erf(x / sqrt 2)) at ±1: Φ(1) = 0.8413447460685429.
    let e = fv(&eval1(Op::Gelu { approximate: GeluApprox::Erf }, &[&x]));
    assert_close(&e, &[-0.15865525, 0.0, 0.8413447], 1e-7);
    let t = fv(&eval1(Op::Gelu { approximate: GeluApprox::Tanh }, &[&x]));
    assert_close(&t, &[-0.15880801, 0.0, 0.841192], 1e-6);
}

#[test]
fn nan_propagates_like_onnx_runtime() {
    let n = f(&[2], &[f32::NAN, 1.0]);
    let one = f(&[2], &[1.0, f32::NAN]);
    for op in [BinaryOp::Max, BinaryOp::Min] {
        let out = fv(&eval1(Op::Binary(op), &[&n, &one]));
        assert!(out[0].is_nan() && out[1].is_nan(), "{op:?}: {out:?}");
    }
    assert!(fv(&eval1(Op::Unary(UnaryOp::Relu), &[&n]))[0].is_nan());
    assert!(fv(&eval1(Op::Clip { min: 0.0, max: 6.0 }, &[&n]))[0].is_nan());
    assert!(fv(&eval1(Op::HardSigmoid { alpha: 0.2, beta: 0.5 }, &[&n]))[0].is_nan());
    assert!(fv(&eval1(Op::Softmax { axis: 0 }, &[&n]))[1].is_nan());
}

#[test]
fn float_binary_broadcast_mod_pow() {
    let a = f(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let b = f(&[3], &[10., 20., 30.]);
    assert_eq!(fv(&eval1(Op::Binary(BinaryOp::Add), &[&a, &b])), vec![11., 22., 33., 14., 25., 36.]);
    let col = f(&[2, 1], &[2., 4.]);
    assert_eq!(fv(&eval1(Op::Binary(BinaryOp::Div), &[&a, &col])), vec![0.5, 1., 1.5, 1., 1.25, 1.5]);
    // Scalar on the left.
    assert_eq!(fv(&eval1(Op::Binary(BinaryOp::Sub), &[&f(&[], &[1.]), &b])), vec![-9., -19., -29.]);
    let m = |op, x: f32, y: f32| fv(&eval1(Op::Binary(op), &[&f(&[1], &[x]), &f(&[1], &[y])]))[0];
    assert_eq!(m(BinaryOp::Mod, -7.5, 2.0), 0.5);
    assert_eq!(m(BinaryOp::FMod, -7.5, 2.0), -1.5);
    assert_eq!(m(BinaryOp::Pow, 2.0, 0.5), std::f32::consts::SQRT_2);
    assert_eq!(m(BinaryOp::Pow, -8.0, 3.0), -512.0);
}

#[test]
fn f16_and_bf16_compute_in_f32_and_round_per_op() {
    let h = |v: &[f32]| Tensor::from_f64_as(DType::F16, vec![v.len()], &v.iter().map(|&x| x as f64).collect::<Vec<_>>());
    // 1 + 2^-11 is not an f16: the sum rounds (to even) back to 1.
    let out = eval1(Op::Binary(BinaryOp::Add), &[&h(&[1.0]), &h(&[2f32.powi(-11)])]);
    assert_eq!(out.dtype(), DType::F16);
    assert_eq!(fv(&out), vec![1.0]);
    // f16 overflow goes to inf.
    assert_eq!(fv(&eval1(Op::Binary(BinaryOp::Mul), &[&h(&[300.0]), &h(&[300.0])])), vec![f32::INFINITY]);
    // MatMul in f16: products summed in f32, rounded once: 2049 = 2048 + 1 is a tie, goes to 2048.
    let a = h(&[2048.0, 1.0]).reshaped(vec![1, 2]);
    let b = h(&[1.0, 1.0]).reshaped(vec![2, 1]);
    assert_eq!(fv(&eval1(Op::MatMul, &[&a, &b])), vec![2048.0]);
    let s = Tensor::from_f64_as(DType::BF16, vec![2], &[0.0, 0.0]);
    let sm = eval1(Op::Softmax { axis: 0 }, &[&s]);
    assert_eq!((sm.dtype(), fv(&sm)), (DType::BF16, vec![0.5, 0.5]));
    assert_eq!(f16::from_f32(fv(&out)[0]), f16::ONE);
}

// ---- MatMul ----

#[test]
fn matmul_2d_batched_and_rank1() {
    let a = f(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let b = f(&[3, 2], &[7., 8., 9., 10., 11., 12.]);
    assert_eq!(fv(&eval1(Op::MatMul, &[&a, &b])), vec![58., 64., 139., 154.]);
    // Rank-1 on either side.
    let v = f(&[3], &[1., 0., -1.]);
    let av = eval1(Op::MatMul, &[&a, &v]);
    assert_eq!((av.shape(), fv(&av)), (&[2][..], vec![-2., -2.]));
    let vb = eval1(Op::MatMul, &[&v, &b]);
    assert_eq!((vb.shape(), fv(&vb)), (&[2][..], vec![-4., -4.]));
    let vv = eval1(Op::MatMul, &[&v, &v]);
    assert_eq!((vv.shape(), fv(&vv)), (&[][..], vec![2.]));
    // Batched A [2,1,2,2] x broadcast B [3,2,2] -> [2,3,2,2].
    let a4: Vec<f32> = (0..8).map(|x| x as f32).collect();
    let b3: Vec<f32> = (0..12).map(|x| (x % 5) as f32 - 2.0).collect();
    let out = eval1(Op::MatMul, &[&f(&[2, 1, 2, 2], &a4), &f(&[3, 2, 2], &b3)]);
    assert_eq!(out.shape(), &[2, 3, 2, 2]);
    let got = fv(&out);
    for bi in 0..2 {
        for bj in 0..3 {
            for r in 0..2 {
                for c in 0..2 {
                    let want: f32 = (0..2).map(|k| a4[bi * 4 + r * 2 + k] * b3[bj * 4 + k * 2 + c]).sum();
                    assert_eq!(got[((bi * 3 + bj) * 2 + r) * 2 + c], want);
                }
            }
        }
    }
    // Batched A against a shared 2-D weight (one tall GEMM) equals the per-batch products.
    let out = eval1(Op::MatMul, &[&f(&[2, 2, 3], &[1., 2., 3., 4., 5., 6., 0., 1., 0., 1., 0., 0.]), &b]);
    assert_eq!(fv(&out), vec![58., 64., 139., 154., 9., 10., 7., 8.]);
    // Integer MatMul.
    let ia = i(&[1, 2], &[2, 3]);
    let ib = i(&[2, 1], &[4, 5]);
    assert_eq!(eval1(Op::MatMul, &[&ia, &ib]).to_i64_vec(), vec![23]);
}

// ---- Conv, ConvTranspose, pools ----

/// Direct-loop 2-D convolution (NCHW), the definition the im2col + GEMM kernel must agree with.
fn naive_conv2d(x: &[f32], xs: [usize; 4], w: &[f32], ws: [usize; 4], a: &ConvAttrs, out: [usize; 4]) -> Vec<f32> {
    let [n, c, h, wd] = xs;
    let [m, cg, kh, kw] = ws;
    let mg = m / a.group;
    let mut y = vec![0f32; out.iter().product()];
    for b in 0..n {
        for o in 0..m {
            let g = o / mg;
            for oy in 0..out[2] {
                for ox in 0..out[3] {
                    let mut s = 0f64;
                    for ci in 0..cg {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (oy * a.strides[0] + ky * a.dilations[0]) as i64 - a.pads[0] as i64;
                                let ix = (ox * a.strides[1] + kx * a.dilations[1]) as i64 - a.pads[1] as i64;
                                if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < wd {
                                    let xv = x[((b * c + g * cg + ci) * h + iy as usize) * wd + ix as usize];
                                    s += (xv * w[((o * cg + ci) * kh + ky) * kw + kx]) as f64;
                                }
                            }
                        }
                    }
                    y[((b * m + o) * out[2] + oy) * out[3] + ox] = s as f32;
                }
            }
        }
    }
    y
}

fn ramp(n: usize, k: usize) -> Vec<f32> {
    (0..n).map(|v| ((v * 7 + k) % 11) as f32 / 4.0 - 1.0).collect()
}

#[test]
fn conv_hand_computed() {
    // 3x3 input, 2x2 kernel of ones, pad 1 on the top/left only, stride 2.
    let x = f(&[1, 1, 3, 3], &[1., 2., 3., 4., 5., 6., 7., 8., 9.]);
    let w = f(&[1, 1, 2, 2], &[1., 1., 1., 1.]);
    let a = ConvAttrs { strides: vec![2, 2], pads: vec![1, 1, 0, 0], dilations: vec![1, 1], group: 1 };
    let y = eval1(Op::Conv(a), &[&x, &w, &f(&[1], &[0.5])]);
    assert_eq!(y.shape(), &[1, 1, 2, 2]);
    assert_eq!(fv(&y), vec![1.5, 5.5, 11.5, 28.5]);
}

#[test]
fn conv_matches_direct_loops_across_groups_strides_dilations() {
    let cases = [
        ([1, 4, 7, 6], [6, 2, 3, 3], ConvAttrs { strides: vec![1, 2], pads: vec![1, 0, 2, 1], dilations: vec![1, 1], group: 2 }),
        ([2, 3, 8, 8], [4, 3, 3, 2], ConvAttrs { strides: vec![2, 1], pads: vec![1, 1, 1, 1], dilations: vec![2, 3], group: 1 }),
        ([1, 4, 5, 5], [4, 1, 3, 3], ConvAttrs { strides: vec![1, 1], pads: vec![1, 1, 1, 1], dilations: vec![1, 1], group: 4 }),
        ([2, 6, 4, 3], [3, 6, 1, 1], ConvAttrs { strides: vec![1, 1], pads: vec![0, 0, 0, 0], dilations: vec![1, 1], group: 1 }),
    ];
    for (k, (xs, ws, a)) in cases.into_iter().enumerate() {
        let xv = ramp(xs.iter().product(), k);
        let wv = ramp(ws.iter().product(), k + 3);
        let y = eval1(Op::Conv(a.clone()), &[&f(&xs, &xv), &f(&ws, &wv)]);
        let os: [usize; 4] = y.shape().try_into().unwrap();
        assert_close(&fv(&y), &naive_conv2d(&xv, xs, &wv, ws, &a, os), 1e-5);
    }
}

#[test]
fn conv_1d_and_3d() {
    // 1-D: [1,1,5] * [1,1,3] of [1,0,-1], pad 1.
    let a = ConvAttrs { strides: vec![1], pads: vec![1, 1], dilations: vec![1], group: 1 };
    let y = eval1(Op::Conv(a), &[&f(&[1, 1, 5], &[1., 2., 4., 8., 16.]), &f(&[1, 1, 3], &[1., 0., -1.])]);
    assert_eq!(fv(&y), vec![-2., -3., -6., -12., 8.]);
    // 3-D: a 2x2x2 box sum over a 2x2x2 input of ones with no padding is 8.
    let a = ConvAttrs { strides: vec![1; 3], pads: vec![0; 6], dilations: vec![1; 3], group: 1 };
    let y = eval1(Op::Conv(a), &[&f(&[1, 1, 2, 2, 2], &[1.; 8]), &f(&[1, 1, 2, 2, 2], &[1.; 8])]);
    assert_eq!((y.shape(), fv(&y)), (&[1, 1, 1, 1, 1][..], vec![8.]));
}

#[test]
fn conv_transpose_hand_computed_and_against_scatter_loops() {
    // 1-D, stride 2, kernel [1,1,1]: x0 lands on 0..3, x1 on 2..5.
    let a = ConvTransposeAttrs { strides: vec![2], pads: vec![0, 0], dilations: vec![1], group: 1, output_padding: vec![0] };
    let y = eval1(Op::ConvTranspose(a), &[&f(&[1, 1, 2], &[1., 2.]), &f(&[1, 1, 3], &[1., 1., 1.])]);
    assert_eq!(fv(&y), vec![1., 1., 3., 2., 2.]);
    // 2-D with groups, pads, dilation, output_padding and bias, against a direct scatter.
    let a = ConvTransposeAttrs { strides: vec![2, 1], pads: vec![1, 0, 0, 1], dilations: vec![1, 2], group: 2, output_padding: vec![1, 0] };
    let (xs, ws) = ([1usize, 4, 3, 2], [4usize, 3, 2, 3]);
    let (xv, wv) = (ramp(24, 1), ramp(72, 2));
    let bias = [0.5f32, -0.5, 1.0, 0.0, 2.0, -1.0];
    let y = eval1(Op::ConvTranspose(a.clone()), &[&f(&xs, &xv), &f(&ws, &wv), &f(&[6], &bias)]);
    let (oh, ow) = (y.shape()[2], y.shape()[3]);
    assert_eq!(y.shape(), &[1, 6, 6, 5]);
    let mut want = vec![0f64; 6 * oh * ow];
    for ci in 0..4 {
        let g = ci / 2;
        for co in 0..3 {
            let oc = g * 3 + co;
            for iy in 0..3 {
                for ix in 0..2 {
                    for ky in 0..2 {
                        for kx in 0..3 {
                            let y_ = (iy * 2 + ky) as i64 - 1;
                            let x_ = (ix + kx * 2) as i64;
                            if y_ >= 0 && (y_ as usize) < oh && (x_ as usize) < ow {
                                want[(oc * oh + y_ as usize) * ow + x_ as usize] +=
                                    (xv[(ci * 3 + iy) * 2 + ix] * wv[((ci * 3 + co) * 2 + ky) * 3 + kx]) as f64;
                            }
                        }
                    }
                }
            }
        }
    }
    for (k, v) in want.iter_mut().enumerate() {
        *v += bias[k / (oh * ow)] as f64;
    }
    assert_close(&fv(&y), &want.iter().map(|&v| v as f32).collect::<Vec<_>>(), 1e-5);
}

#[test]
fn max_pool_ceil_mode_and_padding() {
    let x: Vec<f32> = (0..36).map(|v| v as f32).collect();
    let p = PoolAttrs { kernel: vec![3, 3], strides: vec![2, 2], pads: vec![0; 4], dilations: vec![1, 1], ceil_mode: true };
    let y = eval1(Op::MaxPool(p), &[&f(&[1, 1, 6, 6], &x)]);
    // The third window in each direction covers rows/cols 4..6 (only 4, 5 exist).
    assert_eq!((y.shape(), fv(&y)), (&[1, 1, 3, 3][..], vec![14., 16., 17., 26., 28., 29., 32., 34., 35.]));
    let p = PoolAttrs { kernel: vec![2], strides: vec![1], pads: vec![1, 1], dilations: vec![2], ceil_mode: false };
    let y = eval1(Op::MaxPool(p), &[&f(&[1, 1, 4], &[3., 1., 4., 1.])]);
    // windows (taps at o-1, o+1): [pad,1] [3,4] [1,1] [4,pad]
    assert_eq!(fv(&y), vec![1., 4., 1., 4.]);
}

#[test]
fn average_pool_count_include_pad() {
    let x = f(&[1, 1, 3], &[1., 2., 3.]);
    let p = PoolAttrs { kernel: vec![2], strides: vec![2], pads: vec![1, 0], dilations: vec![1], ceil_mode: false };
    let inc = eval1(Op::AveragePool { pool: p.clone(), count_include_pad: true }, &[&x]);
    let exc = eval1(Op::AveragePool { pool: p, count_include_pad: false }, &[&x]);
    // windows: [pad, 1], [2, 3]
    assert_eq!(fv(&inc), vec![0.5, 2.5]);
    assert_eq!(fv(&exc), vec![1.0, 2.5]);
    // ceil_mode window running past the end padding is not charged for it: [pad,1] [2,3] [4,-]
    let p = PoolAttrs { kernel: vec![2], strides: vec![2], pads: vec![1, 0], dilations: vec![1], ceil_mode: true };
    let y = eval1(Op::AveragePool { pool: p, count_include_pad: true }, &[&f(&[1, 1, 4], &[1., 2., 3., 4.])]);
    assert_eq!(fv(&y), vec![0.5, 2.5, 4.0]);
    let g = eval1(Op::GlobalAveragePool, &[&f(&[1, 2, 2, 1], &[1., 2., 3., 5.])]);
    assert_eq!((g.shape(), fv(&g)), (&[1, 2, 1, 1][..], vec![1.5, 4.0]));
}

// ---- normalizations ----

#[test]
fn softmax_and_log_softmax_on_any_axis() {
    let x = f(&[2, 2], &[0., 1., 2., 3.]);
    let s = fv(&eval1(Op::Softmax { axis: 0 }, &[&x]));
    let e2 = 1.0 / (1.0 + (-2f32).exp());
    assert_close(&s, &[1.0 - e2, 1.0 - e2, e2, e2], 1e-6);
    let s = fv(&eval1(Op::Softmax { axis: 1 }, &[&x]));
    let e1 = 1.0 / (1.0 + (-1f32).exp());
    assert_close(&s, &[1.0 - e1, e1, 1.0 - e1, e1], 1e-6);
    let l = fv(&eval1(Op::LogSoftmax { axis: 1 }, &[&x]));
    assert_close(&l, &[(1.0 - e1).ln(), e1.ln(), (1.0 - e1).ln(), e1.ln()], 1e-6);
    // Large values do not overflow.
    let big = fv(&eval1(Op::Softmax { axis: 0 }, &[&f(&[2], &[1000., 1000.])]));
    assert_eq!(big, vec![0.5, 0.5]);
}

#[test]
fn layer_norm_and_batch_norm() {
    let x = f(&[2, 2], &[1., 3., -1., 1.]);
    let y = fv(&eval1(Op::LayerNorm { axis: 1, epsilon: 0.0 }, &[&x, &f(&[2], &[1., 2.]), &f(&[2], &[0., 10.])]));
    assert_close(&y, &[-1., 12., -1., 12.], 1e-6);
    // Scale broadcast from a smaller shape; no bias; normalize over two axes.
    let x3 = f(&[1, 2, 2], &[1., 2., 3., 4.]);
    let y = fv(&eval1(Op::LayerNorm { axis: 1, epsilon: 1e-5 }, &[&x3, &f(&[1], &[2.])]));
    let sd = (1.25f64 + 1e-5).sqrt();
    assert_close(&y, &[-1.5, -0.5, 0.5, 1.5].map(|v| (2.0 * v / sd) as f32), 1e-6);
    let bn = eval1(
        Op::BatchNorm { epsilon: 0.0 },
        &[&f(&[1, 2, 1, 2], &[1., 2., 3., 4.]), &f(&[2], &[1., 2.]), &f(&[2], &[0., 1.]), &f(&[2], &[1., 3.]), &f(&[2], &[4., 1.])],
    );
    assert_eq!(fv(&bn), vec![0., 0.5, 1., 3.]);
}

// ---- graphs ----

#[test]
fn run_graph_checks_inputs_and_frees_nothing_it_returns() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", TensorType::f32([2]));
    let w = g.add_const("w", f(&[2], &[10., 20.]));
    let a = g.add("a", Op::Binary(BinaryOp::Add), &[x, w]).unwrap();
    let r = g.add("r", Op::Unary(UnaryOp::Relu), &[a]).unwrap();
    let n = g.add("n", Op::Unary(UnaryOp::Neg), &[a]).unwrap();
    g.outputs.extend([r, n, x, w, a]);
    let out = run_graph(&g, &[f(&[2], &[-15., 1.])]).unwrap();
    let got: Vec<Vec<f32>> = out.iter().map(fv).collect();
    assert_eq!(got, vec![vec![0., 21.], vec![5., -21.], vec![-15., 1.], vec![10., 20.], vec![-5., 21.]]);
    let e = run_graph(&g, &[f(&[3], &[0.; 3])]).unwrap_err().to_string();
    assert!(e.contains("input 0 ('x')") && e.contains("f32[2]") && e.contains("f32[3]"), "{e}");
    let e = run_graph(&g, &[]).unwrap_err().to_string();
    assert!(e.contains("takes 1 inputs (x), got 0"), "{e}");
}

#[test]
fn run_graph_errors_name_the_node() {
    let mut g = Graph::new("t");
    let x = g.add_input("ids", TensorType::new(DType::I64, [2]));
    let table = g.add_const("table", f(&[3, 1], &[1., 2., 3.]));
    let y = g.add("embed", Op::Gather { axis: 0 }, &[table, x]).unwrap();
    g.outputs.push(y);
    let out = run_graph(&g, &[i(&[2], &[2, 0])]).unwrap();
    assert_eq!(fv(&out[0]), vec![3., 1.]);
    let e = run_graph(&g, &[i(&[2], &[5, 0])]).unwrap_err().to_string();
    assert!(e.starts_with("node 'embed' (Gather)") && e.contains("index 5"), "{e}");
}

#[test]
fn random_inputs_are_seeded_nonzero_and_respect_gather_bounds() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", TensorType::f32([1000]));
    let ids = g.add_input("ids", TensorType::new(DType::I64, [1, 500]));
    let tt = g.add_input("tt", TensorType::new(DType::I32, [1, 500]));
    let m = g.add_input("m", TensorType::new(DType::Bool, [64]));
    let h = g.add_input("h", TensorType::new(DType::F16, [64]));
    let table = g.add_const("table", f(&[2, 1], &[1., 2.]));
    let big = g.add_const("big", f(&[1000, 1], &[0.; 1000]));
    let flat = g.add("flat", Op::Reshape { shape: vec![500] }, &[tt]).unwrap();
    let cast = g.add("cast", Op::Cast { to: DType::I64 }, &[flat]).unwrap();
    let e1 = g.add("e1", Op::Gather { axis: 0 }, &[table, cast]).unwrap();
    let e2 = g.add("e2", Op::Gather { axis: 0 }, &[big, ids]).unwrap();
    g.outputs.extend([x, e1, e2, m, h]);
    let a = random_inputs(&g, 7);
    assert_eq!(a, random_inputs(&g, 7));
    assert_ne!(a[0], random_inputs(&g, 8)[0]);
    let xf = fv(&a[0]);
    assert!(xf.iter().all(|&v| (-1.0..1.0).contains(&v) && v != 0.0));
    assert!(xf.iter().any(|&v| v < -0.5) && xf.iter().any(|&v| v > 0.5));
    let idv = a[1].to_i64_vec();
    assert!(idv.iter().all(|&v| (0..INT_INPUT_BOUND).contains(&v)) && idv.iter().any(|&v| v > 50));
    let ttv = a[2].to_i64_vec();
    assert!(ttv.iter().all(|&v| v == 0 || v == 1) && ttv.contains(&1) && ttv.contains(&0));
    let mv = a[3].to_i64_vec();
    assert!(mv.contains(&0) && mv.contains(&1));
    assert!(fv(&a[4]).iter().all(|&v| v != 0.0));
    // Each input has its own stream: changing another input's type leaves it alone.
    let mut g2 = g.clone();
    g2.values[x.index()].ty = TensorType::f32([10]);
    assert_eq!(random_inputs(&g2, 7)[1], a[1]);
    // The graph runs on them.
    run_graph(&g, &a).unwrap();
}

/// An integer input read as a float or a truth value is a 0/1 mask, and gets padding masks: HF's
/// `(1 - mask) * lowest` and OPT's position ids (a CumSum of the mask) mean nothing for values up to 99.
/// An input that only indexes a Gather keeps the gathered axis's bound.
#[test]
fn integer_inputs_read_as_floats_or_bools_are_masks() {
    let mut g = Graph::new("t");
    let mask = g.add_input("attention_mask", TensorType::new(DType::I64, [2, 300]));
    let flag = g.add_input("flag", TensorType::new(DType::I32, [300]));
    let ids = g.add_input("ids", TensorType::new(DType::I64, [300]));
    let t = g.add("t", Op::Transpose { perm: vec![1, 0] }, &[mask]).unwrap();
    let as_f = g.add("as_f", Op::Cast { to: DType::F32 }, &[t]).unwrap();
    let as_b = g.add("as_b", Op::Cast { to: DType::Bool }, &[flag]).unwrap();
    let table = g.add_const("table", f(&[1000, 1], &[0.; 1000]));
    let e = g.add("e", Op::Gather { axis: 0 }, &[table, ids]).unwrap();
    g.outputs.extend([as_f, as_b, e]);
    assert_eq!(crate::interp::int_input_bounds(&g), vec![2, 2, INT_INPUT_BOUND]);
    // Drawn as padding masks: each row 1s (at least one), then 0s.
    let a = random_inputs(&g, 3);
    for m in &a[..2] {
        let v = m.to_i64_vec();
        assert!(v.contains(&0), "{v:?}");
        for row in v.chunks(300) {
            let ones = row.iter().take_while(|&&x| x == 1).count();
            assert!(ones >= 1 && row[ones..].iter().all(|&x| x == 0), "{row:?}");
        }
    }
    assert!(a[2].to_i64_vec().iter().any(|&x| x > 50));
}

// ---- properties: the fast kernels against direct loops on random geometry ----

mod props {
    use super::*;
    use proptest::prelude::*;

    fn conv_case() -> impl Strategy<Value = ([usize; 4], [usize; 4], ConvAttrs)> {
        (1usize..3, 1usize..4, 1usize..3, 1usize..3, 1usize..4, 1usize..4, 1usize..3, 1usize..3, 0usize..3, 0usize..3, 1usize..3, 1usize..3)
            .prop_flat_map(|(n, g, cg, mg, kh, kw, sh, sw, ph, pw, dh, dw)| {
                let ((eh, ew), c, m) = ((dh * (kh - 1) + 1, dw * (kw - 1) + 1), cg * g, mg * g);
                // Input at least as large as the dilated kernel minus the leading padding, so every case is valid.
                (eh.saturating_sub(ph).max(1)..eh + 5, ew.saturating_sub(pw).max(1)..ew + 5, 0..=ph, 0..=pw).prop_map(
                    move |(h, w, ph2, pw2)| {
                        let a = ConvAttrs { strides: vec![sh, sw], pads: vec![ph, pw, ph2, pw2], dilations: vec![dh, dw], group: g };
                        ([n, c, h, w], [m, cg, kh, kw], a)
                    },
                )
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn conv_equals_direct_loops((xs, ws, a) in conv_case(), seed in 0usize..100) {
            let xv = ramp(xs.iter().product(), seed);
            let wv = ramp(ws.iter().product(), seed + 1);
            let (x, w) = (f(&xs, &xv), f(&ws, &wv));
            let y = eval1(Op::Conv(a.clone()), &[&x, &w]);
            let os: [usize; 4] = y.shape().try_into().unwrap();
            let want = naive_conv2d(&xv, xs, &wv, ws, &a, os);
            for (k, (g, w)) in fv(&y).iter().zip(&want).enumerate() {
                prop_assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "element {}: {} vs {}", k, g, w);
            }
        }

        #[test]
        fn matmul_equals_direct_loops(
            batch_a in proptest::collection::vec(1usize..3, 0..3),
            bcast in proptest::collection::vec(any::<bool>(), 3),
            m in 1usize..5, k in 0usize..5, n in 1usize..5, seed in 0usize..100,
        ) {
            // B's batch dims: A's, with some set to 1 (broadcast) and possibly fewer of them.
            let batch_b: Vec<usize> = batch_a.iter().zip(&bcast).map(|(&d, &b)| if b { 1 } else { d }).skip(bcast[2] as usize).collect();
            let sa: Vec<usize> = batch_a.iter().copied().chain([m, k]).collect();
            let sb: Vec<usize> = batch_b.iter().copied().chain([k, n]).collect();
            let (av, bv) = (ramp(sa.iter().product(), seed), ramp(sb.iter().product(), seed + 5));
            let y = eval1(Op::MatMul, &[&f(&sa, &av), &f(&sb, &bv)]);
            let batch = broadcast_shapes(&batch_a, &batch_b).unwrap();
            prop_assert_eq!(&y.shape()[..batch.len()], &batch[..]);
            let got = fv(&y);
            let mut at = 0;
            crate::interp::layout::for_each_index(&batch, |bi| {
                let off = |shape: &[usize], mat: usize| {
                    let lead = batch.len() - shape.len();
                    let mut o = 0;
                    for (d, &s) in shape.iter().enumerate() {
                        o = o * s + if s == 1 { 0 } else { bi[lead + d] };
                    }
                    o * mat
                };
                let (oa, ob) = (off(&batch_a, m * k), off(&batch_b, k * n));
                for r in 0..m {
                    for c in 0..n {
                        let want: f64 = (0..k).map(|p| (av[oa + r * k + p] * bv[ob + p * n + c]) as f64).sum();
                        assert!((got[at] as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()), "{} vs {}", got[at], want);
                        at += 1;
                    }
                }
            });
        }

        /// Folding never changes what a graph computes.
        #[test]
        fn folding_preserves_results(vals in proptest::collection::vec(-4i64..5, 6), perm_first in any::<bool>()) {
            let mut g = Graph::new("p");
            let x = g.add_input("x", TensorType::new(DType::I64, [2, 3]));
            let c = g.add_const("c", i(&[2, 3], &vals));
            let t = g.add("t", Op::Transpose { perm: vec![1, 0] }, &[c]).unwrap();
            let s = g.add("s", Op::Reduce { kind: ReduceKind::Sum, axes: vec![0], keepdims: false }, &[t]).unwrap();
            let e = g.add("e", Op::Expand { shape: vec![3, 2] }, &[s]).unwrap();
            let tt = g.add("tt", Op::Transpose { perm: vec![1, 0] }, &[e]).unwrap();
            let base = if perm_first { tt } else { c };
            let y = g.add("y", Op::Binary(BinaryOp::Mul), &[x, base]).unwrap();
            let z = g.add("z", Op::Binary(BinaryOp::Add), &[y, tt]).unwrap();
            g.outputs.extend([z, s]);
            let input = i(&[2, 3], &[1, -2, 3, 0, 5, -6]);
            let before = run_graph(&g, std::slice::from_ref(&input)).unwrap();
            crate::passes::fold::fold_constants(&mut g).unwrap();
            verify(&g).unwrap();
            prop_assert_eq!(before, run_graph(&g, &[input]).unwrap());
        }
    }
}

/// Attention by hand: one query against two keys, with the K layouts, the masks, NaN rows and Sk = 0.
#[test]
fn attention_by_hand() {
    let attrs = |k_transposed, mask, keep_fill| Op::Attention(AttentionAttrs { scale: 2.0, k_transposed, mask, keep_fill, nan_to_zero: false });
    let q = f(&[1, 2], &[0.5, 0.0]);
    let k = f(&[2, 2], &[1.0, 0.0, 0.0, 1.0]);
    let v = f(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    // scores = 2 * [0.5, 0] = [1, 0]; p = [e, 1] / (e + 1).
    let e = std::f32::consts::E;
    let want = [(e * 1.0 + 3.0) / (e + 1.0), (e * 2.0 + 4.0) / (e + 1.0)];
    assert_close(&fv(&eval1(attrs(false, false, None), &[&q, &k, &v])), &want, 1e-6);
    // The same K given transposed (symmetric here, so a non-symmetric one: keys [1, 0] and [1, 1]).
    let k2 = f(&[2, 2], &[1.0, 0.0, 1.0, 1.0]);
    let k2t = f(&[2, 2], &[1.0, 1.0, 0.0, 1.0]);
    let a = fv(&eval1(attrs(false, false, None), &[&q, &k2, &v]));
    assert_eq!(a, fv(&eval1(attrs(true, false, None), &[&q, &k2t, &v])));
    // Keys' scores are equal ([1, 1]): the plain average of v's rows.
    assert_close(&a, &[2.0, 3.0], 1e-6);
    // An additive mask of -1 on the first key: scores [0, 0].
    let m = f(&[1, 2], &[-1.0, 0.0]);
    assert_close(&fv(&eval1(attrs(false, true, None), &[&q, &k, &v, &m])), &[2.0, 3.0], 1e-6);
    // Keep only the second key (fill -inf, then the mask): v's second row.
    let keep = Tensor::from_bool([2], &[false, true]);
    assert_close(&fv(&eval1(attrs(false, true, Some(f32::NEG_INFINITY)), &[&q, &k, &v, &m, &keep])), &[3.0, 4.0], 0.0);
    // Nothing kept: a row of -inf scores is 0/0 = NaN, as the unfused Softmax gives.
    let none = Tensor::from_bool([2], &[false, false]);
    assert!(fv(&eval1(attrs(false, false, Some(f32::NEG_INFINITY)), &[&q, &k, &v, &none])).iter().all(|x| x.is_nan()));
    // No keys: an empty sum.
    let y = eval1(attrs(false, false, None), &[&q, &f(&[0, 2], &[]), &f(&[0, 2], &[])]);
    assert_eq!(y.shape(), &[1, 2]);
    assert_eq!(fv(&y), vec![0.0, 0.0]);
}

#[test]
fn attention_rejects_bad_operands_by_name() {
    let a = |mask| Op::Attention(AttentionAttrs { scale: 1.0, k_transposed: false, mask, keep_fill: None, nan_to_zero: false });
    let q = f(&[2, 3, 4], &[0.0; 24]);
    let k = f(&[2, 5, 4], &[0.0; 40]);
    let v = f(&[2, 5, 6], &[0.0; 60]);
    let err = |op: Op, ins: &[&Tensor]| eval_op(&op, ins).unwrap_err().to_string();
    assert!(err(a(true), &[&q, &k, &v]).contains("Attention (mask: true, keep: false) takes 4 inputs, got 3"));
    let bad_k = f(&[2, 5, 3], &[0.0; 30]);
    assert!(err(a(false), &[&q, &bad_k, &v]).contains("differ in the head dim"));
    let bad_v = f(&[2, 4, 6], &[0.0; 48]);
    assert!(err(a(false), &[&q, &k, &bad_v]).contains("has 5 keys, v"));
    let wide = f(&[3, 1, 3, 5], &[0.0; 45]);
    assert!(err(a(true), &[&q, &k, &v, &wide]).contains("must broadcast to the scores' shape [2, 3, 5]"));
    assert_eq!(eval1(a(false), &[&q, &k, &v]).shape(), &[2, 3, 6]);
}

// ---- CumSum, GatherND, ScatterND ----

#[test]
fn cumsum_every_flag_combination_on_both_axes() {
    let x = f(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let cs = |axis, exclusive, reverse| fv(&eval1(Op::CumSum { axis, exclusive, reverse }, &[&x]));
    assert_eq!(cs(1, false, false), vec![1., 3., 6., 4., 9., 15.]);
    assert_eq!(cs(1, true, false), vec![0., 1., 3., 0., 4., 9.]);
    assert_eq!(cs(1, false, true), vec![6., 5., 3., 15., 11., 6.]);
    assert_eq!(cs(1, true, true), vec![5., 3., 0., 11., 6., 0.]);
    assert_eq!(cs(0, false, false), vec![1., 2., 3., 5., 7., 9.]);
    assert_eq!(cs(0, true, true), vec![4., 5., 6., 0., 0., 0.]);
    // Integers wrap; i32 keeps its dtype.
    let n = Tensor::from_i32(vec![3], &[i32::MAX, 1, -5]);
    let out = eval1(Op::CumSum { axis: 0, exclusive: false, reverse: false }, &[&n]);
    assert_eq!((out.dtype(), out.to_i64_vec()), (DType::I32, vec![i32::MAX as i64, i32::MIN as i64, i32::MAX as i64 - 4]));
    // Float sums accumulate in f64: 1e8 + 1 - 1e8 is exactly 1 (f32 running sums would give 0).
    let big = f(&[3], &[1e8, 1., -1e8]);
    assert_eq!(fv(&eval1(Op::CumSum { axis: 0, exclusive: false, reverse: false }, &[&big])), vec![1e8, 1e8, 1.]);
    assert!(eval_op(&Op::CumSum { axis: 2, exclusive: false, reverse: false }, &[&x]).is_err());
    let b = Tensor::from_bool(vec![2], &[true, false]);
    assert!(eval_op(&Op::CumSum { axis: 0, exclusive: false, reverse: false }, &[&b]).is_err());
}

#[test]
fn gather_nd_tuples_slices_batch_dims_and_range_error() {
    let data = i(&[2, 2, 2], &[0, 1, 2, 3, 4, 5, 6, 7]);
    // Full tuples pick elements; a negative entry counts from the end.
    let out = eval1(Op::GatherND { batch_dims: 0 }, &[&data, &i(&[2, 3], &[0, 1, 1, -1, 0, 0])]);
    assert_eq!((out.shape(), out.to_i64_vec()), (&[2][..], vec![3, 4]));
    // Shorter tuples pick slices.
    let out = eval1(Op::GatherND { batch_dims: 0 }, &[&data, &i(&[2, 1, 1], &[1, 0])]);
    assert_eq!((out.shape(), out.to_i64_vec()), (&[2, 1, 2, 2][..], vec![4, 5, 6, 7, 0, 1, 2, 3]));
    // One batch dim: batch b reads data[b][tuple].
    let out = eval1(Op::GatherND { batch_dims: 1 }, &[&data, &i(&[2, 1], &[1, 0])]);
    assert_eq!((out.shape(), out.to_i64_vec()), (&[2, 2][..], vec![2, 3, 4, 5]));
    // Bool data moves bit for bit.
    let b = Tensor::from_bool(vec![2, 2], &[true, false, false, true]);
    let out = eval1(Op::GatherND { batch_dims: 0 }, &[&b, &i(&[2, 2], &[1, 1, 0, 1])]);
    assert_eq!(out.to_i64_vec(), vec![1, 0]);
    let e = eval_op(&Op::GatherND { batch_dims: 0 }, &[&data, &i(&[1, 2], &[0, 2])]).unwrap_err().to_string();
    assert!(e.contains("GatherND") && e.contains("index 2"), "{e}");
    // Tuples longer than the rank, and batch dims that disagree, are type errors.
    assert!(eval_op(&Op::GatherND { batch_dims: 0 }, &[&data, &i(&[1, 4], &[0, 0, 0, 0])]).is_err());
    assert!(eval_op(&Op::GatherND { batch_dims: 1 }, &[&data, &i(&[3, 1], &[0, 0, 0])]).is_err());
}

#[test]
fn scatter_nd_elements_slices_and_repeated_tuples() {
    let data = f(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let out = eval1(Op::ScatterND, &[&data, &i(&[2, 2], &[1, 2, 0, -3]), &f(&[2], &[60., 10.])]);
    assert_eq!(fv(&out), vec![10., 2., 3., 4., 5., 60.]);
    // A tuple of length 1 replaces a row.
    let out = eval1(Op::ScatterND, &[&data, &i(&[1, 1], &[1]), &f(&[1, 3], &[7., 8., 9.])]);
    assert_eq!(fv(&out), vec![1., 2., 3., 7., 8., 9.]);
    // A repeated tuple: the later update wins.
    let out = eval1(Op::ScatterND, &[&data, &i(&[2, 1], &[0, 0]), &f(&[2, 3], &[1., 1., 1., 2., 2., 2.])]);
    assert_eq!(fv(&out), vec![2., 2., 2., 4., 5., 6.]);
    let e = eval_op(&Op::ScatterND, &[&data, &i(&[1, 1], &[2]), &f(&[1, 3], &[0., 0., 0.])]).unwrap_err().to_string();
    assert!(e.contains("ScatterND") && e.contains("index 2"), "{e}");
    // Updates of the wrong shape are a type error.
    assert!(eval_op(&Op::ScatterND, &[&data, &i(&[1, 1], &[0]), &f(&[1, 2], &[0., 0.])]).is_err());
}

// ---- parallel kernels: the bits depend neither on the thread count nor on the split ----

mod parallel {
    use super::*;

    fn on<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap().install(f)
    }

    fn rnd(dtype: DType, shape: &[usize], seed: u64) -> Tensor {
        random_tensor(&TensorType::new(dtype, shape.to_vec()), seed, 0, INT_INPUT_BOUND)
    }

    /// `x[lo..hi]` along axis 0.
    fn rows(x: &Tensor, lo: usize, hi: usize) -> Tensor {
        eval1(Op::Slice { axes: vec![0], starts: vec![lo as i64], ends: vec![hi as i64], steps: vec![1] }, &[x])
    }

    fn concat(parts: &[Tensor]) -> Tensor {
        let refs: Vec<&Tensor> = parts.iter().collect();
        eval1(Op::Concat { axis: 0 }, &refs)
    }

    fn same(got: &Tensor, want: &Tensor, what: &str) {
        assert_eq!(got.ty, want.ty, "{what}");
        assert!(got.bytes() == want.bytes(), "{what}: bits differ");
    }

    /// `op` on `inputs` (large enough to run in parallel) gives the same bits on 1 thread and on 4, and the
    /// same as the concatenation of `op` on blocks of `step` entries of axis 0 of the inputs in `split`
    /// (each block small enough to run serially), the other inputs whole.
    fn check(op: Op, inputs: &[&Tensor], split: &[usize], step: usize) {
        let what = format!("{op:?}");
        let one = on(1, || eval1(op.clone(), inputs));
        let four = on(4, || eval1(op.clone(), inputs));
        same(&four, &one, &what);
        let n = inputs[split[0]].shape()[0];
        let parts: Vec<Tensor> = (0..n)
            .step_by(step)
            .map(|lo| {
                let sliced: Vec<Tensor> = inputs
                    .iter()
                    .enumerate()
                    .map(|(i, t)| if split.contains(&i) { rows(t, lo, (lo + step).min(n)) } else { (*t).clone() })
                    .collect();
                let refs: Vec<&Tensor> = sliced.iter().collect();
                eval1(op.clone(), &refs)
            })
            .collect();
        same(&concat(&parts), &one, &format!("{what} in blocks of {step}"));
    }

    #[test]
    fn elementwise_ops_and_casts() {
        let x = rnd(DType::F32, &[96, 700], 1);
        let bias = rnd(DType::F32, &[700], 2);
        let y = rnd(DType::F32, &[96, 700], 3);
        check(Op::Gelu { approximate: GeluApprox::Erf }, &[&x], &[0], 8);
        check(Op::Gelu { approximate: GeluApprox::Tanh }, &[&x], &[0], 8);
        for u in [UnaryOp::Erf, UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Sigmoid, UnaryOp::Relu, UnaryOp::Sqrt] {
            check(Op::Unary(u), &[&x], &[0], 8);
        }
        check(Op::Binary(BinaryOp::Add), &[&x, &bias], &[0], 8);
        check(Op::Binary(BinaryOp::Mul), &[&x, &y], &[0, 1], 8);
        check(Op::Binary(BinaryOp::Pow), &[&x, &f(&[], &[1.5])], &[0], 8);
        check(Op::Binary(BinaryOp::Less), &[&x, &y], &[0, 1], 8);
        for to in [DType::F16, DType::BF16, DType::I64] {
            check(Op::Cast { to }, &[&x], &[0], 8);
        }
        let h = rnd(DType::F16, &[96, 700], 4);
        check(Op::Cast { to: DType::F32 }, &[&h], &[0], 8);
        check(Op::Gelu { approximate: GeluApprox::Erf }, &[&h], &[0], 8);
        let c = rnd(DType::Bool, &[96, 1], 5);
        check(Op::Where, &[&c, &x, &y], &[0, 1, 2], 8);
    }

    #[test]
    fn rows_lines_and_planes() {
        let x = rnd(DType::F32, &[96, 700], 1);
        let (scale, bias) = (rnd(DType::F32, &[700], 2), rnd(DType::F32, &[700], 3));
        check(Op::Softmax { axis: 1 }, &[&x], &[0], 8);
        check(Op::LogSoftmax { axis: 1 }, &[&x], &[0], 8);
        check(Op::LayerNorm { axis: 1, epsilon: 1e-5 }, &[&x, &scale, &bias], &[0], 8);
        check(Op::Reduce { kind: ReduceKind::Mean, axes: vec![1], keepdims: true }, &[&x], &[0], 8);
        let x3 = rnd(DType::F32, &[6, 16, 700], 4);
        check(Op::Softmax { axis: 1 }, &[&x3], &[0], 1);
        check(Op::Reduce { kind: ReduceKind::Sum, axes: vec![1], keepdims: false }, &[&x3], &[0], 1);
        let img = rnd(DType::F32, &[2, 16, 40, 40], 5);
        let ch: Vec<Tensor> = (0..4).map(|s| rnd(DType::F32, &[16], 6 + s)).collect();
        let var = eval1(Op::Unary(UnaryOp::Abs), &[&ch[3]]);
        check(Op::BatchNorm { epsilon: 1e-5 }, &[&img, &ch[0], &ch[1], &ch[2], &var], &[0], 1);
        let p = PoolAttrs { kernel: vec![3, 3], strides: vec![2, 2], pads: vec![1, 1, 1, 1], dilations: vec![1, 1], ceil_mode: false };
        check(Op::MaxPool(p.clone()), &[&img], &[0], 1);
        check(Op::AveragePool { pool: p, count_include_pad: false }, &[&img], &[0], 1);
        check(Op::GlobalAveragePool, &[&img], &[0], 1);
        check(Op::Transpose { perm: vec![0, 2, 3, 1] }, &[&img], &[0], 1);
        let table = rnd(DType::F32, &[1000, 96], 10);
        let ids = rnd(DType::I64, &[8, 64], 11);
        check(Op::Gather { axis: 0 }, &[&table, &ids], &[1], 2);
        let t3 = rnd(DType::F32, &[12, 300, 40], 12);
        let ids = rnd(DType::I64, &[70], 13);
        check(Op::Gather { axis: 1 }, &[&t3, &ids], &[0], 3);
    }

    #[test]
    fn gemms_attention_and_convolutions() {
        let a = rnd(DType::F32, &[3, 130, 70], 1);
        let w = rnd(DType::F32, &[70, 301], 2);
        let b = rnd(DType::F32, &[3, 70, 90], 3);
        check(Op::MatMul, &[&a, &w], &[0], 1);
        check(Op::MatMul, &[&a, &b], &[0, 1], 1);
        let (q, k, v) = (rnd(DType::F32, &[4, 3, 130, 40], 4), rnd(DType::F32, &[4, 3, 130, 40], 5), rnd(DType::F32, &[4, 3, 130, 24], 6));
        let mask = rnd(DType::F32, &[4, 1, 1, 130], 7);
        let keep = rnd(DType::Bool, &[1, 1, 130, 130], 8);
        let attn = |k_transposed, mask, keep_fill| Op::Attention(AttentionAttrs { scale: 0.125, k_transposed, mask, keep_fill, nan_to_zero: false });
        check(attn(false, true, Some(-1e4)), &[&q, &k, &v, &mask, &keep], &[0, 1, 2, 3], 1);
        let kt = eval1(Op::Transpose { perm: vec![0, 1, 3, 2] }, &[&k]);
        check(attn(true, false, None), &[&q, &kt, &v], &[0, 1, 2], 1);
        let x = rnd(DType::F32, &[2, 8, 30, 30], 9);
        let wc = rnd(DType::F32, &[16, 4, 3, 3], 10);
        let bc = rnd(DType::F32, &[16], 11);
        let ca = ConvAttrs { strides: vec![1, 1], pads: vec![1, 1, 1, 1], dilations: vec![1, 1], group: 2 };
        check(Op::Conv(ca), &[&x, &wc, &bc], &[0], 1);
        let big = rnd(DType::F32, &[1, 3, 120, 120], 12);
        let w7 = rnd(DType::F32, &[70, 3, 7, 7], 13);
        let ca = ConvAttrs { strides: vec![2, 2], pads: vec![3, 3, 3, 3], dilations: vec![1, 1], group: 1 };
        check(Op::Conv(ca), &[&big, &w7], &[0], 1);
        let dw = rnd(DType::F32, &[32, 1, 3, 3], 14);
        let xd = rnd(DType::F32, &[2, 32, 40, 40], 15);
        let ca = ConvAttrs { strides: vec![1, 1], pads: vec![1, 1, 1, 1], dilations: vec![1, 1], group: 32 };
        check(Op::Conv(ca), &[&xd, &dw], &[0], 1);
    }
}
