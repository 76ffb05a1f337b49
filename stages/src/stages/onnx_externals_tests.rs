use super::*;

#[test]
fn the_externals_stage_is_keyed_by_the_file_and_checks_it() {
    let bytes = || Ok(Vec::new());
    let a = ExternalFiles { file: Digest(*blake3::hash(b"").as_bytes()), read: &bytes };
    let b = ExternalFiles { file: Digest([1; 32]), read: &bytes };
    assert_ne!(a.key().unwrap(), b.key().unwrap());
    assert_eq!(a.compute().unwrap(), Vec::<String>::new());
    assert!(b.compute().is_err(), "bytes that are not the keyed file are refused");
}
