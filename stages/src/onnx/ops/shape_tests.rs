use super::clamp_slice;

#[test]
fn slice_clamping_follows_onnx() {
    assert_eq!(clamp_slice(0, i64::MAX, 1, 5), (0, 5));
    assert_eq!(clamp_slice(-2, 100, 1, 5), (3, 5));
    assert_eq!(clamp_slice(-1, i64::MIN, -1, 5), (4, -1));
    assert_eq!(clamp_slice(10, -10, -2, 5), (4, -1));
    assert_eq!(clamp_slice(i64::MIN, 3, 1, 5), (0, 3));
}
