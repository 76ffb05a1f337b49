//! The memo driver: stage calls over the content-addressed store (the one implementation of
//! [`tessera_stages::stage::Driver`]).
//!
//! Every stage is a pure function of its key's ingredients. The driver, not the stage, looks the key up
//! before running, applies the stage's device policy, and records the output after. Concurrent callers of one key (two models of a zoo sharing a
//! kernel, compiled in parallel) wait for a single execution, so "computed once" holds within a run too.
//! Outputs are named by digest, and downstream keys are built from upstream output digests: when an output
//! comes out unchanged, everything after it hits (early cutoff). Across machines sharing a remote tier, a
//! lease in the remote does the same ([`Store::claim`]): one machine computes, the others wait for its entry.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;
use tessera_stages::stage::{guarded, DevicePolicy, Driver, SharedFailure};
use tessera_store::lease::Claim;
use tessera_store::LocalClaim;
use tessera_store::{Digest, MemoEntry, Store};

/// Executions, hits and time of one stage in one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunStageStats {
    pub executions: u64,
    pub hits: u64,
    /// Time spent executing (misses only), in microseconds.
    pub exec_micros: u64,
}

/// One key's single execution within a run: later callers block on it until it is set. Blocking is safe while a
/// flight's holder never needs the blocked thread to finish. Rayon's work stealing breaks that on one thread: a
/// worker leading a flight waits inside its own nested parallel work (a module's NVRTC programs, a graph's
/// constants stored at once) by running other tasks, and a task that wants the same key then waits, on the
/// leader's own thread, for the leader below it on the stack. So the flight knows its leader's thread, and a
/// call from that thread computes the output itself instead ([`Memo::call`]). A GPU build hung that way on
/// the H200 (2026-11-28: validation built plans that share a module as rayon tasks). The same wait between two
/// builds of one process, through the store's local lease, did hang (three compiles into one store on a
/// 16-core machine), so that one never waits in-process (store/src/local_lease.rs).
#[derive(Default)]
struct Flight {
    leader: Mutex<Option<std::thread::ThreadId>>,
    result: OnceLock<std::result::Result<Digest, SharedFailure>>,
}

/// A run's view of the store: memoized calls and per-stage counters.
pub struct Memo<'s> {
    store: &'s Store,
    stats: Mutex<BTreeMap<&'static str, RunStageStats>>,
    inflight: Mutex<BTreeMap<(&'static str, Digest), Arc<Flight>>>,
    observer: Option<Box<dyn Fn(&'static str, bool) + Send + Sync + 's>>,
}

impl Driver for Memo<'_> {
    fn store(&self) -> &Store {
        self.store
    }

    fn call(&self, stage: &'static str, key: Digest, policy: DevicePolicy, compute: &mut dyn FnMut() -> Result<Vec<u8>>) -> Result<Digest> {
        let flight: Arc<Flight> = self.inflight.lock().expect("inflight lock").entry((stage, key)).or_default().clone();
        let me = std::thread::current().id();
        if flight.result.get().is_none() && *flight.leader.lock().expect("flight leader lock") == Some(me) {
            // Called again under its own execution, on the leader's thread (see `Flight`): waiting would wait
            // for itself. The same output, computed here (or found in the store, if the leader got that far).
            return self.lookup_or_compute(stage, key, policy, compute);
        }
        let mut ran = false;
        let result = flight.result.get_or_init(|| {
            ran = true;
            *flight.leader.lock().expect("flight leader lock") = Some(me);
            self.lookup_or_compute(stage, key, policy, compute).map_err(|e| SharedFailure(Arc::new(e)))
        });
        if !ran {
            // Another caller (earlier in this run, or concurrently) produced it.
            self.count(stage, true, 0);
        }
        result.clone().map_err(anyhow::Error::new)
    }
}

impl<'s> Memo<'s> {
    pub fn new(store: &'s Store) -> Self {
        Memo { store, stats: Mutex::default(), inflight: Mutex::default(), observer: None }
    }

    /// Calls `f(stage, was_hit)` after every memoized call (progress display).
    pub fn with_observer(mut self, f: impl Fn(&'static str, bool) + Send + Sync + 's) -> Self {
        self.observer = Some(Box::new(f));
        self
    }

    /// The store (with the driver's lifetime, unlike [`Driver::store`]).
    pub fn store(&self) -> &'s Store {
        self.store
    }

    /// Per-stage counters so far.
    pub fn stats(&self) -> BTreeMap<&'static str, RunStageStats> {
        self.stats.lock().expect("stats lock").clone()
    }

    fn lookup_or_compute(&self, stage: &'static str, key: Digest, policy: DevicePolicy, compute: &mut dyn FnMut() -> Result<Vec<u8>>) -> Result<Digest> {
        if let Some(entry) = self.store.memo_lookup(stage, &key).with_context(|| format!("stage {stage}: memo lookup"))? {
            if self.store.contains(&entry.output) {
                tracing::debug!(stage, key = %key.short(), "cached");
                self.count(stage, true, 0);
                return Ok(entry.output);
            }
            // The output object is gone (gc'd or quarantined): recompute.
        }
        // A miss here and on the remote: with a shared remote, take its lease first, or wait for the machine
        // that holds it (its entry arrives through the remote), so that machines sharing one remote execute
        // each output once in total. Held until the entry is recorded, released on drop.
        let _lease = match self.store.claim(stage, &key).with_context(|| format!("stage {stage}: remote lease"))? {
            Claim::Served(entry) if self.store.contains(&entry.output) => {
                self.count(stage, true, 0);
                return Ok(entry.output);
            }
            Claim::Held(guard) => Some(guard),
            Claim::Served(_) | Claim::Unleased => None,
        };
        // The processes sharing this store do the same through a local lease: concurrent compiles on one
        // machine execute each output once in total (remote lease first, then local: one order for all).
        let _local_lease = match self.store.claim_local(stage, &key).with_context(|| format!("stage {stage}: lease"))? {
            LocalClaim::Served(entry) => {
                self.count(stage, true, 0);
                return Ok(entry.output);
            }
            LocalClaim::Held(lease) => Some(lease),
            LocalClaim::Unleased => None,
        };
        let start = Instant::now();
        let bytes = guarded(policy, compute)?;
        let elapsed = start.elapsed();
        let output = self.store.put(&bytes).with_context(|| format!("stage {stage}: storing output"))?;
        self.store
            .memo_record(stage, &key, &MemoEntry::new(output, bytes.len() as u64, elapsed))
            .with_context(|| format!("stage {stage}: recording memo entry"))?;
        tracing::info!(stage, key = %key.short(), bytes = bytes.len(), "executed in {:.1} ms", elapsed.as_secs_f64() * 1e3);
        self.count(stage, false, elapsed.as_micros() as u64);
        Ok(output)
    }

    fn count(&self, stage: &'static str, hit: bool, micros: u64) {
        {
            let mut stats = self.stats.lock().expect("stats lock");
            let s = stats.entry(stage).or_default();
            if hit {
                s.hits += 1;
            } else {
                s.executions += 1;
                s.exec_micros += micros;
            }
        }
        if let Some(f) = &self.observer {
            f(stage, hit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_store::OpenOptions;

    /// A stage whose execution calls its own key again on the same thread (what a rayon worker does when it
    /// takes up another task wanting the key it is computing) gets the output instead of waiting for itself.
    #[test]
    fn a_call_under_its_own_execution_on_the_same_thread_does_not_wait_for_itself() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), OpenOptions::writable()).unwrap();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let memo = Memo::new(&store);
                let key = Digest::of(b"re-entered");
                let inner = |memo: &Memo| memo.call("reenter", key, DevicePolicy::Own, &mut || Ok(b"output".to_vec()));
                let outer = memo.call("reenter", key, DevicePolicy::Own, &mut || {
                    let again = inner(&memo)?;
                    assert_eq!(store.get(&again).unwrap(), b"output");
                    Ok(b"output".to_vec())
                });
                let _ = done.send(outer.map_err(|e| e.to_string()));
            });
            let outcome = finished.recv_timeout(std::time::Duration::from_secs(60));
            // A hang leaves the thread blocked for good: fail rather than wait for it.
            let result = outcome.unwrap_or_else(|_| {
                eprintln!("the re-entered call waited for itself");
                std::process::exit(1)
            });
            assert_eq!(store.get(&result.unwrap()).unwrap(), b"output");
        });
    }
}
