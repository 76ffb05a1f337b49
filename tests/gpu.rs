//! The `cuda` backend end to end.
//!
//! - Without a GPU (CI): every kernel of every model of the bundled zoo compiles to an sm_90 cubin with
//!   NVRTC (from the CUDA toolkit or NVIDIA's PyPI wheels, which scripts/test.sh installs); with
//!   `TESSERA_REQUIRE_NVRTC=1` (set by the test script) a missing NVRTC fails instead of skipping.
//! - On a GPU machine (`TESSERA_GPU=1`, `--include-ignored`): every model of a manifest (default
//!   fixtures/zoo-full.toml, or `TESSERA_GPU_MANIFEST`), compiled for `cuda` alone, runs through the GPU
//!   runtime and matches the reference interpreter on fresh random inputs (fp32: relative error below 1e-4,
//!   NaN never); the per-model results (error, kernels per run, median replay time) are written as markdown
//!   to `TESSERA_GPU_RESULTS` when set.
//!
//! Paths are relative to the working directory (the repo root), not to where the binary was built, so the
//! test binary runs as is on the GPU machine.

use std::path::{Path, PathBuf};
use tessera::build::load_graph;
use tessera::memo::Memo;
use tessera::zoo::{all_backends, compile_all, jobs_from_inputs, resolve_targets};
use tessera_kernels::artifact::Artifact;
use tessera_kernels::runtime::Executable;
use tessera_stages::interp::{random_inputs, run_graph};
use tessera_stages::partition::stage::CostMode;
use tessera_store::{OpenOptions, Store};

/// The targets checked: fp32, and fp16 storage with fp32 accumulation.
const TARGETS: [(&str, f64); 2] = [("cuda -compiler=nvrtc", 1e-4), ("cuda -compiler=nvrtc -precision=fp16", 1e-2)];

fn repo() -> PathBuf {
    std::env::var_os("TESSERA_REPO").map(PathBuf::from).unwrap_or_else(|| {
        let here = std::env::current_dir().unwrap();
        if here.join("fixtures/zoo.toml").is_file() {
            here
        } else {
            Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
        }
    })
}

fn nvrtc_or_skip(what: &str) -> bool {
    match tessera_kernels::runtime::cuda::libs::toolkit() {
        Ok(_) => true,
        Err(why) => {
            assert!(std::env::var_os("TESSERA_REQUIRE_NVRTC").is_none(), "TESSERA_REQUIRE_NVRTC is set but NVRTC is missing: {why}");
            eprintln!("skipping {what}: {why}");
            false
        }
    }
}

fn compile_for_cuda(target: &str, manifest: &Path, store: &Path, out: &Path) -> tessera::zoo::Summary {
    let store = Store::open(store, OpenOptions::writable()).unwrap();
    let backends = all_backends();
    let targets = resolve_targets(&[target.to_string()], &backends).unwrap();
    let jobs = jobs_from_inputs(&[manifest.to_path_buf()], &Default::default()).unwrap();
    let memo = Memo::new(&store);
    compile_all(&memo, &targets, &backends, &jobs, out, CostMode::Analytical, &|_| {}).unwrap()
}

/// Every generated kernel of every model of the bundled zoo, in both precisions, compiles to an sm_90
/// cubin, no GPU needed.
#[test]
fn the_zoo_compiles_to_cubins_without_a_gpu() {
    if !nvrtc_or_skip("compiling the zoo for cuda") {
        return;
    }
    for (target, _) in TARGETS {
        zoo_compiles_for(target);
    }
}

fn zoo_compiles_for(target: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let manifest = repo().join("fixtures/zoo.toml");
    let s = compile_for_cuda(target, &manifest, &tmp.path().join("store"), &tmp.path().join("out"));
    let jobs = jobs_from_inputs(&[manifest], &Default::default()).unwrap();
    assert_eq!(s.models, jobs.len());
    for job in &jobs {
        let a = Artifact::open(&tmp.path().join("out").join(format!("{}.tsr", job.name))).unwrap();
        assert!(!a.body.modules.is_empty() && a.body.modules.iter().all(|m| m.backend == "cuda"), "{}", job.name);
        for m in &a.body.modules {
            let c = tessera_kernels::runtime::cuda::format::CubinModule::decode(m).unwrap();
            assert_eq!(c.arch, "sm_90");
        }
        // Without a GPU, loading says why instead of crashing.
        if tessera_kernels::runtime::cuda::available().is_err() {
            let e = Executable::load(&a).err().expect("no GPU here").to_string();
            assert!(e.contains("GPU"), "{e}");
        }
    }
}

fn relative_error(got: &tessera_stages::ir::Tensor, want: &tessera_stages::ir::Tensor) -> Result<f64, String> {
    if got.ty != want.ty {
        return Err(format!("type {} instead of {}", got.ty, want.ty));
    }
    let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
    if !want.dtype().is_float() {
        return if a == b { Ok(0.0) } else { Err("integer values differ".into()) };
    }
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
    let mut worst = 0f64;
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        if x.is_nan() || y.is_nan() {
            return Err(format!("NaN at element {i} (got {x}, want {y})"));
        }
        worst = worst.max((x - y).abs() / scale);
    }
    Ok(worst)
}

/// Every model of the manifest, compiled for `cuda` in each precision (`TESSERA_GPU_PRECISION`: fp32, fp16
/// or both, the default), matches the fp32 reference interpreter on the GPU: relative error below 1e-4 in
/// fp32, 1e-2 in fp16, NaN never.
#[test]
#[ignore = "needs a GPU: run with TESSERA_GPU=1 and --include-ignored on the GPU machine"]
fn the_zoo_matches_the_reference_on_the_gpu() {
    if std::env::var_os("TESSERA_GPU").is_none() {
        eprintln!("skipping: set TESSERA_GPU=1 on a machine with an NVIDIA GPU");
        return;
    }
    let which = std::env::var("TESSERA_GPU_PRECISION").unwrap_or_else(|_| "both".into());
    let mut tables = Vec::new();
    let mut failures = Vec::new();
    for (target, tol) in TARGETS {
        let fp16 = target.contains("fp16");
        if (which == "fp16" && !fp16) || (which == "fp32" && fp16) {
            continue;
        }
        let (table, fails) = zoo_on_the_gpu(target, tol);
        tables.push(table);
        failures.extend(fails);
    }
    let all = tables.join("\n");
    if let Some(path) = std::env::var_os("TESSERA_GPU_RESULTS") {
        std::fs::write(path, &all).unwrap();
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

fn zoo_on_the_gpu(target: &str, tol: f64) -> (String, Vec<String>) {
    let device = tessera_kernels::runtime::cuda::device::info().expect("TESSERA_GPU=1 but no usable GPU");
    let manifest = std::env::var_os("TESSERA_GPU_MANIFEST").map(PathBuf::from).unwrap_or_else(|| repo().join("fixtures/zoo-full.toml"));
    let tmp = tempfile::tempdir().unwrap();
    let t0 = std::time::Instant::now();
    let s = compile_for_cuda(target, &manifest, &tmp.path().join("store"), &tmp.path().join("out"));
    let compile_s = t0.elapsed().as_secs_f64();
    let jobs = jobs_from_inputs(&[manifest.clone()], &Default::default()).unwrap();
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for job in &jobs {
        let g = load_graph(job).unwrap();
        let art = Artifact::open(&tmp.path().join("out").join(format!("{}.tsr", job.name))).unwrap();
        let mut exe = match Executable::load(&art) {
            Ok(e) => e,
            Err(e) => {
                failures.push(format!("{}: load: {e}", job.name));
                continue;
            }
        };
        let inputs = random_inputs(&g, 0x6770_0000 + job.name.len() as u64);
        let want = run_graph(&g, &inputs).unwrap();
        let got = match exe.run(&inputs) {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("{}: run: {e}", job.name));
                continue;
            }
        };
        let mut worst = 0f64;
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            match relative_error(a, b) {
                Ok(e) => worst = worst.max(e),
                Err(e) => failures.push(format!("{} output {i}: {e}", job.name)),
            }
        }
        if worst >= tol {
            failures.push(format!("{} ({target}): relative error {worst:.3e} is not below {tol:e}", job.name));
        }
        let mut times = exe.gpu_replay_times_us(&inputs, 20, 200).expect("a GPU artifact").unwrap();
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let row = format!("| {} | {} | {:.2e} | {:.1} |", job.name, exe.kernel_count().unwrap_or(0), worst, median);
        eprintln!("{row}");
        rows.push(row);
    }
    let table = format!(
        "Device: {} ({}, {} SMs, driver CUDA {}); target `{target}`; manifest {}; {} models compiled in {compile_s:.1} s ({} partitions).\n\n| model | kernels per run | max relative error (against the fp32 reference) | median graph replay (us) |\n|---|---|---|---|\n{}\n",
        device.name,
        device.arch,
        device.sm_count,
        device.driver_cuda,
        manifest.file_name().unwrap().to_string_lossy(),
        s.models,
        s.partitions,
        rows.join("\n")
    );
    println!("{table}");
    (table, failures)
}
