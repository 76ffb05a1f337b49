//! The `tessera` binary under faults, as a user runs it: several processes on one store at once, a compile
//! killed with SIGKILL at random moments and started again, a store on a disk that fills up.
//!
//! Small models and analytical costs keep it affordable on a 2-core machine. The kill test runs a short
//! version by default; `TESSERA_KILLS=N cargo test -p tessera --test processes -- --ignored` runs N
//! kills (50 by default) and prints where each one landed.
//!
//! The file lives with the other end-to-end tests but is a test of the `tessera` package
//! (pipeline/Cargo.toml), so that cargo builds the binary it runs and names it (`CARGO_BIN_EXE_tessera`).

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;
use tessera_kernels::artifact::Artifact;
use tessera_store::{OpenOptions, Store};

fn tessera_bin() -> &'static str {
    env!("CARGO_BIN_EXE_tessera")
}

/// A small seeded random generator (splitmix64): reproducible kill moments without a dependency.
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

const MLP_B1: &str = "[[entry]]\nmodel = \"mlp3\"\nbatch = 1\n";
const MLP_B2: &str = "[[entry]]\nmodel = \"mlp3\"\nbatch = 2\n";
const BERT_S16: &str = "[[entry]]\nmodel = \"bert-tiny\"\nseq = 16\n";

fn manifest(dir: &Path, name: &str, entries: &[&str]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, entries.join("\n")).unwrap();
    p
}

fn compile_cmd(manifest: &Path, store: &Path, out: &Path) -> Command {
    let mut c = Command::new(tessera_bin());
    c.arg("compile").arg(manifest).args(["--costs", "analytical", "--store"]).arg(store).arg("--out").arg(out);
    c.env_remove("TESSERA_STORE").stdin(Stdio::null());
    c
}

fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn store_verify(store: &Path) -> Output {
    Command::new(tessera_bin()).args(["store", "verify", "--store"]).arg(store).env_remove("TESSERA_STORE").output().unwrap()
}

/// Artifact file name -> bytes, for every `.tsr` in `out` (each one checked by the artifact validator).
fn artifacts(out: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut m = BTreeMap::new();
    for e in std::fs::read_dir(out).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "tsr") {
            Artifact::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            m.insert(p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap());
        }
    }
    m
}

/// Eight `tessera compile` processes started at once on one store (no `--wait`: they share it), with zoos
/// that overlap: all succeed, each distinct stage output is computed once across all of them (the local
/// leases' single flight), each model's artifact is byte-identical whichever process wrote it, readers
/// (`store stats`) run meanwhile without waiting, the store verifies, and a compile of the union afterwards
/// finds every stage cached (no process lost another's work).
#[test]
fn eight_processes_compile_overlapping_zoos_on_one_store() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let store = t.join("store");
    let zoos: [&[&str]; 8] = [
        &[MLP_B1, MLP_B2],
        &[MLP_B2, BERT_S16],
        &[MLP_B1, BERT_S16],
        &[MLP_B1, MLP_B2, BERT_S16],
        &[BERT_S16],
        &[MLP_B1],
        &[MLP_B2, MLP_B1],
        &[BERT_S16, MLP_B1],
    ];
    let children: Vec<_> = zoos
        .iter()
        .enumerate()
        .map(|(i, z)| {
            let m = manifest(t, &format!("zoo{i}.toml"), z);
            let child = compile_cmd(&m, &store, &t.join(format!("out{i}")))
                .arg("--json")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (i, child)
        })
        .collect();
    // A reader while the writers write: never refused, never queued behind them.
    let mut reader_runs = Vec::new();
    for _ in 0..3 {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let start = Instant::now();
        let out = Command::new(tessera_bin()).args(["store", "stats", "--json", "--store"]).arg(&store).env_remove("TESSERA_STORE").output().unwrap();
        // The store may not exist yet in the first moments.
        if out.status.success() {
            reader_runs.push(start.elapsed());
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("no store here yet"), "a reader failed while compiles ran: {err}");
        }
    }
    eprintln!("store stats while eight compiles write: {reader_runs:?}");
    assert!(!reader_runs.is_empty(), "no reader ran while the compiles wrote");
    let mut seen: BTreeMap<String, (usize, Vec<u8>)> = BTreeMap::new();
    let mut executions: BTreeMap<String, u64> = BTreeMap::new();
    for (i, child) in children {
        let json = ok(&format!("compile process {i}"), child.wait_with_output().unwrap());
        let summary: serde_json::Value = serde_json::from_str(&json).unwrap();
        for (stage, st) in summary["stages"].as_object().unwrap() {
            *executions.entry(stage.clone()).or_default() += st["executions"].as_u64().unwrap();
        }
        let arts = artifacts(&t.join(format!("out{i}")));
        assert_eq!(arts.len(), zoos[i].len(), "process {i} wrote {:?}", arts.keys());
        for (name, bytes) in arts {
            match seen.get(&name) {
                Some((j, first)) => assert!(first == &bytes, "{name} from process {i} differs from process {j}'s"),
                None => {
                    seen.insert(name, (i, bytes));
                }
            }
        }
    }
    assert_eq!(seen.len(), 3);
    ok("store verify", store_verify(&store));
    // Each distinct output once in total: as many executions per stage as the store holds entries.
    let entries = memo_entries(&store);
    for (stage, n) in &executions {
        assert_eq!(Some(n), entries.get(stage), "stage {stage}: {n} executions across the processes for {:?} entries", entries.get(stage));
    }
    let all = manifest(t, "all.toml", &[MLP_B1, MLP_B2, BERT_S16]);
    let json = ok("the union compile", compile_cmd(&all, &store, &t.join("out-all")).arg("--json").output().unwrap());
    let summary: serde_json::Value = serde_json::from_str(&json).unwrap();
    for (stage, st) in summary["stages"].as_object().unwrap() {
        assert_eq!(st["executions"], 0, "stage {stage} executed again after eight processes built the same models");
    }
}

/// Stages in pipeline order (what a kill is classified by).
const STAGES: [&str; 6] = ["targets", "load", "partition", "lower", "compile", "link"];

/// Memo entries per stage in a store (none when there is no store yet).
fn memo_entries(store: &Path) -> BTreeMap<String, u64> {
    match Store::open(store, OpenOptions::read_only()) {
        Ok(s) => s.stats().unwrap().stages.into_iter().map(|(k, v)| (k, v.entries)).collect(),
        Err(_) => BTreeMap::new(),
    }
}

/// Where a killed build was: the first stage (in pipeline order) with fewer memo entries than a complete
/// build has; "artifacts" when every stage was complete (writing the artifacts out, or exiting).
fn landed_in(now: &BTreeMap<String, u64>, full: &BTreeMap<String, u64>) -> String {
    if now.is_empty() {
        return "startup".into();
    }
    for s in STAGES {
        if now.get(s).copied().unwrap_or(0) < full.get(s).copied().unwrap_or(0) {
            return s.into();
        }
    }
    "artifacts".into()
}

/// Compiles a two-model zoo uninterrupted, then again in fresh stores, each time killing the compile
/// with SIGKILL at seeded random moments (one to four kills in a row, each followed by a restart), and
/// finishing with an uninterrupted run. After every kill the store verifies (after the crash recovery
/// that opening it does); every finished build has exactly the uninterrupted build's artifact bytes and
/// verifies. Returns how many kills landed in each stage.
fn kill_and_restart(kills: usize, seed: u64) -> BTreeMap<String, usize> {
    kill_and_restart_until(kills, seed, false)
}

/// [`kill_and_restart`]; with `every_stage`, it goes on past `kills` (up to four times as many) until a
/// kill has landed in every stage, since where a moment lands depends on the machine's load.
fn kill_and_restart_until(kills: usize, seed: u64, every_stage: bool) -> BTreeMap<String, usize> {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let zoo = manifest(t, "zoo.toml", &[MLP_B1, BERT_S16]);
    let ref_store = t.join("ref-store");
    let mut uninterrupted = compile_cmd(&zoo, &ref_store, &t.join("ref-out"));
    let start = Instant::now();
    ok("the uninterrupted compile", uninterrupted.output().unwrap());
    let cold = start.elapsed();
    let want = artifacts(&t.join("ref-out"));
    let full = memo_entries(&ref_store);
    for s in STAGES {
        assert!(full.get(s).copied().unwrap_or(0) > 0, "a complete build has no {s} entries: {full:?}");
    }

    let mut rng = SplitMix(seed);
    let mut landed: BTreeMap<String, usize> = BTreeMap::new();
    let (mut done, mut round) = (0, 0);
    let missing = |landed: &BTreeMap<String, usize>| STAGES.iter().skip(1).any(|s| !landed.contains_key(*s));
    let more = |done: usize, landed: &BTreeMap<String, usize>| done < kills || (every_stage && missing(landed) && done < 4 * kills);
    while more(done, &landed) {
        let (store, out) = (t.join(format!("store{round}")), t.join(format!("out{round}")));
        let chain = 1 + rng.below(4) as usize;
        let mut k = 0;
        while k < chain && more(done, &landed) {
            if landed_in(&memo_entries(&store), &full) == "artifacts" {
                break; // a restart finished every stage: later kills would only hit a cached build
            }
            // Squared: most of a cold build is the C compiler, so uniform moments would rarely land in the
            // short early stages; u^2 spreads the kills over all of them.
            let u = rng.unit();
            let delay = cold.mul_f64(u * u * 1.1);
            let mut child = compile_cmd(&zoo, &store, &out).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
            std::thread::sleep(delay);
            child.kill().unwrap();
            let status = child.wait().unwrap();
            if status.signal() != Some(9) {
                // It finished before the kill: not a kill; the next one starts over.
                assert!(status.success(), "round {round}: compile failed on its own: {status}");
                continue;
            }
            let at = landed_in(&memo_entries(&store), &full);
            let v = store_verify(&store);
            assert!(
                v.status.success() || at == "startup" && !store.join("FORMAT").exists(),
                "round {round}: after a kill in {at} ({delay:?} in), the store does not verify:\n{}{}",
                String::from_utf8_lossy(&v.stdout),
                String::from_utf8_lossy(&v.stderr)
            );
            *landed.entry(at).or_default() += 1;
            done += 1;
            k += 1;
        }
        ok(&format!("round {round}: the compile after the kills"), compile_cmd(&zoo, &store, &out).output().unwrap());
        let got = artifacts(&out);
        assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "round {round}");
        for (name, bytes) in &got {
            assert!(bytes == &want[name], "round {round}: {name} differs from the uninterrupted build's");
        }
        ok(&format!("round {round}: store verify"), store_verify(&store));
        let _ = std::fs::remove_dir_all(&store);
        let _ = std::fs::remove_dir_all(&out);
        round += 1;
    }
    eprintln!("{done} kills over {round} rounds (cold build {cold:.2?}, seed {seed:#x}); landed in: {landed:?}");
    landed
}

/// The short version CI runs: 8 kills.
#[test]
fn a_compile_killed_at_random_moments_finishes_with_the_same_bytes() {
    kill_and_restart(8, 0x6b11_0001);
}

/// The long version: at least `TESSERA_KILLS` kills (default 50), more until one has landed in every stage.
#[test]
#[ignore = "long: run with --ignored (TESSERA_KILLS=N sets the count)"]
fn many_kills_across_every_stage() {
    let kills = std::env::var("TESSERA_KILLS").ok().and_then(|s| s.parse().ok()).unwrap_or(50);
    let landed = kill_and_restart_until(kills, 0x6b11_0050, true);
    for s in STAGES.iter().skip(1) {
        assert!(landed.contains_key(*s), "no kill landed in {s}: {landed:?}");
    }
}

/// A tmpfs mounted for one test, unmounted on drop (whatever the test's outcome).
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (mount's syntax: `8m`) on `dir`; `Err` says why it could not.
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tessera-test"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!("mount failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }

    fn resize(&self, size: &str) {
        let out = Command::new("mount").args(["-o", &format!("remount,size={size}")]).arg(&self.0).output().unwrap();
        assert!(out.status.success(), "remount failed: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount").arg(&self.0).status().is_ok_and(|s| s.success());
        if !ok {
            // Busy (a process still has a file open): detach it now, the kernel frees it when that closes.
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// Compiles into a store on a small tmpfs until the disk is full: the compile that does not fit fails with
/// a "no space left" error naming the store, the store still verifies (nothing that was recorded is lost
/// or damaged), and once there is room again the same compile succeeds and the store verifies. Needs root
/// to mount (CI runs as root); without it the test says why and does nothing.
#[test]
fn a_full_disk_fails_clearly_loses_nothing_and_recovers() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let fs = match Tmpfs::mount(&t.join("disk"), "8m") {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("SKIPPED a_full_disk_fails_clearly_loses_nothing_and_recovers: cannot mount a tmpfs ({why}); it needs root");
            return;
        }
    };
    let store = fs.0.join("store");
    // Growing zoos: mlp3 is ~2 MB of weights (~4 MB in the store with its artifact), bert-tiny ~18 MB.
    let zoos: [&[&str]; 3] = [&[MLP_B1], &[MLP_B1, MLP_B2], &[MLP_B1, MLP_B2, BERT_S16]];
    let mut failed = None;
    for (i, z) in zoos.iter().enumerate() {
        let m = manifest(t, &format!("zoo{i}.toml"), z);
        let out = compile_cmd(&m, &store, &t.join(format!("out{i}"))).output().unwrap();
        if !out.status.success() {
            failed = Some((i, m, String::from_utf8_lossy(&out.stderr).into_owned()));
            break;
        }
    }
    let (i, m, stderr) = failed.expect("a zoo larger than the disk compiled");
    assert!(i > 0, "the first, small zoo did not fit either:\n{stderr}");
    assert!(stderr.contains("no space left on device for the store"), "the error does not say the disk is full:\n{stderr}");
    assert_eq!(stderr.matches("No space left").count() + stderr.matches("no space left").count(), 1, "said more than once:\n{stderr}");
    assert!(stderr.contains(&store.display().to_string()), "the error does not name the store {}:\n{stderr}", store.display());
    assert!(!stderr.contains("panicked"), "{stderr}");
    eprintln!("zoo {i} on the full disk failed as it should:\n{stderr}");
    ok("store verify on the full disk", store_verify(&store));

    fs.resize("64m");
    ok("the same compile with room", compile_cmd(&m, &store, &t.join("out-retry")).output().unwrap());
    assert_eq!(artifacts(&t.join("out-retry")).len(), zoos[i].len());
    ok("store verify after", store_verify(&store));
}
