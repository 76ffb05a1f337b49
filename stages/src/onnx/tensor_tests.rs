use super::*;
use crate::onnx::proto::StringStringEntryProto;

fn ext(kv: &[(&str, &str)]) -> Vec<StringStringEntryProto> {
    kv.iter().map(|(k, v)| StringStringEntryProto { key: Some(k.to_string()), value: Some(v.to_string()) }).collect()
}

#[test]
fn typed_and_raw_fields_agree() {
    let a = TensorProto { dims: vec![2], data_type: Some(1), float_data: vec![1.5, -2.0], ..Default::default() };
    let b = tensor_to_proto("b", &Tensor::from_f32([2], &[1.5, -2.0]));
    assert_eq!(tensor_from_proto(&a, None).unwrap(), tensor_from_proto(&b, None).unwrap());
    let h = TensorProto { dims: vec![1], data_type: Some(10), int32_data: vec![0x3c00], ..Default::default() };
    assert_eq!(tensor_from_proto(&h, None).unwrap().to_f32_vec(), vec![1.0]);
}

#[test]
fn rejects_double_naming_the_tensor() {
    let t = TensorProto { name: Some("w".into()), dims: vec![1], data_type: Some(11), double_data: vec![1.0], ..Default::default() };
    let e = tensor_from_proto(&t, None).unwrap_err().to_string();
    assert!(e.contains("'w'") && e.contains("DOUBLE"), "{e}");
}

#[test]
fn wrong_value_count_is_an_error() {
    let t = TensorProto { name: Some("w".into()), dims: vec![3], data_type: Some(1), float_data: vec![1.0], ..Default::default() };
    assert!(tensor_from_proto(&t, None).unwrap_err().to_string().contains("'w'"));
}

#[test]
fn external_data_with_offset_and_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = vec![0xAAu8; 8];
    bytes.extend(3.0f32.to_le_bytes());
    bytes.extend(4.0f32.to_le_bytes());
    std::fs::write(dir.path().join("w.bin"), &bytes).unwrap();
    let mut t = TensorProto {
        name: Some("w".into()),
        dims: vec![2],
        data_type: Some(1),
        data_location: Some(1),
        external_data: ext(&[("location", "w.bin"), ("offset", "8"), ("length", "8")]),
        ..Default::default()
    };
    assert_eq!(tensor_from_proto(&t, Some(dir.path())).unwrap().to_f32_vec(), vec![3.0, 4.0]);
    t.external_data = ext(&[("location", "w.bin"), ("offset", "12"), ("length", "8")]);
    let e = tensor_from_proto(&t, Some(dir.path())).unwrap_err().to_string();
    assert!(e.contains("past the end"), "{e}");
    t.external_data = ext(&[("location", "../w.bin")]);
    assert!(tensor_from_proto(&t, Some(dir.path())).unwrap_err().to_string().contains("relative path"));
    t.external_data = ext(&[("location", "missing.bin")]);
    assert!(tensor_from_proto(&t, Some(dir.path())).unwrap_err().to_string().contains("missing.bin"));
    t.external_data = ext(&[("location", "w.bin")]);
    assert!(tensor_from_proto(&t, None).unwrap_err().to_string().contains("without a directory"));
}
