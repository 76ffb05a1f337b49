//! `tessera store ...` through the binary: what a shell user sees on stdout.

use std::path::Path;
use std::process::Command;

fn tessera(args: &[&str], cwd: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera")).args(args).current_dir(cwd).output().expect("tessera runs");
    assert!(out.status.success(), "tessera {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// Every line `store export` and `store import` print ends with a newline (the last one used not to, so a
/// shell prompt or the next command's output ran on after it).
#[test]
fn store_export_and_import_end_their_output_with_a_newline() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    tessera(&["compile", "fixture:mlp3", "--costs", "analytical", "--target", "cpu", "--store", "a", "--out", "out"], t);
    let exported = tessera(&["store", "export", "--store", "a", "zoo.tar"], t);
    assert!(exported.starts_with("exported 1 root(s)") && exported.ends_with("zoo.tar\n"), "{exported:?}");
    assert_eq!(exported.lines().count(), 1, "{exported:?}");
    let imported = tessera(&["store", "import", "--store", "b", "zoo.tar"], t);
    assert!(imported.starts_with("imported 1 root(s)") && imported.ends_with("already present\n"), "{imported:?}");
    assert_eq!(imported.lines().count(), 1, "{imported:?}");
    // The import really holds the build: verifying it passes.
    let verified = tessera(&["store", "verify", "--store", "b"], t);
    assert!(verified.ends_with('\n'), "{verified:?}");
}
