//! Zoo artifacts for the tests: compiled with the compiler (analytical costs, the default CPU backends), into
//! a store under cargo's target tmp folder kept between test runs, so only the first run compiles.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use tessera::memo::Memo;
use tessera::zoo::{all_backends, compile_all, jobs_from_inputs, resolve_targets};
use tessera_stages::context::CostMode;
use tessera_store::{OpenOptions, Store};

/// The models the runtime tests run: an MLP (c and gemm GEMMs), BERT-tiny (i64 ids and mask, attention),
/// MobileNetV2 (convolutions, depthwise loops on the runtime pool); and the MLP batched at 1 and 8 (one
/// artifact, two plans: [`BATCHED`]), and at 1 alone (what the batched artifact's weights compare with).
pub const MANIFEST: &str = r#"
[[entry]]
model = "mlp3"
batch = 8

[[entry]]
model = "bert-tiny"
batch = 1
seq = 128

[[entry]]
model = "mobilenetv2"
batch = 1

[[entry]]
model = "mlp3"
batch = [1, 8]

[[entry]]
model = "mlp3"
batch = 1
"#;

/// The batched artifact of [`MANIFEST`] (plans for batch 1 and 8).
pub const BATCHED: &str = "mlp3-b1_8";

pub const MODELS: [&str; 3] = ["mlp3-b8", "bert-tiny-b1-s128", "mobilenetv2-b1"];

/// The folder holding `<model>.tsr` for every model of [`MANIFEST`], compiled once per test process for the
/// default CPU backends (`c` and `gemm`).
pub fn zoo() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| compile("out", &["cpu", "cpu -compiler=gemm"]))
}

/// [`zoo`] compiled for the `c` backend alone (generated C, which allocates nothing when it runs).
pub fn c_zoo() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| compile("out-c", &["cpu"]))
}

/// Compiles [`MANIFEST`] for `targets` into `<tmp>/tessera-runtime-tests/<folder>` (a store shared by the
/// test processes) and returns the folder.
pub fn compile(folder: &str, targets: &[&str]) -> PathBuf {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tessera-runtime-tests");
    // Artifacts are deterministic: a concurrent test process writing the same folder writes the same bytes.
    let out = base.join(folder);
    std::fs::create_dir_all(&out).unwrap();
    let manifest = out.join("zoo.toml");
    std::fs::write(&manifest, MANIFEST).unwrap();
    let store = Store::open(&base.join("store"), OpenOptions::writable().wait(true)).unwrap();
    let backends = all_backends();
    let targets: Vec<String> = targets.iter().map(|t| t.to_string()).collect();
    let targets = resolve_targets(&targets, &backends).unwrap();
    let jobs = jobs_from_inputs(&[manifest], &Default::default()).unwrap();
    compile_all(&Memo::new(&store), &targets, &backends, &jobs, &out, CostMode::Analytical, &|_| {}).unwrap();
    out
}

pub fn artifact(model: &str) -> PathBuf {
    zoo().join(format!("{model}.tsr"))
}

/// fp32: relative error below 1e-4 (of the largest magnitude), NaN never.
pub fn close(what: &str, got: &tessera_runtime::Tensor, want: &tessera_runtime::Tensor) {
    assert_eq!(got.ty, want.ty, "{what}");
    let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
    let scale = w.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() / scale < 1e-4, "{what}[{i}]: {a} vs {b}");
    }
}
