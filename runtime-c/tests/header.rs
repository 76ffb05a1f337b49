//! The committed header is what cbindgen generates from the sources now: an ABI change without a header
//! change (or a hand edit) fails here. `TESSERA_BLESS=1` rewrites the header instead.

use std::path::Path;

#[test]
fn committed_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    let mut fresh = Vec::new();
    cbindgen::Builder::new().with_crate(dir).with_config(config).generate().expect("cbindgen generates the header").write(&mut fresh);
    let path = dir.join("include/tessera.h");
    if std::env::var_os("TESSERA_BLESS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "{} differs from what cbindgen generates; regenerate with TESSERA_BLESS=1 cargo test -p tessera-runtime-c --test header",
        path.display()
    );
}
