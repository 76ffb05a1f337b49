//! The store's size cap through the `tessera` binary (issue 29): `store gc --max-size` and `store config
//! --max-size` evict least recently used memo entries and the objects only they name, never what a root
//! lists; a rebuild recomputes exactly what was evicted; several processes filling a capped store leave it
//! within the cap and intact; an eviction killed midway loses nothing and is finished by the next open.

mod common {
    pub mod cli;
}

use common::cli::{json, ok, tessera};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use tessera_store::{Digest, MemoEntry, MemoRecord, OpenOptions, Store};

/// Compiles fixture mlp3 (model `mlp3-b1`, so every build replaces the same root) for one target with
/// analytical costs; returns the stages it executed (not the hits), by name.
fn build(target: &str, store: &str, cwd: &Path) -> BTreeMap<String, u64> {
    let s = json(
        &["compile", "fixture:mlp3", "--costs", "analytical", "--target", target, "--store", store, "--out", "out", "--json", "-q"],
        cwd,
    );
    executed(&s)
}

fn executed(summary: &Value) -> BTreeMap<String, u64> {
    summary["stages"]
        .as_object()
        .expect("a summary lists its stages")
        .iter()
        .map(|(k, v)| (k.clone(), v["executions"].as_u64().expect("executions")))
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn by_stage(report: &Value) -> BTreeMap<String, u64> {
    report["evicted_by_stage"]
        .as_object()
        .expect("an eviction report lists its stages")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().expect("a count")))
        .collect()
}

fn add(a: &mut BTreeMap<String, u64>, b: &BTreeMap<String, u64>) {
    for (k, v) in b {
        *a.entry(k.clone()).or_default() += v;
    }
}

fn verify(store: &str, cwd: &Path) -> Output {
    let out = tessera(&["store", "verify", "--store", store], cwd);
    assert!(
        out.status.success(),
        "store verify failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn a_rebuild_after_eviction_recomputes_exactly_what_was_evicted() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    // Build A, then B: B's root replaces A's, so A's plan, kernels, modules and artifact are a cache now.
    let a = build("cpu", "s", t);
    assert!(a.contains_key("link") && a.contains_key("load"), "{a:?}");
    let b = build("cpu -compiler=gemm", "s", t);
    assert!(!b.contains_key("load"), "B reuses A's graph: {b:?}");

    // Evict the least a cap just under the store's size takes: one entry, and of the build used longest ago.
    let stats = json(&["store", "stats", "--store", "s", "--json"], t);
    let size = stats["object_bytes"].as_u64().unwrap();
    let cap = (size - 1).to_string();
    let r1 = json(&["store", "gc", "--store", "s", "--max-size", &cap, "--json"], t);
    assert_eq!(r1["entries_evicted"], 1, "{r1}");
    assert!(r1["bytes_evicted"].as_u64().unwrap() > 0 && r1["within_cap"] == true, "{r1}");
    assert_eq!(r1["bytes_before"].as_u64(), Some(size));
    let after = json(&["store", "stats", "--store", "s", "--json"], t)["object_bytes"].as_u64().unwrap();
    assert_eq!(after, size - r1["bytes_evicted"].as_u64().unwrap());
    // B was used more recently: it rebuilds from the store alone.
    assert_eq!(build("cpu -compiler=gemm", "s", t), BTreeMap::new(), "B lost nothing");
    // A recomputes exactly the evicted entry (the rest of A, unrooted as it was, is still there).
    assert_eq!(build("cpu", "s", t), by_stage(&r1), "A recomputes exactly what was evicted");

    // A cap of 0: everything no root needs goes; what A's root lists stays, so the store stays over the cap.
    let r2 = json(&["store", "gc", "--store", "s", "--max-size", "0", "--json"], t);
    assert_eq!(r2["within_cap"], false, "{r2}");
    // (Loose: objects no root or entry names, such as a constant the graph document names that folding
    // left out of the plan; eviction leaves them to plain gc.)
    let kept = r2["root_bytes"].as_u64().unwrap() + r2["loose_bytes"].as_u64().unwrap();
    assert_eq!(r2["bytes_after"].as_u64(), Some(kept), "{r2}");
    assert!(!by_stage(&r2).contains_key("load"), "the graph is rooted: {r2}");
    verify("s", t);
    // Rebuilding both recomputes, in total, exactly the entries evicted: A's unrooted targets entry and
    // all of B's.
    let mut again = build("cpu", "s", t);
    add(&mut again, &build("cpu -compiler=gemm", "s", t));
    assert_eq!(again, by_stage(&r2));
    let total: u64 = again.values().sum();
    assert_eq!(r2["entries_evicted"].as_u64(), Some(total));

    // The text report says what it did.
    let text = ok(&["store", "gc", "--store", "s", "--max-size", "1T"], t);
    assert!(text.contains("nothing to evict"), "{text}");
    // Bad sizes are errors that name the option.
    let bad = tessera(&["store", "gc", "--store", "s", "--max-size", "2X"], t);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("--max-size") && err.contains("'2X'"), "{err}");
}

#[test]
fn several_processes_fill_a_capped_store_and_it_stays_within_the_cap_and_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    // The root of one build is ~4.2 MiB (graph and weights 2.1, artifact 2.1); every other build's artifact
    // adds ~2.1 MiB that only its memo entries name. Four builds without a cap: ~10.5 MiB.
    const CAP: u64 = 6 << 20;
    let set = ok(&["store", "config", "--store", "s", "--max-size", "6M"], t);
    assert!(set.starts_with(&format!("max-size {CAP} ")), "{set}");
    assert_eq!(ok(&["store", "config", "--store", "s"], t), set);
    let targets = ["cpu", "cpu -compiler=gemm", "cpu -opt-level=1", "cpu -opt-level=3"];
    let children: Vec<_> = targets
        .iter()
        .enumerate()
        .map(|(i, target)| {
            let out = format!("out{i}");
            Command::new(env!("CARGO_BIN_EXE_tessera"))
                .args(["compile", "fixture:mlp3", "--costs", "analytical", "--target", target, "--store", "s"])
                .args(["--out", &out, "--json", "-q"])
                .current_dir(t)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("tessera starts")
        })
        .collect();
    // They share the store (no --wait); eviction needs it alone, so a compile that finishes while others
    // still build defers it to them (saying so), and the last one out enforces it.
    let (mut evicted_bytes, mut enforced) = (0, 0);
    for (child, target) in children.into_iter().zip(targets) {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "compile --target '{target}' failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let summary: Value = serde_json::from_slice(&out.stdout).expect("a JSON summary");
        let r = &summary["evicted"];
        assert_eq!(r["max_size"].as_u64(), Some(CAP), "every compile applies the cap: {summary}");
        if r["deferred_for"].is_null() {
            assert!(r["within_cap"] == true && r["bytes_after"].as_u64().unwrap() <= CAP, "{r}");
            evicted_bytes += r["bytes_evicted"].as_u64().unwrap();
            enforced += 1;
        } else {
            assert!(r["dry_run"] == true && r["deferred_for"].as_str().unwrap().contains("pid "), "{r}");
        }
    }
    assert!(enforced >= 1, "the last compile to finish enforces the cap");
    assert!(evicted_bytes > 0, "the builds filled the store past its cap");
    verify("s", t);
    let stats = json(&["store", "stats", "--store", "s", "--json"], t);
    let size = stats["object_bytes"].as_u64().unwrap();
    assert!(size <= CAP, "{size} bytes in a store capped at {CAP}");
    // The last build's root is whole: its artifact rebuilds from the store without executing anything.
    let last = Store::open(&t.join("s"), OpenOptions::read_only()).unwrap();
    let root = last.root("model:mlp3-b1").unwrap().expect("the model's root");
    for d in &root {
        last.get(d).unwrap_or_else(|e| panic!("root object: {e}"));
    }
    drop(last);
    let removed = ok(&["store", "config", "--store", "s", "--max-size", "none"], t);
    assert!(removed.starts_with("max-size none"), "{removed}");
    let bad = tessera(&["store", "config", "--store", "s", "--max-size", "lots"], t);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("'lots'"));
}

/// A store of `n` unrooted entries of 2 KiB and one root of 16 objects with their entries.
fn fill(dir: &Path, n: usize) -> Vec<Digest> {
    let s = Store::open(dir, OpenOptions::writable()).unwrap();
    let mut records = Vec::new();
    let mut rooted = Vec::new();
    for i in 0..n + 16 {
        let mut bytes = vec![0u8; 2048];
        bytes[..8].copy_from_slice(&(i as u64).to_le_bytes());
        let d = s.put(&bytes).unwrap();
        let stage = if i < n { "lower" } else { "link" };
        let key = Digest::of(&(i as u64).to_le_bytes());
        records.push(MemoRecord { stage: stage.into(), key, entry: MemoEntry::new(d, 2048, Duration::ZERO) });
        if i >= n {
            rooted.push(d);
        }
    }
    s.memo_record_batch(&records).unwrap();
    s.set_root("model:kept", &rooted).unwrap();
    rooted
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// SIGKILL `tessera store gc --max-size` at delays spread over its run: after each kill the store verifies
/// (no entry names a missing object), the root's objects are all there, and where the kill landed between
/// the entries' removal and the objects' deletion (the intent file `EVICTING` was left), the next open
/// finishes the eviction; a second gc then meets the cap.
#[test]
fn an_eviction_killed_midway_loses_nothing_a_root_needs() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let template = t.join("template");
    let rooted = fill(&template, 1500);
    let cap = "32K";
    // How long an uninterrupted run takes here, to spread the kills over it.
    copy_dir(&template, &t.join("timed"));
    let start = Instant::now();
    let r = json(&["store", "gc", "--store", "timed", "--max-size", cap, "--json"], t);
    let full = start.elapsed();
    assert_eq!(r["entries_evicted"].as_u64(), Some(1500), "{r}");
    let (mut landed_midway, mut finished_on_open) = (0, 0);
    let kills = 12;
    for i in 0..kills {
        let dir = format!("k{i}");
        copy_dir(&template, &t.join(&dir));
        let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["store", "gc", "--store", &dir, "--max-size", cap])
            .current_dir(t)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(full.mul_f64((i as f64 + 0.5) / kills as f64));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        if t.join(&dir).join("EVICTING").exists() {
            landed_midway += 1;
        }
        let out = verify(&dir, t);
        if String::from_utf8_lossy(&out.stderr).contains("finished an eviction a crash interrupted") {
            finished_on_open += 1;
        }
        assert!(!t.join(&dir).join("EVICTING").exists(), "kill {i}: the open finished the eviction");
        {
            let s = Store::open(&t.join(&dir), OpenOptions::read_only()).unwrap();
            for d in &rooted {
                s.get(d).unwrap_or_else(|e| panic!("kill {i}: a rooted object is lost: {e}"));
            }
            assert_eq!(s.root("model:kept").unwrap().map(|r| r.len()), Some(16));
        }
        let r = json(&["store", "gc", "--store", &dir, "--max-size", cap, "--json"], t);
        assert_eq!(r["within_cap"], true, "kill {i}: {r}");
        verify(&dir, t);
        std::fs::remove_dir_all(t.join(&dir)).unwrap();
    }
    eprintln!("{landed_midway} of {kills} kills landed between the entries' removal and the objects' deletion (run: {full:?})");
    assert_eq!(landed_midway, finished_on_open);
    assert!(landed_midway > 0, "no kill landed mid-eviction (run took {full:?}): the test tested nothing");
}
