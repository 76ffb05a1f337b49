//! Digests of the runtime's source units, embedded at build time (`build.rs`, `units.rs`): the compiler puts
//! them into the keys of what this code decides (linked artifacts, measurements), so a change here is a
//! cold rebuild of exactly those.

include!(concat!(env!("OUT_DIR"), "/source_digests.rs"));

#[cfg(test)]
mod units;

#[cfg(test)]
mod tests {
    /// The embedded digests are those of the source as it is: the build script ran on this tree.
    #[test]
    fn embedded_digests_match_the_source() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for u in super::units::UNITS {
            let embedded = match u.name {
                "ARTIFACT" => super::ARTIFACT,
                "RUNTIME" => super::RUNTIME,
                "RUNTIME_C" => super::RUNTIME_C,
                "RUNTIME_GEMM" => super::RUNTIME_GEMM,
                "RUNTIME_CUDA" => super::RUNTIME_CUDA,
                other => panic!("unit {other} has no constant here"),
            };
            assert_eq!(tessera_source_digest::digest(root, u.paths).unwrap(), embedded, "unit {}", u.name);
        }
    }

    fn e_name(path: &std::path::Path) -> String {
        path.file_name().unwrap().to_string_lossy().into_owned()
    }

    /// Every source file under `src/runtime` (test-only files aside, which no digest holds) is in exactly one
    /// runtime unit: a new file is digested somewhere, and no file re-keys two formats' records.
    #[test]
    fn every_runtime_file_is_in_one_unit() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let runtime: Vec<_> = super::units::UNITS.iter().filter(|u| u.name.starts_with("RUNTIME")).collect();
        let mut files = vec![];
        let mut stack = vec![root.join("src/runtime")];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap() {
                let path = e.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if !tessera_source_digest::is_test_only(&e_name(&path)) {
                    files.push(path.strip_prefix(root).unwrap().to_str().unwrap().to_string());
                }
            }
        }
        assert!(files.len() > 10, "{files:?}");
        for f in files {
            let covering: Vec<&str> = runtime.iter().filter(|u| u.paths.iter().any(|p| f == *p || f.starts_with(&format!("{p}/")))).map(|u| u.name).collect();
            assert_eq!(covering.len(), 1, "{f} is in the runtime units {covering:?}");
        }
    }
}
