//! Logs and CLI habits, through the binary: warnings logged with `tracing` reach stderr by default, `-v` shows
//! each stage executed and `-vv` the cache hits, `-q` silences warnings and progress, `$TESSERA_LOG` overrides,
//! `tessera completions SHELL` prints a completion script, and every command that reports prints JSON with
//! `--json`.

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

/// `--json` on the store commands that report (gc, export, import, config, keygen; stats and verify had it):
/// one JSON object each, with the report's counts.
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
    assert_eq!(json(&["store", "config", "--store", "s2", "--json"]), serde_json::json!({ "max_size": null }));
    assert_eq!(json(&["store", "config", "--store", "s2", "--max-size", "2M", "--json"]), serde_json::json!({ "max_size": 2 << 20 }));
    let keys = json(&["store", "keygen", "--out", "keys", "--json"]);
    for k in ["secret_key", "public_key"] {
        assert!(t.join(keys[k].as_str().unwrap()).is_file(), "{keys}");
    }
}

/// `tessera run --json`: the runner, the time, and every input and output with its type and file; drawn
/// inputs with their seed. The files are those the text report names.
#[test]
fn run_reports_are_json_on_request() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let mut a: Vec<&str> = COMPILE.to_vec();
    a.push("o");
    tessera(&a, t, &[]);
    let json = |args: &[&str]| -> serde_json::Value {
        let out = tessera(args, t, &[]);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
    };
    let r = json(&["run", "o/mlp3-b1.tsr", "--out", "r1", "--seed", "4", "--json"]);
    assert_eq!((r["model"].as_str(), r["runner"].as_str()), (Some("o/mlp3-b1.tsr"), Some("artifact")), "{r}");
    assert!(r["seconds"].as_f64().unwrap() > 0.0, "{r}");
    let input = &r["inputs"][0];
    assert_eq!((input["name"].as_str(), input["type"].as_str(), input["seed"].as_u64()), (Some("input"), Some("f32[1x784]"), Some(4)), "{r}");
    let output = &r["outputs"][0];
    assert_eq!((output["name"].as_str(), output["type"].as_str()), (Some("logits"), Some("f32[1x10]")), "{r}");
    for f in [&input["file"], &output["file"]] {
        assert!(t.join(f.as_str().unwrap()).is_file(), "{r}");
    }
    // A given input has no seed; the run reproduces the outputs.
    let given = format!("input={}", input["file"].as_str().unwrap());
    let r2 = json(&["run", "o/mlp3-b1.tsr", "--out", "r2", "--input", &given, "--json"]);
    assert_eq!(r2["inputs"][0]["seed"], serde_json::Value::Null, "{r2}");
    assert_eq!(r2["inputs"][0]["file"], input["file"]);
    let read = |v: &serde_json::Value| std::fs::read(t.join(v.as_str().unwrap())).unwrap();
    assert!(read(&r2["outputs"][0]["file"]) == read(&output["file"]));
    // The text report names the same files.
    let text = String::from_utf8(tessera(&["run", "o/mlp3-b1.tsr", "--out", "r1", "--seed", "4"], t, &[]).stdout).unwrap();
    assert!(text.contains(output["file"].as_str().unwrap()) && text.contains("drawn from seed 4"), "{text}");
}
