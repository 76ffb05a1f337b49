//! End-to-end tests of the CPU pipeline: every zoo model compiled with the default CPU backends matches the
//! reference interpreter; a second identical run executes no stage; a changed model compiles only kernels
//! never seen before; artifacts are byte-identical across stores and output folders.
//!
//! All of it counts stage executions rather than timing anything.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use tessera::job::{load_graph, ModelJob};
use tessera::memo::Memo;
use tessera_stages::context::CostMode;
use tessera::zoo::{all_backends, compile_all, jobs_from_inputs, resolve_targets, Summary};
use tessera_kernels::artifact::Artifact;
use tessera_kernels::runtime::Executable;
use tessera_stages::interp::{random_inputs, run_graph};
use tessera_store::{OpenOptions, Store};
use tessera_tests::assert_close;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn write_manifest(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

fn compile(store_dir: &Path, out: &Path, manifest: &Path, targets: &[String]) -> Summary {
    compile_with(store_dir, out, manifest, targets, CostMode::Analytical)
}

fn compile_with(store_dir: &Path, out: &Path, manifest: &Path, targets: &[String], costs: CostMode) -> Summary {
    let store = Store::open(store_dir, OpenOptions::writable()).unwrap();
    let backends = all_backends();
    let targets = resolve_targets(targets, &backends).unwrap();
    let jobs = jobs_from_inputs(&[manifest.to_path_buf()], &Default::default()).unwrap();
    let memo = Memo::new(&store);
    // Analytical costs: the same plan on every machine and in every store, so artifacts can be compared
    // byte for byte (measured costs are exercised by the Collage tests).
    compile_all(&memo, &targets, &backends, &jobs, out, costs, &|_| {}).unwrap()
}

fn executions(s: &Summary, stage: &str) -> u64 {
    s.stages.get(stage).map(|st| st.executions).unwrap_or(0)
}

/// Every model of the bundled zoo, compiled for every CPU backend, matches the reference interpreter on
/// fresh random inputs (fp32: relative error below 1e-4).
#[test]
fn bundled_zoo_matches_the_reference_interpreter() {
    let tmp = tempfile::tempdir().unwrap();
    let manifest = repo().join("fixtures/zoo.toml");
    let summary = compile(&tmp.path().join("store"), &tmp.path().join("out"), &manifest, &[]);
    let jobs = jobs_from_inputs(&[manifest], &Default::default()).unwrap();
    assert_eq!(summary.models, jobs.len());
    for job in &jobs {
        check_against_reference(job, &tmp.path().join("out").join(format!("{}.tsr", job.name)));
    }
}

fn check_against_reference(job: &ModelJob, artifact: &Path) {
    let g = load_graph(job).unwrap();
    let art = Artifact::open(artifact).unwrap();
    let mut exe = Executable::load(&art).unwrap();
    // A seed no other test uses: fresh inputs.
    let inputs = random_inputs(&g, 0x5eed_0000 + job.name.len() as u64);
    let want = run_graph(&g, &inputs).unwrap();
    let got = exe.run(&inputs).unwrap();
    assert_eq!(got.len(), want.len(), "{}: output count", job.name);
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_close(&format!("{} output {i}", job.name), a, b, 1e-4);
    }
}

#[test]
fn second_identical_run_executes_nothing_and_artifacts_are_reproducible() {
    let tmp = tempfile::tempdir().unwrap();
    let manifest = write_manifest(
        tmp.path(),
        "zoo.toml",
        "[[entry]]\nmodel = \"mlp3\"\nbatch = 2\n\n[[entry]]\nmodel = \"bert-tiny\"\nseq = 16\n\n[[entry]]\nmodel = \"resnet18\"\nimage = 32\n",
    );
    let (store, out1) = (tmp.path().join("store"), tmp.path().join("out1"));
    let cold = compile(&store, &out1, &manifest, &[]);
    for stage in ["load", "partition", "lower", "compile", "link"] {
        assert!(executions(&cold, stage) > 0, "cold run executed no {stage}");
    }
    let out2 = tmp.path().join("out2");
    let warm = compile(&store, &out2, &manifest, &[]);
    for (stage, st) in &warm.stages {
        assert_eq!(st.executions, 0, "warm run executed {stage}");
        assert!(st.hits > 0, "warm run never looked up {stage}");
    }
    // A different store and output folder give the same bytes.
    let (store3, out3) = (tmp.path().join("elsewhere/store"), tmp.path().join("elsewhere/out"));
    compile(&store3, &out3, &manifest, &[]);
    for a in &cold.artifacts {
        let name = format!("{}.tsr", a.model);
        let first = std::fs::read(out1.join(&name)).unwrap();
        assert_eq!(first, std::fs::read(out2.join(&name)).unwrap(), "{name} differs after a cached rebuild");
        assert_eq!(first, std::fs::read(out3.join(&name)).unwrap(), "{name} differs when built in another store");
    }
}

#[test]
fn a_changed_model_compiles_only_kernels_never_seen_before() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let before = write_manifest(
        tmp.path(),
        "before.toml",
        "[[entry]]\nmodel = \"mlp3\"\n\n[[entry]]\nname = \"bert\"\nmodel = \"bert-tiny\"\nseq = 16\n",
    );
    // The same zoo, except that the BERT entry now runs at sequence length 32.
    let after = write_manifest(
        tmp.path(),
        "after.toml",
        "[[entry]]\nmodel = \"mlp3\"\n\n[[entry]]\nname = \"bert\"\nmodel = \"bert-tiny\"\nseq = 32\n",
    );
    let first = compile(&store, &tmp.path().join("out"), &before, &[]);
    let seen: BTreeSet<_> = first.artifacts.iter().flat_map(|a| a.kernels.iter().cloned()).collect();
    let second = compile(&store, &tmp.path().join("out"), &after, &[]);
    let now: BTreeSet<_> = second.artifacts.iter().flat_map(|a| a.kernels.iter().cloned()).collect();
    let new: BTreeSet<_> = now.difference(&seen).collect();
    assert!(!new.is_empty(), "changing the sequence length must change some kernel");
    assert_eq!(executions(&second, "lower") as usize, new.len(), "lowered kernels beyond the never-seen ones");
    // Only the changed model is re-partitioned, re-compiled and re-linked; mlp3 is all hits.
    assert_eq!(executions(&second, "load"), 1);
    assert_eq!(executions(&second, "partition"), 1);
    assert_eq!(executions(&second, "link"), 1);
}

#[test]
fn every_single_backend_mix_runs_the_same_model() {
    // The same model compiled for the C backend alone and for c + gemm gives matching results.
    let tmp = tempfile::tempdir().unwrap();
    let manifest = write_manifest(tmp.path(), "m.toml", "[[entry]]\nmodel = \"resnet18\"\nimage = 32\n");
    let jobs = jobs_from_inputs(std::slice::from_ref(&manifest), &Default::default()).unwrap();
    for (i, targets) in [vec!["cpu".to_string()], vec!["cpu".to_string(), "cpu -compiler=gemm".to_string()]].iter().enumerate() {
        let out = tmp.path().join(format!("out{i}"));
        let s = compile(&tmp.path().join("store"), &out, &manifest, targets);
        if targets.len() == 2 {
            assert!(s.artifacts[0].partitions_by_backend.contains_key("gemm"), "gemm won no partition of resnet18");
        }
        check_against_reference(&jobs[0], &out.join(format!("{}.tsr", jobs[0].name)));
    }
}

#[test]
fn a_bad_model_fails_alone_with_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("broken.onnx"), b"\x0a\x05trunc").unwrap();
    let manifest = write_manifest(tmp.path(), "m.toml", "[[entry]]\nmodel = \"mlp3\"\n\n[[entry]]\nonnx = \"broken.onnx\"\n");
    let out = tmp.path().join("out");
    let s = compile(&tmp.path().join("store"), &out, &manifest, &[]);
    assert_eq!(s.models, 1);
    assert_eq!(s.failed.len(), 1);
    assert_eq!(s.failed[0].model, "broken");
    assert!(s.failed[0].error.contains("broken.onnx"), "{}", s.failed[0].error);
    assert!(out.join("mlp3-b1.tsr").exists());
}

/// The default path: candidates measured on this machine, searched, compiled; correct, and a rebuild measures
/// nothing again.
#[test]
fn measured_costs_compile_correct_models_and_are_measured_once() {
    let tmp = tempfile::tempdir().unwrap();
    let manifest = write_manifest(tmp.path(), "m.toml", "[[entry]]\nmodel = \"mlp3\"\n\n[[entry]]\nmodel = \"bert-tiny\"\nseq = 16\n");
    let (store, out) = (tmp.path().join("store"), tmp.path().join("out"));
    let cold = compile_with(&store, &out, &manifest, &[], CostMode::Measured);
    assert_eq!(cold.cost_source, "measured");
    assert!(executions(&cold, "tune") > 0);
    for job in &jobs_from_inputs(std::slice::from_ref(&manifest), &Default::default()).unwrap() {
        check_against_reference(job, &out.join(format!("{}.tsr", job.name)));
    }
    let warm = compile_with(&store, &tmp.path().join("out2"), &manifest, &[], CostMode::Measured);
    for (stage, st) in &warm.stages {
        assert_eq!(st.executions, 0, "warm measured run executed {stage}");
    }
}

/// With measured costs over several backends, the searched plan is checked end to end against the plans of
/// each backend alone; the plan used is the one the rule picks from the recorded trials, and the preferred-
/// backend baseline of the same run is exactly one of those trials. Analytical costs validate nothing.
#[test]
fn measured_plans_are_validated_against_single_backend_plans() {
    use tessera::build::Ctx;
    use tessera_stages::build::plan_model;
    use tessera::explain::parse_fixture_spec;
    use tessera_stages::stages::validate::choose;
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(&tmp.path().join("store"), OpenOptions::writable()).unwrap();
    let memo = Memo::new(&store);
    let backends = all_backends();
    let targets = resolve_targets(&[], &backends).unwrap();
    let job = parse_fixture_spec("fixture:bert-tiny:s16").unwrap();

    let ctx = Ctx::new(&memo, &targets, &backends).with_costs(CostMode::Measured);
    let mix = plan_model(&ctx, &job).unwrap().plan;
    let v = mix.validation.as_ref().expect("a measured mix over two backends is validated");
    let labels: Vec<&str> = v.trials.iter().map(|t| t.label.as_str()).collect();
    assert_eq!(labels, ["searched", "gemm", "c alone"]);
    assert_eq!(v.trials[choose(&v.trials)].label, v.chosen);
    for t in &v.trials {
        match (&t.skipped, t.median_us) {
            (None, Some(m)) => assert!(m.is_finite() && m > 0.0 && t.runs >= 7 && t.artifact.is_some(), "{t:?}"),
            (Some(why), None) => assert!(!why.is_empty() && t.runs == 0, "{t:?}"),
            _ => panic!("a trial is either measured or skipped with a reason: {t:?}"),
        }
    }
    let chosen = v.trials.iter().find(|t| t.label == v.chosen).unwrap();
    assert_eq!(mix.partitions.len(), chosen.partitions);

    // The gemm-preferred baseline is the 'gemm' trial's placement.
    let gemm = plan_model(&ctx_with_prefer(&memo, &targets, &backends, "gemm"), &job).unwrap().plan;
    assert!(gemm.validation.is_none(), "baselines are not validated");
    assert_eq!(gemm.partitions.len(), v.trials[1].partitions);
    if v.chosen == "gemm" {
        assert!(mix.same_placement(&gemm));
    }

    let analytical = Ctx::new(&memo, &targets, &backends).with_costs(CostMode::Analytical);
    assert!(plan_model(&analytical, &job).unwrap().plan.validation.is_none());
}

fn ctx_with_prefer<'a>(
    memo: &'a Memo<'a>,
    targets: &'a tessera_stages::target::TargetSet,
    backends: &'a [Box<dyn tessera_stages::backend::Backend>],
    prefer: &str,
) -> tessera::build::Ctx<'a> {
    tessera::build::Ctx::new(memo, targets, backends).with_costs(CostMode::Measured).with_prefer(Some(prefer.to_string()))
}

/// A held-out model whose weights changed (the same graph, every initializer no kernel embeds rewritten)
/// compiles no kernel, tunes nothing and searches no partitioning (the partition stage is keyed by the graph's
/// structure): only the ONNX file's external-data list, load and link run again, the artifact holds the new weights (it matches the reference interpreter on the changed model),
/// and the rebuild costs about what a warm one does. Measured costs, so that the cold build does tune; one
/// backend, so that no plan validation times artifacts (which embed the weights). tests/gpu.rs has the same
/// for GPU targets.
#[test]
fn changed_weights_compile_no_kernel_and_tune_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("bert.onnx");
    std::fs::copy(tessera_tests::bert_tiny_onnx(), &model).unwrap();
    let (store, out) = (tmp.path().join("store"), tmp.path().join("out"));
    // Two backends: validation times whole plans (the time-plans stage), which a weights change must not
    // time again either.
    let targets = ["cpu".to_string(), "cpu -compiler=gemm".to_string()];
    let cold = compile_with(&store, &out, &model, &targets, CostMode::Measured);
    assert!(executions(&cold, "tune") > 0 && executions(&cold, "lower") > 0 && executions(&cold, "compile") > 0, "{:?}", cold.stages);
    assert!(executions(&cold, "time-plans") > 0, "validation timed no plans: {:?}", cold.stages);
    let warm = compile_with(&store, &out, &model, &targets, CostMode::Measured);
    for (stage, st) in &warm.stages {
        assert_eq!(st.executions, 0, "warm run executed {stage}");
    }
    assert!(tessera_tests::change_large_initializers(&tessera_tests::bert_tiny_onnx(), &model) >= 10);
    let changed = compile_with(&store, &out, &model, &targets, CostMode::Measured);
    let ran: BTreeSet<&str> = changed.stages.iter().filter(|(_, s)| s.executions > 0).map(|(n, _)| n.as_str()).collect();
    assert_eq!(ran, BTreeSet::from(["link", "load", "onnx-externals"]), "{:?}", changed.stages);
    // The model's artifact only: validation finds its plans' timings by their identities before linking them.
    assert_eq!(executions(&changed, "link"), 1, "validation linked its trial plans again: {:?}", changed.stages);
    assert_ne!(changed.artifacts[0].digest, cold.artifacts[0].digest, "the weights are in the artifact");
    let job = &jobs_from_inputs(&[model], &Default::default()).unwrap()[0];
    check_against_reference(job, &out.join("bert.tsr"));
    // Bound like a warm rebuild (a loose bound for a shared machine; the figures are in bench/compile_times.md).
    assert!(changed.seconds < 3.0 * warm.seconds + 1.0 && changed.seconds < cold.seconds / 2.0, "cold {:.2} s, warm {:.2} s, changed weights {:.2} s", cold.seconds, warm.seconds, changed.seconds);
}

/// A fine-tune built after its base model (the plan taken from the base's structure, bound to the new weights)
/// gives the same bytes as the fine-tune built cold in an empty store: binding is exactly the plan the search
/// would have made. Analytical costs, so that the cold build's plan is deterministic.
#[test]
fn a_fine_tune_built_after_its_base_gives_the_bytes_of_a_cold_build() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("bert.onnx");
    std::fs::copy(tessera_tests::bert_tiny_onnx(), &model).unwrap();
    let targets = ["cpu".to_string(), "cpu -compiler=gemm".to_string()];
    let (store, out) = (tmp.path().join("store"), tmp.path().join("out"));
    compile_with(&store, &out, &model, &targets, CostMode::Analytical);
    assert!(tessera_tests::change_large_initializers(&tessera_tests::bert_tiny_onnx(), &model) >= 10);
    let after = compile_with(&store, &out, &model, &targets, CostMode::Analytical);
    assert_eq!(executions(&after, "partition"), 0, "{:?}", after.stages);
    let cold = compile_with(&tmp.path().join("cold-store"), &tmp.path().join("cold-out"), &model, &targets, CostMode::Analytical);
    assert!(executions(&cold, "partition") > 0);
    assert_eq!(after.artifacts[0].digest, cold.artifacts[0].digest);
    assert_eq!(std::fs::read(out.join("bert.tsr")).unwrap(), std::fs::read(tmp.path().join("cold-out/bert.tsr")).unwrap());
}
