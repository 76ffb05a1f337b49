//! The C API end to end: examples/c/run.c compiled with the system C compiler against the committed header,
//! linked once against the shared library and once against the static one, run on zoo artifacts; its
//! outputs must equal, byte for byte, those of `tessera run` (the CLI's own code, in this process) on the
//! same inputs, and the provenance it prints the one the Rust API gives. It also reports two errors (a run
//! without inputs, a missing file) as messages.

#[path = "../../runtime/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use tessera_kernels::artifact::Artifact;
use tessera_stages::npy;

/// Where cargo put this crate's libraries: beside this test's executable (target/<profile>/deps).
fn lib_dir() -> PathBuf {
    std::env::current_exe().unwrap().parent().unwrap().to_path_buf()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Compiles examples/c/run.c into `exe`, linked against the shared library or the static one.
fn build(exe: &Path, shared: bool) {
    let dir = lib_dir();
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.args(["-std=c99", "-Wall", "-Werror", "-O1"])
        .arg("-I")
        .arg(repo().join("runtime-c/include"))
        .arg(repo().join("examples/c/run.c"))
        .arg("-o")
        .arg(exe);
    if shared {
        let so = dir.join("libtessera_runtime_c.so");
        assert!(so.exists(), "{} is missing", so.display());
        cc.arg(format!("-L{}", dir.display())).arg("-ltessera_runtime_c").arg(format!("-Wl,-rpath,{}", dir.display()));
    } else {
        let a = dir.join("libtessera_runtime_c.a");
        assert!(a.exists(), "{} is missing", a.display());
        // `cargo rustc --crate-type staticlib -- --print native-static-libs` lists these.
        cc.arg(a).args(["-lpthread", "-ldl", "-lm", "-lrt", "-lgcc_s", "-lutil", "-lc"]);
    }
    let out = cc.output().expect("a C compiler (cc) runs");
    assert!(out.status.success(), "compiling run.c ({}) failed:\n{}", if shared { "shared" } else { "static" }, String::from_utf8_lossy(&out.stderr));
}

#[test]
fn c_program_matches_tessera_run_linked_shared_and_static() {
    let tmp = tempfile::tempdir().unwrap();
    let programs: Vec<(&str, PathBuf)> = vec![("shared", tmp.path().join("run-shared")), ("static", tmp.path().join("run-static"))];
    for (kind, exe) in &programs {
        build(exe, *kind == "shared");
    }
    for name in ["mlp3-b8", "bert-tiny-b1-s128"] {
        let path = common::artifact(name);
        let a = Artifact::open(&path).unwrap();
        let dir = tmp.path().join(name);
        let (inputs_dir, reference) = (dir.join("in"), dir.join("tessera-run"));
        std::fs::create_dir_all(&inputs_dir).unwrap();
        // The same inputs for both: raw bytes for the C program, .npy files for `tessera run --input`.
        let mut args = Vec::new();
        for (i, (d, t)) in a.body.inputs.iter().zip(a.random_inputs(21)).enumerate() {
            std::fs::write(inputs_dir.join(format!("{i}.bin")), t.bytes()).unwrap();
            let npy_file = inputs_dir.join(format!("{i}.npy"));
            npy::write(&npy_file, &t).unwrap();
            args.push(format!("{}={}", d.name, npy_file.display()));
        }
        let report = tessera::cli::run_artifact::run_artifact(&path, &args, 0, &reference).unwrap();
        let want: Vec<PathBuf> = report.files[..a.body.outputs.len()].to_vec();

        for (kind, exe) in &programs {
            let out_dir = dir.join(format!("c-{kind}"));
            std::fs::create_dir_all(&out_dir).unwrap();
            let run = Command::new(exe).arg(&path).arg(&inputs_dir).arg(&out_dir).output().unwrap();
            let stdout = String::from_utf8_lossy(&run.stdout);
            assert!(run.status.success(), "{name} ({kind}): run.c failed:\n{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
            assert!(stdout.contains(&format!("model {}", a.body.model)), "{stdout}");
            // The provenance, as the Rust API gives it.
            let provenance = tessera_runtime::Model::load(&path).unwrap().provenance_json().expect("the pipeline records provenance");
            assert!(stdout.contains(&format!("provenance {provenance}\n")) && provenance.contains("\"costs\":\"analytical\""), "{stdout}");
            for (o, file) in want.iter().enumerate() {
                let got = std::fs::read(out_dir.join(format!("{o}.bin"))).unwrap();
                let want = npy::read(file).unwrap();
                assert!(got == want.bytes(), "{name} ({kind}): output {o} ({}) differs from tessera run's {}", a.body.outputs[o].name, file.display());
            }
            // The two errors, as statuses with messages naming what is at fault.
            let first = &a.body.inputs[0].name;
            assert!(stdout.contains("run without inputs: status 3:") && stdout.contains("missing input") && stdout.contains(first.as_str()), "{stdout}");
            assert!(stdout.contains("load of a missing file: status 1:") && stdout.contains("no/such/model.tsr"), "{stdout}");
        }
    }
}
