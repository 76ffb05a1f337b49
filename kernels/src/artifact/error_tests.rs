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
    let e = Artifact::open(std::path::Path::new("/no/such/model.tsr")).unwrap_err();
    let text = chain(&e);
    assert!(text.contains("/no/such/model.tsr") && text.contains("cannot read"), "{text}");
    assert_eq!(text.matches("No such file or directory").count(), 1, "{text}");
    // The kind alone (what `?` on an I/O error makes inside the reader) too.
    let kind = ArtifactErrorKind::from(std::io::Error::from_raw_os_error(2));
    assert_eq!(chain(&kind).matches("No such file or directory").count(), 1, "{}", chain(&kind));
}
