//! nvcc and the CUTLASS headers: a module's CUDA C++ to one cubin for the target's architecture, on a machine
//! with or without a GPU.
//!
//! nvcc is looked for where the CUDA toolkit is (`$TESSERA_CUDA_HOME/bin`, `/usr/local/cuda/bin`, the
//! `nvidia-cuda-nvcc` PyPI wheel's `site-packages/nvidia/cu13/bin`); the CUTLASS headers in
//! `$TESSERA_CUTLASS_HOME` (a folder holding `cutlass/version.h`, or its `include/`) and in the
//! `nvidia-cutlass` PyPI wheel (`site-packages/cutlass_library/source/include`). Where they live is a fact of
//! the machine, not of the code; their versions (nvcc's release, CUTLASS's version.h) and the options are
//! what the compile key holds ([`Toolchain::environment`]).

use crate::backend::ToolError;
use crate::target::{AttrValue, Target};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use tessera_kernels::runtime::cuda::libs;

/// Where modules are compiled: a fixed path on every machine (see [`Toolchain::compile`]).
const BUILD_ROOT: &str = "/tmp/tessera-cutlass";

/// The tools found on this machine.
#[derive(Clone, Debug)]
pub struct Toolchain {
    pub nvcc: PathBuf,
    /// `release 13.0, V13.0.88`
    pub nvcc_version: String,
    /// The folder holding `cutlass/` and `cute/`.
    pub cutlass_include: PathBuf,
    /// `4.2.0`
    pub cutlass_version: String,
}

fn find_nvcc() -> Result<(PathBuf, String), ToolError> {
    let homes = libs::candidate_homes();
    let nvcc = homes.iter().map(|h| h.join("bin").join("nvcc")).find(|p| p.is_file()).ok_or_else(|| {
        let looked: Vec<String> = homes.iter().map(|h| h.join("bin").display().to_string()).collect();
        ToolError::NotFound(format!(
            "no nvcc found (looked in {}); install the CUDA toolkit, or `pip install nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88`, or set TESSERA_CUDA_HOME",
            looked.join(", ")
        ))
    })?;
    let out = std::process::Command::new(&nvcc).arg("--version").output().map_err(|e| ToolError::NotFound(format!("cannot run {}: {e}", nvcc.display())))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .lines()
        .find_map(|l| l.split_once("compilation tools, ").map(|(_, v)| v.trim().to_string()))
        .ok_or_else(|| ToolError::BadOutput(format!("{} --version does not say its release: {text}", nvcc.display())))?;
    Ok((nvcc, version))
}

fn cutlass_in(dir: &Path) -> Option<PathBuf> {
    [dir.to_path_buf(), dir.join("include")].into_iter().find(|d| d.join("cutlass").join("version.h").is_file())
}

/// `major.minor.patch` from CUTLASS's version.h.
pub fn cutlass_version(include: &Path) -> Result<String, ToolError> {
    let path = include.join("cutlass").join("version.h");
    let text = std::fs::read_to_string(&path).map_err(|e| ToolError::Io(format!("cannot read {}: {e}", path.display())))?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix("#define ").and_then(|r| r.strip_prefix(name)).map(|v| v.trim().to_string()))
            .filter(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit()))
            .ok_or_else(|| ToolError::BadOutput(format!("{} defines no {name}", path.display())))
    };
    Ok(format!("{}.{}.{}", field("CUTLASS_MAJOR")?, field("CUTLASS_MINOR")?, field("CUTLASS_PATCH")?))
}

fn find_cutlass() -> Result<PathBuf, ToolError> {
    let mut looked = Vec::new();
    if let Some(h) = std::env::var_os("TESSERA_CUTLASS_HOME") {
        let h = PathBuf::from(h);
        if let Some(d) = cutlass_in(&h) {
            return Ok(d);
        }
        looked.push(h.display().to_string());
    }
    for site in libs::python_site_dirs() {
        let d = site.join("cutlass_library").join("source").join("include");
        if let Some(d) = cutlass_in(&d) {
            return Ok(d);
        }
        looked.push(d.display().to_string());
    }
    Err(ToolError::NotFound(format!(
        "no CUTLASS headers found (looked for cutlass/version.h in: {}); `pip install nvidia-cutlass==4.2.0.0`, or set TESSERA_CUTLASS_HOME",
        looked.join(", ")
    )))
}

fn find() -> Result<Toolchain, ToolError> {
    let (nvcc, nvcc_version) = find_nvcc()?;
    let cutlass_include = find_cutlass()?;
    let cutlass_version = cutlass_version(&cutlass_include)?;
    Ok(Toolchain { nvcc, nvcc_version, cutlass_include, cutlass_version })
}

/// The toolchain of this machine (found once), or why there is none.
pub fn toolchain() -> Result<&'static Toolchain, ToolError> {
    static FOUND: OnceLock<Result<Toolchain, ToolError>> = OnceLock::new();
    FOUND.get_or_init(find).as_ref().map_err(Clone::clone)
}

/// The `-arch` of a cuda target (`sm_90`).
pub fn arch(target: &Target) -> String {
    match target.attr("arch") {
        AttrValue::Str(s) => s.clone(),
        _ => "sm_90".to_string(),
    }
}

/// nvcc's options for `target` (the include folders, which say where this machine keeps the headers, are
/// added at the call: the versions stand for them in keys).
pub fn options(target: &Target) -> Vec<String> {
    options_for(&arch(target))
}

/// nvcc's options for a module of architecture `arch` (`sm_90`, or `sm_90a` for the Hopper family, which
/// the module's code chooses).
pub fn options_for(arch: &str) -> Vec<String> {
    [
        "-cubin".to_string(),
        format!("-arch={arch}"),
        "-std=c++17".into(),
        "-O3".into(),
        "--expt-relaxed-constexpr".into(),
        // CUTLASS's conv3d headers, pulled in by the GEMM headers, call std::get from host-device code.
        "-diag-suppress=20013,20015".into(),
    ]
    .into()
}

impl Toolchain {
    /// The facts a compiled module depends on, as sorted name/value pairs.
    pub fn environment(&self, target: &Target) -> Vec<(String, String)> {
        vec![
            ("cutlass.version".into(), self.cutlass_version.clone()),
            ("nvcc.options".into(), options(target).join(" ")),
            ("nvcc.version".into(), self.nvcc_version.clone()),
        ]
    }

    /// Compiles `source` to a cubin; `Err` holds nvcc's diagnostics.
    ///
    /// nvcc names internal-linkage symbols (libcu++'s customization-point objects, which CUTLASS pulls in)
    /// after a hash of the source file's absolute path, so the same source compiled in two temporary folders
    /// gives two cubins. To keep builds byte for byte reproducible across runs and machines, the source is
    /// compiled at a path that depends on its content only, `/tmp/tessera-cutlass/<digest>/module.cu`
    /// (include folders and the working machine do not enter the cubin: checked), under a lock held by the
    /// one compile of that content at a time.
    ///
    /// Where that folder cannot be used (another user's `/tmp/tessera-cutlass`, a read-only `/tmp`), the module
    /// is compiled in a private temporary folder instead, with a warning: it works, but its cubin is not the one
    /// another machine builds.
    pub fn compile(&self, target: &Target, source: &str) -> Result<Vec<u8>, ToolError> {
        self.compile_for(&arch(target), source)
    }

    /// [`Self::compile`] for architecture `arch`, once per process for each text: the result depends on the
    /// options and the source only (see [`Self::compile`]), so a second compile of the same program (a plan's
    /// module after the tune stage compiled its kernels) takes the first one's cubin.
    pub fn compile_for(&self, arch: &str, source: &str) -> Result<Vec<u8>, ToolError> {
        let key = blake3::hash(format!("cubin\0{}\0{source}", options_for(arch).join(" ")).as_bytes());
        cached(key, || self.compile_under(Path::new(BUILD_ROOT), arch, source))
    }

    /// Compiles a probe (host code with CUTLASS's headers, see `hopper.rs`) into a program in a private
    /// folder, runs it, and returns what it printed. Its output depends on the source only: no GPU, driver or
    /// address enters it.
    pub fn probe(&self, source: &str) -> Result<String, ToolError> {
        let key = blake3::hash(format!("probe\0{source}").as_bytes());
        let out = cached(key, || self.probe_uncached(source).map(String::into_bytes))?;
        String::from_utf8(out).map_err(|_| ToolError::BadOutput("the probe printed something that is not UTF-8".to_string()))
    }

    /// [`Self::probe`] without the process's cache (a test compares the two).
    pub fn probe_uncached(&self, source: &str) -> Result<String, ToolError> {
        let dir = tempfile::Builder::new().prefix("tessera-probe-").tempdir().map_err(|e| ToolError::Io(format!("cannot make a temporary folder: {e}")))?;
        std::fs::write(dir.path().join("probe.cu"), source).map_err(|e| ToolError::Io(format!("cannot write the probe: {e}")))?;
        let mut options: Vec<String> = options_for("sm_90a").into_iter().filter(|o| o != "-cubin" && o != "-O3").collect();
        options.push("-O1".into());
        if let Ok(t) = libs::toolkit() {
            options.push(format!("-L{}", t.lib_dir.display()));
        }
        self.run_nvcc(options, dir.path(), "probe", "probe.cu")?;
        let run = std::process::Command::new(dir.path().join("probe")).current_dir(dir.path()).output().map_err(|e| ToolError::Failed(format!("cannot run the probe: {e}")))?;
        let out = String::from_utf8_lossy(&run.stdout).into_owned();
        if !run.status.success() {
            return Err(ToolError::Failed(format!("the probe failed ({}): {}{}", run.status, String::from_utf8_lossy(&run.stderr), out.lines().filter(|l| l.starts_with("error")).collect::<Vec<_>>().join("\n"))));
        }
        Ok(out)
    }

    /// [`Self::compile_for`] without the process's cache (a test compares the two).
    pub fn compile_uncached(&self, arch: &str, source: &str) -> Result<Vec<u8>, ToolError> {
        self.compile_under(Path::new(BUILD_ROOT), arch, source)
    }

    fn compile_under(&self, root: &Path, arch: &str, source: &str) -> Result<Vec<u8>, ToolError> {
        let options = options_for(arch);
        let digest = blake3::hash(format!("{}\0{source}", options.join(" ")).as_bytes()).to_hex();
        let dir = root.join(&digest.as_str()[..32]);
        match Self::claim(&dir) {
            Ok(lock) => {
                let result = self.compile_in(&dir, options, source);
                drop(lock);
                result
            }
            Err(why) => {
                tracing::warn!("cutlass: {why}; compiling in a private folder (the cubin will not match other machines' byte for byte)");
                let private = tempfile::Builder::new().prefix("tessera-cutlass-").tempdir().map_err(|e| ToolError::Io(format!("cannot make a temporary folder: {e}")))?;
                self.compile_in(private.path(), options, source)
            }
        }
    }

    /// Makes the content's folder and takes its lock (held until the returned file is dropped).
    fn claim(dir: &Path) -> Result<std::fs::File, ToolError> {
        std::fs::create_dir_all(dir).map_err(|e| ToolError::Io(format!("cannot make {}: {e}", dir.display())))?;
        let lock = std::fs::File::create(dir.join("lock")).map_err(|e| ToolError::Io(format!("cannot open {}: {e}", dir.join("lock").display())))?;
        lock.lock().map_err(|e| ToolError::Io(format!("cannot lock {}: {e}", dir.join("lock").display())))?;
        Ok(lock)
    }

    fn compile_in(&self, dir: &Path, options: Vec<String>, source: &str) -> Result<Vec<u8>, ToolError> {
        let (src, out) = (dir.join("module.cu"), dir.join("module.cubin"));
        let _ = std::fs::remove_file(&out);
        std::fs::write(&src, source).map_err(|e| ToolError::Io(format!("cannot write {}: {e}", src.display())))?;
        let result = self.run_nvcc(options, dir, "module.cubin", "module.cu").and_then(|()| std::fs::read(&out).map_err(|e| ToolError::Io(format!("nvcc wrote no cubin ({}): {e}", out.display()))));
        let _ = std::fs::remove_file(&src);
        let _ = std::fs::remove_file(&out);
        result
    }

    fn run_nvcc(&self, options: Vec<String>, dir: &Path, output: &str, input: &str) -> Result<(), ToolError> {
        let _slot = NvccSlot::take();
        let mut cmd = std::process::Command::new(&self.nvcc);
        cmd.args(options).arg(format!("-I{}", self.cutlass_include.display()));
        if let Ok(t) = libs::toolkit() {
            cmd.arg(format!("-I{}", t.include_dir.display()));
            let cccl = t.include_dir.join("cccl");
            if cccl.is_dir() {
                cmd.arg(format!("-I{}", cccl.display()));
            }
        }
        cmd.current_dir(dir).arg("-o").arg(output).arg(input);
        let run = cmd.output().map_err(|e| ToolError::NotFound(format!("cannot run {}: {e}", self.nvcc.display())))?;
        if !run.status.success() {
            let log = String::from_utf8_lossy(&run.stderr);
            let errors: Vec<&str> = log.lines().filter(|l| l.contains("error")).take(12).collect();
            return Err(ToolError::Failed(format!("nvcc failed ({}):\n{}", run.status, if errors.is_empty() { log.lines().take(12).collect::<Vec<_>>().join("\n") } else { errors.join("\n") })));
        }
        Ok(())
    }
}

/// What this process compiled, by the digest of what went in: each entry filled once (its lock held while
/// the one compile of that text runs, so a second caller waits for it instead of compiling it again).
/// Failures are not kept: the next caller tries again.
fn cached(key: blake3::Hash, compile: impl FnOnce() -> Result<Vec<u8>, ToolError>) -> Result<Vec<u8>, ToolError> {
    type Entry = std::sync::Arc<std::sync::Mutex<Option<Vec<u8>>>>;
    static DONE: OnceLock<std::sync::Mutex<std::collections::HashMap<blake3::Hash, Entry>>> = OnceLock::new();
    let entry = DONE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner()).entry(key).or_default().clone();
    let mut slot = entry.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(done) = slot.as_ref() {
        return Ok(done.clone());
    }
    let out = compile()?;
    *slot = Some(out.clone());
    Ok(out)
}

/// A slot for one nvcc process: at most one per core run at once (a CUTLASS 3.x compile takes a core and a
/// gigabyte or more; the tune stage and a module's kernels both compile in parallel, and together they would
/// start more).
struct NvccSlot;

static NVCC_RUNNING: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static NVCC_FREED: std::sync::Condvar = std::sync::Condvar::new();

impl NvccSlot {
    fn take() -> NvccSlot {
        let limit = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut running = NVCC_RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        while *running >= limit {
            running = NVCC_FREED.wait(running).unwrap_or_else(|e| e.into_inner());
        }
        *running += 1;
        NvccSlot
    }
}

impl Drop for NvccSlot {
    fn drop(&mut self) {
        *NVCC_RUNNING.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        NVCC_FREED.notify_one();
    }
}

#[cfg(test)]
#[path = "toolchain_tests.rs"]
mod tests;
