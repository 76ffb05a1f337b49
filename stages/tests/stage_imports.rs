//! Data flows one way: no circle of imports among the stage files, and no stage imports the module that runs
//! the DAG (`build.rs`). Read from the source, so a new `use` that closes a circle fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The stage files and the modules below them that the stages share.
const STAGE_FILES: &[&str] = &[
    "context.rs",
    "stage.rs",
    "target/mod.rs",
    "load.rs",
    "precision.rs",
    "partition/select.rs",
    "partition/prune.rs",
    "partition/stage.rs",
    "partition/validate.rs",
    "tune.rs",
    "lower.rs",
    "compile.rs",
    "link.rs",
    "artifact.rs",
    "build.rs",
];

/// The file a module path names (`partition::stage` -> `partition/stage.rs`), if it is one of the stage files.
fn file_of(path: &[&str]) -> Option<&'static str> {
    for n in (1..=path.len()).rev() {
        let joined = path[..n].join("/");
        for candidate in [format!("{joined}.rs"), format!("{joined}/mod.rs")] {
            if let Some(f) = STAGE_FILES.iter().find(|f| **f == candidate) {
                return Some(f);
            }
        }
    }
    None
}

/// The stage files `file` refers to through `crate::...` or `super::...` paths (doc comments and tests aside).
fn imports(src: &Path, file: &str) -> BTreeSet<&'static str> {
    let text = std::fs::read_to_string(src.join(file)).unwrap();
    let dir: Vec<&str> = {
        let mut parts: Vec<&str> = file.trim_end_matches(".rs").split('/').collect();
        parts.pop();
        parts
    };
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        if code.starts_with("#[cfg(test)]") {
            // Test modules come last in these files; what they use is not the stage's import.
            break;
        }
        for (prefix, base) in [("crate::", Vec::new()), ("super::", dir.clone())] {
            let mut rest = code;
            while let Some(i) = rest.find(prefix) {
                let after = &rest[i + prefix.len()..];
                let path: Vec<&str> = after.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).next().unwrap_or("").split("::").filter(|s| !s.is_empty()).collect();
                let mut full = base.clone();
                full.extend(path.iter().copied());
                if let Some(f) = file_of(&full) {
                    if f != file {
                        out.insert(f);
                    }
                }
                rest = after;
            }
        }
    }
    out
}

#[test]
fn stage_files_import_each_other_without_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph: BTreeMap<&str, BTreeSet<&str>> = STAGE_FILES.iter().map(|f| (*f, imports(&src, f))).collect();
    for (f, deps) in &graph {
        if *f != "build.rs" {
            assert!(!deps.contains("build.rs"), "{f} imports build.rs, the module that runs the DAG");
        }
    }
    // Depth-first search for a back edge.
    fn visit<'a>(f: &'a str, g: &BTreeMap<&'a str, BTreeSet<&'a str>>, stack: &mut Vec<&'a str>, done: &mut BTreeSet<&'a str>) {
        if done.contains(f) {
            return;
        }
        if let Some(i) = stack.iter().position(|s| *s == f) {
            panic!("import circle among stage files: {} -> {f}", stack[i..].join(" -> "));
        }
        stack.push(f);
        for d in &g[f] {
            visit(d, g, stack, done);
        }
        stack.pop();
        done.insert(f);
    }
    let mut done = BTreeSet::new();
    for f in STAGE_FILES {
        visit(f, &graph, &mut Vec::new(), &mut done);
    }
    // The reader is not blind: the partition stage does read the context, and validation the artifact module.
    assert!(graph["partition/stage.rs"].contains("context.rs"), "{graph:?}");
    assert!(graph["partition/validate.rs"].contains("artifact.rs"), "{graph:?}");
}
