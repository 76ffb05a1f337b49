//! Logs and CLI habits, through the binary: warnings logged with `tracing` reach stderr by default, `-v` shows
//! each stage executed and `-vv` the cache hits, `-q` silences warnings and progress, `$TESSERA_LOG` overrides,
//! and `tessera completions SHELL` prints a completion script.

use std::path::Path;
use std::process::{Command, Output};

fn tessera(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tessera"));
    c.args(args).current_dir(cwd).env_remove("TESSERA_LOG").env_remove("TESSERA_REMOTE").env_remove("TESSERA_STORE");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("tessera runs");
    assert!(out.status.success(), "tessera {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const COMPILE: [&str; 9] = ["compile", "fixture:mlp3:b1", "-t", "cpu", "--costs", "analytical", "--store", "s", "--out"];

#[test]
fn verbosity_flags_choose_what_reaches_stderr() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let with = |extra: &[&str], out: &str, env: &[(&str, &str)]| {
        let mut a: Vec<&str> = extra.to_vec();
        a.extend(COMPILE);
        a.push(out);
        stderr(&tessera(&a, t, env))
    };
    // Cold, -v: every stage executed is logged with its time; the default (warnings) logs none of it.
    let cold = with(&["-v"], "o1", &[]);
    assert!(cold.contains("executed in") && (cold.contains("stage=\"load\"") || cold.contains("stage=load")), "{cold}");
    let warm = with(&[], "o2", &[]);
    assert!(!warm.contains("executed in") && !warm.contains("cached"), "{warm}");
    assert!(warm.contains("[1/1] mlp3-b1"), "progress is shown by default: {warm}");
    // -vv: hits too; $TESSERA_LOG overrides the flags.
    assert!(with(&["-vv"], "o3", &[]).contains("cached"));
    assert!(with(&[], "o4", &[("TESSERA_LOG", "debug")]).contains("cached"));
    // -q: nothing but errors (no progress).
    let quiet = with(&["-q"], "o5", &[]);
    assert!(quiet.trim().is_empty(), "{quiet}");
}

#[test]
fn warnings_logged_by_the_store_reach_the_terminal_unless_quiet() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    tessera(&["store", "keygen", "--out", "keys"], t, &[]);
    // A remote that requires signed entries, and no key to sign with: a warning at start (the remote itself is
    // a closed port, skipped after its probe).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let remote = format!("redis://127.0.0.1:{port}");
    let mut args: Vec<&str> = COMPILE.to_vec();
    args.push("o");
    args.extend(["--remote", remote.as_str(), "--remote-trust", "keys/remote-signing.pub"]);
    let loud = stderr(&tessera(&args, t, &[]));
    assert!(loud.contains("WARN") && loud.contains("no signing key"), "{loud}");
    let mut quiet_args = vec!["-q"];
    quiet_args.extend(args.iter().copied());
    let quiet = stderr(&tessera(&quiet_args, t, &[]));
    assert!(!quiet.contains("no signing key") && !quiet.contains("warning"), "{quiet}");
}

#[test]
fn completions_are_printed_for_each_shell() {
    let tmp = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let out = tessera(&["completions", shell], tmp.path(), &[]);
        let script = String::from_utf8(out.stdout).unwrap();
        assert!(script.contains("tessera") && script.contains("compile") && script.contains("target"), "{shell}: {script:.200}");
    }
}

/// `--json` on the store commands that report (gc, export, import; stats and verify had it): one JSON object
/// each, with the report's counts.
#[test]
fn store_reports_are_json_on_request() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let mut a: Vec<&str> = COMPILE.to_vec();
    a.push("o");
    tessera(&a, t, &[]);
    let json = |args: &[&str]| -> serde_json::Value {
        let out = tessera(args, t, &[]);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
    };
    let export = json(&["store", "export", "--store", "s", "x.tar", "--json"]);
    assert!(export["objects"].as_u64().unwrap() > 0 && export["roots"].as_u64().unwrap() == 1, "{export}");
    let import = json(&["store", "import", "--store", "s2", "x.tar", "--json"]);
    assert_eq!(import["objects_added"], export["objects"], "{import}");
    let gc = json(&["store", "gc", "--store", "s2", "--dry-run", "--json"]);
    assert_eq!((gc["dry_run"].as_bool(), gc["roots"].as_u64()), (Some(true), Some(1)), "{gc}");
    assert_eq!(gc["objects_kept"], export["objects"], "{gc}");
}
