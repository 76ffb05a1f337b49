//! `tessera-fuzz [TARGET|all] [--seed S] [--from N] [--execs N] [--seconds T] [--hang S] [--save DIR]`
//!
//! Runs `--execs` executions (default 10000) of each target, starting at index `--from` (default 0), from
//! seed `--seed` (default 0x7e55e7a), stopping early after `--seconds` if given; prints one line per target
//! (executions, seconds, exec/s, accepted, largest allocation, findings) and every finding with how to
//! reproduce it. `--save DIR` writes each finding's input there. Exits 1 when anything was found.

use tessera_fuzz::alloc::CountingAlloc;
use tessera_fuzz::{run, Corpus, RunOptions, TARGETS};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn main() {
    let mut args = std::env::args().skip(1);
    let mut which = "all".to_string();
    let mut opts = RunOptions { seed: 0x7e55e7a, from: 0, execs: 10_000, time_limit: None, hang: std::time::Duration::from_secs(10) };
    let mut save = None;
    let num = |v: Option<String>, what: &str| -> u64 {
        let v = v.unwrap_or_else(|| panic!("{what} needs a value"));
        let parsed = match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16),
            None => v.parse(),
        };
        parsed.unwrap_or_else(|_| panic!("{what} '{v}' is not a number"))
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seed" => opts.seed = num(args.next(), "--seed"),
            "--from" => opts.from = num(args.next(), "--from"),
            "--execs" => opts.execs = num(args.next(), "--execs"),
            "--seconds" => opts.time_limit = Some(std::time::Duration::from_secs(num(args.next(), "--seconds"))),
            "--hang" => opts.hang = std::time::Duration::from_secs(num(args.next(), "--hang")),
            "--save" => save = Some(std::path::PathBuf::from(args.next().expect("--save needs a folder"))),
            t if !t.starts_with('-') => which = t.to_string(),
            other => panic!("unknown option {other}"),
        }
    }
    assert!(tessera_fuzz::alloc::installed(), "the counting allocator is not installed");
    let corpus = Corpus::load();
    let mut any = false;
    for t in TARGETS.iter().filter(|t| which == "all" || t.name == which) {
        let r = run(t, &corpus, &opts);
        println!(
            "{:<11} execs {:>9} (from {})  {:>8.1}s  {:>9.0} exec/s  accepted {:>8}  largest allocation {:>10} B  findings {}",
            t.name,
            r.execs,
            opts.from,
            r.seconds,
            r.execs_per_sec(),
            r.accepted,
            r.peak_alloc,
            r.findings.len()
        );
        for (f, hits) in &r.findings {
            any = true;
            println!("  FINDING ({hits} executions): {f}");
            if let Some(dir) = &save {
                std::fs::create_dir_all(dir).expect("creating --save folder");
                std::fs::write(dir.join(format!("{}-{}.bin", f.target, f.index)), &f.input).expect("saving a finding");
            }
        }
    }
    if which != "all" && !TARGETS.iter().any(|t| t.name == which) {
        let names: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
        eprintln!("unknown target '{which}' (targets: {})", names.join(", "));
        std::process::exit(2);
    }
    std::process::exit(i32::from(any));
}
