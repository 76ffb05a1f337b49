//! The bundled zoo's CUTLASS kernels compile on a machine without a GPU: `fixtures/zoo.toml` built for the four
//! GPU backends in fp16 with analytical costs (nothing is measured), so `cutlass` takes the chains its
//! estimate wins and nvcc compiles their kernels to sm_90 cubins here, with the PyPI nvcc and CUTLASS headers
//! that scripts/test.sh installs. A warm rebuild compiles nothing.
//!
//! (A measured GPU build picks its CUTLASS tiles by timing them, Hopper ones included; the backend's own tests
//! compile every tile family of every element type without a GPU, `backend::cutlass::tests`.)

mod common {
    pub mod cli;
}

use common::cli::{json, ok};
use serde_json::Value;
use std::path::Path;

/// Whether NVRTC and nvcc with the CUTLASS headers are here. CI installs them and sets TESSERA_REQUIRE_NVRTC
/// and TESSERA_REQUIRE_CUTLASS, so there a missing one fails instead of skipping.
fn toolchains_here() -> bool {
    let nvrtc = tessera_kernels::runtime::cuda::libs::toolkit().map(|_| ()).map_err(|e| e.to_string());
    let nvcc = tessera_stages::backend::cutlass::toolchain::toolchain().map(|_| ()).map_err(|e| e.to_string());
    for (what, found, require) in [("NVRTC", nvrtc, "TESSERA_REQUIRE_NVRTC"), ("nvcc with the CUTLASS headers", nvcc, "TESSERA_REQUIRE_CUTLASS")] {
        if let Err(why) = found {
            if std::env::var_os(require).is_some() {
                panic!("{require} is set and {what} is not here: {why}");
            }
            eprintln!("SKIPPED: no {what} here ({why})");
            return false;
        }
    }
    true
}

fn executions(summary: &Value, stage: &str) -> u64 {
    summary["stages"][stage]["executions"].as_u64().unwrap_or(0)
}

#[test]
fn the_zoo_compiles_its_cutlass_kernels_without_a_gpu() {
    if !toolchains_here() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let zoo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/zoo.toml");
    let (store, out) = (d.path().join("store"), d.path().join("out"));
    let mut args: Vec<String> = ["compile", zoo.to_str().unwrap(), "--costs", "analytical", "--store", store.to_str().unwrap(), "--out", out.to_str().unwrap(), "--json"].map(String::from).to_vec();
    for c in ["nvrtc", "cublas", "cudnn", "cutlass"] {
        args.extend(["--target".to_string(), format!("cuda -compiler={c} -precision=fp16")]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let cold = json(&args, d.path());
    let artifacts = cold["artifacts"].as_array().unwrap();
    assert_eq!(artifacts.len(), 9, "every entry of the zoo: {cold}");
    // Each artifact's modules, by backend; the cutlass ones are cubin modules of compiled kernels.
    let mut cutlass_functions = 0;
    for a in artifacts {
        let model = a["model"].as_str().unwrap();
        let inspected = json(&["inspect", out.join(format!("{model}.tsr")).to_str().unwrap(), "--json"], d.path());
        for m in inspected["modules"].as_array().unwrap() {
            if m["backend"] == "cutlass" {
                assert_eq!((m["format"].as_str(), m["place"].as_str()), (Some("cubins"), Some("gpu")), "{model}: {m}");
                assert!(m["bytes"].as_u64().unwrap() > 10_000, "{model}: a cubin per kernel: {m}");
                assert!(m["target"].as_str().unwrap().contains("-arch=sm_90"), "{m}");
                cutlass_functions += m["functions"].as_u64().unwrap();
            }
        }
    }
    // bert-tiny at batch 4 (512 rows): its FFN's GEMM with the bias and GELU is cutlass's by estimate.
    assert!(cutlass_functions >= 1, "no zoo model placed a kernel on cutlass: {cold}");
    assert!(executions(&cold, "compile") > 0);
    // Warm: every stage hits, nothing is lowered or compiled again.
    let warm: Value = serde_json::from_str(&ok(&args, d.path())).unwrap();
    assert_eq!((executions(&warm, "lower"), executions(&warm, "compile")), (0, 0), "{warm}");
}

/// `cutlass` is opt-in: available here, and `tessera targets` says why a build without `--target` leaves it out.
#[test]
fn cutlass_is_available_but_not_in_default_builds() {
    if !toolchains_here() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let registry = json(&["targets", "--json"], d.path());
    let cutlass = registry["kinds"].as_array().unwrap().iter().flat_map(|k| k["backends"].as_array().unwrap()).find(|b| b["backend"] == "cutlass").unwrap();
    let status = cutlass["status"].as_str().unwrap();
    assert!(status.starts_with("available, not in default builds: ") && status.contains("--target"), "{status}");
}
