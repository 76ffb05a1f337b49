//! Many machines, one cache: compiles of a small zoo model (mlp3) into fresh local stores sharing one remote
//! tier, against real servers started on 127.0.0.1 (Redis; nginx WebDAV). Stage executions are counted from
//! the build's own report (`Summary::stages`), artifacts compared byte for byte.

#[path = "../../store/tests/servers/mod.rs"]
mod servers;

use clap::Parser;
use servers::Server;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use tessera::cli::build_options::BuildOptions;
use tessera::explain::jobs_from_specs;
use tessera::zoo::Summary;
use tessera_stages::context::CostMode;
use tessera_store::{Remote, RemoteOptions};

const MODEL: &str = "fixture:mlp3:b2";

fn options(store: &Path, remote: Option<&str>) -> BuildOptions {
    BuildOptions {
        targets: vec!["cpu".into()],
        shapes: vec![],
        calibration: None,
        store: Some(store.to_path_buf()),
        wait: false,
        costs: CostMode::Analytical,
        tuning: Default::default(),
        gpus: tessera::cli::build_options::GpuList(None),
        frozen: false,
        measured_on: None,
        remote: remote.map(|u| u.parse().unwrap()),
        remote_read_only: false, remote_timeout_ms: tessera::cli::build_options::DEFAULT_REMOTE_TIMEOUT_MS, remote_signing_key: None, remote_trust: None, remote_credentials: None, remote_ca: None,
    }
}

fn compile_observed(store: &Path, remote: Option<&str>, out: &Path, on_stage: &(dyn Fn(&'static str, bool) + Send + Sync)) -> Summary {
    let jobs = jobs_from_specs(&[MODEL.to_string()], &Default::default()).unwrap();
    let s = options(store, remote).request(&[], out).unwrap().compile_jobs(&jobs, on_stage, &|_| {}).unwrap();
    assert!(s.failed.is_empty(), "{:?}", s.failed);
    assert_eq!(s.models, 1);
    s
}

fn compile(store: &Path, remote: Option<&str>, out: &Path) -> Summary {
    compile_observed(store, remote, out, &|_, _| {})
}

fn executions(s: &Summary) -> u64 {
    s.stages.values().map(|st| st.executions).sum()
}

fn artifact_bytes(s: &Summary) -> Vec<u8> {
    std::fs::read(&s.artifacts[0].path).unwrap()
}

/// The artifact a build without any remote makes.
fn reference(t: &Path) -> Vec<u8> {
    artifact_bytes(&compile(&t.join("ref-store"), None, &t.join("ref-out")))
}

#[test]
fn a_second_machine_executes_no_stage_and_gets_the_same_bytes() {
    for server in servers::plain() {
        let t = tempfile::tempdir().unwrap();
        let want = reference(t.path());
        let a = compile(&t.path().join("a"), Some(&server.url), &t.path().join("out-a"));
        let ra = a.remote.clone().unwrap();
        assert!(executions(&a) > 0);
        assert_eq!(ra.memo_uploaded, executions(&a), "{}: every execution's entry went to the remote: {ra:?}", server.url);
        assert!(ra.objects_uploaded > 0 && ra.disabled.is_none(), "{ra:?}");
        let b = compile(&t.path().join("b"), Some(&server.url), &t.path().join("out-b"));
        let rb = b.remote.clone().unwrap();
        assert_eq!(executions(&b), 0, "{}: the second machine must execute nothing: {:?}", server.url, b.stages);
        assert!(rb.memo_hits > 0 && rb.objects_fetched > 0, "{rb:?}");
        assert_eq!((rb.objects_rejected, rb.memo_rejected, rb.disabled.clone()), (0, 0, None), "{rb:?}");
        assert_eq!(artifact_bytes(&a), want, "{}", server.url);
        assert_eq!(artifact_bytes(&b), want, "{}", server.url);
        assert_eq!(a.artifacts[0].digest, b.artifacts[0].digest);
        eprintln!("{}: first machine executed {} stages, the second 0 ({} memo hits from the remote)", server.url, executions(&a), rb.memo_hits);
    }
}

#[test]
fn a_tampered_artifact_on_the_remote_is_detected_and_recomputed() {
    for server in servers::plain() {
        let t = tempfile::tempdir().unwrap();
        let a = compile(&t.path().join("a"), Some(&server.url), &t.path().join("out-a"));
        let artifact = a.artifacts[0].digest;
        Remote::new(&server.url.parse().unwrap(), RemoteOptions::default()).unwrap().put_object(&artifact, b"not the artifact").unwrap();
        let b = compile(&t.path().join("b"), Some(&server.url), &t.path().join("out-b"));
        let rb = b.remote.clone().unwrap();
        assert!(rb.objects_rejected >= 1 && rb.memo_rejected >= 1, "{}: {rb:?}", server.url);
        assert_eq!(b.stages["link"].executions, 1, "{}: the link stage recomputes the artifact: {:?}", server.url, b.stages);
        assert_eq!(executions(&b), 1, "{}: only the tampered output is recomputed: {:?}", server.url, b.stages);
        assert_eq!(artifact_bytes(&b), artifact_bytes(&a));
        // The recomputed artifact replaced the bad copy: a third machine is served in full.
        let c = compile(&t.path().join("c"), Some(&server.url), &t.path().join("out-c"));
        let rc = c.remote.clone().unwrap();
        assert_eq!((executions(&c), rc.objects_rejected), (0, 0), "{}: {rc:?}", server.url);
        assert_eq!(artifact_bytes(&c), artifact_bytes(&a));
    }
}

#[test]
fn the_server_killed_mid_build_costs_a_warning_and_a_restarted_empty_one_is_refilled() {
    for server in servers::plain() {
        let t = tempfile::tempdir().unwrap();
        let want = reference(t.path());
        let url = server.url.clone();
        let server = Mutex::new(server);
        let calls = AtomicUsize::new(0);
        let kill_after_3 = |_: &'static str, _: bool| {
            if calls.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
                server.lock().unwrap().kill();
            }
        };
        let a = compile_observed(&t.path().join("a"), Some(&url), &t.path().join("out-a"), &kill_after_3);
        let ra = a.remote.clone().unwrap();
        assert!(calls.load(Ordering::SeqCst) > 3, "the server was killed before the build ended");
        let why = ra.disabled.clone().unwrap_or_else(|| panic!("{url}: the tier must be disabled: {ra:?}"));
        assert!(why.contains(&url), "{why}");
        assert_eq!(ra.warnings().len(), 1, "one warning, not one per object: {:?}", ra.warnings());
        assert_eq!(artifact_bytes(&a), want, "{url}: the build finished locally, correct");
        // Nothing corrupt locally: the same store rebuilds without executing, to the same bytes.
        let again = compile(&t.path().join("a"), None, &t.path().join("out-a2"));
        assert_eq!((executions(&again), artifact_bytes(&again)), (0, want.clone()));

        // The server comes back empty: the next (fresh) machine recomputes and refills it.
        server.lock().unwrap().restart_empty();
        let c = compile(&t.path().join("c"), Some(&url), &t.path().join("out-c"));
        let rc = c.remote.clone().unwrap();
        assert!(executions(&c) > 0 && rc.memo_hits == 0, "{url}: {rc:?}");
        assert_eq!((rc.memo_uploaded, rc.disabled.clone()), (executions(&c), None), "{rc:?}");
        let d = compile(&t.path().join("d"), Some(&url), &t.path().join("out-d"));
        assert_eq!(executions(&d), 0, "{url}: refilled: {:?}", d.stages);
        assert_eq!(artifact_bytes(&d), want);
    }
}

#[test]
fn a_read_only_client_writes_nothing_to_the_remote() {
    for server in servers::plain() {
        let t = tempfile::tempdir().unwrap();
        let ro_url = format!("{}?ro", server.url);
        let r = compile(&t.path().join("r"), Some(&ro_url), &t.path().join("out-r"));
        let rr = r.remote.clone().unwrap();
        assert!(rr.read_only && executions(&r) > 0);
        assert_eq!((rr.objects_uploaded, rr.memo_uploaded, rr.memo_hits, rr.disabled.clone()), (0, 0, 0, None), "{rr:?}");
        // --remote-read-only does the same.
        let mut opts = options(&t.path().join("r2"), Some(&server.url));
        opts.remote_read_only = true;
        let jobs = jobs_from_specs(&[MODEL.to_string()], &Default::default()).unwrap();
        let r2 = opts.request(&[], &t.path().join("out-r2")).unwrap().compile_jobs(&jobs, &|_, _| {}, &|_| {}).unwrap();
        assert_eq!(r2.remote.clone().unwrap().objects_uploaded, 0);
        // The server holds nothing: a writable machine after them finds no entry and no object.
        let w = compile(&t.path().join("w"), Some(&server.url), &t.path().join("out-w"));
        let rw = w.remote.clone().unwrap();
        assert_eq!((rw.memo_hits, rw.objects_fetched), (0, 0), "{}: {rw:?}", server.url);
        assert_eq!(executions(&w), executions(&r));
    }
}

#[test]
fn the_command_line_takes_a_typed_remote_url() {
    let cli = tessera::cli::Cli::try_parse_from(["tessera", "compile", "m.onnx", "--remote", "redis://127.0.0.1:6379/1?ro"]).unwrap();
    let tessera::cli::Command::Compile(args) = cli.command else { panic!("not compile") };
    let url = args.build.remote.unwrap();
    assert!(url.read_only);
    assert_eq!(url.url, "redis://127.0.0.1:6379/1");
    let err = tessera::cli::Cli::try_parse_from(["tessera", "compile", "m.onnx", "--remote", "ftp://h/x"]).unwrap_err().to_string();
    assert!(err.contains("ftp://h/x") && err.contains("unknown scheme"), "{err}");
    let cli = tessera::cli::Cli::try_parse_from(["tessera", "explain", "fixture:mlp3", "--remote", "http://h:8080/c", "--remote-read-only"]).unwrap();
    let tessera::cli::Command::Explain(args) = cli.command else { panic!("not explain") };
    assert!(args.build.remote_read_only && args.build.remote.is_some());
}

// ---- signed memo entries ------------------------------------------------------------------------------

/// A key pair made by `tessera store keygen --out DIR`: (secret key file, public key file).
fn keygen(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = dir.to_str().unwrap();
    tessera::cli::run(tessera::cli::Cli::try_parse_from(["tessera", "store", "keygen", "--out", dir]).unwrap()).unwrap();
    (Path::new(dir).join("remote-signing.key"), Path::new(dir).join("remote-signing.pub"))
}

fn compile_signed(store: &Path, remote: &str, key: Option<&Path>, trust: Option<&Path>, out: &Path) -> Summary {
    let mut opts = options(store, Some(remote));
    opts.remote_signing_key = key.map(Path::to_path_buf);
    opts.remote_trust = trust.map(Path::to_path_buf);
    let jobs = jobs_from_specs(&[MODEL.to_string()], &Default::default()).unwrap();
    let s = opts.request(&[], out).unwrap().compile_jobs(&jobs, &|_, _| {}, &|_| {}).unwrap();
    assert!(s.failed.is_empty(), "{:?}", s.failed);
    s
}

#[test]
fn a_trusting_machine_recomputes_unsigned_or_foreign_entries_and_is_served_signed_ones() {
    for server in servers::plain() {
        let t = tempfile::tempdir().unwrap();
        let want = reference(t.path());
        let (secret, public) = keygen(&t.path().join("ci-key"));
        let (_, foreign_public) = keygen(&t.path().join("someone-else"));
        // An unsigned writer fills the cache (as before signing).
        let a = compile(&t.path().join("a"), Some(&server.url), &t.path().join("out-a"));
        let all = executions(&a);
        // A machine that trusts the CI key uses none of it: every stage computes here, to the right bytes;
        // it also signs, so its entries replace the unsigned ones.
        let b = compile_signed(&t.path().join("b"), &server.url, Some(&secret), Some(&public), &t.path().join("out-b"));
        let rb = b.remote.clone().unwrap();
        assert_eq!(executions(&b), all, "{}: nothing unsigned is used: {:?}", server.url, b.stages);
        assert_eq!((rb.memo_hits, rb.memo_signature_rejected, rb.memo_rejected), (0, all, all), "{}: {rb:?}", server.url);
        assert_eq!(artifact_bytes(&b), want, "{}", server.url);
        // A trusting reader is now served everything, signed.
        let c = compile_signed(&t.path().join("c"), &server.url, None, Some(&public), &t.path().join("out-c"));
        let rc = c.remote.clone().unwrap();
        assert_eq!(executions(&c), 0, "{}: {:?}", server.url, c.stages);
        assert_eq!((rc.memo_rejected, rc.memo_signature_rejected), (0, 0), "{rc:?}");
        assert_eq!(artifact_bytes(&c), want, "{}", server.url);
        // A machine trusting another key rejects them all and computes.
        let d = compile_signed(&t.path().join("d"), &server.url, None, Some(&foreign_public), &t.path().join("out-d"));
        let rd = d.remote.clone().unwrap();
        assert_eq!((executions(&d), rd.memo_signature_rejected, rd.memo_hits), (all, all, 0), "{}: {rd:?}", server.url);
        assert_eq!(artifact_bytes(&d), want, "{}", server.url);
        assert!(rd.warnings().iter().any(|w| w.contains("valid signature")), "{:?}", rd.warnings());
        // Without trusted keys, signed entries are used as any other.
        let e = compile(&t.path().join("e"), Some(&server.url), &t.path().join("out-e"));
        assert_eq!(executions(&e), 0, "{}", server.url);
    }
}

#[test]
fn bad_key_files_fail_the_command_naming_the_file() {
    let t = tempfile::tempdir().unwrap();
    let (secret, public) = keygen(&t.path().join("k"));
    let e = tessera::cli::run(tessera::cli::Cli::try_parse_from(["tessera", "store", "keygen", "--out", t.path().join("k").to_str().unwrap()]).unwrap()).unwrap_err();
    assert!(format!("{e:#}").contains("exists already"), "{e:#}");
    let secret_text = std::fs::read_to_string(&secret).unwrap();
    let cases: [(Option<&Path>, Option<&Path>, &Path, &str); 4] = [
        (Some(&public), None, &public, "--remote-signing-key"),
        (None, Some(&secret), &secret, "--remote-trust"),
        (Some(Path::new("/nonexistent/tessera.key")), None, Path::new("/nonexistent/tessera.key"), "cannot read"),
        (None, Some(Path::new("/nonexistent/trust.pub")), Path::new("/nonexistent/trust.pub"), "cannot read"),
    ];
    for (key, trust, file, says) in cases {
        let mut opts = options(&t.path().join("store"), Some("redis://127.0.0.1:1"));
        opts.remote_signing_key = key.map(Path::to_path_buf);
        opts.remote_trust = trust.map(Path::to_path_buf);
        let e = format!("{:#}", opts.open_store().err().expect("a bad key file is an error"));
        assert!(e.contains(&file.display().to_string()) && e.contains(says), "{e}");
        assert!(!secret_text.lines().any(|l| !l.starts_with('#') && e.contains(l.split_whitespace().last().unwrap())), "never the key: {e}");
    }
    // The options parse on the commands that take --remote.
    let cli = tessera::cli::Cli::try_parse_from(["tessera", "baselines", "fixture:mlp3", "--remote", "redis://h:1", "--remote-signing-key", "k", "--remote-trust", "t.pub"]).unwrap();
    let tessera::cli::Command::Baselines(args) = cli.command else { panic!("not baselines") };
    assert_eq!((args.build.remote_signing_key.unwrap(), args.build.remote_trust.unwrap()), ("k".into(), "t.pub".into()));
}

#[allow(dead_code)]
fn _servers_are_send(s: Server) -> impl Send {
    s
}
