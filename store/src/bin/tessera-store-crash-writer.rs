//! The writer process of the crash test (store/tests/crash.rs): opens a store and writes objects, memo
//! entries and roots until it is killed, printing one line on stdout after each call returns:
//!
//! ```text
//! open
//! put <digest> <size>
//! memo <stage> <key> <output> <size> <compute_micros> <recorded_unix>
//! root <name> <digest>,<digest>,...
//! ```
//!
//! Every line printed is a promise: the test SIGKILLs this process at a random moment and then checks
//! that everything printed is in the store, intact. Content is derived from the seed (blake3 as a
//! stream cipher), so a failing seed reproduces the same writes. Stops by itself after `MAX_OPS`.
//!
//! Usage: `tessera-store-crash-writer STORE_DIR SEED`

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tessera_store::{KeyBuilder, MemoEntry, OpenOptions, Store};

const MAX_OPS: u64 = 20_000;
const STAGES: [&str; 3] = ["partition", "compile", "tune"];

/// A deterministic byte stream from a seed.
struct Rng(blake3::OutputReader);

impl Rng {
    fn new(seed: u64) -> Self {
        let mut h = blake3::Hasher::new_derive_key("tessera crash writer rng");
        h.update(&seed.to_le_bytes());
        Rng(h.finalize_xof())
    }
    fn below(&mut self, n: u64) -> u64 {
        let mut b = [0u8; 8];
        self.0.fill(&mut b);
        u64::from_le_bytes(b) % n
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.0.fill(&mut v);
        v
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: {} STORE_DIR SEED", args[0]);
        return ExitCode::from(2);
    }
    let dir = PathBuf::from(&args[1]);
    let seed: u64 = match args[2].parse() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bad seed '{}': {e}", args[2]);
            return ExitCode::from(2);
        }
    };
    match run(dir, seed) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crash writer failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(dir: PathBuf, seed: u64) -> Result<(), Box<dyn std::error::Error>> {
    let mut out = std::io::stdout().lock();
    let mut say = move |line: String| -> std::io::Result<()> {
        out.write_all(line.as_bytes())?;
        out.write_all(b"\n")?;
        out.flush()
    };
    let store = Store::open(&dir, OpenOptions::writable().wait(true))?;
    say("open".into())?;
    let mut rng = Rng::new(seed);
    let mut recent = Vec::new();
    for n in 0..MAX_OPS {
        let kind = rng.below(16);
        let data = match kind {
            0 => {
                let size = 256 * 1024 + rng.below(768 * 1024) as usize;
                rng.bytes(size)
            }
            // Repeated content: exercises dedupe.
            1 => vec![7u8; 1000],
            _ => {
                let size = rng.below(32 * 1024) as usize;
                rng.bytes(size)
            }
        };
        let size = data.len() as u64;
        let d = if kind & 1 == 0 { store.put_reader(&data[..])? } else { store.put(&data)? };
        say(format!("put {d} {size}"))?;
        recent.push(d);
        if rng.below(2) == 0 {
            let stage = STAGES[rng.below(3) as usize];
            let key = KeyBuilder::new(stage, 1).input("seed", &seed).input("op", &n).finish()?;
            let e = MemoEntry::new(d, size, Duration::from_micros(rng.below(1_000_000)));
            store.memo_record(stage, &key, &e)?;
            say(format!("memo {stage} {key} {d} {size} {} {}", e.compute_micros, e.recorded_unix))?;
        }
        if rng.below(8) == 0 {
            let name = format!("root-{seed:016x}-{n}");
            let ds: Vec<_> = recent.iter().rev().take(5).copied().collect();
            store.set_root(&name, &ds)?;
            let list: Vec<String> = ds.iter().map(|d| d.to_hex()).collect();
            say(format!("root {name} {}", list.join(",")))?;
        }
        if rng.below(4) == 0 {
            let key = KeyBuilder::new("tune", 1).input("probe", &n).finish()?;
            store.memo_lookup("tune", &key)?;
        }
    }
    Ok(())
}
