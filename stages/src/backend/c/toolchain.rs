//! The C toolchain: found once through the `cc` crate, then invoked directly for each module.
//!
//! Reproducibility: a module is compiled in a fresh temporary directory under fixed file names
//! (`module.c` -> `module.so`), with the temporary path mapped away (`-ffile-prefix-map`), no debug info,
//! no compiler identification string (`-fno-ident` when supported), and the result stripped (`-s`), so the
//! bytes depend only on the source, the target's flags and the compiler itself, never on where the checkout
//! or the temporary directory lives.
//!
//! Floating point: `-ffp-contract=off` keeps the compiler from fusing a separate multiply and add into an FMA
//! (which would round differently from the reference interpreter); the GEMM micro-kernel opts back in to
//! FMA on its own when the target has it. `-fno-math-errno` only lets sqrt and friends inline (errno is never
//! read), it changes no value. `-fno-trapping-math` (floating-point exceptions are never read either) lets
//! the compiler turn the float selects of the prelude's math (range cases, NaN checks) into blends, without
//! which no loop over them vectorizes; it changes no value. `-ffast-math` is passed only when the target
//! asks for it.
//!
//! Instruction sets: with `-march=generic` on x86-64, every kernel item is compiled three times (AVX-512,
//! AVX2, baseline) through GCC's `target_clones` and chosen at load time (see the prelude's `TSR_KERNEL`),
//! where the compiler accepts it (probed once, [`Toolchain::clones`]); other `-march` values compile for that
//! instruction set alone.

use crate::backend::ToolError;
use crate::target::Target;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The compiler `cc` selects for the host, with the base flags it would use.
#[derive(Debug, Clone)]
pub struct Toolchain {
    pub path: PathBuf,
    /// cc's base flags minus optimization and debug flags (the target decides those).
    pub base_args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    pub no_ident: bool,
    /// First line of `--version`: part of what a compiled module depends on.
    pub version: String,
    /// Whether the compiler builds x86-64-v4/v3/baseline function clones with a load-time dispatch.
    pub clones: bool,
}

/// The host's target triple as `cc` spells it (the compiler runs outside any build script, so it cannot
/// read cargo's TARGET/HOST variables).
pub fn host_triple() -> String {
    let arch = std::env::consts::ARCH;
    match std::env::consts::OS {
        "linux" => format!("{arch}-unknown-linux-gnu"),
        "macos" => format!("{arch}-apple-darwin"),
        "windows" => format!("{arch}-pc-windows-msvc"),
        os => format!("{arch}-unknown-{os}"),
    }
}

fn find() -> Result<Toolchain, ToolError> {
    let dir = tempfile::Builder::new().prefix("tessera-cc-probe-").tempdir().map_err(|e| ToolError::Io(format!("cannot create a temporary directory: {e}")))?;
    let triple = host_triple();
    let mut b = cc::Build::new();
    b.target(&triple)
        .host(&triple)
        .opt_level(2)
        .debug(false)
        .pic(true)
        .warnings(false)
        .out_dir(dir.path())
        .cargo_metadata(false)
        .cargo_warnings(false)
        .emit_rerun_if_env_changed(false);
    let tool = b.try_get_compiler().map_err(|e| ToolError::NotFound(format!("no C compiler found for {triple}: {e}")))?;
    let out = Command::new(tool.path())
        .arg("--version")
        .output()
        .map_err(|e| ToolError::NotFound(format!("C compiler '{}' cannot run: {e}", tool.path().display())))?;
    if !out.status.success() {
        return Err(ToolError::NotFound(format!("C compiler '{}' --version failed", tool.path().display())));
    }
    let version = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").trim().to_string();
    let base_args = tool
        .args()
        .iter()
        .filter(|a| {
            let s = a.to_string_lossy();
            !(s.starts_with("-O") || s.starts_with("-g") || s == "-ffunction-sections" || s == "-fdata-sections")
        })
        .cloned()
        .collect();
    let no_ident = b.is_flag_supported("-fno-ident").unwrap_or(false);
    let clones = cfg!(target_arch = "x86_64") && compiles(tool.path(), dir.path(), CLONES_PROBE);
    Ok(Toolchain { path: tool.path().to_path_buf(), base_args, env: tool.get_envs().map(|(k, v)| (k.to_os_string(), v.to_os_string())).collect(), no_ident, version, clones })
}

/// A shared object with one cloned function: what `TSR_CLONES` asks of the compiler (GCC 12 and later).
const CLONES_PROBE: &str = "__attribute__((target_clones(\"arch=x86-64-v4\", \"arch=x86-64-v3\", \"default\"))) int f(int x) { return x + 1; }\nint g(int x) { return f(x); }\n";

/// Whether `cc` compiles `source` into a shared object.
fn compiles(cc: &std::path::Path, dir: &std::path::Path, source: &str) -> bool {
    let file = dir.join("probe.c");
    std::fs::write(&file, source).is_ok()
        && Command::new(cc)
            .current_dir(dir)
            .args(["-shared", "-fPIC", "-O2", "-o", "probe.so", "probe.c"])
            .output()
            .is_ok_and(|o| o.status.success())
}

/// The host toolchain, found once per process (finding it runs the compiler).
pub fn toolchain() -> Result<&'static Toolchain, ToolError> {
    static TC: OnceLock<Result<Toolchain, ToolError>> = OnceLock::new();
    TC.get_or_init(find).as_ref().map_err(|e| e.clone())
}

/// Compiler flags a target implies (besides the toolchain's base flags).
pub fn target_flags(target: &Target) -> Vec<String> {
    let mut flags = vec![format!("-O{}", target.int_attr("opt-level")), "-shared".into(), "-fPIC".into(), "-g0".into()];
    if target.bool_attr("fast-math") {
        flags.push("-ffast-math".into());
    } else {
        flags.push("-ffp-contract=off".into());
    }
    flags.push("-fno-math-errno".into());
    flags.push("-fno-trapping-math".into());
    // -O2's own cost model ("very cheap") vectorizes only loops that need no scalar remainder, which leaves out
    // most of a model's loops (49 positions, 1000 classes, 7 keys); -O3's model weighs the remainder instead.
    if target.int_attr("opt-level") >= 2 {
        flags.push("-fvect-cost-model=dynamic".into());
    }
    match target.str_attr("march") {
        "generic" => {
            if toolchain().is_ok_and(|tc| tc.clones) {
                flags.push("-DTSR_CLONES".into());
            }
        }
        m => flags.push(format!("-march={m}")),
    }
    flags
}

/// Compiles `source` to a shared object and returns its bytes; on failure, the first lines of the compiler's
/// output (with `module.c:LINE` locations for the caller to attribute).
pub fn compile(target: &Target, source: &str) -> Result<Vec<u8>, ToolError> {
    let tc = toolchain()?;
    let dir = tempfile::Builder::new().prefix("tessera-c-").tempdir().map_err(|e| ToolError::Io(format!("cannot create a temporary directory: {e}")))?;
    std::fs::write(dir.path().join("module.c"), source).map_err(|e| ToolError::Io(format!("cannot write module.c: {e}")))?;
    let map = dir.path().display().to_string();
    let mut cmd = Command::new(&tc.path);
    cmd.current_dir(dir.path());
    for (k, v) in &tc.env {
        cmd.env(k, v);
    }
    cmd.args(&tc.base_args);
    cmd.args(target_flags(target));
    if tc.no_ident {
        cmd.arg("-fno-ident");
    }
    cmd.arg(format!("-ffile-prefix-map={map}=."));
    cmd.arg(format!("-fdebug-prefix-map={map}=."));
    cmd.args(["-s", "-o", "module.so", "module.c", "-lm"]);
    let out = cmd.output().map_err(|e| ToolError::NotFound(format!("cannot run C compiler '{}': {e}", tc.path.display())))?;
    if !out.status.success() {
        let mut text = String::from_utf8_lossy(&out.stderr).to_string();
        text.push_str(&String::from_utf8_lossy(&out.stdout));
        return Err(ToolError::Failed(text));
    }
    std::fs::read(dir.path().join("module.so")).map_err(|e| ToolError::Io(format!("cannot read module.so: {e}")))
}

/// The assembly `compile` would assemble for `source` (tests check what the compiler made of a loop).
#[cfg(test)]
pub fn assembly(target: &Target, source: &str) -> Result<String, ToolError> {
    let io = |e: std::io::Error| ToolError::Io(e.to_string());
    let tc = toolchain()?;
    let dir = tempfile::tempdir().map_err(io)?;
    std::fs::write(dir.path().join("module.c"), source).map_err(io)?;
    let out = Command::new(&tc.path)
        .current_dir(dir.path())
        .args(&tc.base_args)
        .args(target_flags(target))
        .args(["-S", "-o", "module.s", "module.c"])
        .output()
        .map_err(|e| ToolError::NotFound(e.to_string()))?;
    if !out.status.success() {
        return Err(ToolError::Failed(String::from_utf8_lossy(&out.stderr).to_string()));
    }
    std::fs::read_to_string(dir.path().join("module.s")).map_err(io)
}
