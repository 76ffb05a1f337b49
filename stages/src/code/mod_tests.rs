use super::*;
use std::path::Path;

fn embedded(name: &str) -> [u8; 32] {
    match name {
        "TARGETS" => digests::TARGETS,
        "LOAD" => digests::LOAD,
        "PASSES" => digests::PASSES,
        "IMPORT" => digests::IMPORT,
        "PRECISION" => digests::PRECISION,
        "LAYOUT" => digests::LAYOUT,
        "CALIBRATE" => digests::CALIBRATE,
        "PARTITION" => digests::PARTITION,
        "TUNE" => digests::TUNE,
        "LOWER" => digests::LOWER,
        "COMPILE" => digests::COMPILE,
        "LINK" => digests::LINK,
        "BACKEND_C" => digests::BACKEND_C,
        "BACKEND_GEMM" => digests::BACKEND_GEMM,
        "BACKEND_CUDA" => digests::BACKEND_CUDA,
        "BACKEND_CUBLAS" => digests::BACKEND_CUBLAS,
        "BACKEND_CUDNN" => digests::BACKEND_CUDNN,
        "BACKEND_CUTLASS" => digests::BACKEND_CUTLASS,
        other => panic!("unit {other} has no constant in this test"),
    }
}

/// What is embedded is the digest of the source as it is now (the build script ran on this tree), for
/// every unit, and units are distinct.
#[test]
fn embedded_digests_match_the_source() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut seen = std::collections::BTreeSet::new();
    for u in UNITS {
        assert_eq!(tessera_source_digest::digest(root, u.paths).unwrap(), embedded(u.name), "unit {}", u.name);
        assert!(seen.insert(embedded(u.name)), "unit {} digests like another", u.name);
    }
}

/// For every unit, one changed byte in any one of its files (in a scratch copy of the crate's source)
/// changes the unit's digest, so every code version built on it, so every key holding one.
#[test]
fn a_changed_byte_in_any_unit_file_changes_its_digest_and_version() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scratch = tempfile::tempdir().unwrap();
    for u in UNITS {
        let files = tessera_source_digest::files(root, u.paths).unwrap();
        assert!(!files.is_empty(), "unit {} has no files", u.name);
        for f in &files {
            let to = scratch.path().join(f);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(root.join(f), &to).unwrap();
        }
        let before = tessera_source_digest::digest(scratch.path(), u.paths).unwrap();
        assert_eq!(before, embedded(u.name), "the scratch copy of {} digests as the source", u.name);
        // The first, the middle and the last file of the unit.
        for f in [&files[0], &files[files.len() / 2], &files[files.len() - 1]] {
            let p = scratch.path().join(f);
            let orig = std::fs::read(&p).unwrap();
            let mut changed = orig.clone();
            let mid = changed.len() / 2;
            changed[mid] ^= 0x20;
            std::fs::write(&p, &changed).unwrap();
            let after = tessera_source_digest::digest(scratch.path(), u.paths).unwrap();
            assert_ne!(after, before, "unit {}: a byte of {}", u.name, f.display());
            assert_ne!(CodeVersion::new(1, &[after]), CodeVersion::new(1, &[before]));
            std::fs::write(&p, &orig).unwrap();
        }
    }
}

#[test]
fn the_code_ingredient_is_in_the_key() {
    let a = CodeVersion::new(3, &[[1; 32]]);
    let b = CodeVersion::new(3, &[[2; 32]]);
    assert_eq!(a.declared, b.declared);
    let key = |v: &CodeVersion| v.key_builder("lower").input("x", &1u8).finish().unwrap();
    assert_ne!(key(&a), key(&b));
    assert_eq!(key(&a), key(&CodeVersion::new(3, &[[1; 32]])));
    assert_ne!(key(&a), key(&CodeVersion::new(4, &[[1; 32]])));
}

/// Every file under `dir` (relative to the crate root), test files included, recursively.
fn all_files(root: &Path, dir: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![root.join(dir)];
    while let Some(d) = todo.pop() {
        if d.is_file() {
            out.push(d);
            continue;
        }
        for e in std::fs::read_dir(&d).unwrap() {
            todo.push(e.unwrap().path());
        }
    }
    out.sort();
    out
}

/// Backends do not import one another (units.rs): no file of a backend's folder, test files included, names
/// another backend's module (`backend::<other>::`) or the partitioner (`partition::`), and no shared file
/// (`src/backend/lowering`, `src/backend/library.rs`, `src/rules`) names a backend's module. So a backend's unit (its
/// folder and the shared files it lists) holds all the code that makes its output.
#[test]
fn backends_import_no_other_backend() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut backends: Vec<String> = std::fs::read_dir(root.join("src/backend"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|name| name != "lowering")
        .collect();
    backends.sort();
    assert!(backends.len() >= 6, "found only the backends {backends:?}: the scan is broken");
    let mut checked = 0;
    let mut scan = |dir: &str, own: Option<&str>| {
        for f in all_files(root, dir) {
            if f.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            for other in backends.iter().filter(|b| Some(b.as_str()) != own) {
                assert!(!text.contains(&format!("backend::{other}::")), "{} names backend::{other}", f.display());
            }
            if own.is_some() {
                assert!(!text.contains("partition::"), "{} names the partitioner", f.display());
            }
            checked += 1;
        }
    };
    for b in &backends {
        scan(&format!("src/backend/{b}"), Some(b));
    }
    scan("src/backend/lowering", None);
    scan("src/backend/library.rs", None);
    scan("src/rules", None);
    assert!(checked > 60, "scanned only {checked} files: the scan is broken");
}
