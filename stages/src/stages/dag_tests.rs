//! The stage list is declared once ([`DAG`]) and everything else is checked against it: the source (every
//! `impl Stage`), ARCHITECTURE.md's table, and the order a real build runs the stages in.

use super::*;
use crate::backend::{c::CBackend, Backend};
use crate::context::{CostMode, Ctx, LazyGraph};
use crate::ir::{Graph, Op, TensorType, UnaryOp};
use crate::stage::{DevicePolicy, Driver};
use crate::stages::load::GraphSource;
use crate::target::TargetSet;
use anyhow::Result;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use tessera_store::{Digest, Store};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, relative to `root`.
fn rust_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(root, &p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p.strip_prefix(root).unwrap().to_path_buf());
        }
    }
}

/// The `(name, file)` of every `impl Stage for` in the crate's source: the `NAME` constant of each such block.
fn stage_impls() -> Vec<(String, String)> {
    let root = src();
    let mut files = Vec::new();
    rust_files(&root, &root, &mut files);
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(root.join(&f)).unwrap();
        let mut rest = text.as_str();
        while let Some(i) = find_impl_stage(rest) {
            let block = &rest[i..];
            let name = block
                .find("const NAME: &'static str = \"")
                .map(|j| {
                    let from = j + "const NAME: &'static str = \"".len();
                    block[from..from + block[from..].find('"').unwrap()].to_string()
                })
                .unwrap_or_else(|| panic!("{}: an `impl Stage` without a NAME", f.display()));
            out.push((name, f.to_string_lossy().into_owned()));
            rest = &block[1..];
        }
    }
    out
}

/// Where the next `impl Stage for` / `impl<..> Stage for` starts in `text` (code, not comments).
fn find_impl_stage(text: &str) -> Option<usize> {
    let mut at = 0;
    while let Some(i) = text[at..].find("impl") {
        let start = at + i;
        let line_start = text[..start].rfind('\n').map_or(0, |n| n + 1);
        let after = text[start + 4..].trim_start();
        let after = if after.starts_with('<') { after[after.find('>').unwrap() + 1..].trim_start() } else { after };
        if !text[line_start..start].contains("//") && after.starts_with("Stage for ") {
            return Some(start);
        }
        at = start + 4;
    }
    None
}

#[test]
fn every_stage_implementation_is_in_the_dag_and_in_its_file() {
    let found = stage_impls();
    for (name, file) in &found {
        let decl = decl(name).unwrap_or_else(|| panic!("stage '{name}' ({file}) is not in stages::DAG: declare it there"));
        assert_eq!(file, &format!("stages/{}", decl.file), "stage '{name}' must live in its declared file");
    }
    for s in DAG {
        assert!(found.iter().any(|(n, _)| n == s.name), "stages::DAG declares '{}', which no `impl Stage` names", s.name);
        for r in s.reads.iter().chain(s.calls) {
            assert!(decl(r).is_some(), "'{}' reads or calls '{r}', which is not a stage", s.name);
        }
    }
    let names: BTreeSet<&str> = DAG.iter().map(|s| s.name).collect();
    assert_eq!(names.len(), DAG.len(), "a stage is declared twice");
    // The scanner is not blind: it sees every declared stage, two of them in one file.
    assert_eq!(found.len(), DAG.len(), "{found:?}");
}

#[test]
fn what_a_stage_reads_comes_before_it_in_the_dag() {
    for (i, s) in DAG.iter().enumerate() {
        for r in s.reads {
            let j = DAG.iter().position(|d| d.name == *r).unwrap();
            assert!(j < i, "'{}' reads '{r}', declared after it", s.name);
        }
    }
}

/// The table ARCHITECTURE.md shows between its `stage-dag` markers, rendered from [`DAG`].
fn architecture_table() -> String {
    let mut out = String::from("| stage | file (`stages/src/stages/`) | reads | calls | runs |\n|---|---|---|---|---|\n");
    let list = |xs: &[&str]| if xs.is_empty() { "".to_string() } else { xs.iter().map(|x| format!("`{x}`")).collect::<Vec<_>>().join(", ") };
    for s in DAG {
        out.push_str(&format!("| `{}` | `{}` | {} | {} | {} |\n", s.name, s.file, list(s.reads), list(s.calls), s.when));
    }
    out
}

#[test]
fn architecture_shows_the_dag_as_declared() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ARCHITECTURE.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = ("<!-- stage-dag: generated from stages::DAG, checked by stages::dag_tests -->\n", "<!-- /stage-dag -->");
    let from = doc.find(begin).expect("ARCHITECTURE.md has no stage-dag table") + begin.len();
    let to = from + doc[from..].find(end).expect("the stage-dag table is not closed");
    let want = architecture_table();
    assert!(doc[from..to] == want, "ARCHITECTURE.md's stage table is not stages::DAG's; replace it with:\n{want}");
}

/// A driver that computes every call and records the stage names in the order their calls begin.
struct Recording {
    store: Store,
    calls: Mutex<Vec<&'static str>>,
}

impl Driver for Recording {
    fn store(&self) -> &Store {
        &self.store
    }
    fn call(&self, name: &'static str, _: Digest, _: DevicePolicy, compute: &mut dyn FnMut() -> Result<Vec<u8>>) -> Result<Digest> {
        self.calls.lock().unwrap().push(name);
        Ok(self.store.put(&compute()?)?)
    }
}

struct TwoOps;

impl GraphSource for TwoOps {
    fn name(&self) -> &str {
        "two-ops"
    }
    fn recipe(&self, _: &dyn Driver) -> Result<Option<Digest>> {
        Ok(Some(Digest::of(b"two-ops")))
    }
    fn build(&self) -> Result<Graph> {
        let mut g = Graph::new("two-ops");
        let x = g.add_input("x", TensorType::f32([8]));
        let a = g.add("a", Op::Unary(UnaryOp::Relu), &[x])?;
        let b = g.add("b", Op::Unary(UnaryOp::Exp), &[a])?;
        g.outputs.push(b);
        Ok(g)
    }
}

/// A model built through `build.rs` and `artifact.rs` runs only declared stages, each after what it reads.
#[test]
fn a_build_runs_the_declared_stages_in_an_order_the_dag_allows() {
    let dir = tempfile::tempdir().unwrap();
    let driver = Recording { store: Store::open(dir.path(), Default::default()).unwrap(), calls: Mutex::new(Vec::new()) };
    let targets = TargetSet::parse(&["cpu".to_string()]).unwrap();
    let backends: Vec<Box<dyn Backend>> = vec![Box::new(CBackend)];
    let ctx = Ctx::new(&driver, &targets, &backends).with_costs(CostMode::Analytical);
    crate::stage::run(&driver, &targets::Targets { targets: &targets }).unwrap();
    let planned = crate::build::plan_model(&ctx, &TwoOps).unwrap();
    let graph: &LazyGraph = &planned.graph;
    artifact::build_artifact(&ctx, &planned.plan_digest, &planned.plan, &|| graph.get(), None).unwrap();
    let calls = driver.calls.into_inner().unwrap();
    for (i, name) in calls.iter().enumerate() {
        let s = decl(name).unwrap_or_else(|| panic!("the build ran '{name}', which stages::DAG does not declare"));
        for r in s.reads {
            if let Some(j) = calls.iter().position(|c| c == r) {
                assert!(j < i, "'{name}' ran before '{r}', which it reads: {calls:?}");
            }
        }
    }
    for want in ["targets", "load", "partition", "lower", "compile", "link"] {
        assert!(calls.contains(&want), "{want} did not run: {calls:?}");
    }
}
