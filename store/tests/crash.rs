//! Crash test: two writer processes (src/bin/tessera-store-crash-writer.rs) sharing the store are
//! SIGKILLed at random moments, again and again on the same store; after each kill the store must open, verify clean, and hold
//! every object, memo entry and root whose write call returned before the kill (the writer prints a
//! line after each return; whatever reached the pipe before the kill is a promise kept).
//!
//! Seeded: `TESSERA_CRASH_SEED` (default below) fixes the writer's content and the kill delays, so a
//! failure names its seed and iteration and can be rerun; `TESSERA_CRASH_KILLS` sets the count (>= 50).
//! The exact instant a kill lands still depends on the machine's speed.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tessera_store::{Digest, MemoEntry, OpenOptions, Store};

const DEFAULT_SEED: u64 = 0x7e55_e4a0_c4a5_0001;
const DEFAULT_KILLS: u64 = 100;

struct Rng(blake3::OutputReader);

impl Rng {
    fn new(seed: u64) -> Self {
        let mut h = blake3::Hasher::new_derive_key("tessera crash test kill times");
        h.update(&seed.to_le_bytes());
        Rng(h.finalize_xof())
    }
    fn below(&mut self, n: u64) -> u64 {
        let mut b = [0u8; 8];
        self.0.fill(&mut b);
        u64::from_le_bytes(b) % n
    }
}

#[derive(Default)]
struct Promised {
    objects: BTreeMap<Digest, u64>,
    memo: BTreeMap<(String, Digest), MemoEntry>,
    roots: BTreeMap<String, Vec<Digest>>,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn parse_line(line: &str, p: &mut Promised, ctx: &str) {
    let f: Vec<&str> = line.split(' ').collect();
    let d = |s: &str| -> Digest { s.parse().unwrap_or_else(|e| panic!("{ctx}: bad digest in '{line}': {e}")) };
    let n = |s: &str| -> u64 { s.parse().unwrap_or_else(|e| panic!("{ctx}: bad number in '{line}': {e}")) };
    match f[0] {
        "open" => {}
        "put" => {
            p.objects.insert(d(f[1]), n(f[2]));
        }
        "memo" => {
            let e = MemoEntry { output: d(f[3]), size: n(f[4]), compute_micros: n(f[5]), recorded_unix: n(f[6]) };
            p.memo.insert((f[1].to_string(), d(f[2])), e);
        }
        "root" => {
            let mut ds: Vec<Digest> = f[2].split(',').filter(|s| !s.is_empty()).map(d).collect();
            ds.sort();
            ds.dedup();
            p.roots.insert(f[1].to_string(), ds);
        }
        other => panic!("{ctx}: unknown line kind '{other}' in '{line}'"),
    }
}

fn check(dir: &Path, p: &Promised, ctx: &str) {
    let mut store =
        Store::open(dir, OpenOptions::writable()).unwrap_or_else(|e| panic!("{ctx}: store does not open: {e}"));
    for (d, size) in &p.objects {
        let bytes = store.get(d).unwrap_or_else(|e| panic!("{ctx}: promised object missing or damaged: {e}"));
        assert_eq!(bytes.len() as u64, *size, "{ctx}: object {d} has the wrong size");
    }
    for ((stage, key), e) in &p.memo {
        let got = store.memo_lookup(stage, key).unwrap_or_else(|e| panic!("{ctx}: memo lookup failed: {e}"));
        assert_eq!(
            got.as_ref(),
            Some(e),
            "{ctx}: promised memo entry stage '{stage}' key {key} is missing or different"
        );
    }
    for (name, ds) in &p.roots {
        let got = store.root(name).unwrap_or_else(|e| panic!("{ctx}: root read failed: {e}"));
        assert_eq!(got.as_ref(), Some(ds), "{ctx}: promised root '{name}' is missing or different");
    }
    let report = store.verify(false).unwrap_or_else(|e| panic!("{ctx}: verify failed to run: {e}"));
    assert!(report.is_clean(), "{ctx}: verify found problems:\n{}", report.lines().join("\n"));
}

#[test]
fn sigkilled_writer_loses_nothing_it_promised() {
    let seed = env_u64("TESSERA_CRASH_SEED", DEFAULT_SEED);
    let kills = env_u64("TESSERA_CRASH_KILLS", DEFAULT_KILLS).max(50);
    let exe = env!("CARGO_BIN_EXE_tessera-store-crash-writer");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let mut rng = Rng::new(seed);
    let mut promised = Promised::default();
    let started = Instant::now();
    let mut lines_total = 0usize;
    for i in 0..kills {
        let ctx = format!("seed {seed:#x} iteration {i}");
        // Mostly mid-stream kills, some very early ones that land while the store is being opened
        // (and so during crash recovery of the previous kill).
        // Two writers share the store (as concurrent compiles do), each killed at its own moment: their
        // journal appends interleave, and one may die between its append and its commit while the other
        // goes on (its next write then replays the dead one's frame).
        let mut children = Vec::new();
        for w in 0..2u64 {
            let delay = if rng.below(5) == 0 { rng.below(15) } else { 15 + rng.below(120) };
            let writer_seed = seed.wrapping_mul(1_000_003).wrapping_add(i * 2 + w);
            let child = Command::new(exe)
                .arg(&dir)
                .arg(writer_seed.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("{ctx}: cannot start {exe}: {e}"));
            children.push((Instant::now() + Duration::from_millis(delay), child));
        }
        children.sort_by_key(|(at, _)| *at);
        for (at, mut child) in children {
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            let killed = child.kill().is_ok();
            let status = child.wait().unwrap();
            let mut out = String::new();
            child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            assert!(
                killed && status.code().is_none(),
                "{ctx}: a writer ended on its own ({status}) before the kill: {err}"
            );
            // A line cut by the kill (no newline yet) promises nothing.
            let complete = match out.rfind('\n') {
                Some(end) => &out[..end],
                None => "",
            };
            for line in complete.lines() {
                parse_line(line, &mut promised, &ctx);
                lines_total += 1;
            }
        }
        check(&dir, &promised, &ctx);
    }
    eprintln!(
        "crash test: {kills} kills, {lines_total} promises ({} objects, {} memo entries, {} roots) kept, in {:.1?}",
        promised.objects.len(),
        promised.memo.len(),
        promised.roots.len(),
        started.elapsed()
    );
    assert!(
        !promised.memo.is_empty() && !promised.roots.is_empty(),
        "the writer never got far enough to test anything"
    );
}
