//! Sharded builds end to end: the bundled zoo compiled as 3 shards (each its own store, one output folder)
//! gives every model exactly once, byte-identical to an unsharded build, and `tessera summary` merges the
//! shards' summaries into the unsharded report, or names the shard that is missing.
//!
//! The commands run in-process through the CLI's own entry points (`tessera::cli::compile::run`,
//! `tessera::cli::summary::run`), with analytical costs so that every store plans the same.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use tessera::cli::build_options::BuildOptions;
use tessera::cli::compile::{self, CompileArgs};
use tessera::cli::summary::{self, SummaryArgs};
use tessera::shard::report::{collect_files, merge, ShardReport};
use tessera::shard::{Shard, ShardArg};
use tessera::zoo::jobs_from_inputs;
use tessera_stages::context::CostMode;

fn zoo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("fixtures/zoo.toml")
}

fn compile_args(store: &Path, out: &Path, shard: Option<Shard>, summary_out: Option<PathBuf>) -> CompileArgs {
    CompileArgs {
        inputs: vec![zoo().display().to_string()],
        build: BuildOptions { targets: vec![], shapes: vec![], calibration: None, store: Some(store.to_path_buf()), wait: false, costs: CostMode::Analytical, tuning: Default::default(), gpus: tessera::cli::build_options::GpuList(None), frozen: false, measured_on: None, remote: None, remote_read_only: false, remote_timeout_ms: tessera::cli::build_options::DEFAULT_REMOTE_TIMEOUT_MS, remote_signing_key: None, remote_trust: None, remote_credentials: None, remote_ca: None },
        batch: None,
        out: out.to_path_buf(),
        json: false,
        check: false,
        shard: shard.map(ShardArg::Fixed),
        summary_out,
    }
}

#[test]
fn three_shards_build_the_zoo_once_and_merge_into_the_unsharded_report() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, whole_out) = (tmp.path().join("out"), tmp.path().join("whole-out"));
    for index in 0..3 {
        let store = tmp.path().join(format!("store-{index}"));
        compile::run(compile_args(&store, &out, Some(Shard { index, count: 3 }), None)).unwrap();
    }
    // The unsharded build, with its summary written as shard 0/1.
    let whole_file = tmp.path().join("whole.json");
    compile::run(compile_args(&tmp.path().join("whole-store"), &whole_out, None, Some(whole_file.clone()))).unwrap();
    let whole = ShardReport::read(&whole_file).unwrap();
    assert_eq!((whole.shard.index, whole.shard.count), (0, 1));

    let names: Vec<String> = jobs_from_inputs(&[zoo()], &Default::default()).unwrap().into_iter().map(|j| j.name).collect();
    assert_eq!(whole.shard.models, names);

    // Every model in exactly one shard, and each shard built what it took.
    let files = collect_files(std::slice::from_ref(&out)).unwrap();
    let file_names: Vec<_> = files.iter().map(|f| f.file_name().unwrap().to_str().unwrap().to_string()).collect();
    assert_eq!(file_names, ["summary-shard-0-of-3.json", "summary-shard-1-of-3.json", "summary-shard-2-of-3.json"]);
    let reports: Vec<(PathBuf, ShardReport)> = files.iter().map(|f| (f.clone(), ShardReport::read(f).unwrap())).collect();
    let mut seen = BTreeSet::new();
    for (file, r) in &reports {
        assert!(!r.shard.models.is_empty(), "{}: an empty shard for 9 models over 3", file.display());
        let built: Vec<&str> = r.summary.artifacts.iter().map(|a| a.model.as_str()).collect();
        assert_eq!(built, r.shard.models, "{}", file.display());
        for m in &r.shard.models {
            assert!(seen.insert(m.clone()), "{m} is in two shards");
        }
        assert_eq!(r.shard.assignment, reports[0].1.shard.assignment, "the shards computed different assignments");
    }
    assert_eq!(seen, names.iter().cloned().collect::<BTreeSet<_>>(), "the shards together are the zoo");

    // Artifacts byte-identical to the unsharded build's.
    for name in &names {
        let file = format!("{name}.tsr");
        let (a, b) = (std::fs::read(out.join(&file)).unwrap(), std::fs::read(whole_out.join(&file)).unwrap());
        assert!(a == b, "{file}: the sharded artifact differs from the unsharded one");
    }

    // The merge is the unsharded report (up to stage counts and times, which depend on the stores).
    let merged = merge(&reports).unwrap();
    let s = &merged.summary;
    let w = &whole.summary;
    assert_eq!((s.models, s.partitions, s.unique_kernels, &s.targets, &s.cost_source), (w.models, w.partitions, w.unique_kernels, &w.targets, &w.cost_source));
    assert_eq!(s.dedupe_ratio, w.dedupe_ratio);
    let rows = |s: &tessera::zoo::Summary| s.artifacts.iter().map(|a| (a.model.clone(), a.digest, a.bytes, a.partitions)).collect::<Vec<_>>();
    assert_eq!(rows(s), rows(w), "merged artifacts (in manifest order) differ from the unsharded build's");
    assert!(s.failed.is_empty());
    summary::run(SummaryArgs { paths: vec![out.clone()], json: false }).unwrap();
    summary::run(SummaryArgs { paths: vec![out.clone()], json: true }).unwrap();

    // A missing shard is named, with the models it should have built.
    let lost = out.join("summary-shard-1-of-3.json");
    let lost_models = reports[1].1.shard.models.join(", ");
    std::fs::remove_file(&lost).unwrap();
    let e = format!("{:#}", summary::run(SummaryArgs { paths: vec![out.clone()], json: false }).unwrap_err());
    assert!(e.contains(&format!("missing shard summaries: 1/3 (models: {lost_models})")), "{e}");
    // A shard of another build does not merge.
    let e = format!("{:#}", summary::run(SummaryArgs { paths: vec![out.join("summary-shard-0-of-3.json"), whole_file], json: false }).unwrap_err());
    assert!(e.contains("the shard counts differ"), "{e}");
}
