use super::*;

/// What anyhow's `{:#}` prints (how `tessera` prints every error): the message, then each `source()`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut next = e.source();
    while let Some(c) = next {
        s += &format!(": {c}");
        next = c.source();
    }
    s
}

#[test]
fn a_missing_file_names_its_cause_once() {
    let e = super::super::import_file(std::path::Path::new("/no/such/model.onnx"), &Default::default()).unwrap_err();
    let text = chain(&e);
    assert!(text.starts_with("/no/such/model.onnx: cannot read: "), "{text}");
    assert_eq!(text.matches("No such file or directory").count(), 1, "{text}");
    let e = super::super::import_bytes(b"\x0a\xff\xff", None, "m.onnx", &Default::default()).unwrap_err();
    let ImportErrorKind::Decode(decode) = &e.kind else { panic!("{e}") };
    assert_eq!(chain(&e).matches(&decode.to_string()).count(), 1, "{}", chain(&e));
}
