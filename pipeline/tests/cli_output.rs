//! How the `tessera` binary ends and what it prints when things go wrong around it (issue 29): a reader that
//! closes stdout early (`tessera targets | head -1`) ends it quietly, and an error prints each cause once.

use std::path::Path;
use std::process::{Command, Output, Stdio};

fn tessera() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tessera"));
    c.env_remove("TESSERA_STORE").env_remove("TESSERA_REMOTE").stdin(Stdio::null());
    c
}

/// Runs `tessera args` with stdout a pipe whose read end is already closed (the reader left before the first
/// line, as `head -1` does after it), in `cwd`.
#[cfg(unix)]
fn with_closed_stdout(args: &[&str], cwd: &Path) -> Output {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just created by pipe(2) and are owned here alone.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    let out = tessera().args(args).current_dir(cwd).stdout(Stdio::from(write)).stderr(Stdio::piped()).output().expect("tessera runs");
    out
}

#[cfg(unix)]
#[test]
fn a_closed_stdout_ends_every_printing_command_quietly_with_sigpipe() {
    use std::os::unix::process::ExitStatusExt;
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    let store = store.to_str().unwrap();
    let commands: &[&[&str]] = &[
        &["targets"],
        &["targets", "--json"],
        &["explain", "fixture:mlp3:b1", "--target", "cpu", "--costs", "analytical", "--store", store],
        &["explain", "fixture:mlp3:b1", "--target", "cpu", "--costs", "analytical", "--store", store, "--json"],
        &["compile", "fixture:mlp3:b1", "--target", "cpu", "--costs", "analytical", "--store", store, "--json", "--out", "out"],
        &["store", "stats", "--store", store],
    ];
    for args in commands {
        let out = with_closed_stdout(args, t.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "tessera {args:?}: {stderr}");
        // Ended by SIGPIPE (the shell's status 141), as `cat`, `ls` or `git log` are; not 101 (a panic).
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "tessera {args:?}: {:?}, stderr: {stderr}", out.status);
    }
}

#[cfg(unix)]
#[test]
fn a_reader_that_stops_after_the_first_line_gets_it() {
    // The realistic shape: `tessera targets | head -1` through a shell, with pipefail to see tessera's status.
    let bin = env!("CARGO_BIN_EXE_tessera");
    let out = Command::new("bash")
        .args(["-c", &format!("set -o pipefail; '{bin}' targets --json | head -c 1; echo \" status=${{PIPESTATUS[0]}}\"")])
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.starts_with('{'), "{stdout}");
    assert!(stdout.contains("status=141") || stdout.contains("status=0"), "{stdout} {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

fn failure(args: &[&str], cwd: &Path) -> String {
    let out = tessera().args(args).current_dir(cwd).output().expect("tessera runs");
    assert_eq!(out.status.code(), Some(1), "tessera {args:?} must fail with status 1: {out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn an_error_prints_its_cause_once() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    let store = store.to_str().unwrap();
    let base = ["--target", "cpu", "--costs", "analytical", "--store", store];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        // The ONNX importer (stages/src/onnx/error.rs).
        ([&["compile", "/no/such/model.onnx"][..], &base[..]].concat(), "/no/such/model.onnx"),
        // A zoo manifest (fixtures/src/manifest.rs).
        ([&["compile", "/no/such/zoo.toml"][..], &base[..]].concat(), "/no/such/zoo.toml"),
        // An artifact (kernels/src/artifact).
        (vec!["run", "/no/such/model.tsr", "--out", "o"], "/no/such/model.tsr"),
        (vec!["bench", "/no/such/model.tsr"], "/no/such/model.tsr"),
        // The reference interpreter on a missing ONNX file.
        (vec!["run", "/no/such/model.onnx", "--reference", "--out", "o"], "/no/such/model.onnx"),
    ];
    for (args, names) in cases {
        let stderr = failure(&args, t.path());
        assert!(stderr.contains(names), "tessera {args:?}: {stderr}");
        assert_eq!(stderr.matches("No such file or directory").count(), 1, "tessera {args:?}: the cause must be printed once: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // The store: an object file that cannot be read (store/src/error.rs's Io).
    let stderr = failure(&["store", "import", "--store", store, "/no/such/records.tar"], t.path());
    assert!(stderr.contains("/no/such/records.tar"), "{stderr}");
    assert_eq!(stderr.matches("No such file or directory").count(), 1, "{stderr}");
}

/// `--gpus` (the GPUs that measure) refuses a list it cannot measure on before anything is built, naming
/// what is wrong; on a machine without a GPU any list is refused with why.
#[test]
fn a_bad_gpu_list_is_refused_before_the_build() {
    let t = tempfile::tempdir().unwrap();
    let manifest = t.path().join("m.toml");
    std::fs::write(&manifest, "[[entry]]\nmodel = \"mlp3\"\nbatch = 1\n").unwrap();
    let (manifest, store) = (manifest.to_str().unwrap(), t.path().join("s"));
    let base = ["compile", manifest, "--target", "cpu", "--store", store.to_str().unwrap(), "--out", "o"];
    let twice = failure(&[&base[..], &["--gpus", "1,0,1"]].concat(), t.path());
    assert!(twice.contains("--gpus: --gpus names GPU 1 twice"), "{twice}");
    let parse = tessera().args([&base[..], &["--gpus", "0,one"]].concat()).current_dir(t.path()).output().unwrap();
    assert!(String::from_utf8_lossy(&parse.stderr).contains("'one' is not a GPU index"), "{parse:?}");
    let absent = failure(&[&base[..], &["--gpus", "99"]].concat(), t.path());
    assert!(absent.contains("--gpus: ") && (absent.contains("there is no GPU 99") || absent.contains("no CUDA driver") || absent.contains("sees no GPU")), "{absent}");
    assert!(!t.path().join("o").exists(), "nothing is built");
}
