//! The corpus of real exports (fixtures/corpus/, written by scripts/export_corpus.py): transformers from Hugging
//! Face and torchvision configs, exported by PyTorch's TorchScript (opset 17) and dynamo (opset 18) exporters.
//! For every export that the exporter accepted:
//! - the importer's canonicalising passes turn every attention layer into one `Attention` op and leave no
//!   `Softmax` outside one (the count of layers is the manifest's, from the model's config), and no attention
//!   reads K or V repeated for a group of query heads;
//! - the reference interpreter, on the canonical graph, gives ONNX Runtime's outputs (relative error 1e-4).

use std::path::{Path, PathBuf};
use tessera_stages::interp::run_graph;
use tessera_stages::ir::{Graph, Op};
use tessera_stages::npy;
use tessera_stages::onnx::{import_file, ImportOptions};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/corpus")
}

struct Entry {
    name: String,
    attention_layers: usize,
}

/// The manifest's exported models (exporter refusals are recorded there and skipped here).
fn entries() -> Vec<Entry> {
    let text = std::fs::read_to_string(corpus_dir().join("manifest.json")).expect("fixtures/corpus/manifest.json");
    let m: serde_json::Value = serde_json::from_str(&text).expect("manifest.json is JSON");
    let rows = m["models"].as_array().expect("manifest.json: models");
    let out: Vec<Entry> = rows
        .iter()
        .filter(|r| r["status"] == "ok")
        .map(|r| Entry { name: r["name"].as_str().unwrap().to_string(), attention_layers: r["attention_layers"].as_u64().unwrap() as usize })
        .collect();
    assert!(out.len() >= 20, "the corpus holds {} exports, expected at least 20", out.len());
    out
}

fn load(name: &str) -> Graph {
    let path = corpus_dir().join(name).join("model.onnx");
    import_file(&path, &ImportOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn count(g: &Graph, pred: impl Fn(&Op) -> bool) -> usize {
    g.nodes.iter().filter(|n| pred(&n.op)).count()
}

#[test]
fn every_attention_layer_fuses() {
    let mut failed = Vec::new();
    for e in entries() {
        let g = load(&e.name);
        let attn = count(&g, |op| matches!(op, Op::Attention(_)));
        let softmax = count(&g, |op| matches!(op, Op::Softmax { .. }));
        // K and V are read where they are: never a copy repeated for a group of query heads (GQA's repeat_kv).
        let repeated = g
            .nodes
            .iter()
            .filter(|n| matches!(n.op, Op::Attention(_)))
            .flat_map(|n| [n.inputs[1], n.inputs[2]])
            .filter(|&v| {
                let through = |v, pred: fn(&Op) -> bool| g.producer(v).filter(|&p| pred(&g.node(p).op)).map(|p| g.node(p).inputs[0]);
                through(v, |op| matches!(op, Op::Reshape { .. })).and_then(|x| through(x, |op| matches!(op, Op::Expand { .. }))).is_some()
            })
            .count();
        eprintln!("{:32} nodes {:5}  attention {attn}/{}  softmax left {softmax}  repeated K/V {repeated}", e.name, g.nodes.len(), e.attention_layers);
        if attn != e.attention_layers || softmax != 0 || repeated != 0 {
            failed.push(format!("{}: {attn} of {} attention layers fused, {softmax} Softmax left, {repeated} K/V repeated", e.name, e.attention_layers));
        }
    }
    assert!(failed.is_empty(), "not canonical:\n{}", failed.join("\n"));
}

/// Relative error max|got - want| / max|want|; infinite on a shape mismatch or a NaN.
fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    if got.len() != want.len() || got.iter().chain(want).any(|x| x.is_nan()) {
        return f64::INFINITY;
    }
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
    got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / scale
}

#[test]
fn canonical_graphs_give_onnx_runtimes_outputs() {
    let mut failed = Vec::new();
    for e in entries() {
        let dir = corpus_dir().join(&e.name);
        let g = load(&e.name);
        let inputs: Vec<_> = g
            .inputs
            .iter()
            .map(|&v| {
                let name = &g.value(v).name;
                npy::read_as(&dir.join("inputs").join(format!("{name}.npy")), g.ty(v).dtype).unwrap_or_else(|err| panic!("{}: {err}", e.name))
            })
            .collect();
        let got = run_graph(&g, &inputs).unwrap_or_else(|err| panic!("{}: {err}", e.name));
        for (&v, t) in g.outputs.iter().zip(&got) {
            let name = &g.value(v).name;
            let want = npy::read(&dir.join("expected").join(format!("{name}.npy"))).unwrap();
            let err = if want.shape() == t.shape() { rel_err(&t.to_f64_vec(), &want.to_f64_vec()) } else { f64::INFINITY };
            eprintln!("{:32} {name}: relative error {err:e}", e.name);
            if !(err < 1e-4) {
                failed.push(format!("{} output {name}: relative error {err:e} against ONNX Runtime", e.name));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
