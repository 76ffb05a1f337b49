//! No work done twice across machines: workers with their own local stores sharing one real Redis
//! (started on 127.0.0.1) compile the same models at once, and execute each distinct stage output once in
//! total, counted from each build's own report (`Summary::stages`); a worker that dies holding leases
//! delays the others by one expiry, then they take the work over and finish with the same bytes.

#[path = "../../store/tests/servers/mod.rs"]
mod servers;

use servers::Server;
use std::collections::BTreeMap;
use std::path::Path;
use tessera::cli::build_options::BuildOptions;
use tessera::explain::jobs_from_specs;
use tessera::zoo::Summary;
use tessera_stages::context::CostMode;
use tessera_store::{OpenOptions, Remote, RemoteOptions, Store};

/// Two batch sizes of one model: distinct graphs that share kernels, so workers contend on shared keys.
const MODELS: [&str; 2] = ["fixture:mlp3:b2", "fixture:mlp3:b8"];

fn compile(store: &Path, remote: Option<&str>, out: &Path) -> Summary {
    compile_with(store, remote, out, CostMode::Analytical)
}

fn compile_with(store: &Path, remote: Option<&str>, out: &Path, costs: CostMode) -> Summary {
    let opts = BuildOptions {
        targets: vec!["cpu".into()],
        shapes: vec![],
        calibration: None,
        store: Some(store.to_path_buf()),
        wait: false,
        costs,
        tuning: Default::default(),
        gpus: tessera::cli::build_options::GpuList(None),
        frozen: false,
        measured_on: None,
        remote: remote.map(|u| u.parse().unwrap()),
        remote_read_only: false,
        remote_timeout_ms: tessera::cli::build_options::DEFAULT_REMOTE_TIMEOUT_MS,
        remote_signing_key: None,
        remote_trust: None,
        remote_credentials: None,
        remote_ca: None,
    };
    let specs: Vec<String> = MODELS.iter().map(|m| m.to_string()).collect();
    let jobs = jobs_from_specs(&specs, &Default::default()).unwrap();
    let s = opts.request(&[], out).unwrap().compile_jobs(&jobs, &|_, _| {}, &|_| {}).unwrap();
    assert!(s.failed.is_empty(), "{:?}", s.failed);
    s
}

fn per_stage(s: &Summary) -> BTreeMap<String, u64> {
    s.stages.iter().map(|(k, v)| (k.to_string(), v.executions)).collect()
}

fn artifacts(s: &Summary) -> BTreeMap<String, Vec<u8>> {
    s.artifacts.iter().map(|a| (a.model.clone(), std::fs::read(&a.path).unwrap())).collect()
}

#[test]
fn four_workers_at_once_execute_each_stage_once_in_total() {
    let Some(server) = Server::redis() else { return };
    let t = tempfile::tempdir().unwrap();
    let cold = compile(&t.path().join("cold"), None, &t.path().join("out-cold"));
    let want = per_stage(&cold);
    let url = format!("{}?lease=2s", server.url);
    let barrier = std::sync::Barrier::new(4);
    let runs: Vec<Summary> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let (t, url, barrier) = (t.path(), &url, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    compile(&t.join(format!("w{i}")), Some(url), &t.join(format!("out-w{i}")))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut total: BTreeMap<String, u64> = BTreeMap::new();
    for r in &runs {
        for (stage, n) in per_stage(r) {
            *total.entry(stage).or_default() += n;
        }
        assert_eq!(artifacts(r), artifacts(&cold), "every worker gets the cold build's bytes");
        let rs = r.remote.clone().unwrap();
        assert_eq!((rs.disabled.clone(), rs.objects_rejected, rs.memo_rejected, rs.lease_timeouts), (None, 0, 0, 0), "{rs:?}");
    }
    total.retain(|_, n| *n > 0);
    let mut want_nonzero = want.clone();
    want_nonzero.retain(|_, n| *n > 0);
    let leases: Vec<_> = runs.iter().map(|r| r.remote.clone().unwrap()).map(|r| (r.lease_taken, r.lease_waits, r.lease_served)).collect();
    assert_eq!(total, want_nonzero, "executions per stage over 4 workers = one cold build's; leases (taken, waits, served) per worker: {leases:?}");
    let taken: u64 = leases.iter().map(|l| l.0).sum();
    assert_eq!(taken, want_nonzero.values().sum::<u64>(), "one lease per execution: {leases:?}");
    eprintln!("4 workers: executions per stage {total:?} (cold: {want:?}); leases (taken, waits, served) {leases:?}");
}

#[test]
fn a_worker_that_dies_holding_leases_is_taken_over_after_expiry() {
    let Some(server) = Server::redis() else { return };
    let t = tempfile::tempdir().unwrap();
    let cold = compile(&t.path().join("cold"), None, &t.path().join("out-cold"));
    let url = format!("{}?lease=1s", server.url);
    // The dead worker: it took the lease of every (stage, key) this build computes and then stopped (never
    // renewed, never released, never recorded), as a process killed with SIGKILL mid-stage leaves them.
    let keys = Store::open(&t.path().join("cold"), OpenOptions::read_only()).unwrap().memo_entries().unwrap();
    let dead = Remote::new(&url.parse().unwrap(), RemoteOptions::default()).unwrap();
    let leases = dead.leases().unwrap();
    for rec in &keys {
        assert!(leases.try_acquire(&rec.stage, &rec.key).unwrap().is_some(), "the dead worker holds {} {}", rec.stage, rec.key);
    }
    let w = compile(&t.path().join("w"), Some(&url), &t.path().join("out-w"));
    let rw = w.remote.clone().unwrap();
    assert_eq!(per_stage(&w), per_stage(&cold), "the survivor executes the whole build: {rw:?}");
    assert!(rw.lease_waits >= 1 && rw.lease_takeovers >= 1, "it waited, then took over: {rw:?}");
    assert_eq!((rw.lease_timeouts, rw.disabled.clone()), (0, None), "{rw:?}");
    assert_eq!(artifacts(&w), artifacts(&cold), "correct output");
}

#[test]
fn tune_records_are_shared_too_each_measured_once_across_workers() {
    let Some(server) = Server::redis() else { return };
    let t = tempfile::tempdir().unwrap();
    let cold = compile_with(&t.path().join("cold"), None, &t.path().join("out-cold"), CostMode::Measured);
    let want = cold.stages.get("tune").map(|s| s.executions).unwrap_or(0);
    assert!(want > 0, "a measured build measures: {:?}", cold.stages);
    let url = format!("{}?lease=2s", server.url);
    let barrier = std::sync::Barrier::new(2);
    let runs: Vec<Summary> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|i| {
                let (t, url, barrier) = (t.path(), &url, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    compile_with(&t.join(format!("w{i}")), Some(url), &t.join(format!("out-w{i}")), CostMode::Measured)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // The device fingerprint is in every tune key: both workers run on this CPU, so one's measurements are
    // the other's, each measured once in total, and both build from the same records the same bytes. (Which
    // kernels are measured at all follows measured times, under pruned tuning: a build's count can differ
    // from the cold one's by a kernel or two, so the count to match is that of the distinct records made.)
    let total: u64 = runs.iter().map(|r| r.stages.get("tune").map(|s| s.executions).unwrap_or(0)).sum();
    let recorded: std::collections::BTreeSet<_> = (0..2)
        .flat_map(|i| Store::open(&t.path().join(format!("w{i}")), OpenOptions::read_only()).unwrap().memo_entries().unwrap())
        .filter(|rec| rec.stage == "tune")
        .map(|rec| rec.key)
        .collect();
    assert_eq!(total, recorded.len() as u64, "tune executions over 2 workers = the distinct tune records");
    assert!(total as f64 >= 0.8 * want as f64, "the workers measured {total} kernels, a cold build {want}");
    assert_eq!(artifacts(&runs[0]), artifacts(&runs[1]));
}
