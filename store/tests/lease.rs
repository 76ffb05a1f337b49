//! Leases in the remote tier against a real Redis (plain, and over TLS as an ACL user; and nginx WebDAV, which
//! has none) on 127.0.0.1: one
//! claimant holds, another waits and is served the holder's entry; a holder that dies (stops renewing,
//! never releases) is taken over after expiry; a live holder keeps its lease past expiry by renewing;
//! read-only and WebDAV clients take no lease; a dead server costs no hang.
//!
//! Assertions are on outcomes and counters; timeouts have generous slack (the expiry is 1 s).

mod servers;

use servers::Server;
use std::time::{Duration, Instant};
use tessera_store::lease::Claim;
use tessera_store::{Digest, MemoEntry, OpenOptions, Remote, RemoteOptions, RemoteUrl, Store};

fn store_at(dir: &std::path::Path, url: &str) -> Store {
    store_with(dir, url, RemoteOptions::default())
}

fn store_with(dir: &std::path::Path, url: &str, opts: RemoteOptions) -> Store {
    let u: RemoteUrl = url.parse().unwrap();
    Store::open(dir, OpenOptions::writable()).unwrap().with_remote(Remote::new(&u, opts).unwrap()).unwrap()
}

fn leased(s: &Server) -> String {
    format!("{}?lease=1s", s.url)
}

fn held(c: Claim) -> tessera_store::LeaseGuard {
    match c {
        Claim::Held(g) => g,
        other => panic!("expected to hold the lease, got {other:?}"),
    }
}

#[test]
fn one_claimant_computes_and_the_other_is_served_its_entry() {
    // Plain, and over TLS as an ACL user (the lease scripts run under the user's ACL too).
    for server in [Server::redis(), Server::redis_tls()].into_iter().flatten() {
        one_claimant_is_served_by_the_other(&server);
    }
}

fn one_claimant_is_served_by_the_other(server: &Server) {
    let t = tempfile::tempdir().unwrap();
    let at = |name: &str| store_with(&t.path().join(name), &leased(server), server.options());
    let (a, b) = (at("a"), at("b"));
    let key = Digest::of(b"k1");
    let guard = held(a.claim("lower", &key).unwrap());
    std::thread::scope(|s| {
        let waiter = s.spawn(|| b.claim("lower", &key).unwrap());
        // The holder works for longer than an expiry: its heartbeat keeps the lease.
        std::thread::sleep(Duration::from_millis(2500));
        assert!(!guard.lost(), "a live holder keeps its lease by renewing it");
        let out = a.put(b"the output").unwrap();
        a.memo_record("lower", &key, &MemoEntry::new(out, 10, Duration::from_millis(1))).unwrap();
        drop(guard);
        match waiter.join().unwrap() {
            Claim::Served(e) => assert_eq!(e.output, out),
            other => panic!("the waiter must be served the holder's entry, got {other:?}"),
        }
    });
    assert_eq!(b.get(&Digest::of(b"the output")).unwrap(), b"the output", "served means back-filled");
    let (ra, rb) = (a.remote_stats().unwrap(), b.remote_stats().unwrap());
    assert_eq!((ra.lease_taken, ra.lease_waits), (1, 0), "{ra:?}");
    assert_eq!((rb.lease_taken, rb.lease_waits, rb.lease_served, rb.lease_takeovers), (0, 1, 1, 0), "{rb:?}");
    // Released: a third claimant on a new key takes it at once; on the recorded key it is served.
    let c = at("c");
    assert!(matches!(c.claim("lower", &key).unwrap(), Claim::Served(_)));
}

#[test]
fn a_holder_that_dies_is_taken_over_after_expiry() {
    let Some(server) = Server::redis() else { return };
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (store_at(&t.path().join("a"), &leased(&server)), store_at(&t.path().join("b"), &leased(&server)));
    let key = Digest::of(b"k2");
    // The holder stops renewing and never releases, as a killed process would.
    held(a.claim("compile", &key).unwrap()).abandon();
    let start = Instant::now();
    let g = held(b.claim("compile", &key).unwrap());
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(500) && waited < Duration::from_secs(30), "waited {waited:?} for a 1 s lease");
    let rb = b.remote_stats().unwrap();
    assert_eq!((rb.lease_waits, rb.lease_takeovers, rb.lease_taken, rb.lease_served), (1, 1, 1, 0), "{rb:?}");
    drop(g);
}

#[test]
fn a_released_lease_without_an_entry_is_taken_over_at_once() {
    let Some(server) = Server::redis() else { return };
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (store_at(&t.path().join("a"), &leased(&server)), store_at(&t.path().join("b"), &leased(&server)));
    let key = Digest::of(b"k3");
    // The holder failed (its stage errored): dropping the guard releases the lease, recording nothing.
    drop(held(a.claim("tune", &key).unwrap()));
    held(b.claim("tune", &key).unwrap());
    let rb = b.remote_stats().unwrap();
    assert_eq!((rb.lease_waits, rb.lease_taken), (0, 1), "{rb:?}");
}

#[test]
fn read_only_webdav_and_lease_off_clients_take_no_lease() {
    let servers = servers::all();
    let t = tempfile::tempdir().unwrap();
    for (i, server) in servers.iter().enumerate() {
        let key = Digest::of(b"k4");
        let with = |opt: &str| format!("{}{}{opt}", server.url, if server.url.contains('?') { "&" } else { "?" });
        let mut urls = vec![with("ro"), with("lease=off")];
        if !server.url.starts_with("redis") {
            // nginx's DAV module has no atomic create-if-absent (it ignores If-None-Match on PUT); S3 leases are
            // not implemented (Redis only).
            urls.push(server.url.clone());
        }
        for (j, u) in urls.iter().enumerate() {
            let s = store_with(&t.path().join(format!("s{i}-{j}")), u, server.options());
            assert!(matches!(s.claim("lower", &key).unwrap(), Claim::Unleased), "{u}");
            let r = s.remote_stats().unwrap();
            assert_eq!((r.lease_taken, r.lease_waits), (0, 0), "{u}: {r:?}");
        }
    }
}

#[test]
fn a_dead_server_disables_the_tier_and_costs_no_hang() {
    let Some(mut server) = Server::redis() else { return };
    let t = tempfile::tempdir().unwrap();
    let a = store_at(&t.path().join("a"), &leased(&server));
    server.kill();
    let start = Instant::now();
    assert!(matches!(a.claim("lower", &Digest::of(b"k5")).unwrap(), Claim::Unleased));
    assert!(start.elapsed() < Duration::from_secs(30));
    let why = a.remote_stats().unwrap().disabled.expect("disabled");
    assert!(why.contains(&server.url) && why.contains("lease tessera-lease/lower/"), "names the server and the key: {why}");
}

/// Not a test on its own: the child process of the next test (it returns at once without its variables).
/// Takes a lease, with its heartbeat renewing it, says so, and waits to be killed.
#[test]
fn child_process_holding_a_lease() {
    let (Ok(url), Ok(dir)) = (std::env::var("TESSERA_LEASE_CHILD_URL"), std::env::var("TESSERA_LEASE_CHILD_DIR")) else { return };
    let s = store_at(std::path::Path::new(&dir), &url);
    let _guard = held(s.claim("compile", &Digest::of(b"k6")).unwrap());
    println!("HELD");
    std::io::Write::flush(&mut std::io::stdout()).unwrap();
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn a_process_killed_while_holding_a_lease_is_taken_over_after_expiry() {
    use std::io::BufRead;
    let Some(server) = Server::redis() else { return };
    let t = tempfile::tempdir().unwrap();
    /// Kills the child however the test ends, so a failed assertion leaves no process behind.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_holding_a_lease", "--nocapture", "--test-threads=1"])
        .env("TESSERA_LEASE_CHILD_URL", leased(&server))
        .env("TESSERA_LEASE_CHILD_DIR", t.path().join("child"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map(Killed)
        .unwrap();
    let mut lines = std::io::BufReader::new(child.0.stdout.take().unwrap()).lines();
    assert!(lines.any(|l| l.unwrap().contains("HELD")), "the child never took the lease");
    // Alive, it keeps the lease past its expiry (1 s) by renewing it.
    std::thread::sleep(Duration::from_millis(2500));
    let probe = Remote::new(&leased(&server).parse().unwrap(), RemoteOptions::default()).unwrap();
    assert_eq!(probe.leases().unwrap().try_acquire("compile", &Digest::of(b"k6")).unwrap(), None, "a live holder's lease is still held");
    drop(child); // SIGKILL: no release, no more renewals
    let b = store_at(&t.path().join("b"), &leased(&server));
    let start = Instant::now();
    let g = held(b.claim("compile", &Digest::of(b"k6")).unwrap());
    assert!(start.elapsed() < Duration::from_secs(30), "taken over within the expiry, with slack: {:?}", start.elapsed());
    let rb = b.remote_stats().unwrap();
    assert_eq!((rb.lease_waits, rb.lease_takeovers, rb.lease_taken), (1, 1, 1), "{rb:?}");
    drop(g);
}
