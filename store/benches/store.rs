//! Store benchmark (`cargo bench -p tessera-store`): a plain main that prints a Markdown table, so the
//! figures can be pasted into bench/store.md as they are.
//!
//! Measures: durable put and verified get of 1 KiB and 64 MiB objects (both the in-memory and the
//! streaming API), memo record latency, memo lookups per second on a store with 100k entries, and the
//! open of that store from a fresh handle (sled recovery + journal check + first lookup), and eviction to a
//! size cap (`Store::evict_to`, what `tessera store gc --max-size` runs) on a store of 20k entries.
//! `TESSERA_BENCH_DIR` picks the directory the stores are made in (default: the system temp dir);
//! fsync cost depends on its filesystem, so the table names it. `TESSERA_BENCH_ONLY=evict` runs only the
//! eviction part; `TESSERA_BENCH_KEEP=1` keeps the stores (the eviction store's untouched copy is
//! `evict-copy`, for timing `tessera store gc --max-size` on it).

use std::hint::black_box;
use std::io::{self, Write};
use std::path::Path;
use std::time::{Duration, Instant};
use tessera_store::{Digest, KeyBuilder, MemoEntry, MemoRecord, OpenOptions, Store};

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

struct Row {
    what: String,
    n: u64,
    per_op: Duration,
    throughput: String,
}

fn row(what: &str, n: u64, total: Duration, bytes_per_op: Option<usize>) -> Row {
    let per_op = total / n as u32;
    let ops = n as f64 / total.as_secs_f64();
    let throughput = match bytes_per_op {
        Some(b) => format!("{:.0} ops/s, {:.0} MiB/s", ops, ops * b as f64 / MIB as f64),
        None => format!("{ops:.0} ops/s"),
    };
    Row { what: what.into(), n, per_op, throughput }
}

/// Distinct pseudo-random content (blake3 as a stream).
fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut h = blake3::Hasher::new();
    h.update(&seed.to_le_bytes());
    let mut v = vec![0u8; len];
    h.finalize_xof().fill(&mut v);
    v
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed())
}

struct Sink;
impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        black_box(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn small_objects(dir: &Path, rows: &mut Vec<Row>) {
    let s = Store::open(dir, OpenOptions::writable()).unwrap();
    let n = 2000u64;
    let blobs: Vec<Vec<u8>> = (0..n).map(|i| content(i, KIB)).collect();
    let (digests, t) = timed(|| blobs.iter().map(|b| s.put(b).unwrap()).collect::<Vec<Digest>>());
    rows.push(row("put 1 KiB (new, durable)", n, t, Some(KIB)));
    let (_, t) = timed(|| blobs.iter().for_each(|b| assert!(s.put_outcome(b).unwrap().already_present)));
    rows.push(row("put 1 KiB (already present: dedupe)", n, t, Some(KIB)));
    let reps = 10u64;
    let (_, t) = timed(|| {
        for _ in 0..reps {
            for d in &digests {
                black_box(s.get(d).unwrap());
            }
        }
    });
    rows.push(row("get 1 KiB (verified)", n * reps, t, Some(KIB)));
}

fn large_objects(dir: &Path, rows: &mut Vec<Row>) {
    let s = Store::open(dir, OpenOptions::writable()).unwrap();
    let n = 3u64;
    let blobs: Vec<Vec<u8>> = (0..2 * n).map(|i| content(1_000_000 + i, 64 * MIB)).collect();
    let (ds, t) = timed(|| blobs[..n as usize].iter().map(|b| s.put(b).unwrap()).collect::<Vec<_>>());
    rows.push(row("put 64 MiB (new, durable)", n, t, Some(64 * MIB)));
    let (ds2, t) = timed(|| blobs[n as usize..].iter().map(|b| s.put_reader(&b[..]).unwrap()).collect::<Vec<_>>());
    rows.push(row("put_reader 64 MiB (new, streaming)", n, t, Some(64 * MIB)));
    let (_, t) = timed(|| ds.iter().for_each(|d| drop(black_box(s.get(d).unwrap()))));
    rows.push(row("get 64 MiB (verified, into memory)", n, t, Some(64 * MIB)));
    let (_, t) = timed(|| ds2.iter().for_each(|d| assert_eq!(s.get_to_writer(d, &mut Sink).unwrap(), 64 * MIB as u64)));
    rows.push(row("get_to_writer 64 MiB (verified, streaming)", n, t, Some(64 * MIB)));
}

fn memo(dir: &Path, rows: &mut Vec<Row>) {
    let entries = 100_000u64;
    let outputs = 1000u64;
    let stages = ["partition", "compile", "tune", "link"];
    let key = |i: u64| KeyBuilder::new(stages[(i % 4) as usize], 1).input("i", &i).finish().unwrap();
    {
        let s = Store::open(dir, OpenOptions::writable()).unwrap();
        let outs: Vec<(Digest, u64)> = (0..outputs).map(|i| (s.put(&content(i, 256)).unwrap(), 256)).collect();
        let n = 200u64;
        let (_, t) = timed(|| {
            for i in 0..n {
                let (d, size) = outs[(i % outputs) as usize];
                s.memo_record(stages[(i % 4) as usize], &key(i), &MemoEntry::new(d, size, Duration::from_millis(1)))
                    .unwrap();
            }
        });
        rows.push(row("memo_record (one entry, durable)", n, t, None));
        let batch = 5000u64;
        let (_, t) = timed(|| {
            for start in (n..entries).step_by(batch as usize) {
                let recs: Vec<MemoRecord> = (start..(start + batch).min(entries))
                    .map(|i| {
                        let (d, size) = outs[(i % outputs) as usize];
                        MemoRecord {
                            stage: stages[(i % 4) as usize].into(),
                            key: key(i),
                            entry: MemoEntry::new(d, size, Duration::from_millis(1)),
                        }
                    })
                    .collect();
                s.memo_record_batch(&recs).unwrap();
            }
        });
        rows.push(row("memo_record_batch (5000 per batch), per entry", entries - n, t, None));
    }
    // Cold open: a fresh handle on the 100k-entry store, until the first lookup answers.
    let mut opens = Vec::new();
    for _ in 0..5 {
        let ((), t) = timed(|| {
            let s = Store::open(dir, OpenOptions::writable()).unwrap();
            assert!(s.memo_lookup("partition", &key(0)).unwrap().is_some());
        });
        opens.push(t);
    }
    opens.sort();
    rows.push(Row {
        what: "open store with 100k memo entries + first lookup (median of 5)".into(),
        n: 5,
        per_op: opens[2],
        throughput: "-".into(),
    });

    let s = Store::open(dir, OpenOptions::writable()).unwrap();
    let keys: Vec<(usize, Digest)> = (0..entries).map(|i| ((i % 4) as usize, key(i))).collect();
    let reps = 3u64;
    let (_, t) = timed(|| {
        for _ in 0..reps {
            for (st, k) in &keys {
                assert!(s.memo_lookup(stages[*st], k).unwrap().is_some());
            }
        }
    });
    rows.push(row("memo_lookup hit (100k entries)", entries * reps, t, None));
    let misses: Vec<Digest> = (entries..2 * entries).map(key).collect();
    let (_, t) = timed(|| {
        for k in &misses {
            assert!(s.memo_lookup("partition", k).unwrap().is_none());
        }
    });
    rows.push(row("memo_lookup miss (100k entries)", entries, t, None));
    let (_, t) = timed(|| {
        for i in 0..entries {
            black_box(key(i));
        }
    });
    rows.push(row("KeyBuilder: build one key (2 ingredients)", entries, t, None));
}

/// Eviction: `n` entries of 1 KiB each with its own object (half recorded in one session, half in the next,
/// so least recently used means the first half), plus a root of 100 objects with their entries.
fn evict(dir: &Path, rows: &mut Vec<Row>) {
    let n = 20_000u64;
    let stages = ["partition", "compile", "tune", "link"];
    let key = |i: u64| KeyBuilder::new(stages[(i % 4) as usize], 1).input("i", &i).finish().unwrap();
    for half in 0..2u64 {
        let s = Store::open(dir, OpenOptions::writable()).unwrap();
        let range = half * n / 2..(half + 1) * n / 2;
        let recs: Vec<MemoRecord> = range
            .map(|i| MemoRecord {
                stage: stages[(i % 4) as usize].into(),
                key: key(i),
                entry: MemoEntry::new(s.put(&content(i, KIB)).unwrap(), KIB as u64, Duration::from_millis(1)),
            })
            .collect();
        s.memo_record_batch(&recs).unwrap();
    }
    {
        let s = Store::open(dir, OpenOptions::writable()).unwrap();
        let rooted: Vec<Digest> = (0..100u64)
            .map(|i| {
                let d = s.put(&content(1_000_000 + i, KIB)).unwrap();
                s.memo_record("link", &key(1_000_000 + i), &MemoEntry::new(d, KIB as u64, Duration::ZERO)).unwrap();
                d
            })
            .collect();
        s.set_root("model:kept", &rooted).unwrap();
    }
    copy_dir(dir, &dir.with_file_name("evict-copy"));
    // The copy's dirty pages would otherwise be written back inside the eviction's first fsyncs (ext4
    // commits them together) and be timed as eviction.
    let _ = std::process::Command::new("sync").status();
    let mut s = Store::open(dir, OpenOptions::writable()).unwrap();
    let total = s.stats().unwrap().object_bytes;
    let (r, t) = timed(|| s.evict_to(total, false).unwrap());
    assert_eq!(r.entries_evicted, 0);
    rows.push(row(&format!("evict_to, {} entries, within the cap (scan only)", n + 100), 1, t, None));
    let (r, t) = timed(|| s.evict_to(total / 2, false).unwrap());
    assert!(r.within_cap && r.entries_evicted >= n / 2 - 1, "{r:?}");
    rows.push(Row {
        what: format!("evict_to, {} entries, evict {} (LRU half) + journal compaction", n + 100, r.entries_evicted),
        n: 1,
        per_op: t,
        throughput: format!("{:.1} µs per evicted entry", t.as_secs_f64() * 1e6 / r.entries_evicted as f64),
    });
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

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let base = std::env::var_os("TESSERA_BENCH_DIR").map(std::path::PathBuf::from).unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base).unwrap();
    let tmp = tempfile::tempdir_in(&base).unwrap();
    let mut rows = Vec::new();
    if std::env::var("TESSERA_BENCH_ONLY").as_deref() != Ok("evict") {
        eprintln!("small objects...");
        small_objects(&tmp.path().join("small"), &mut rows);
        eprintln!("large objects...");
        large_objects(&tmp.path().join("large"), &mut rows);
        eprintln!("memo table...");
        memo(&tmp.path().join("memo"), &mut rows);
    }
    eprintln!("eviction...");
    evict(&tmp.path().join("evict"), &mut rows);
    println!("stores in {}", tmp.path().display());
    if std::env::var_os("TESSERA_BENCH_KEEP").is_some() {
        let _ = tmp.keep();
    }
    println!();
    println!("| operation | n | time per op | throughput |");
    println!("|---|---:|---:|---:|");
    for r in rows {
        println!("| {} | {} | {} | {} |", r.what, r.n, fmt_dur(r.per_op), r.throughput);
    }
}

fn fmt_dur(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.1} µs")
    } else if us < 1e6 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}
