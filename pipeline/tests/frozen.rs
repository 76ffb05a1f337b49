//! Builds from recorded measurements (`tessera compile --frozen`): nothing is measured, a missing record
//! fails the build with the list of every one missing, and records exported from the machine that measured
//! them rebuild, on another store (another machine), the artifacts that machine built, byte for byte.
//!
//! On the CPU targets here the whole flow runs on one machine; `a_gpu_build_rebuilds_on_the_cpu_from_its_records`
//! does it across machines: the records and artifact digests of a build on the GPU machine are a committed
//! fixture (fixtures/frozen/, recorded by scripts/gpu/record_frozen.sh), and this machine, which has no GPU,
//! rebuilds the same bytes from them.

mod common {
    pub mod cli;
    pub mod onnx;
    pub mod toolchain;
}

use common::cli::{failure, json, ok, tessera};
use common::onnx::{f32_initializer, f32_value, node, write};
use common::toolchain::nvrtc_here;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Executions of `stage` in a `compile --json` summary.
fn executions(summary: &str, stage: &str) -> u64 {
    let v: Value = serde_json::from_str(summary).expect("a JSON summary");
    v["stages"][stage]["executions"].as_u64().unwrap_or(0)
}

/// Model name -> hex artifact digest, from a `compile --json` summary (digests are 64 hex characters in JSON,
/// as scripts/gpu/record_frozen.sh copies them into expected.json).
fn artifact_digests(summary: &str) -> std::collections::BTreeMap<String, String> {
    let v: Value = serde_json::from_str(summary).expect("a JSON summary");
    v["artifacts"]
        .as_array()
        .expect("artifacts")
        .iter()
        .map(|a| {
            let digest = a["digest"].as_str().unwrap_or_else(|| panic!("a digest is a hex string in JSON: {}", a["digest"]));
            assert!(digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()), "{digest}");
            (a["model"].as_str().expect("model").to_string(), digest.to_string())
        })
        .collect()
}

/// `tessera inspect --json` of `out/<model>.tsr` (run in `cwd`).
fn inspect(out: &Path, model: &str, cwd: &Path) -> Value {
    json(&["inspect", out.join(format!("{model}.tsr")).to_str().unwrap(), "--json"], cwd)
}

/// The model file (written by [`write_model`]) and the name of its artifact.
const MODEL: &str = "mixed.onnx";
const NAME: &str = "mixed";

/// A model whose validation always times at least two plans, so that the measured build always records
/// end-to-end timings (time-plans) for the frozen build to need: a tiny MatMul, which the gemm backend takes
/// when preferred, beside an elementwise chain on a larger tensor that only the C backend runs. The 'gemm'
/// plan and 'c alone' then differ in placement, and their estimates differ by the tiny MatMul's cost, far
/// within the factor beyond which 'c alone' is not measured. (mlp3, used before, timed two plans only when
/// the search happened to split it: its 'c alone' estimate is ten times the gemm plan's, and on CI the
/// search chose the gemm plan's placement, so nothing was left to compare.)
fn write_model(dir: &Path) {
    let w: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
    let nodes = vec![
        node("MatMul", "mm", &["x", "w"], "m"),
        node("Relu", "relu", &["m"], "small"),
        node("Tanh", "tanh", &["y"], "t"),
        node("Sigmoid", "sigmoid", &["t"], "s"),
        node("Mul", "mul", &["s", "y"], "large"),
    ];
    let inputs = vec![f32_value("x", &[2, 8]), f32_value("y", &[64, 512])];
    let outputs = vec![f32_value("small", &[2, 8]), f32_value("large", &[64, 512])];
    write(&dir.join(MODEL), nodes, inputs, outputs, vec![f32_initializer("w", &[8, 8], w)]);
}

/// Two targets, so the searched plan is also validated end to end (time-plans records).
const TARGETS: [&str; 4] = ["--target", "cpu -compiler=c", "--target", "cpu -compiler=gemm"];

fn compile(store: &str, out: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["compile", MODEL, "--json", "--store", store, "--out", out].iter().map(|s| s.to_string()).collect();
    a.extend(TARGETS.iter().map(|s| s.to_string()));
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn a_frozen_build_rebuilds_the_measured_artifact_from_exported_records_and_lists_what_is_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    write_model(t);

    // The measuring machine: a measured build, then its measurements exported (no roots, no plans).
    let measured = ok(&args(&compile("a", "out-a", &[])), t);
    assert!(executions(&measured, "tune") > 0 && executions(&measured, "time-plans") > 0, "{measured}");
    let exported = ok(&["store", "export", "--store", "a", "--stage", "tune", "--stage", "time-plans", "records.tar"], t);
    assert!(exported.starts_with("exported 0 root(s)"), "{exported}");

    // An empty store: the frozen build fails, listing every missing tune record with its target and ops.
    let err = failure(&args(&compile("empty", "out-empty", &["--frozen"])), t);
    assert!(err.contains("frozen build:") && err.contains("tune record(s) are not in the store"), "{err}");
    assert!(err.contains("target cpu -compiler=c") && err.contains("target cpu -compiler=gemm") && err.contains("MatMul"), "{err}");

    // Another store with the records imported: the search and validation run again from them (the plan is
    // not in the archive) and build the measured build's bytes, measuring nothing.
    ok(&["store", "import", "--store", "b", "records.tar"], t);
    let frozen = ok(&args(&compile("b", "out-b", &["--frozen"])), t);
    assert_eq!(executions(&frozen, "tune"), 0, "{frozen}");
    assert_eq!(executions(&frozen, "time-plans"), 0, "{frozen}");
    assert_eq!(executions(&frozen, "partition"), 1, "the plan must be searched again from the records: {frozen}");
    // The same payload, byte for byte; the files differ in their provenance only, which says how each was built.
    let (a, b) = (inspect(&t.join("out-a"), NAME, t), inspect(&t.join("out-b"), NAME, t));
    assert_eq!(a["payload_digest"], b["payload_digest"], "the frozen build's artifact differs from the measured build's");
    assert_eq!(artifact_digests(&frozen)[NAME], b["payload_digest"].as_str().unwrap());
    assert_eq!((a["provenance"]["costs"].as_str(), b["provenance"]["costs"].as_str()), (Some("measured"), Some("recorded")));
    let mut same = b["provenance"].clone();
    same["costs"] = a["provenance"]["costs"].clone();
    assert_eq!(same, a["provenance"]);
}

#[test]
fn frozen_options_that_contradict_each_other_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    write_model(t);
    let err = failure(&args(&compile("s", "o", &["--frozen", "--costs", "analytical"])), t);
    assert!(err.contains("--frozen") && err.contains("--costs analytical"), "{err}");
    // Measuring under an assumed GPU would record this machine's times as that GPU's.
    let err = failure(&args(&compile("s", "o", &["--measured-on", "gpu.json"])), t);
    assert!(err.contains("--frozen"), "{err}");
    let err = failure(&args(&compile("s", "o", &["--frozen", "--measured-on", "missing.json"])), t);
    assert!(err.contains("missing.json"), "{err}");
    std::fs::write(t.join("bad.json"), "{\"name\": 3}").unwrap();
    let err = failure(&args(&compile("s", "o", &["--frozen", "--measured-on", "bad.json"])), t);
    assert!(err.contains("bad.json") && err.contains("not a GPU fingerprint"), "{err}");
    // Exporting records of a stage the store never ran names the stage.
    ok(&["compile", MODEL, "--costs", "analytical", "--target", "cpu", "--store", "s", "--out", "o"], t);
    let err = failure(&["store", "export", "--store", "s", "--stage", "tune", "x.tar"], t);
    assert!(err.contains("no records of stage 'tune'"), "{err}");
}

/// The fixture recorded on the GPU machine (see fixtures/frozen/README.md).
fn gpu_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/frozen")
}

#[test]
fn a_gpu_build_rebuilds_on_the_cpu_from_its_records() {
    if !nvrtc_here("the GPU build cannot be rebuilt") {
        return;
    }
    let fixture = gpu_fixture();
    let expected: Value = serde_json::from_str(&std::fs::read_to_string(fixture.join("expected.json")).expect("fixtures/frozen/expected.json")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    ok(&["store", "import", "--store", "s", fixture.join("records.tar").to_str().unwrap()], t);
    let mut a: Vec<String> = vec!["compile".into(), "--json".into(), "--store".into(), "s".into(), "--out".into(), "out".into(), "--frozen".into()];
    a.extend(["--measured-on".into(), fixture.join("gpu.json").to_string_lossy().into_owned()]);
    for target in expected["targets"].as_array().expect("targets") {
        a.extend(["--target".into(), target.as_str().unwrap().to_string()]);
    }
    let models = expected["artifacts"].as_object().expect("artifacts");
    a.extend(expected["inputs"].as_array().expect("inputs").iter().map(|m| m.as_str().unwrap().to_string()));
    let summary = ok(&args(&a), t);
    assert_eq!(executions(&summary, "tune"), 0, "{summary}");
    let built = artifact_digests(&summary);
    assert_eq!(built.len(), models.len(), "{summary}");
    for (model, digest) in models {
        let got = built.get(model.as_str()).unwrap_or_else(|| panic!("{model} was not built: {summary}"));
        assert_eq!(
            got,
            digest.as_str().unwrap(),
            "{model}: the frozen rebuild here differs from the GPU machine's build ({}); a backend, NVRTC or format \
             change since the fixture was recorded also changes the bytes: record it again with scripts/gpu/record_frozen.sh",
            expected["recorded"]
        );
        // The file written is that payload with this build's provenance: the held-out records' build, frozen,
        // for the GPU that measured them, from this tessera.
        let d = inspect(&t.join("out"), model, t);
        assert_eq!(d["payload_digest"], *digest, "{model}");
        let p = &d["provenance"];
        assert_eq!(p["source_revision"], tessera::provenance::SOURCE_REVISION);
        assert_eq!(p["costs"], "recorded", "{model}");
        assert_eq!(p["precision"], "fp16", "{model}");
        let canonical: Vec<String> = expected["targets"].as_array().unwrap().iter().map(|t| canonical_targets(t.as_str().unwrap())).collect();
        let recorded: Vec<&str> = p["targets"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
        assert!(canonical.iter().all(|c| recorded.contains(&c.as_str())), "{model}: {recorded:?} lacks one of {canonical:?}");
        let fingerprint: Value = serde_json::from_str(p["options"]["measured_on"].as_str().expect("measured_on")).unwrap();
        let given: Value = serde_json::from_str(&std::fs::read_to_string(fixture.join("gpu.json")).unwrap()).unwrap();
        assert_eq!(fingerprint, given, "{model}");
        let source = format!("fixture:{}", model.replace('-', ":"));
        assert_eq!(p["source"]["name"], source.as_str(), "{model}");
    }
}

/// The canonical form of one target (every attribute present), as the build records it.
fn canonical_targets(target: &str) -> String {
    tessera_stages::target::Target::parse(target).unwrap().canonical()
}

/// `--frozen` never falls back to estimates: on a machine without the GPU a target names, and without
/// `--measured-on`, every candidate is a missing record, listed, and the build fails (it used to exit 0 with
/// "costs: analytical"). On a GPU machine the empty store has no records either: the same failure.
#[test]
fn a_frozen_gpu_build_without_records_or_fingerprint_fails_instead_of_estimating() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let out = tessera(&["compile", "fixture:mlp3:b2", "--frozen", "--target", "cuda -compiler=cublas", "--store", "s", "--out", "o"], t);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "a frozen build without records succeeded:\n{stdout}\n{stderr}");
    assert!(!stdout.contains("costs: analytical"), "{stdout}");
    assert!(stderr.contains("frozen build:") && stderr.contains("tune record(s) are not in the store"), "{stderr}");
    assert!(stderr.contains("-compiler=cublas") && stderr.contains("MatMul"), "{stderr}");
    assert!(!t.join("o/mlp3-b2.tsr").exists(), "no artifact may be written");
}
