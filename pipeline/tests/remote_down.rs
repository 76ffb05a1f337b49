//! A remote tier that is down costs at most its timeout, once, through the `tessera` binary (issue 29): a
//! closed port is found down at once, a server that accepts connections but never answers after
//! `--remote-timeout-ms`; either way the rebuild goes on with the local store and says so in one warning line.
//! Only 127.0.0.1 addresses; no real server needed.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The rebuild: a model already in the store and one that is not, so that the build looks stages up on the
/// remote (the misses) and writes to it (the new outputs), as a rebuild after a change does. A build where
/// everything hits locally sends nothing to the remote at all (checked below).
const WARM: &str = "fixture:mlp3:b1";
const NEW: &str = "fixture:mlp3:b2";

fn tessera(args: &[&str], cwd: &Path) -> (Duration, String) {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .args(["--target", "cpu", "--costs", "analytical"])
        .current_dir(cwd)
        .env_remove("TESSERA_REMOTE")
        .env_remove("TESSERA_STORE")
        .stdin(Stdio::null())
        .output()
        .expect("tessera runs");
    let took = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "tessera {args:?} failed: {stderr}");
    (took, stderr)
}

/// A store in `cwd/name` holding `WARM`, then the rebuild of `WARM` and `NEW` into it, with `extra` arguments.
fn rebuild(cwd: &Path, name: &str, extra: &[&str]) -> (Duration, String) {
    let store = cwd.join(name);
    let store = store.to_str().unwrap();
    tessera(&["compile", WARM, "--store", store, "--out", &format!("{name}-warm")], cwd);
    let args: Vec<&str> = [&["compile", WARM, NEW, "--store", store, "--out", name][..], extra].concat();
    tessera(&args, cwd)
}

fn remote_warnings(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.contains("remote")).collect()
}

/// A port on 127.0.0.1 that nothing listens on (bound, then closed).
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn a_remote_on_a_closed_port_costs_no_time_and_one_warning() {
    let t = tempfile::tempdir().unwrap();
    let (base, stderr) = rebuild(t.path(), "none", &[]);
    assert!(remote_warnings(&stderr).is_empty(), "{stderr}");
    for scheme in ["redis", "http"] {
        let url = format!("{scheme}://127.0.0.1:{}", closed_port());
        let (took, stderr) = rebuild(t.path(), scheme, &["--remote", &url]);
        let warnings = remote_warnings(&stderr);
        assert_eq!(warnings.len(), 1, "{url}: exactly one line about the remote: {stderr}");
        assert!(warnings[0].starts_with("warning: remote tier disabled") && warnings[0].contains(&url), "{}", warnings[0]);
        assert!(warnings[0].contains("cannot connect to 127.0.0.1"), "{}", warnings[0]);
        let bound = base.mul_f64(1.1) + Duration::from_secs(1);
        assert!(took < bound, "{url}: the rebuild took {took:?}, without a remote {base:?} (bound {bound:?})");
        eprintln!("{url}: rebuild {took:?}, without a remote {base:?}");
    }
}

#[test]
fn a_remote_that_accepts_but_never_answers_costs_its_timeout_once() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accepts every connection and holds it open, answering nothing.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            held.push(s);
        }
    });
    let t = tempfile::tempdir().unwrap();
    let (base, _) = rebuild(t.path(), "none", &[]);
    for scheme in ["redis", "http"] {
        let url = format!("{scheme}://127.0.0.1:{port}");
        let (took, stderr) = rebuild(t.path(), scheme, &["--remote", &url, "--remote-timeout-ms", "400"]);
        let warnings = remote_warnings(&stderr);
        assert_eq!(warnings.len(), 1, "{url}: exactly one line about the remote: {stderr}");
        assert!(warnings[0].contains("did not answer within 400 ms"), "{}", warnings[0]);
        let bound = base.mul_f64(1.1) + Duration::from_millis(400) + Duration::from_secs(1);
        assert!(took < bound, "{url}: the rebuild took {took:?}, without a remote {base:?} (bound {bound:?})");
        assert!(took >= Duration::from_millis(400), "{url}: {took:?}: the timeout was waited once");
        eprintln!("{url}: rebuild {took:?}, without a remote {base:?}");
    }
}

#[test]
fn a_build_that_hits_locally_sends_nothing_to_the_remote() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    let store = store.to_str().unwrap();
    tessera(&["compile", WARM, "--store", store, "--out", "a"], t.path());
    let url = format!("redis://127.0.0.1:{}", closed_port());
    let (_, stderr) = tessera(&["compile", WARM, "--store", store, "--out", "b", "--remote", &url], t.path());
    assert!(remote_warnings(&stderr).is_empty(), "a fully cached build asks the remote nothing: {stderr}");
}

#[test]
fn the_timeout_must_be_positive() {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["compile", WARM, "--remote-timeout-ms", "0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("invalid value '0' for '--remote-timeout-ms"), "{stderr}");
}
