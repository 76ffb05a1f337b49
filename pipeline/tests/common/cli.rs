// Each test binary that includes this module uses part of it.
#![allow(dead_code)]
//! Running the `tessera` binary from the pipeline's end-to-end tests.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

/// `tessera args` run in `cwd`.
pub fn tessera(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera")).args(args).current_dir(cwd).output().expect("tessera runs")
}

/// The standard output of `tessera args`, which must succeed.
pub fn ok(args: &[&str], cwd: &Path) -> String {
    let out = tessera(args, cwd);
    assert!(out.status.success(), "tessera {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// The JSON `tessera args` prints, which must succeed.
pub fn json(args: &[&str], cwd: &Path) -> Value {
    let text = ok(args, cwd);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("tessera {args:?} printed no JSON ({e}):\n{text}"))
}

/// The standard error of `tessera args`, which must fail.
pub fn failure(args: &[&str], cwd: &Path) -> String {
    let out = tessera(args, cwd);
    assert!(!out.status.success(), "tessera {args:?} succeeded; it must fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}
