use super::*;
use crate::ir::op::*;

/// Found by fuzzing (tessera-fuzz onnx-model): a Tile whose repeats overflow a dimension panicked on
/// the multiplication (debug) or wrapped to a small shape (release); a Pad of i64::MAX likewise.
#[test]
fn tile_and_pad_sizes_that_overflow_are_errors() {
    let x = TensorType::new(DType::F32, vec![3, 2]);
    let e = infer_op(&Op::Tile { repeats: vec![usize::MAX / 2, 1] }, &[&x]).unwrap_err().to_string();
    assert!(e.contains("Tile: dimension 0 (3 repeated 9223372036854775807 times) overflows"), "{e}");
    let pad = Op::Pad { pads: vec![i64::MAX, 0, 1, 0], mode: PadMode::Constant, value: 0.0 };
    let e = infer_op(&pad, &[&x]).unwrap_err().to_string();
    assert!(e.contains("Pad: dimension 0") && e.contains("overflows"), "{e}");
}

#[test]
fn broadcast() {
    assert_eq!(broadcast_shapes(&[2, 1, 3], &[4, 1]).unwrap(), vec![2, 4, 3]);
    assert!(broadcast_shapes(&[2, 3], &[4]).is_err());
}

#[test]
fn conv_shapes() {
    let op = Op::Conv(ConvAttrs { strides: vec![2, 2], pads: vec![3, 3, 3, 3], dilations: vec![1, 1], group: 1 });
    let out = infer_op(&op, &[&TensorType::f32([1, 3, 224, 224]), &TensorType::f32([64, 3, 7, 7])]).unwrap();
    assert_eq!(out[0].shape, vec![1, 64, 112, 112]);
}

#[test]
fn pool_ceil_mode() {
    let p = PoolAttrs { kernel: vec![3, 3], strides: vec![2, 2], pads: vec![0; 4], dilations: vec![1, 1], ceil_mode: true };
    let out = infer_op(&Op::MaxPool(p), &[&TensorType::f32([1, 1, 6, 6])]).unwrap();
    assert_eq!(out[0].shape, vec![1, 1, 3, 3]);
}

#[test]
fn matmul_batched_broadcast() {
    let out = infer_op(&Op::MatMul, &[&TensorType::f32([2, 1, 4, 8]), &TensorType::f32([3, 8, 5])]).unwrap();
    assert_eq!(out[0].shape, vec![2, 3, 4, 5]);
    let v = infer_op(&Op::MatMul, &[&TensorType::f32([8]), &TensorType::f32([8, 5])]).unwrap();
    assert_eq!(v[0].shape, vec![5]);
}

#[test]
fn slice_negative_step() {
    let op = Op::Slice { axes: vec![0], starts: vec![4], ends: vec![-1], steps: vec![-2] };
    assert_eq!(infer_op(&op, &[&TensorType::f32([5])]).unwrap()[0].shape, vec![3]);
    let op = Op::Slice { axes: vec![0], starts: vec![1], ends: vec![5], steps: vec![2] };
    assert_eq!(infer_op(&op, &[&TensorType::f32([5])]).unwrap()[0].shape, vec![2]);
}
