use super::*;

#[test]
fn f16_results_round_to_nearest_even() {
    // 1 + 2^-11 lies exactly between two f16 values (1 and 1 + 2^-10): ties go to the even one, 1.
    let t = from_floats(DType::F16, &[2], &[1.0 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-11)]).unwrap();
    assert_eq!(floats(&t).as_ref(), &[1.0, 1.0 + 2.0 * 2f32.powi(-10)]);
}

#[test]
fn float_to_int_truncates_and_marks_out_of_range() {
    assert_eq!(float_to_int(-2.7, DType::I64), -2);
    assert_eq!(float_to_int(2.7, DType::I32), 2);
    assert_eq!(float_to_int(f64::NAN, DType::I64), i64::MIN);
    assert_eq!(float_to_int(3e9, DType::I32), i32::MIN as i64);
    assert_eq!(float_to_int(1e19, DType::I64), i64::MIN);
}

#[test]
fn unaligned_bytes_are_copied() {
    let v: Vec<u8> = (0..9).collect();
    let p = pod::<u32>(&v[1..9]);
    assert_eq!(p.as_ref(), &[u32::from_le_bytes([1, 2, 3, 4]), u32::from_le_bytes([5, 6, 7, 8])]);
}
