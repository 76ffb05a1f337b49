//! The driver: runs a target's executions, each under `catch_unwind` (a panic is a finding) with the
//! counting allocator armed (an allocation far beyond what the input justifies is a finding) and a
//! watchdog thread (an execution running longer than the hang limit is a finding: it prints how to
//! reproduce it and ends the process, since a hung thread cannot be interrupted).

use crate::rng::Rng;
use crate::targets::{Corpus, FuzzTarget};
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FindingKind {
    Panic,
    /// An allocation of `bytes` with a limit of `limit` for this input.
    BigAlloc { bytes: usize, limit: usize },
}

#[derive(Clone, Debug)]
pub struct Finding {
    pub target: &'static str,
    pub kind: FindingKind,
    /// The panic message and location, or what allocated.
    pub message: String,
    pub seed: u64,
    pub index: u64,
    pub input: Vec<u8>,
}

impl Finding {
    /// What two findings of one cause share (the panic location; the allocation's target).
    pub fn signature(&self) -> String {
        match &self.kind {
            FindingKind::Panic => {
                let first = self.message.lines().next().unwrap_or_default();
                format!("panic at {}", first.rsplit(" at ").next().unwrap_or(first))
            }
            FindingKind::BigAlloc { .. } => format!("big allocation in {}", self.target),
        }
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match &self.kind {
            FindingKind::Panic => "panic".to_string(),
            FindingKind::BigAlloc { bytes, limit } => format!("allocation of {bytes} bytes (limit {limit} for this input)"),
        };
        write!(
            f,
            "{}: {what}: {} (input {} bytes; reproduce: tessera-fuzz {} --seed {:#x} --from {} --execs 1)",
            self.target,
            self.message,
            self.input.len(),
            self.target,
            self.seed,
            self.index
        )
    }
}

#[derive(Debug, Default)]
pub struct Report {
    pub execs: u64,
    pub seconds: f64,
    /// Executions the target accepted (parsed/imported without error).
    pub accepted: u64,
    /// The largest allocation any execution made.
    pub peak_alloc: usize,
    /// One finding per signature (the first seen), with how many executions hit it.
    pub findings: Vec<(Finding, u64)>,
}

impl Report {
    pub fn execs_per_sec(&self) -> f64 {
        self.execs as f64 / self.seconds.max(1e-9)
    }
}

thread_local! {
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs (once) a panic hook that records the message and location instead of printing them, for
/// threads that are fuzzing; other threads keep the default hook.
fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let recorded = FUZZING.with(|f| *f.borrow());
            if !recorded {
                return default(info);
            }
            let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
                s.to_string()
            } else if let Some(s) = info.payload().downcast_ref::<String>() {
                s.clone()
            } else {
                "non-string panic payload".into()
            };
            let loc = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
            // TESSERA_FUZZ_BACKTRACE=1 (when reproducing one execution) adds where it came from.
            let trace = if std::env::var_os("TESSERA_FUZZ_BACKTRACE").is_some() {
                format!("\n{}", std::backtrace::Backtrace::force_capture())
            } else {
                String::new()
            };
            LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{msg} at {loc}{trace}")));
        }));
    });
}

thread_local! {
    static FUZZING: RefCell<bool> = const { RefCell::new(false) };
}

/// What one run does.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub seed: u64,
    /// Index of the first execution (to replay one: `from = N, execs = 1`).
    pub from: u64,
    pub execs: u64,
    /// Stop early after this long (None: run every execution).
    pub time_limit: Option<Duration>,
    /// An execution running longer than this is a hang.
    pub hang: Duration,
}

/// Runs one target.
pub fn run(target: &FuzzTarget, corpus: &Corpus, opts: &RunOptions) -> Report {
    install_hook();
    let mut report = Report::default();
    let start = Instant::now();
    // Watchdog: the index of the execution in progress and when it started.
    let current = Arc::new(AtomicU64::new(u64::MAX));
    let started_ms = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (current, started_ms, done) = (current.clone(), started_ms.clone(), done.clone());
        let (hang, seed, name) = (opts.hang, opts.seed, target.name);
        std::thread::spawn(move || {
            let mut seen = (u64::MAX, 0u64);
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let (i, t0) = (current.load(Ordering::Relaxed), started_ms.load(Ordering::Relaxed));
                if i == u64::MAX || (i, t0) != seen {
                    seen = (i, t0);
                    continue;
                }
                let now = start.elapsed().as_millis() as u64;
                if now.saturating_sub(t0) > hang.as_millis() as u64 {
                    eprintln!(
                        "tessera-fuzz: HANG: {name} execution {i} has run over {hang:?}; reproduce: tessera-fuzz {name} --seed {seed:#x} --from {i} --execs 1"
                    );
                    std::process::exit(3);
                }
            }
        })
    };
    let mut by_sig: std::collections::BTreeMap<String, usize> = Default::default();
    FUZZING.with(|f| *f.borrow_mut() = true);
    for index in opts.from..opts.from.saturating_add(opts.execs) {
        if opts.time_limit.is_some_and(|t| start.elapsed() > t) {
            break;
        }
        let mut rng = Rng::for_exec(opts.seed, index);
        let input = (target.generate)(&mut rng, corpus);
        let limit = (target.alloc_limit)(input.len());
        started_ms.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        current.store(index, Ordering::Relaxed);
        LAST_PANIC.with(|p| p.borrow_mut().take());
        crate::alloc::arm(limit);
        let result = catch_unwind(AssertUnwindSafe(|| (target.exec)(&input, corpus)));
        let (worst, peak) = crate::alloc::disarm();
        current.store(u64::MAX, Ordering::Relaxed);
        report.execs += 1;
        report.peak_alloc = report.peak_alloc.max(peak);
        let mut found = Vec::new();
        match result {
            Ok(true) => report.accepted += 1,
            Ok(false) => {}
            Err(_) => {
                let message = LAST_PANIC.with(|p| p.borrow_mut().take()).unwrap_or_else(|| "panic".into());
                found.push((FindingKind::Panic, message));
            }
        }
        if worst > 0 {
            found.push((FindingKind::BigAlloc { bytes: worst, limit }, format!("input of {} bytes", input.len())));
        }
        for (kind, message) in found {
            let f = Finding { target: target.name, kind, message, seed: opts.seed, index, input: input.clone() };
            let sig = f.signature();
            match by_sig.get(&sig) {
                Some(&k) => report.findings[k].1 += 1,
                None => {
                    by_sig.insert(sig, report.findings.len());
                    report.findings.push((f, 1));
                }
            }
        }
    }
    FUZZING.with(|f| *f.borrow_mut() = false);
    report.seconds = start.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let _ = watchdog.join();
    report
}
