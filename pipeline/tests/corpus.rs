//! The corpus of real exports (fixtures/corpus/: Hugging Face and torchvision transformers exported by both of
//! PyTorch's exporters, with ONNX Runtime's outputs), end to end through the binary:
//! - planned for the default GPU set (`cuda` + `cublas` + `cudnn`, fp16, analytical costs: no GPU needed),
//!   every attention layer is one `Attention` node in one partition of the `cuda` backend, and no `Softmax`
//!   is planned anywhere;
//! - compiled for the CPU (`c` + `gemm`) as one manifest, every artifact gives ONNX Runtime's outputs on the
//!   recorded inputs (relative error below 1e-4).

mod common {
    pub mod cli;
    pub mod toolchain;
}

use common::toolchain::nvrtc_here;
use std::path::{Path, PathBuf};
use tessera_stages::npy;

/// The standard output of `tessera args`, which must succeed.
fn tessera(args: &[&str]) -> String {
    common::cli::ok(args, Path::new(env!("CARGO_MANIFEST_DIR")))
}

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/corpus")
}

/// The exports (name, attention layers) the manifest records as accepted by their exporter.
fn exports() -> Vec<(String, usize)> {
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(corpus().join("manifest.json")).unwrap()).unwrap();
    m["models"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["status"] == "ok")
        .map(|r| (r["name"].as_str().unwrap().to_string(), r["attention_layers"].as_u64().unwrap() as usize))
        .collect()
}

#[test]
fn gpu_plans_run_every_attention_layer_as_one_fused_kernel() {
    if !nvrtc_here("the GPU plans cannot be made") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let mut failed = Vec::new();
    for (name, layers) in exports() {
        let model = corpus().join(&name).join("model.onnx");
        let text = tessera(&[
            "explain",
            model.to_str().unwrap(),
            "--costs",
            "analytical",
            "--target",
            "cuda -precision=fp16",
            "--target",
            "cuda -compiler=cublas -precision=fp16",
            "--target",
            "cuda -compiler=cudnn -precision=fp16",
            "--json",
            "--store",
            store.to_str().unwrap(),
        ]);
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let (mut fused, mut softmax, mut elsewhere) = (0, 0, Vec::new());
        for p in json["partitions"].as_array().unwrap() {
            let backend = p["backend"].as_str().unwrap();
            for n in p["nodes"].as_array().unwrap() {
                match n["op"].as_str().unwrap() {
                    "Attention" if backend == "cuda" => fused += 1,
                    "Attention" => elsewhere.push(backend.to_string()),
                    "Softmax" => softmax += 1,
                    _ => {}
                }
            }
        }
        eprintln!("{name:32} attention on cuda {fused}/{layers}, elsewhere {elsewhere:?}, softmax {softmax}");
        if fused != layers || softmax != 0 || !elsewhere.is_empty() {
            failed.push(format!("{name}: {fused} of {layers} attention layers fused on cuda, others on {elsewhere:?}, {softmax} Softmax"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    if got.len() != want.len() || got.iter().chain(want).any(|x| x.is_nan()) {
        return f64::INFINITY;
    }
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
    got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / scale
}

#[test]
fn cpu_artifacts_give_onnx_runtimes_outputs() {
    let d = tempfile::tempdir().unwrap();
    let (store, out) = (d.path().join("store"), d.path().join("out"));
    let manifest = corpus().join("corpus.toml");
    tessera(&["compile", manifest.to_str().unwrap(), "--target", "cpu", "--store", store.to_str().unwrap(), "--out", out.to_str().unwrap(), "-q"]);
    let mut failed = Vec::new();
    for (name, _) in exports() {
        let dir = corpus().join(&name);
        let mut args: Vec<String> = vec!["run".into(), out.join(format!("{name}.tsr")).to_str().unwrap().into()];
        for e in std::fs::read_dir(dir.join("inputs")).unwrap() {
            let p = e.unwrap().path();
            args.push("--input".into());
            args.push(format!("{}={}", p.file_stem().unwrap().to_str().unwrap(), p.display()));
        }
        let got_dir = d.path().join("got").join(&name);
        args.extend(["--out".into(), got_dir.to_str().unwrap().into(), "-q".into()]);
        tessera(&args.iter().map(String::as_str).collect::<Vec<_>>());
        for e in std::fs::read_dir(dir.join("expected")).unwrap() {
            let want_path = e.unwrap().path();
            let want = npy::read(&want_path).unwrap();
            let got = npy::read(&got_dir.join(want_path.file_name().unwrap())).unwrap_or_else(|e| panic!("{name}: {e}"));
            let err = if got.shape() == want.shape() { rel_err(&got.to_f64_vec(), &want.to_f64_vec()) } else { f64::INFINITY };
            eprintln!("{name:32} {}: relative error {err:e}", want_path.display());
            if !(err < 1e-4) {
                failed.push(format!("{name}: {} relative error {err:e} against ONNX Runtime", want_path.display()));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
