
/// Found by fuzzing (tessera-fuzz npy): a header length of 662 MB in a 141-byte file made the reader
/// allocate 662 MB before reading; a shape of 2^40 elements likewise. Both are now errors naming the
/// file, before any allocation of that size.
#[test]
fn untrusted_header_lengths_and_shapes_are_checked_against_the_file() {
    let path = Path::new("in.npy");
    let mut b = b"\x93NUMPY\x02\x00\x00\x00\x7b\x27".to_vec();
    b.extend_from_slice(b"{'descr': '<f4', 'fortran_order': False, 'shape': (), }     \n");
    let e = read_bytes(&b, path).unwrap_err().to_string();
    assert!(e.starts_with("in.npy: not a valid .npy file: the header says it is 662372352 bytes long"), "{e}");

    let mut header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 4), }".to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend((header.len() as u16).to_le_bytes());
    b.extend(header.as_bytes());
    b.extend([0u8; 16]);
    let e = read_bytes_as(&b, path, DType::F32).unwrap_err().to_string();
    assert!(e.contains("the header's shape [1099511627776, 4] needs 17592186044416 bytes of data, the file has 16"), "{e}");

    // A shape whose element count overflows: npyz's own product panicked (debug) or wrapped (release).
    let mut header = "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 2), }".to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend((header.len() as u16).to_le_bytes());
    b.extend(header.as_bytes());
    let e = read_bytes(&b, path).unwrap_err().to_string();
    assert!(e.starts_with("in.npy: truncated or corrupt data: the header's shape [4294967296, 4294967296, 2] has dimensions whose product overflows"), "{e}");
    // With a zero dimension: no elements, but npyz's strides still overflowed.
    let mut header = "{'descr': '<f4', 'fortran_order': True, 'shape': (0, 2, 9223372036854775807, 3), }".to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend((header.len() as u16).to_le_bytes());
    b.extend(header.as_bytes());
    let e = read_bytes_as(&b, path, DType::F32).unwrap_err().to_string();
    assert!(e.contains("shape [0, 2, 9223372036854775807, 3] has dimensions whose product overflows"), "{e}");
    // Below 2^64 but past isize::MAX: the transpose's strides (isize) overflowed.
    let mut header = "{'descr': '|b1', 'fortran_order': True, 'shape': (1, 3, 4611686018427387903, 0), }".to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend((header.len() as u16).to_le_bytes());
    b.extend(header.as_bytes());
    let e = read_bytes_as(&b, path, DType::Bool).unwrap_err().to_string();
    assert!(e.contains("shape [1, 3, 4611686018427387903, 0] has dimensions whose product overflows"), "{e}");
    assert_eq!(header_shape("{'shape': (3,), }"), Some(vec![3]));
    assert_eq!(header_shape("{'shape': (), }"), Some(vec![]));
}
use super::*;

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// A .npy file built by hand: magic, version, header length, header dict (padded), then data.
fn handmade(version: u8, descr: &str, fortran: bool, shape: &str, data: &[u8]) -> Vec<u8> {
    let dict = format!("{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape}, }}", if fortran { "True" } else { "False" });
    let len_bytes = if version == 1 { 2 } else { 4 };
    let pre = 6 + 2 + len_bytes;
    let mut header = dict.into_bytes();
    while (pre + header.len() + 1) % 64 != 0 {
        header.push(b' ');
    }
    header.push(b'\n');
    let mut out = b"\x93NUMPY".to_vec();
    out.extend([version, 0]);
    if version == 1 {
        out.extend((header.len() as u16).to_le_bytes());
    } else {
        out.extend((header.len() as u32).to_le_bytes());
    }
    out.extend(header);
    out.extend_from_slice(data);
    out
}

#[test]
fn round_trips_every_dtype() {
    let d = tmp();
    let cases = [
        Tensor::from_f32(vec![2, 3], &[1., -2., 3.5, f32::NAN, 0., 6.]),
        Tensor::from_f64_as(DType::F16, vec![3], &[1.0, -0.5, 65504.0]),
        Tensor::from_i64(vec![1, 2, 2], &[i64::MIN, -1, 0, i64::MAX]),
        Tensor::from_i32(vec![], &[-7]),
        Tensor::from_bool(vec![3], &[true, false, true]),
        Tensor::from_f32(vec![0, 4], &[]),
    ];
    for (k, t) in cases.iter().enumerate() {
        let p = d.path().join(format!("{k}.npy"));
        write(&p, t).unwrap();
        let back = read(&p).unwrap();
        assert_eq!(back.ty, t.ty);
        assert_eq!(back.bytes(), t.bytes(), "case {k}");
    }
}

#[test]
fn bf16_is_written_as_f32_and_read_back_as_bf16() {
    let d = tmp();
    let p = d.path().join("b.npy");
    let t = Tensor::from_f64_as(DType::BF16, vec![2], &[1.5, -3.0]);
    write(&p, &t).unwrap();
    assert_eq!(read(&p).unwrap().dtype(), DType::F32);
    assert_eq!(read_as(&p, DType::BF16).unwrap(), t);
}

#[test]
fn reads_v1_v2_v3_big_endian_and_fortran_order() {
    let d = tmp();
    let le: Vec<u8> = [1f32, 2., 3., 4., 5., 6.].iter().flat_map(|x| x.to_le_bytes()).collect();
    let be: Vec<u8> = [1f32, 2., 3., 4., 5., 6.].iter().flat_map(|x| x.to_be_bytes()).collect();
    for (k, (v, descr, data)) in [(1u8, "<f4", &le), (2, "<f4", &le), (3, ">f4", &be)].into_iter().enumerate() {
        let p = d.path().join(format!("v{k}.npy"));
        std::fs::write(&p, handmade(v, descr, false, "(2, 3)", data)).unwrap();
        let t = read(&p).unwrap();
        assert_eq!((t.shape(), t.to_f32_vec()), (&[2, 3][..], vec![1., 2., 3., 4., 5., 6.]), "version {v}");
    }
    // Fortran order: column-major data of [[1,2,3],[4,5,6]] is 1,4,2,5,3,6.
    let cm: Vec<u8> = [1f32, 4., 2., 5., 3., 6.].iter().flat_map(|x| x.to_le_bytes()).collect();
    let p = d.path().join("f.npy");
    std::fs::write(&p, handmade(1, "<f4", true, "(2, 3)", &cm)).unwrap();
    let t = read(&p).unwrap();
    assert_eq!((t.shape(), t.to_f32_vec()), (&[2, 3][..], vec![1., 2., 3., 4., 5., 6.]));
}

#[test]
fn f64_only_for_f32_and_bf16() {
    let d = tmp();
    let data: Vec<u8> = [0.1f64, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    let p = d.path().join("d.npy");
    std::fs::write(&p, handmade(1, "<f8", false, "(2,)", &data)).unwrap();
    let t = read_as(&p, DType::F32).unwrap();
    assert_eq!(t.to_f32_vec(), vec![0.1f32, 2.0]);
    let e = read_as(&p, DType::F16).unwrap_err().to_string();
    assert!(e.contains("d.npy") && e.contains("float64") && e.contains("f16"), "{e}");
    assert!(read(&p).unwrap_err().to_string().contains("float64"));
    let e = read_as(&d.path().join("missing.npy"), DType::F32).unwrap_err().to_string();
    assert!(e.contains("missing.npy") && e.contains("cannot read"), "{e}");
}

#[test]
fn bad_files_are_errors_naming_the_file() {
    let d = tmp();
    let p = d.path().join("junk.npy");
    std::fs::write(&p, b"not numpy at all").unwrap();
    let e = read(&p).unwrap_err().to_string();
    assert!(e.contains("junk.npy") && e.contains("not a valid .npy file"), "{e}");
    // Header promises 6 floats, data has 2.
    let short: Vec<u8> = [1f32, 2.].iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(&p, handmade(1, "<f4", false, "(2, 3)", &short)).unwrap();
    assert!(read(&p).unwrap_err().to_string().contains("junk.npy"));
    std::fs::write(&p, handmade(1, "<u2", false, "(1,)", &[0, 0])).unwrap();
    let e = read(&p).unwrap_err().to_string();
    assert!(e.contains("not supported"), "{e}");
    let i = Tensor::from_i32(vec![1], &[1]);
    write(&p, &i).unwrap();
    let e = read_as(&p, DType::I64).unwrap_err().to_string();
    assert!(e.contains("holds i32 data, the value needs i64"), "{e}");
}
