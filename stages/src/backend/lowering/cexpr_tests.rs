use super::*;

#[test]
fn float_literals_are_exact_hex() {
    assert_eq!(f32_lit(1.0), "0x1.000000p+0f");
    assert_eq!(f32_lit(-0.5), "-0x1.000000p-1f");
    assert_eq!(f32_lit(0.0), "0x0.000000p-126f");
    assert_eq!(f32_lit(f32::from_bits(1)), "0x0.000002p-126f");
    assert_eq!(f32_lit(f32::INFINITY), "__builtin_inff()");
    assert_eq!(f32_lit(f32::NEG_INFINITY), "(-__builtin_inff())");
    // 0.1f: mantissa 0x4ccccd, exponent -4.
    assert_eq!(f32_lit(0.1), "0x1.99999ap-4f");
}

#[test]
fn int_literals() {
    assert_eq!(int_lit(i64::MIN, DType::I64), "INT64_MIN");
    assert_eq!(int_lit(-3, DType::I32), "-3");
    assert_eq!(int_lit(7, DType::Bool), "1");
}
