//! Production remotes through the `tessera` binary (issue 29): Redis over TLS as an ACL user, nginx WebDAV over
//! TLS with basic authentication, and an S3-compatible server (moto, TLS, IAM authentication), each started on
//! 127.0.0.1 with a CA the test makes. A first build fills the remote, a second machine with an empty store is
//! served from it (no stage executed, the same bytes); the credentials and CA come each way a user gives them
//! (`--remote-credentials`/`--remote-ca`, the environment, `AWS_*` and `AWS_ENDPOINT_URL` for S3). Wrong
//! credentials cost one warning line and the build goes on; no secret is ever printed.

#[path = "../../store/tests/servers/mod.rs"]
mod servers;

use serde_json::Value;
use servers::Server;
use std::path::Path;
use std::process::{Command, Stdio};

const MODEL: &str = "fixture:mlp3:b2";

/// Every variable that could configure a remote, removed so that the machine's environment cannot leak in.
const REMOTE_VARS: [&str; 14] = [
    "TESSERA_REMOTE",
    "TESSERA_STORE",
    "TESSERA_REMOTE_USER",
    "TESSERA_REMOTE_PASSWORD",
    "TESSERA_REMOTE_TOKEN",
    "TESSERA_REMOTE_CREDENTIALS",
    "TESSERA_REMOTE_CA",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
];

/// `tessera compile MODEL --json` into `store` with `args` and `env`: (success, summary or None, stdout and stderr).
fn compile(cwd: &Path, store: &str, args: &[String], env: &[(String, String)]) -> (bool, Option<Value>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
    cmd.args(["compile", MODEL, "--target", "cpu", "--costs", "analytical", "--json", "--store", store, "--out", &format!("out-{store}")]).args(args).current_dir(cwd).stdin(Stdio::null());
    for v in REMOTE_VARS {
        cmd.env_remove(v);
    }
    let out = cmd.envs(env.iter().map(|(k, v)| (k, v))).output().expect("tessera runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    (out.status.success(), serde_json::from_str(&stdout).ok(), format!("{stdout}\n{stderr}"))
}

fn executions(summary: &Value) -> u64 {
    summary["stages"].as_object().expect("stages").values().map(|s| s["executions"].as_u64().expect("executions")).sum()
}

/// The arguments and environment that point a build at `server` with `credentials`, each kind of server
/// configured a different way a user would: flags and a credentials file (Redis), the CA flag and credential
/// variables (WebDAV), only the environment and a bare `s3://` URL (S3).
fn configure(server: &Server, dir: &Path, credentials: &tessera_store::Credentials) -> (Vec<String>, Vec<(String, String)>) {
    let ca = server.ca.clone().unwrap().display().to_string();
    let mut env = Vec::new();
    let mut set = |k: &str, v: Option<&str>| {
        if let Some(v) = v {
            env.push((k.to_string(), v.to_string()));
        }
    };
    let args = if server.url.starts_with("rediss:") {
        use std::os::unix::fs::PermissionsExt;
        let file = dir.join("redis.credentials");
        let text = format!("TESSERA_REMOTE_USER={}\nTESSERA_REMOTE_PASSWORD='{}'\n", credentials.user.as_deref().unwrap(), credentials.password.as_ref().unwrap().expose());
        std::fs::write(&file, text).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        vec!["--remote".into(), server.url.clone(), "--remote-ca".into(), ca, "--remote-credentials".into(), file.display().to_string()]
    } else if server.url.starts_with("https:") {
        set("TESSERA_REMOTE_USER", credentials.user.as_deref());
        set("TESSERA_REMOTE_PASSWORD", credentials.password.as_ref().map(|p| p.expose()));
        vec!["--remote".into(), server.url.clone(), "--remote-ca".into(), ca]
    } else {
        set("TESSERA_REMOTE", Some(&format!("s3://{}/cache", servers::BUCKET)));
        set("AWS_ENDPOINT_URL", Some(&format!("https://127.0.0.1:{}", server.port)));
        set("AWS_ACCESS_KEY_ID", credentials.access_key_id.as_deref());
        set("AWS_SECRET_ACCESS_KEY", credentials.secret_access_key.as_ref().map(|p| p.expose()));
        set("TESSERA_REMOTE_CA", Some(&ca));
        vec![]
    };
    (args, env)
}

#[test]
fn a_second_machine_is_served_from_a_tls_remote_with_credentials_and_nothing_shows_a_secret() {
    for server in servers::secured() {
        let t = tempfile::tempdir().unwrap();
        let secret = server.secret().unwrap();
        let (args, env) = configure(&server, t.path(), &server.credentials());
        let (ok, a, out_a) = compile(t.path(), "a", &args, &env);
        assert!(ok, "{}: {out_a}", server.url);
        let a = a.unwrap();
        let ra = &a["remote"];
        assert!(executions(&a) > 0, "{}", server.url);
        assert_eq!(ra["memo_uploaded"].as_u64(), Some(executions(&a)), "{}: every entry went to the remote: {ra}", server.url);
        assert!(ra["disabled"].is_null(), "{}: {ra}", server.url);
        let (ok, b, out_b) = compile(t.path(), "b", &args, &env);
        assert!(ok, "{}: {out_b}", server.url);
        let b = b.unwrap();
        let rb = &b["remote"];
        assert_eq!(executions(&b), 0, "{}: the second machine executes nothing: {}", server.url, b["stages"]);
        assert!(rb["memo_hits"].as_u64() > Some(0) && rb["objects_fetched"].as_u64() > Some(0) && rb["disabled"].is_null(), "{}: {rb}", server.url);
        let artifact = |s: &Value| std::fs::read(t.path().join(s["artifacts"][0]["path"].as_str().unwrap())).unwrap();
        assert_eq!(artifact(&a), artifact(&b), "{}", server.url);
        for out in [&out_a, &out_b] {
            assert!(!out.contains(&secret), "{}: the secret was printed: {out}", server.url);
        }
        eprintln!("{}: the first machine executed {} stages, the second 0 ({} memo hits)", server.url, executions(&a), rb["memo_hits"]);
    }
}

#[test]
fn wrong_credentials_cost_one_warning_line_and_the_build_goes_on() {
    for server in servers::secured() {
        let t = tempfile::tempdir().unwrap();
        let (args, env) = configure(&server, t.path(), &server.wrong_credentials());
        let (ok, summary, out) = compile(t.path(), "s", &args, &env);
        assert!(ok, "{}: {out}", server.url);
        assert!(executions(&summary.unwrap()) > 0);
        let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("warning:") && l.contains("remote")).collect();
        assert_eq!(lines.len(), 1, "{}: one line about the remote: {out}", server.url);
        assert!(lines[0].contains("remote tier disabled") && lines[0].contains("refused the credentials"), "{}", lines[0]);
        assert!(!out.contains("not-the-password") && !out.contains(&server.secret().unwrap()), "{}: a secret was printed: {out}", server.url);
    }
}

#[test]
fn credentials_in_a_url_or_a_shared_credentials_file_are_refused_without_showing_them() {
    let t = tempfile::tempdir().unwrap();
    let url = "rediss://tessera:hunter2@127.0.0.1:6380/0";
    for (args, env) in [(vec!["--remote".to_string(), url.into()], vec![]), (vec![], vec![("TESSERA_REMOTE".to_string(), url.to_string())])] {
        let (ok, _, out) = compile(t.path(), "s", &args, &env);
        assert!(!ok, "{out}");
        assert!(out.contains("rediss://***@127.0.0.1:6380/0") && out.contains("TESSERA_REMOTE_PASSWORD") && out.contains("--remote-credentials"), "{out}");
        assert!(!out.contains("hunter2"), "the password was printed: {out}");
    }
    use std::os::unix::fs::PermissionsExt;
    let file = t.path().join("shared.credentials");
    std::fs::write(&file, "TESSERA_REMOTE_PASSWORD=hunter2\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let args: Vec<String> = ["--remote", "rediss://127.0.0.1:6380", "--remote-credentials", file.to_str().unwrap()].map(String::from).to_vec();
    let (ok, _, out) = compile(t.path(), "s", &args, &[]);
    assert!(!ok, "{out}");
    assert!(out.contains(&file.display().to_string()) && out.contains("mode 0644") && out.contains("chmod 600") && !out.contains("hunter2"), "{out}");
}
