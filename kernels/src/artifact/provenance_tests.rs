//! The provenance section's encoding and the stamper, on hand-made payloads (kernels/tests/artifact.rs does
//! it on linked artifacts).

use super::super::{header, Artifact, ArtifactErrorKind, Body};
use super::*;
use proptest::prelude::*;

fn provenance() -> Provenance {
    Provenance {
        tessera_version: "0.1.0".into(),
        source_revision: "0123456789abcdef0123456789abcdef01234567-dirty".into(),
        source: SourceModel { kind: "onnx".into(), name: "model.onnx".into(), digest: Blake3([7; 32]) },
        targets: vec!["cpu -compiler=c -opt-level=2".into(), "cpu -compiler=gemm".into()],
        precision: "fp32".into(),
        costs: "analytical".into(),
        options: [("shape.x".to_string(), "1x3".to_string())].into(),
    }
}

/// A valid payload: an empty model with a 100-byte data section.
fn payload() -> Vec<u8> {
    let body = Body {
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
    };
    header::encode(&body, &[9u8; 100]).unwrap()
}

fn any_provenance() -> impl Strategy<Value = Provenance> {
    let text = ".{0,40}";
    (
        (text, text, text, text, any::<[u8; 32]>()),
        prop::collection::vec(text, 0..4),
        (text, text),
        prop::collection::btree_map(text, text, 0..4),
    )
        .prop_map(|((version, revision, kind, name, digest), targets, (precision, costs), options)| Provenance {
            tessera_version: version,
            source_revision: revision,
            source: SourceModel { kind, name, digest: Blake3(digest) },
            targets,
            precision,
            costs,
            options,
        })
}

proptest! {
    #[test]
    fn sections_round_trip(p in any_provenance()) {
        let s = encode_section(&p).unwrap();
        prop_assert_eq!(decode_section(&s).unwrap(), p.clone());
        // And through a whole stamped file.
        let a = Artifact::read(&with_provenance(&payload(), &p).unwrap()).unwrap();
        prop_assert_eq!(a.provenance, Some(p));
    }

    #[test]
    fn a_damaged_section_is_an_error_never_a_panic(p in any_provenance(), at in any::<usize>(), x in 1u8..=255, cut in any::<usize>()) {
        let s = encode_section(&p).unwrap();
        let mut v = s.clone();
        v[at % s.len()] ^= x;
        prop_assert!(decode_section(&v).is_err());
        prop_assert!(decode_section(&s[..cut % s.len()]).is_err());
    }

    #[test]
    fn hostile_encodings_behind_a_correct_digest_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut s = Vec::new();
        s.extend_from_slice(&PROVENANCE_VERSION.to_le_bytes());
        s.extend_from_slice(&0u32.to_le_bytes());
        s.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        s.extend_from_slice(blake3::hash(&bytes).as_bytes());
        s.extend_from_slice(&bytes);
        let _ = decode_section(&s);
    }
}

#[test]
fn stamping_keeps_the_payload_and_its_digest() {
    let payload = payload();
    let stamped = with_provenance(&payload, &provenance()).unwrap();
    assert_eq!(stamped.len(), payload.len() + encode_section(&provenance()).unwrap().len());
    // Only the flags word differs within the payload.
    let diff: Vec<usize> = (0..payload.len()).filter(|&i| payload[i] != stamped[i]).collect();
    assert_eq!(diff, [12]);
    let a = Artifact::read(&stamped).unwrap();
    assert_eq!(a.payload_digest(), Blake3::of(&payload));
    assert_eq!(a.payload_len(), payload.len());
    assert_eq!(a.data(), &[9u8; 100][..]);
    // An artifact without provenance: its payload digest is its own blake3.
    let plain = Artifact::read(&payload).unwrap();
    assert_eq!((&plain.provenance, plain.payload_digest()), (&None, Blake3::of(&payload)));
}

#[test]
fn the_stamper_streams_in_any_pieces_and_checks_what_it_stamps() {
    let payload = payload();
    let whole = with_provenance(&payload, &provenance()).unwrap();
    for piece in [1, 7, 63, 64, 65, 1000] {
        let mut s = Stamper::new(Vec::new(), &provenance()).unwrap();
        for c in payload.chunks(piece) {
            s.write_all(c).unwrap();
        }
        assert_eq!(s.finish().unwrap(), whole, "pieces of {piece}");
    }
    let err = |bytes: &[u8]| with_provenance(bytes, &provenance()).unwrap_err().to_string();
    assert!(err(&payload[..payload.len() - 1]).contains("header promises"), "{}", err(&payload[..payload.len() - 1]));
    assert!(err(&payload[..10]).contains("header promises"));
    let mut longer = payload.clone();
    longer.push(0);
    assert!(err(&longer).contains("longer than"), "{}", err(&longer));
    assert!(err(&whole).contains("already carries provenance"), "{}", err(&whole));
    let mut other = payload.clone();
    other[8] = 2;
    assert!(err(&other).contains("format version 2"), "{}", err(&other));
    assert!(err(&[0u8; 64]).contains("bad magic"));
}

#[test]
fn the_flag_and_the_section_are_checked_together() {
    let payload = payload();
    let stamped = with_provenance(&payload, &provenance()).unwrap();
    let kind = |b: &[u8]| header::decode(b).err().map(|e| e.to_string()).unwrap_or_default();
    // The flag without the section: a file cut at the payload's end.
    assert!(kind(&stamped[..payload.len()]).contains("provenance section: the header announces one"), "{}", kind(&stamped[..payload.len()]));
    // The section without the flag: bytes the header does not promise.
    let mut unflagged = stamped.clone();
    unflagged[12] = 0;
    assert!(matches!(header::decode(&unflagged), Err(ArtifactErrorKind::Length { .. })));
    // Another flag bit: refused, naming it.
    let mut other = stamped.clone();
    other[12] = 3;
    assert!(kind(&other).contains("unknown flags 0x3"), "{}", kind(&other));
    // Another section version.
    let mut v2 = stamped.clone();
    v2[payload.len()] = 2;
    assert!(kind(&v2).contains("section version 2 is not supported"), "{}", kind(&v2));
}

#[test]
fn digests_are_hex_in_json_and_raw_in_postcard() {
    let d = Blake3([0xab; 32]);
    assert_eq!(postcard::to_stdvec(&d).unwrap(), vec![0xab; 32]);
    assert_eq!(Blake3::from_hex(&d.to_hex()), Some(d));
    assert_eq!(d.to_hex(), "ab".repeat(32));
    assert_eq!(Blake3::from_hex("ab"), None);
    assert_eq!(Blake3::from_hex(&"zz".repeat(32)), None);
    assert_eq!(Blake3::from_hex(&"é".repeat(32)), None);
}
