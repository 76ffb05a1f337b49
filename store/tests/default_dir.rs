//! `default_dir` / `resolve_dir`: --store beats TESSERA_STORE beats `.tessera`. In its own test binary
//! because it changes the process environment.

use std::path::{Path, PathBuf};
use tessera_store::{default_dir, resolve_dir, DEFAULT_DIR, STORE_ENV};

#[test]
fn store_dir_resolution_order() {
    std::env::remove_var(STORE_ENV);
    assert_eq!(default_dir(), PathBuf::from(DEFAULT_DIR));
    std::env::set_var(STORE_ENV, "");
    assert_eq!(default_dir(), PathBuf::from(".tessera"), "an empty TESSERA_STORE is ignored");
    std::env::set_var(STORE_ENV, "/ci/cache/tessera");
    assert_eq!(default_dir(), PathBuf::from("/ci/cache/tessera"));
    assert_eq!(resolve_dir(Some(Path::new("explicit"))), PathBuf::from("explicit"));
    assert_eq!(resolve_dir(None), PathBuf::from("/ci/cache/tessera"));
    std::env::remove_var(STORE_ENV);
}
