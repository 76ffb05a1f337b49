use super::*;

#[test]
fn contiguous_operands_coalesce_to_one_loop() {
    let s = [2, 3, 4];
    let n = Nest::new(&s, &[contiguous(&s), contiguous(&s)]);
    assert_eq!(n.dims, vec![24]);
    assert_eq!(n.strides, vec![vec![1], vec![1]]);
}

#[test]
fn broadcast_keeps_needed_loops() {
    let out = [2, 3, 4];
    let n = Nest::new(&out, &[contiguous(&out), broadcast(&[4], &out)]);
    assert_eq!(n.dims, vec![6, 4]);
    assert_eq!(n.strides, vec![vec![4, 1], vec![0, 1]]);
    let n = Nest::new(&out, &[contiguous(&out), broadcast(&[3, 1], &out)]);
    assert_eq!(n.dims, vec![2, 3, 4]);
}

#[test]
fn row_offsets_decompose() {
    // rows [2, 3] where the operand has strides [0, 5]: offset = (r % 3) * 5.
    assert_eq!(row_offset(&[2, 3], &[0, 5], "R"), "(R % 3) * 5");
    assert_eq!(row_offset(&[2, 3], &[3, 1], "R"), "R");
    assert_eq!(row_offset(&[2, 3], &[0, 0], "R"), "0");
    assert_eq!(row_offset(&[2, 3], &[7, 0], "R"), "(R / 3) * 7");
    assert_eq!(flat_stride(&[4, 5], &[5, 1]), Some(1));
    assert_eq!(flat_stride(&[4, 5], &[0, 0]), Some(0));
    assert_eq!(flat_stride(&[4, 5], &[0, 1]), None);
}
