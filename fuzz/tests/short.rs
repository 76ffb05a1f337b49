//! A short budget of every fuzz target, as a normal test (what CI runs): a few seconds each, from a fixed
//! seed, so a failure is reproducible with `tessera-fuzz TARGET --seed 0xc1 --from N --execs 1`.

use std::sync::OnceLock;
use tessera_fuzz::alloc::CountingAlloc;
use tessera_fuzz::{run, target, Corpus, RunOptions};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn corpus() -> &'static Corpus {
    static C: OnceLock<Corpus> = OnceLock::new();
    C.get_or_init(Corpus::load)
}

fn short(name: &str) {
    assert!(tessera_fuzz::alloc::installed());
    let t = target(name).expect("a target");
    let opts = RunOptions {
        seed: 0xc1,
        from: 0,
        execs: 200_000,
        time_limit: Some(std::time::Duration::from_secs(3)),
        hang: std::time::Duration::from_secs(20),
    };
    let r = run(t, corpus(), &opts);
    eprintln!("{name}: {} executions in {:.1}s ({:.0}/s), {} accepted", r.execs, r.seconds, r.execs_per_sec(), r.accepted);
    assert!(r.execs > 0);
    let found: Vec<String> = r.findings.iter().map(|(f, n)| format!("{f} [{n} executions]")).collect();
    assert!(found.is_empty(), "{name}: findings:\n{}", found.join("\n"));
}

#[test]
fn onnx_bytes() {
    short("onnx-bytes");
}

#[test]
fn onnx_model() {
    short("onnx-model");
}

#[test]
fn targets() {
    short("target");
}

#[test]
fn manifests() {
    short("manifest");
}

#[test]
fn npy() {
    short("npy");
}

#[test]
fn artifacts() {
    short("artifact");
}

/// The harness itself: a panic and an oversized allocation are findings; a clean run has none.
#[test]
fn the_harness_reports_panics_and_big_allocations() {
    use tessera_fuzz::{FindingKind, FuzzTarget};
    let opts = RunOptions { seed: 1, from: 0, execs: 50, time_limit: None, hang: std::time::Duration::from_secs(20) };
    let panics = FuzzTarget {
        name: "panics",
        generate: |rng, _| vec![rng.bits() as u8],
        exec: |b, _| if b[0] < 128 { panic!("small byte {}", b[0]) } else { true },
        alloc_limit: |_| 1 << 20,
    };
    let r = run(&panics, corpus(), &opts);
    assert_eq!(r.findings.len(), 1, "{:?}", r.findings);
    assert!(r.findings[0].0.kind == FindingKind::Panic && r.findings[0].0.message.contains("small byte"));
    let allocates = FuzzTarget {
        name: "allocates",
        generate: |_, _| vec![0; 4],
        exec: |b, _| std::hint::black_box(vec![0u8; 8 << 20]).len() > b.len(),
        alloc_limit: |_| 1 << 20,
    };
    let r = run(&allocates, corpus(), &opts);
    assert!(matches!(r.findings[0].0.kind, FindingKind::BigAlloc { bytes, .. } if bytes == 8 << 20), "{:?}", r.findings);
}
