//! The GPU's fingerprint cached across processes (`tessera_stages::gpu_facts`, the store's `machine/` folder),
//! through the binary, since a fact is for the *next* process:
//! - everywhere: builds that never need the fingerprint (CPU targets; GPU targets with analytical costs)
//!   record no fact, and a fact survives `store gc`, passes `store verify` and stays out of exports;
//! - on a GPU machine (`TESSERA_GPU=1`, `--include-ignored`): a measured build records the fact, the next
//!   build recalls it (the driver is not initialised) and hits every stage, and a fact that lies about the
//!   GPU fails the next build that measures, before it measures, and is removed, so the build after works.
//!
//! `TESSERA_BIN` names the binary where it is not the one cargo built (the GPU machine runs a staged copy).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tessera_store::{Digest, MachineFacts};

fn bin() -> PathBuf {
    std::env::var_os("TESSERA_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tessera")))
}

fn tessera(args: &[&str], cwd: &Path) -> Output {
    let mut c = Command::new(bin());
    c.args(args).current_dir(cwd).env_remove("TESSERA_REMOTE").env_remove("TESSERA_STORE").env("TESSERA_LOG", "warn,tessera_stages::gpu_facts=debug");
    c.output().expect("tessera runs")
}

fn ok(o: Output, what: &str) -> Output {
    assert!(o.status.success(), "{what} failed:\n{}", String::from_utf8_lossy(&o.stderr));
    o
}

fn facts(store: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(store.join("machine")).map(|rd| rd.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    files.sort();
    files
}

const GPU_TARGETS: [&str; 6] = ["-t", "cuda -compiler=nvrtc -precision=fp16", "-t", "cuda -compiler=cublas -precision=fp16", "-t", "cuda -compiler=cudnn -precision=fp16"];

#[test]
fn builds_that_need_no_fingerprint_record_none_and_facts_stay_out_of_the_content() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    ok(tessera(&["compile", "fixture:mlp3:b1", "-t", "cpu", "--costs", "analytical", "--store", "s", "--out", "o"], t), "a CPU build");
    assert_eq!(facts(&t.join("s")), Vec::<PathBuf>::new());
    if tessera_kernels::runtime::cuda::libs::toolkit().is_ok() {
        let mut args = vec!["compile", "fixture:mlp3:b1", "--costs", "analytical", "--store", "s", "--out", "o"];
        args.extend(GPU_TARGETS);
        ok(tessera(&args, t), "an analytical GPU build");
        assert_eq!(facts(&t.join("s")), Vec::<PathBuf>::new(), "analytical costs do not depend on the GPU");
    } else {
        eprintln!("skipping the analytical GPU build: no NVRTC here");
    }

    let name = Digest::of(b"a witness");
    MachineFacts::in_store(&t.join("s")).put(&name, b"a fingerprint").unwrap();
    ok(tessera(&["store", "gc"], &t.join("s")), "store gc");
    ok(tessera(&["store", "verify"], &t.join("s")), "store verify");
    assert_eq!(MachineFacts::in_store(&t.join("s")).get(&name).as_deref(), Some(&b"a fingerprint"[..]), "gc leaves facts alone");
    ok(tessera(&["store", "export", "--store", "s", "all.tar"], t), "store export");
    let listed = Command::new("tar").args(["tf", "all.tar"]).current_dir(t).output().unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains("tessera-archive.postcard") && !listed.contains("machine"), "{listed}");
}

#[test]
#[ignore = "needs a GPU: run with TESSERA_GPU=1 and --include-ignored on the GPU machine"]
fn a_warm_measured_build_recalls_the_gpu_and_a_false_fact_fails_before_measuring() {
    if std::env::var_os("TESSERA_GPU").is_none() {
        eprintln!("skipping: TESSERA_GPU is not set");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let store = t.join("s");
    let mut build: Vec<&str> = vec!["compile", "fixture:mlp3:b8", "--store", "s", "--out", "o", "--json"];
    build.extend(GPU_TARGETS);
    let executions = |o: &Output| -> u64 {
        let s: serde_json::Value = serde_json::from_slice(&o.stdout).expect("the JSON summary");
        s["stages"].as_object().unwrap().values().map(|st| st["executions"].as_u64().unwrap()).sum()
    };

    let cold = ok(tessera(&build, t), "the cold measured build");
    assert!(executions(&cold) > 0);
    let recorded = facts(&store);
    assert_eq!(recorded.len(), 1, "one fact, the GPU's fingerprint: {recorded:?}\n{}", String::from_utf8_lossy(&cold.stderr));

    let warm = ok(tessera(&build, t), "the warm build");
    let log = String::from_utf8_lossy(&warm.stderr);
    assert!(log.contains("GPU fingerprint recalled"), "{log}");
    assert_eq!(executions(&warm), 0, "{log}");

    // A fact that names another GPU: the first measurement finds it out (the keys it makes miss, so the
    // build tunes), fails the build and removes it.
    let live: serde_json::Value = serde_json::from_slice(&ok(tessera(&["targets", "--gpu-fingerprint"], t), "targets").stdout).unwrap();
    let gpu = live["name"].as_str().unwrap().to_string();
    let file = &recorded[0];
    let bytes = std::fs::read(file).unwrap();
    let content = &bytes[32..];
    let at = content.windows(gpu.len()).position(|w| w == gpu.as_bytes()).expect("the GPU's name in the fact");
    let mut lie = content.to_vec();
    lie[at + gpu.len() - 1] ^= 1;
    let name: Digest = file.file_name().unwrap().to_string_lossy().parse().unwrap();
    MachineFacts::in_store(&store).put(&name, &lie).unwrap();
    let failed = tessera(&build, t);
    let log = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success(), "a build under a false fingerprint must fail: {log}");
    assert!(log.contains("is not this GPU's"), "{log}");
    assert_eq!(facts(&store), Vec::<PathBuf>::new(), "the false fact is removed");

    // The next build reads the GPU again, finds the cold build's records (its keys are the live
    // fingerprint's again) and records the fact anew.
    let again = ok(tessera(&build, t), "the build after");
    assert_eq!(facts(&store).len(), 1);
    let s: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(s["stages"]["tune"]["executions"].as_u64().unwrap_or(0), 0, "{}", String::from_utf8_lossy(&again.stderr));
}
