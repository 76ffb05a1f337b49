//! Code versions that follow the code.
//!
//! A memo key names the code that computes its value by a *code version*: a declared number (bumped by hand
//! when the meaning of an output changes) combined with a digest of the source files that produce the output.
//! A forgotten bump then can never serve an old kernel: any change to a generator's source changes its
//! digest, so its keys (cranelift's `VersionMarker`, sccache hashing the compiler binary).
//!
//! A crate declares its *units* (a name and the files or folders, relative to the crate's root, whose source
//! makes one stage's or backend's output) in a table its build script and its tests share. The build script
//! calls [`emit`], which digests every unit and writes `$OUT_DIR/source_digests.rs`, one
//! `pub const NAME: [u8; 32]` per unit, and tells cargo to run it again when any of those files change. Tests
//! recompute [`digest`] from the crate's source and compare it with the embedded constant.
//!
//! What a unit's digest covers: the bytes of every file under its paths (folders recursively, in sorted
//! order), each framed by its path relative to the crate root and its length, so moving or renaming a file
//! changes the digest too. Test-only files ([`is_test_only`]) are skipped: they never reach an output, and
//! editing a test must not invalidate everyone's cache.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// One unit of source: the files whose content decides one stage's or backend's output.
#[derive(Clone, Copy, Debug)]
pub struct Unit {
    /// The constant's name in the generated file (an upper-case Rust identifier).
    pub name: &'static str,
    /// Files and folders relative to the crate root.
    pub paths: &'static [&'static str],
}

/// Whether a file is test-only and so left out of every digest: `tests.rs`, `*_tests.rs`, `*_cases.rs` (test
/// data tables), and the CPU emulation of generated kernels (`emulate.*`), which only tests compile.
pub fn is_test_only(file_name: &str) -> bool {
    let stem = file_name.split('.').next().unwrap_or(file_name);
    stem == "tests" || stem.ends_with("_tests") || stem.ends_with("_cases") || stem == "emulate"
}

/// Every file of `paths` under `root`, relative to `root`, sorted, test-only files left out. A path that does
/// not exist is an error naming it (a unit table that drifted from the tree must not digest to "nothing").
pub fn files(root: &Path, paths: &[&str]) -> io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        let full = root.join(p);
        let meta = fs::metadata(&full).map_err(|e| io::Error::new(e.kind(), format!("source unit path {}: {e}", full.display())))?;
        if meta.is_dir() {
            walk(root, &full, &mut out)?;
        } else {
            out.push(PathBuf::from(p));
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            walk(root, &path, out)?;
        } else if !is_test_only(&entry.file_name().to_string_lossy()) {
            out.push(path.strip_prefix(root).expect("walked under root").to_path_buf());
        }
    }
    Ok(())
}

/// The digest of the files of `paths` under `root` (see the crate docs for what it covers).
pub fn digest(root: &Path, paths: &[&str]) -> io::Result<[u8; 32]> {
    let mut h = blake3::Hasher::new();
    h.update(b"tessera source digest v1\0");
    for rel in files(root, paths)? {
        let bytes = fs::read(root.join(&rel))?;
        // Paths with '/' on every OS, so a digest does not depend on where it was built.
        let name = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join("/");
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(*h.finalize().as_bytes())
}

/// Combines a declared version and unit digests into one code digest (order matters: callers list units in
/// a fixed order).
pub fn combine(declared: u32, units: &[[u8; 32]]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"tessera code version v1\0");
    h.update(&declared.to_le_bytes());
    for u in units {
        h.update(u);
    }
    *h.finalize().as_bytes()
}

/// For a build script: digests every unit of the crate at `CARGO_MANIFEST_DIR`, writes
/// `$OUT_DIR/source_digests.rs` (`pub const NAME: [u8; 32] = [..];` per unit) and prints the
/// `cargo:rerun-if-changed` lines for every path, so a change to any of them rebuilds the crate with new digests.
pub fn emit(units: &[Unit]) -> io::Result<()> {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").ok_or_else(|| io::Error::other("CARGO_MANIFEST_DIR is not set"))?);
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").ok_or_else(|| io::Error::other("OUT_DIR is not set"))?);
    let mut text = String::from("// Generated by tessera-source-digest from the crate's source units: do not edit.\n");
    for u in units {
        let d = digest(&root, u.paths)?;
        let bytes: Vec<String> = d.iter().map(|b| format!("{b:#04x}")).collect();
        text.push_str(&format!("/// Digest of the source unit {:?}.\npub const {}: [u8; 32] = [{}];\n", u.paths, u.name, bytes.join(", ")));
        for p in u.paths {
            println!("cargo:rerun-if-changed={}", root.join(p).display());
        }
    }
    let mut f = fs::File::create(out_dir.join("source_digests.rs"))?;
    f.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("src/gen/sub")).unwrap();
        fs::write(dir.path().join("src/gen/mod.rs"), "pub fn gen() {}\n").unwrap();
        fs::write(dir.path().join("src/gen/prelude.cuh"), "__device__ float f(float x) { return x; }\n").unwrap();
        fs::write(dir.path().join("src/gen/sub/tile.rs"), "pub const T: usize = 64;\n").unwrap();
        fs::write(dir.path().join("src/gen/tests.rs"), "#[test] fn t() {}\n").unwrap();
        fs::write(dir.path().join("src/gen/emulate.cpp"), "int main() {}\n").unwrap();
        fs::write(dir.path().join("src/other.rs"), "pub fn other() {}\n").unwrap();
        dir
    }

    #[test]
    fn files_are_sorted_recursive_and_skip_test_only_files() {
        let dir = tree();
        let f = files(dir.path(), &["src/gen", "src/other.rs"]).unwrap();
        let names: Vec<String> = f.iter().map(|p| p.to_string_lossy().replace('\\', "/")).collect();
        assert_eq!(names, ["src/gen/mod.rs", "src/gen/prelude.cuh", "src/gen/sub/tile.rs", "src/other.rs"]);
    }

    #[test]
    fn any_byte_of_any_file_changes_the_digest_and_tests_do_not() {
        let dir = tree();
        let paths = ["src/gen"];
        let before = digest(dir.path(), &paths).unwrap();
        assert_eq!(before, digest(dir.path(), &paths).unwrap(), "deterministic");
        for f in ["src/gen/mod.rs", "src/gen/prelude.cuh", "src/gen/sub/tile.rs"] {
            let p = dir.path().join(f);
            let orig = fs::read(&p).unwrap();
            let mut changed = orig.clone();
            changed[0] ^= 1;
            fs::write(&p, &changed).unwrap();
            assert_ne!(digest(dir.path(), &paths).unwrap(), before, "a byte of {f}");
            fs::write(&p, &orig).unwrap();
        }
        assert_eq!(digest(dir.path(), &paths).unwrap(), before);
        // A new file in the folder counts; a renamed one too; test-only files do not.
        fs::write(dir.path().join("src/gen/new.rs"), "").unwrap();
        assert_ne!(digest(dir.path(), &paths).unwrap(), before);
        fs::remove_file(dir.path().join("src/gen/new.rs")).unwrap();
        fs::rename(dir.path().join("src/gen/sub/tile.rs"), dir.path().join("src/gen/sub/tiles.rs")).unwrap();
        assert_ne!(digest(dir.path(), &paths).unwrap(), before);
        fs::rename(dir.path().join("src/gen/sub/tiles.rs"), dir.path().join("src/gen/sub/tile.rs")).unwrap();
        fs::write(dir.path().join("src/gen/tests.rs"), "#[test] fn changed() {}\n").unwrap();
        fs::write(dir.path().join("src/gen/emulate.cpp"), "// changed\n").unwrap();
        assert_eq!(digest(dir.path(), &paths).unwrap(), before);
    }

    #[test]
    fn a_missing_path_is_an_error_naming_it() {
        let dir = tree();
        let e = digest(dir.path(), &["src/nope"]).unwrap_err();
        assert!(e.to_string().contains("src/nope"), "{e}");
    }

    #[test]
    fn combine_depends_on_the_declared_number_and_every_unit() {
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let base = combine(1, &[a, b]);
        assert_ne!(base, combine(2, &[a, b]));
        assert_ne!(base, combine(1, &[a]));
        assert_ne!(base, combine(1, &[b, a]));
        assert_eq!(base, combine(1, &[a, b]));
    }

    #[test]
    fn test_only_names() {
        for n in ["tests.rs", "build_tests.rs", "attention_cases.rs", "emulate.rs", "emulate.cpp"] {
            assert!(is_test_only(n), "{n}");
        }
        for n in ["gemm.rs", "prelude.cuh", "testsuite.rs", "cases.rs", "mod.rs"] {
            assert!(!is_test_only(n), "{n}");
        }
    }
}
