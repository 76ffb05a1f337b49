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

/// x (1x64) * 250 * 250 -> * 1.6e-5 -> MatMul -> y: constants in fp16's range, the second product at
/// 62500|x|, beyond the range for random inputs (|x| < 1) and inside it for |x| up to 0.5.
fn input_scaled_model(path: &std::path::Path) {
    write(
        path,
        vec![
            node("Mul", "scale_a", &["x", "k"], "a"),
            node("Mul", "scale_b", &["a", "k"], "big"),
            node("Mul", "scale_down", &["big", "down"], "small"),
            node("MatMul", "mm", &["small", "w"], "y"),
        ],
        vec![f32_value("x", &[1, 64])],
        vec![f32_value("y", &[1, 16])],
        vec![
            f32_initializer("k", &[64], vec![250.0; 64]),
            f32_initializer("down", &[64], vec![1.6e-5; 64]),
            f32_initializer("w", &[64, 16], (0..64 * 16).map(|i| ((i % 7) as f32 - 3.0) * 0.05).collect()),
        ],
    );
}

/// Writes one calibration sample: `x.npy` filled with `value`.
fn sample(dir: &std::path::Path, value: f32) {
    std::fs::create_dir_all(dir).unwrap();
    let x = tessera_stages::ir::Tensor::from_f32([1, 64], &[value; 64]);
    tessera_stages::npy::write(&dir.join("x.npy"), &x).unwrap();
}

/// `--calibration DIR`: the user's inputs replace the random ones. Random inputs take the model's values
/// beyond fp16's range; inputs of 0.1 keep them in it (6250), so nothing is kept and `-overflow=error` builds;
/// a second sample of 2.0 (125000) keeps the nodes again; `DIR/<model>/` is that model's own; a missing input, a wrong shape and a stray file are
/// refused, naming the file.
#[test]
fn user_calibration_inputs_replace_the_random_ones() {
    let t = tempfile::tempdir().unwrap();
    input_scaled_model(&t.path().join("m.onnx"));
    let explain = |cal: &str| json(&["explain", "m.onnx", "--target", "cuda -precision=fp16", "--costs", "analytical", "--store", "s", "--json", "--calibration", cal], t.path());
    let random = kept_of(&json(&["explain", "m.onnx", "--target", "cuda -precision=fp16", "--costs", "analytical", "--store", "s", "--json"], t.path()));
    assert_eq!(random.into_iter().map(|(n, _)| n).collect::<Vec<_>>(), ["scale_b", "scale_down"], "random inputs leave the range");
    sample(&t.path().join("small"), 0.1);
    assert!(kept_of(&explain("small")).is_empty(), "inputs of 0.1 stay in range");
    common::cli::ok(&["compile", "m.onnx", "--target", "cuda -precision=fp16 -overflow=error", "--costs", "analytical", "--store", "s", "--out", "o", "--calibration", "small"], t.path());
    // Two samples, one per subdirectory: the larger one decides.
    sample(&t.path().join("two/a"), 0.1);
    sample(&t.path().join("two/b"), 2.0);
    let names: Vec<String> = kept_of(&explain("two")).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["scale_b", "scale_down"]);
    // A model's own directory wins over the shared one.
    sample(&t.path().join("shared"), 2.0);
    sample(&t.path().join("shared/m"), 0.1);
    assert!(kept_of(&explain("shared")).is_empty(), "shared/m is the model's own");
    // Bad samples are named.
    std::fs::create_dir_all(t.path().join("empty")).unwrap();
    let err = failure(&["explain", "m.onnx", "--target", "cuda -precision=fp16", "--costs", "analytical", "--store", "s", "--calibration", "empty"], t.path());
    assert!(err.contains("no .npy files"), "{err}");
    let wrong = t.path().join("wrong");
    std::fs::create_dir_all(&wrong).unwrap();
    tessera_stages::npy::write(&wrong.join("x.npy"), &tessera_stages::ir::Tensor::from_f32([1, 8], &[0.1; 8])).unwrap();
    let err = failure(&["explain", "m.onnx", "--target", "cuda -precision=fp16", "--costs", "analytical", "--store", "s", "--calibration", "wrong"], t.path());
    assert!(err.contains("x.npy") && err.contains("shape"), "{err}");
    sample(&t.path().join("stray"), 0.1);
    std::fs::copy(t.path().join("stray/x.npy"), t.path().join("stray/mask.npy")).unwrap();
    let err = failure(&["explain", "m.onnx", "--target", "cuda -precision=fp16", "--costs", "analytical", "--store", "s", "--calibration", "stray"], t.path());
    assert!(err.contains("mask.npy") && err.contains("names no input"), "{err}");
    let missing = t.path().join("missing");
    std::fs::create_dir_all(&missing).unwrap();
    std::fs::copy(t.path().join("stray/x.npy"), missing.join("y.npy")).unwrap();
    let err = failure(&["explain", "m.onnx", "--target", "cuda -precision=fp16", "--costs", "analytical", "--store", "s", "--calibration", "missing"], t.path());
    assert!(err.contains("no file x.npy for input 'x'"), "{err}");
    let err = failure(&["explain", "m.onnx", "--target", "cuda -precision=fp16", "--costs", "analytical", "--store", "s", "--calibration", "nowhere"], t.path());
    assert!(err.contains("nowhere") && err.contains("not a directory"), "{err}");
}
