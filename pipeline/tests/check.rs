//! `tessera compile --check`: every unsupported op and attribute of a model at once, with its node, and
//! nothing compiled.

mod common {
    pub mod onnx;
}

use common::onnx::{f32_value, node, untyped_value, write};
use std::path::Path;
use std::process::Command;

fn write_model(path: &Path, nodes: &[(&str, &str, &str, &str)], outputs: &[&str]) {
    let nodes = nodes.iter().map(|&(op, name, input, output)| node(op, name, &[input], output)).collect();
    write(path, nodes, vec![f32_value("x", &[2, 3])], outputs.iter().map(|o| untyped_value(o)).collect(), vec![]);
}

#[test]
fn check_lists_every_unsupported_op_and_compiles_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    write_model(&t.join("gaps.onnx"), &[("Hardmax", "first_gap", "x", "a"), ("Relu", "after", "a", "b"), ("Relu", "ok", "x", "c"), ("FrobnicateXYZ", "second_gap", "c", "d")], &["b", "d"]);
    write_model(&t.join("fine.onnx"), &[("Relu", "r", "x", "y")], &["y"]);
    let run = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_tessera")).args(args).current_dir(t).output().unwrap();

    let out = run(&["compile", "--check", "gaps.onnx", "fine.onnx", "--store", "s", "--out", "o"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].contains("gaps.onnx") && lines[0].contains("node 'first_gap' (Hardmax)"), "{stdout}");
    assert!(lines[1].contains("node 'second_gap' (FrobnicateXYZ)"), "{stdout}");
    assert!(stderr.contains("2 unsupported op(s) or attribute(s) in 1 model(s)"), "{stderr}");
    assert!(!t.join("o").exists() && !t.join("s").exists(), "--check compiles nothing and opens no store");

    let out = run(&["compile", "--check", "gaps.onnx", "--json", "--store", "s", "--out", "o"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ops: Vec<&str> = v.as_array().unwrap().iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["Hardmax", "FrobnicateXYZ"]);

    let out = run(&["compile", "--check", "fine.onnx"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty());
}
