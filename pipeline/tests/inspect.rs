//! `tessera inspect` and `tessera explain ARTIFACT`: what an artifact holds and how it was built, through the
//! binary, in text and JSON, against the artifact itself and the build's own summary.

mod common {
    pub mod cli;
}

use common::cli::{failure, json, ok, tessera};
use serde_json::Value;
use std::path::{Path, PathBuf};
use tessera_kernels::artifact::Artifact;

const TARGETS: [&str; 4] = ["--target", "cpu", "--target", "cpu -compiler=gemm"];

/// Compiles `model` with analytical costs into `out` (store `s`) in `t`; returns the summary's artifact row.
fn compile(t: &Path, model: &str, out: &str, extra: &[&str]) -> Value {
    let mut a = vec!["compile", model, "--costs", "analytical", "--store", "s", "--out", out, "--json", "-q"];
    a.extend(TARGETS);
    a.extend(extra);
    json(&a, t)["artifacts"][0].clone()
}

fn onnx_model(t: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../stages/src/onnx/testdata/mlp_erf_gelu_opset17.onnx");
    let dst = t.join("mlp.onnx");
    std::fs::copy(src, &dst).unwrap();
    dst
}

#[test]
fn inspect_describes_what_the_artifact_holds_and_how_it_was_built() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let row = compile(t, "fixture:mlp3:b1", "out", &[]);
    let path = t.join("out/mlp3-b1.tsr");
    let bytes = std::fs::read(&path).unwrap();
    let a = Artifact::read(&bytes).unwrap();
    assert_eq!(row["bytes"].as_u64().unwrap() as usize, bytes.len(), "the summary gives the file's size");

    let d = json(&["inspect", path.to_str().unwrap(), "--json"], t);
    assert_eq!(d["model"], "mlp3-b1");
    assert_eq!(d["blake3"].as_str().unwrap(), blake3::hash(&bytes).to_hex().as_str());
    // The payload digest is the build's (the store's object); the file, with its provenance, hashes otherwise.
    assert_eq!(d["payload_digest"], row["digest"]);
    assert_ne!(d["payload_digest"], d["blake3"]);

    // Provenance: this tessera, the fixture's spec and recipe digest, the canonical targets, fp32, analytical.
    let p = &d["provenance"];
    assert_eq!(p["tessera_version"], tessera::provenance::VERSION);
    assert_eq!(p["source_revision"], tessera::provenance::SOURCE_REVISION);
    let origin = tessera::provenance::ModelOrigin::of(&tessera::explain::parse_fixture_spec("fixture:mlp3:b1").unwrap(), None).unwrap();
    assert_eq!((p["source"]["kind"].as_str(), p["source"]["name"].as_str()), (Some("fixture"), Some("fixture:mlp3:b1")));
    assert_eq!(p["source"]["digest"].as_str().unwrap(), origin.source.digest.to_hex());
    let targets: Vec<String> = a.body.modules.iter().map(|m| m.target.clone()).collect();
    assert_eq!(p["targets"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect::<Vec<_>>(), targets, "canonical, in set order");
    assert_eq!((p["precision"].as_str(), p["costs"].as_str()), (Some("fp32"), Some("analytical")));
    assert_eq!(p["options"], serde_json::json!({}));

    // Inputs and outputs with dtypes and shapes; partitions with backends and kernels; constants by digest.
    assert_eq!(d["inputs"][0]["name"].as_str().unwrap(), a.body.inputs[0].name);
    assert_eq!(d["inputs"][0]["dtype"], "f32");
    assert_eq!(d["inputs"][0]["shape"], serde_json::json!(a.body.inputs[0].ty.shape));
    let kernels: Vec<(String, String)> = a
        .body
        .steps
        .iter()
        .map(|s| {
            let m = &a.body.modules[s.module as usize];
            (m.backend.clone(), m.functions[s.function as usize].symbol.clone())
        })
        .collect();
    let shown: Vec<(String, String)> =
        d["partitions"].as_array().unwrap().iter().map(|p| (p["backend"].as_str().unwrap().to_string(), p["kernel"].as_str().unwrap().to_string())).collect();
    assert_eq!(shown, kernels);
    assert_eq!(d["steps"].as_u64().unwrap() as usize, a.body.steps.len());
    let digests: Vec<String> = a.body.constants.iter().map(|c| c.digest.iter().map(|b| format!("{b:02x}")).collect()).collect();
    let shown: Vec<&str> = d["constants"].as_array().unwrap().iter().map(|c| c["digest"].as_str().unwrap()).collect();
    assert_eq!(shown, digests);
    let weights: u64 = a.body.constants.iter().map(|c| c.ty.size_bytes() as u64).sum();
    assert_eq!(d["constant_bytes"].as_u64().unwrap(), weights);

    let text = ok(&["inspect", path.to_str().unwrap()], t);
    for want in ["model mlp3-b1", "provenance:", "source     fixture fixture:mlp3:b1", "costs      analytical", "partitions (2):", "constants (", &digests[0]] {
        assert!(text.contains(want), "{want}: {text}");
    }
    for m in &a.body.modules {
        assert!(text.contains(&m.target), "{text}");
    }
    for (_, k) in &kernels {
        assert!(text.contains(k.as_str()), "{text}");
    }
}

#[test]
fn an_onnx_build_records_the_file_digest_and_its_shapes_and_the_payload_does_not_depend_on_them() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let model = onnx_model(t);
    let plain = compile(t, model.to_str().unwrap(), "a", &[]);
    // The same (static) shape given explicitly: a build option, recorded; the payload is the same.
    let shaped = compile(t, model.to_str().unwrap(), "b", &["--shape", "x0=2x5x16"]);
    assert_eq!(plain["digest"], shaped["digest"]);
    let a = json(&["inspect", "a/mlp.tsr", "--json"], t);
    let b = json(&["inspect", "b/mlp.tsr", "--json"], t);
    assert_eq!(a["payload_digest"], b["payload_digest"]);
    assert_ne!(a["blake3"], b["blake3"], "the provenance differs");
    let source = &b["provenance"]["source"];
    assert_eq!((source["kind"].as_str(), source["name"].as_str()), (Some("onnx"), Some("mlp.onnx")), "the file's name, no folder");
    assert_eq!(source["digest"].as_str().unwrap(), blake3::hash(&std::fs::read(&model).unwrap()).to_hex().as_str());
    assert_eq!(a["provenance"]["options"], serde_json::json!({}));
    assert_eq!(b["provenance"]["options"], serde_json::json!({"shape.x0": "2x5x16"}));
    // Rebuilding an unchanged model rewrites nothing; a build with other options rewrites the file.
    let before = std::fs::metadata(t.join("b/mlp.tsr")).unwrap().modified().unwrap();
    compile(t, model.to_str().unwrap(), "b", &["--shape", "x0=2x5x16"]);
    assert_eq!(std::fs::metadata(t.join("b/mlp.tsr")).unwrap().modified().unwrap(), before);
    compile(t, model.to_str().unwrap(), "b", &[]);
    assert_eq!(json(&["inspect", "b/mlp.tsr", "--json"], t)["blake3"], a["blake3"]);
}

#[test]
fn artifacts_without_provenance_and_damaged_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    compile(t, "fixture:mlp3:b1", "out", &[]);
    let bytes = std::fs::read(t.join("out/mlp3-b1.tsr")).unwrap();
    let payload_len = Artifact::read(&bytes).unwrap().payload_len();

    // As the linker wrote it, or an artifact from before provenance: it reads, and says it records none.
    let mut payload = bytes[..payload_len].to_vec();
    payload[12] = 0;
    std::fs::write(t.join("old.tsr"), &payload).unwrap();
    let d = json(&["inspect", "old.tsr", "--json"], t);
    assert_eq!(d["provenance"], Value::Null);
    assert_eq!(d["payload_digest"], d["blake3"]);
    assert!(ok(&["inspect", "old.tsr"], t).contains("provenance: not recorded"));
    let e = json(&["explain", "old.tsr", "--json"], t);
    assert_eq!((&e["provenance"], &e["explain_source"]), (&Value::Null, &Value::Null));

    // Damaged: clear errors naming the file and what is wrong, no panic.
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("bad.tsr", b"not an artifact".to_vec(), "bad magic"),
        ("cut.tsr", bytes[..payload_len].to_vec(), "provenance section: the header announces one"),
        ("short.tsr", bytes[..bytes.len() - 5].to_vec(), "provenance section:"),
        ("flipped.tsr", { let mut b = bytes.clone(); *b.last_mut().unwrap() ^= 1; b }, "provenance section: digest mismatch"),
    ];
    for (file, content, want) in cases {
        std::fs::write(t.join(file), content).unwrap();
        for cmd in ["inspect", "explain"] {
            let err = failure(&[cmd, file], t);
            assert!(err.contains(file) && err.contains(want) && !err.contains("panicked"), "{cmd} {file}: {err}");
        }
        let run = failure(&["run", file, "--out", "o"], t);
        assert!(run.contains(file) && run.contains(want), "run {file}: {run}");
    }
}

#[test]
fn explain_accepts_an_artifact_and_says_what_it_records() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    compile(t, "fixture:mlp3:b1", "out", &[]);
    let inspected = json(&["inspect", "out/mlp3-b1.tsr", "--json"], t);
    let e = json(&["explain", "out/mlp3-b1.tsr", "--json"], t);
    assert_eq!(e["model"], "mlp3-b1");
    assert_eq!(e["provenance"], inspected["provenance"]);
    assert_eq!(e["partitions"], inspected["partitions"]);
    assert_eq!(e["partitions_by_backend"], inspected["steps_per_backend"]);
    assert!(e["not_recorded"].as_str().unwrap().contains("costs"));

    // The command it gives explains the source model from the store that built it: the same partitions.
    let command = e["explain_source"].as_str().unwrap();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("{} --store s --json", command.replacen("tessera", &format!("'{}'", env!("CARGO_BIN_EXE_tessera")), 1)))
        .current_dir(t)
        .output()
        .unwrap();
    assert!(out.status.success(), "{command}: {}", String::from_utf8_lossy(&out.stderr));
    let source: Value = serde_json::from_slice(&out.stdout).unwrap();
    let backends: Vec<&str> = source["partitions"].as_array().unwrap().iter().map(|p| p["backend"].as_str().unwrap()).collect();
    let recorded: Vec<&str> = e["partitions"].as_array().unwrap().iter().map(|p| p["backend"].as_str().unwrap()).collect();
    assert_eq!(backends, recorded, "{command}");

    let text = ok(&["explain", "out/mlp3-b1.tsr"], t);
    assert!(text.contains("partitions, in execution order:") && text.contains("provenance:") && text.contains(command), "{text}");
    // Options that build a model do not apply to an artifact.
    let err = failure(&["explain", "out/mlp3-b1.tsr", "--target", "cpu"], t);
    assert!(err.contains("--target does not apply to a compiled artifact"), "{err}");
    assert!(!tessera(&["explain", "missing.tsr"], t).status.success());
}
