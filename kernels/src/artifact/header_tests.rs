use super::*;

fn body() -> Body {
    Body {
        model: "m".into(),
        inputs: vec![],
        outputs: vec![],
        values: vec![],
        arena_bytes: 0,
        scratch_bytes: 0,
        steps: vec![],
        modules: vec![],
        constants: vec![],
        transfers: vec![],
    }
}

#[test]
fn round_trip_and_alignment() {
    let data = vec![7u8; 100];
    let bytes = encode(&body(), &data).unwrap();
    let d = decode(&bytes).unwrap();
    assert_eq!((d.plans, d.batches), (vec![body()], vec![]));
    assert_eq!(d.data, &data[..]);
    assert_eq!((bytes.len() - d.data.len()) % 64, 0, "data section starts 64-byte aligned");
    assert_eq!((d.payload_len, d.provenance), (bytes.len(), None));
}

#[test]
fn header_fields_are_checked() {
    let bytes = encode(&body(), &[1, 2, 3]).unwrap();
    let mut v = bytes.clone();
    v[8] = (BATCHED_FORMAT_VERSION + 1) as u8;
    assert!(matches!(decode(&v), Err(ArtifactErrorKind::Version { found }) if found == BATCHED_FORMAT_VERSION + 1));
    let mut v = bytes.clone();
    v[13] = 1;
    assert!(matches!(decode(&v), Err(ArtifactErrorKind::Flags(_))));
    let mut v = bytes.clone();
    v[31] = 0xff;
    assert!(matches!(decode(&v), Err(ArtifactErrorKind::Length { .. })));
    let mut v = bytes.clone();
    v[40] ^= 1;
    assert!(matches!(decode(&v), Err(ArtifactErrorKind::Digest)));
    assert!(matches!(decode(b"TESS"), Err(ArtifactErrorKind::TooShort { len: 4 })));
    assert!(matches!(decode(b"PK\x03\x04"), Err(ArtifactErrorKind::BadMagic)));
}
