//! `tessera inspect`: what an artifact holds, through the binary, in text and JSON, against the artifact itself.

use std::process::{Command, Stdio};

fn tessera() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tessera"));
    c.env_remove("TESSERA_STORE").env_remove("TESSERA_REMOTE").stdin(Stdio::null());
    c
}

#[test]
fn inspect_describes_what_the_artifact_holds() {
    let t = tempfile::tempdir().unwrap();
    let (store, out) = (t.path().join("s"), t.path().join("out"));
    let ok = tessera()
        .args(["compile", "fixture:mlp3:b1", "--target", "cpu", "--target", "cpu -compiler=gemm", "--costs", "analytical", "-q"])
        .arg("--store")
        .arg(&store)
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(ok.success());
    let path = out.join("mlp3-b1.tsr");
    let a = tessera_kernels::artifact::Artifact::open(&path).unwrap();

    let json = tessera().arg("inspect").arg(&path).arg("--json").output().unwrap();
    assert!(json.status.success(), "{}", String::from_utf8_lossy(&json.stderr));
    let d: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(d["model"], "mlp3-b1");
    assert_eq!(d["blake3"].as_str().unwrap(), blake3::hash(&std::fs::read(&path).unwrap()).to_hex().as_str());
    let backends: Vec<&str> = d["modules"].as_array().unwrap().iter().map(|m| m["backend"].as_str().unwrap()).collect();
    assert_eq!(backends, a.body.modules.iter().map(|m| m.backend.as_str()).collect::<Vec<_>>());
    assert_eq!(d["steps"].as_u64().unwrap() as usize, a.body.steps.len());
    let per: u64 = d["steps_per_backend"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(per as usize, a.body.steps.len());
    assert_eq!(d["inputs"][0]["name"].as_str().unwrap(), a.body.inputs[0].name);
    assert_eq!(d["constants"].as_u64().unwrap() as usize, a.body.constants.len());

    let text = tessera().arg("inspect").arg(&path).output().unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("model mlp3-b1") && text.contains("inputs:") && text.contains("modules (") && text.contains("steps:"), "{text}");
    for m in &a.body.modules {
        assert!(text.contains(&m.target), "{text}");
    }

    // Not an artifact: a clear error naming the file, no panic.
    let bad = t.path().join("bad.tsr");
    std::fs::write(&bad, b"not an artifact").unwrap();
    let e = tessera().arg("inspect").arg(&bad).output().unwrap();
    let stderr = String::from_utf8_lossy(&e.stderr);
    assert!(!e.status.success() && stderr.contains("bad.tsr") && !stderr.contains("panicked"), "{stderr}");
}
