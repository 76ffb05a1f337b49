//! fp16 that says when it cannot hold (issue 31): a model whose values leave fp16's range on the calibration
//! inputs gets those nodes in fp32 (`-overflow=keep-fp32`, the default), shown by `tessera explain`; with
//! `-overflow=error` the build fails naming the node and the value. Through the binary, on the CPU machine
//! (GPU targets plan and explain without a GPU; the artifacts' numbers are checked on the GPU machine by
//! scripts/gpu/beyond_zoo.py).

mod common {
    pub mod cli;
    pub mod onnx;
}

use common::cli::{failure, json};
use common::onnx::{f32_initializer, f32_value, node, write};

/// x (1x64) * 1e5 -> * 1e-5 -> MatMul (64x16) -> y: the first product reaches ~1e5, beyond fp16's 65504.
fn overflowing_model(path: &std::path::Path) {
    write(
        path,
        vec![node("Mul", "scale_up", &["x", "up"], "big"), node("Mul", "scale_down", &["big", "down"], "small"), node("MatMul", "mm", &["small", "w"], "y")],
        vec![f32_value("x", &[1, 64])],
        vec![f32_value("y", &[1, 16])],
        vec![
            f32_initializer("up", &[64], vec![1e5; 64]),
            f32_initializer("down", &[64], vec![1e-5; 64]),
            f32_initializer("w", &[64, 16], (0..64 * 16).map(|i| ((i % 7) as f32 - 3.0) * 0.05).collect()),
        ],
    );
}

#[test]
fn nodes_beyond_fp16_stay_fp32_and_explain_says_why() {
    let t = tempfile::tempdir().unwrap();
    overflowing_model(&t.path().join("m.onnx"));
    let ex = json(&["explain", "m.onnx", "--target", "cuda -precision=fp16", "--costs", "analytical", "--store", "s", "--json"], t.path());
    let kept: Vec<(String, f64)> = ex["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["kept_fp32"].as_array().cloned().unwrap_or_default())
        .map(|k| (k["name"].as_str().unwrap().to_string(), k["max_abs"].as_f64().unwrap()))
        .collect();
    let names: Vec<&str> = kept.iter().map(|(n, _)| n.as_str()).collect();
    // scale_up writes the big value and scale_down reads it; mm sees only values in range.
    assert_eq!(names, ["scale_up", "scale_down"], "{ex}");
    assert!(kept.iter().all(|(_, m)| *m > 65504.0), "{kept:?}");
    // fp32 builds calibrate nothing and keep nothing.
    let ex32 = json(&["explain", "m.onnx", "--target", "cuda", "--costs", "analytical", "--store", "s", "--json"], t.path());
    assert!(ex32["partitions"].as_array().unwrap().iter().all(|p| p.get("kept_fp32").is_none()), "{ex32}");
}

#[test]
fn overflow_error_names_the_node_and_the_value() {
    let t = tempfile::tempdir().unwrap();
    overflowing_model(&t.path().join("m.onnx"));
    let err = failure(&["compile", "m.onnx", "--target", "cuda -precision=fp16 -overflow=error", "--costs", "analytical", "--store", "s", "--out", "o"], t.path());
    assert!(err.contains("scale_up") && err.contains("leave fp16's range") && err.contains("-overflow=keep-fp32"), "{err}");
    // A bad policy is refused with the values it takes.
    let err = failure(&["compile", "m.onnx", "--target", "cuda -precision=fp16 -overflow=wrap", "--costs", "analytical", "--store", "s", "--out", "o"], t.path());
    assert!(err.contains("-overflow") && err.contains("keep-fp32"), "{err}");
}

/// The kept nodes of an explain report: (name, type they compute in).
fn kept_of(ex: &serde_json::Value) -> Vec<(String, String)> {
    ex["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["kept_fp32"].as_array().cloned().unwrap_or_default())
        .map(|k| (k["name"].as_str().unwrap().to_string(), k["dtype"].as_str().unwrap().to_string()))
        .collect()
}

/// `-overflow=bf16` keeps the same nodes as keep-fp32, computing them in bf16, and explain says so; a
/// `-precision=bf16` build has fp32's range, so it keeps (and calibrates) nothing.
#[test]
fn overflow_bf16_keeps_the_nodes_in_bf16_and_bf16_builds_keep_none() {
    let t = tempfile::tempdir().unwrap();
    overflowing_model(&t.path().join("m.onnx"));
    let args = |target: &'static str| ["explain", "m.onnx", "--target", target, "--costs", "analytical", "--store", "s", "--json"];
    let kept = kept_of(&json(&args("cuda -precision=fp16 -overflow=bf16"), t.path()));
    assert_eq!(kept, [("scale_up".to_string(), "bf16".to_string()), ("scale_down".to_string(), "bf16".to_string())]);
    let kept32 = kept_of(&json(&args("cuda -precision=fp16"), t.path()));
    assert!(kept32.iter().all(|(_, d)| d == "f32") && kept32.len() == 2, "{kept32:?}");
    let text = common::cli::ok(&["explain", "m.onnx", "--target", "cuda -precision=fp16 -overflow=bf16", "--costs", "analytical", "--store", "s"], t.path());
    assert!(text.contains("in bf16, beyond fp16's range on the calibration inputs: scale_up"), "{text}");
    let ex = json(&args("cuda -precision=bf16"), t.path());
    assert!(kept_of(&ex).is_empty(), "{ex}");
    // bf16 is a GPU precision: the CPU targets have no such attribute, and an fp16 set cannot mix it in.
    let err = failure(&["compile", "m.onnx", "--target", "cpu -precision=bf16", "--costs", "analytical", "--store", "s", "--out", "o"], t.path());
    assert!(err.contains("precision"), "{err}");
    let err = failure(&["compile", "m.onnx", "--target", "cuda -precision=bf16", "--target", "cuda -compiler=cublas -precision=fp16", "--costs", "analytical", "--store", "s", "--out", "o"], t.path());
    assert!(err.contains("different precisions"), "{err}");
}
