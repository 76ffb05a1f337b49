//! Batched artifacts through the `tessera` binary (issue 30 item 4): `compile --batch 1,8` writes one
//! artifact holding a plan per batch size with the weights stored once (well below the two single artifacts
//! together); `inspect` lists both plans; `run` serves batch 1, 3, 5 and 8 from it (3 and 5 padded onto the
//! 8-plan), each matching the reference interpreter on the model built at that batch; an ONNX file's batch
//! is the leading dimension of its `--shape` inputs; bad batch sizes are refused with errors naming them.

mod common {
    pub mod cli;
    pub mod onnx;
}

use common::cli::{failure, json, ok};
use serde_json::Value;
use std::path::Path;
use tessera::job::load_graph;
use tessera::explain::parse_fixture_spec;
use tessera_stages::interp::{random_inputs, run_graph};
use tessera_stages::ir::Tensor;
use tessera_stages::npy;

const TARGETS: [&str; 4] = ["--target", "cpu", "--target", "cpu -compiler=gemm"];

/// `tessera compile MODEL EXTRA.. --json` (analytical costs, store `s`, into `out`); the summary's artifact rows.
fn compile(t: &Path, model: &str, extra: &[&str]) -> Vec<Value> {
    let mut a = vec!["compile", model, "--costs", "analytical", "--store", "s", "--out", "out", "--json", "-q"];
    a.extend(TARGETS);
    a.extend(extra);
    json(&a, t)["artifacts"].as_array().unwrap().clone()
}

/// fp32: relative error below 1e-4 (of the largest magnitude), NaN never.
fn close(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.ty, want.ty, "{what}");
    let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
    let scale = w.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() / scale < 1e-4, "{what}[{i}]: {a} vs {b}");
    }
}

#[test]
fn one_artifact_serves_batch_1_to_8_with_the_weights_once() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let rows = compile(t, "fixture:mlp3", &["--batch", "1,8"]);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["model"], "mlp3-b1_8");
    let plans: Vec<u64> = rows[0]["plans"].as_array().unwrap().iter().map(|p| p["batch"].as_u64().unwrap()).collect();
    assert_eq!(plans, [1, 8]);
    let batched = rows[0]["bytes"].as_u64().unwrap();
    let single = |spec: &str| compile(t, spec, &[])[0]["bytes"].as_u64().unwrap();
    let (b1, b8) = (single("fixture:mlp3:b1"), single("fixture:mlp3:b8"));
    // mlp3's weights are 535,818 f32 (2.1 MB): stored once, the joined file is about one weight set smaller.
    let weights = 535_818 * 4;
    println!("artifact bytes: mlp3-b1 {b1}, mlp3-b8 {b8}, mlp3-b1_8 {batched} (sum of singles {})", b1 + b8);
    assert!(batched + weights * 9 / 10 < b1 + b8, "batched {batched} vs {b1} + {b8}");
    assert!(batched > b8, "both plans' code is in it");

    let path = t.join("out/mlp3-b1_8.tsr");
    let d = json(&["inspect", path.to_str().unwrap(), "--json"], t);
    assert_eq!(d["batches"], serde_json::json!([1, 8]));
    let plan_inputs: Vec<&Value> = d["plans"].as_array().unwrap().iter().map(|p| &p["inputs"][0]["shape"]).collect();
    assert_eq!(plan_inputs, [&serde_json::json!([1, 784]), &serde_json::json!([8, 784])]);
    assert_eq!(d["provenance"]["options"]["batch"], "1,8");
    let constant_bytes = d["constant_bytes"].as_u64().unwrap();
    assert!(constant_bytes >= weights as u64 * 9 / 10 && constant_bytes <= weights as u64, "{constant_bytes}");
    let text = ok(&["inspect", path.to_str().unwrap()], t);
    assert!(text.contains("plans (2): batch sizes 1, 8") && text.contains("batch 8 ") && text.contains("input f32[8x784]"), "{text}");
    let text = ok(&["explain", path.to_str().unwrap()], t);
    assert!(text.contains("plans for batch sizes 1, 8: the partitions below are the first plan's (batch 1)"), "{text}");

    // Drawn inputs at batch N are the reference interpreter's for the model built at N (same seed).
    for batch in [1usize, 3, 8] {
        let out = t.join(format!("run{batch}"));
        let seed = 40 + batch as u64;
        ok(&["run", path.to_str().unwrap(), "--batch", &batch.to_string(), "--seed", &seed.to_string(), "--out", out.to_str().unwrap()], t);
        let g = load_graph(&parse_fixture_spec(&format!("fixture:mlp3:b{batch}")).unwrap()).unwrap();
        let inputs = random_inputs(&g, seed);
        assert_eq!(npy::read(&out.join("input.npy")).unwrap(), inputs[0], "batch {batch}: drawn input");
        let want = run_graph(&g, &inputs).unwrap();
        close(&format!("batch {batch}"), &npy::read(&out.join("logits.npy")).unwrap(), &want[0]);
    }
    // An input given at batch 5: its rows decide the plan (8, padded).
    let g = load_graph(&parse_fixture_spec("fixture:mlp3:b5").unwrap()).unwrap();
    let inputs = random_inputs(&g, 77);
    let x = t.join("x5.npy");
    npy::write(&x, &inputs[0]).unwrap();
    let out = t.join("run5");
    ok(&["run", path.to_str().unwrap(), "--input", &format!("input={}", x.display()), "--out", out.to_str().unwrap()], t);
    close("batch 5", &npy::read(&out.join("logits.npy")).unwrap(), &run_graph(&g, &inputs).unwrap()[0]);

    let e = failure(&["run", path.to_str().unwrap(), "--batch", "9", "--out", "o9"], t);
    assert!(e.contains("batch 9") && e.contains("1, 8"), "{e}");
    let e = failure(&["run", t.join("out/mlp3-b8.tsr").to_str().unwrap(), "--batch", "3", "--out", "o3"], t);
    assert!(e.contains("holds one plan"), "{e}");
}

#[test]
fn bad_batch_sizes_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let compile_err = |args: &[&str]| {
        let mut a = vec!["compile", "--costs", "analytical", "--store", "s", "--out", "out", "--target", "cpu"];
        a.extend(args);
        failure(&a, t)
    };
    assert!(compile_err(&["fixture:mlp3", "--batch", "1,1"]).contains("1 is given twice"));
    assert!(compile_err(&["fixture:mlp3", "--batch", "0,4"]).contains("at least 1, got 0"));
    assert!(compile_err(&["fixture:mlp3", "--batch", "8-2"]).contains("'8-2'"));
    assert!(compile_err(&["fixture:mlp3:b2", "--batch", "1,8"]).contains("give them in one place"));
    // An ONNX file's batch is the leading dimension of the inputs --shape gives: none given, or disagreeing.
    let m = t.join("two.onnx");
    use common::onnx::{node, untyped_value, write};
    write(&m, vec![node("Add", "add", &["a", "b"], "y")], vec![batched_value("a", 3), batched_value("b", 3)], vec![untyped_value("y")], vec![]);
    let e = compile_err(&[m.to_str().unwrap(), "--batch", "1,4"]);
    assert!(e.contains("two.onnx") && e.contains("--shape"), "{e}");
    let e = compile_err(&[m.to_str().unwrap(), "--shape", "a=1x3", "--shape", "b=2x3", "--batch", "1,4"]);
    assert!(e.contains("'a' leads with 1, 'b' with 2"), "{e}");
    // One whose batch dimension is symbolic: each plan fixes it; batch 2 runs on the 4-plan.
    let r = t.join("relu.onnx");
    write(&r, vec![node("Relu", "relu", &["a"], "y")], vec![batched_value("a", 3)], vec![untyped_value("y")], vec![]);
    let rows = compile(t, r.to_str().unwrap(), &["--shape", "a=1x3", "--batch", "1,4"]);
    assert_eq!(rows[0]["model"], "relu");
    let x = t.join("a.npy");
    npy::write(&x, &Tensor::from_f32(vec![2, 3], &[1., -2., 3., -4., 5., -6.])).unwrap();
    ok(&["run", t.join("out/relu.tsr").to_str().unwrap(), "--input", &format!("a={}", x.display()), "--out", "ro"], t);
    assert_eq!(npy::read(&t.join("ro/y.npy")).unwrap(), Tensor::from_f32(vec![2, 3], &[1., 0., 3., 0., 5., 0.]));
    // A model whose output does not lead with the batch (a sum over it) cannot be sliced: refused naming it.
    let s = t.join("sum.onnx");
    write(&s, vec![node("ReduceSum", "sum", &["a"], "y")], vec![batched_value("a", 3)], vec![untyped_value("y")], vec![]);
    let e = compile_err(&[s.to_str().unwrap(), "--shape", "a=1x3", "--batch", "1,4"]);
    assert!(e.contains("model sum") && e.contains("output 'y'") && e.contains("leading dimension is not the batch size"), "{e}");
}

/// An f32 input `[batch, width]` whose batch dimension is symbolic (`--shape` fixes it).
fn batched_value(name: &str, width: i64) -> tessera_stages::onnx::proto::ValueInfoProto {
    use tessera_stages::onnx::proto::{
        tensor_shape_proto::dimension::Value as Dim, tensor_shape_proto::Dimension, type_proto, TensorShapeProto, TypeProto, ValueInfoProto,
    };
    let dim = vec![
        Dimension { value: Some(Dim::DimParam("batch".into())), ..Default::default() },
        Dimension { value: Some(Dim::DimValue(width)), ..Default::default() },
    ];
    let ty = type_proto::Tensor { elem_type: Some(1), shape: Some(TensorShapeProto { dim }) };
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto { value: Some(type_proto::Value::TensorType(ty)), ..Default::default() }),
        ..Default::default()
    }
}

/// A convolutional network the same way: ResNet-18 at 32x32 planned at 1 and 4, batch 3 padded onto the 4-plan
/// and batch 1 on its own, both matching the reference interpreter.
#[test]
fn a_resnet_serves_a_padded_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let rows = compile(t, "fixture:resnet18:i32", &["--batch", "1,4"]);
    assert_eq!(rows[0]["model"], "resnet18-b1_4-i32");
    let path = t.join("out/resnet18-b1_4-i32.tsr");
    for batch in [3usize, 1] {
        let out = t.join(format!("run{batch}"));
        ok(&["run", path.to_str().unwrap(), "--batch", &batch.to_string(), "--seed", "9", "--out", out.to_str().unwrap()], t);
        let g = load_graph(&parse_fixture_spec(&format!("fixture:resnet18:b{batch}:i32")).unwrap()).unwrap();
        let want = run_graph(&g, &random_inputs(&g, 9)).unwrap();
        close(&format!("resnet18 batch {batch}"), &npy::read(&out.join("logits.npy")).unwrap(), &want[0]);
    }
}
