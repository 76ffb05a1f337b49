//! Finding the CUDA libraries before cudarc touches them.
//!
//! cudarc (with `dynamic-loading`) opens `libcuda` and `libnvrtc` by name on first use and *panics* when it
//! cannot. So every entry point here probes first and turns an absent library into a clear error: tessera
//! builds and runs on a machine with no CUDA at all, and says why the `cuda` target is unavailable there.
//!
//! The toolkit (NVRTC and its headers) is looked for in, in order: `$TESSERA_CUDA_HOME`, `/usr/local/cuda`,
//! and the NVIDIA PyPI wheels (`nvidia-cuda-nvrtc` and friends, under `site-packages/nvidia/cu13`), which is
//! how a machine without a GPU (CI) gets NVRTC. The libraries found are opened by full path before cudarc
//! opens them by name: the dynamic loader then matches cudarc's `dlopen("libnvrtc.so.13")` against the
//! already loaded library's soname, so no `LD_LIBRARY_PATH` is needed. The driver (`libcuda.so.1`) comes
//! with the NVIDIA driver and is only looked for where the system's loader looks.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use super::CudaError;

/// The CUDA major version tessera's code targets (cudarc's `cuda-13000` bindings, the GPU machine's toolkit).
pub const CUDA_MAJOR: u32 = 13;

/// A CUDA toolkit found on this machine: where NVRTC and the headers are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Toolkit {
    /// The folder holding `libnvrtc.so.13`.
    pub lib_dir: PathBuf,
    /// The folder holding `cuda_fp16.h` (passed to NVRTC with `-I`).
    pub include_dir: PathBuf,
    /// NVRTC's version, `major.minor`.
    pub nvrtc_version: String,
}

/// The site-packages folders of the Python on PATH (asked once: a fixed, cheap query whose answer only
/// chooses where to look for NVIDIA's and CUTLASS's PyPI wheels; the versions found are what keys depend on).
pub fn python_site_dirs() -> &'static [PathBuf] {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let mut dirs: Vec<PathBuf> = Vec::new();
        if let Ok(out) = std::process::Command::new("python3")
            .args(["-c", "import sysconfig, site; print('\\n'.join([sysconfig.get_paths()['purelib']] + site.getsitepackages() + [site.getusersitepackages()]))"])
            .stderr(std::process::Stdio::null())
            .output()
        {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let p = PathBuf::from(line.trim());
                if !line.trim().is_empty() && !dirs.contains(&p) {
                    dirs.push(p);
                }
            }
        }
        dirs
    })
}

/// Where a CUDA toolkit may live, in the order they are tried: `$TESSERA_CUDA_HOME`, `/usr/local/cuda`, and
/// the PyPI wheels' `site-packages/nvidia/cu13`.
pub fn candidate_homes() -> Vec<PathBuf> {
    let mut homes = fixed_homes();
    for site in python_site_dirs() {
        let p = site.join("nvidia").join(format!("cu{CUDA_MAJOR}"));
        if !homes.contains(&p) {
            homes.push(p);
        }
    }
    homes
}

/// The homes of [`candidate_homes`] that need no question to Python: `$TESSERA_CUDA_HOME`, `/usr/local/cuda`.
fn fixed_homes() -> Vec<PathBuf> {
    let mut homes = Vec::new();
    if let Some(h) = std::env::var_os("TESSERA_CUDA_HOME") {
        homes.push(PathBuf::from(h));
    }
    homes.push(PathBuf::from("/usr/local/cuda"));
    homes
}

fn nvrtc_in(home: &Path) -> Option<(PathBuf, PathBuf)> {
    let include = home.join("include");
    if !include.join("cuda_fp16.h").is_file() {
        return None;
    }
    ["lib64", "lib"].iter().map(|l| home.join(l)).find(|d| d.join(format!("libnvrtc.so.{CUDA_MAJOR}")).is_file()).map(|lib| (lib, include))
}

/// Opens a library by path (or name) and keeps it loaded for the life of the process.
fn open_global(path: &Path) -> Result<(), CudaError> {
    // SAFETY: loading NVIDIA's own libraries, whose initializers have no preconditions.
    let lib = unsafe { libloading::os::unix::Library::open(Some(path), libc::RTLD_NOW | libc::RTLD_GLOBAL) }
        .map_err(|e| CudaError::Unavailable(format!("cannot load {}: {e}", path.display())))?;
    std::mem::forget(lib);
    Ok(())
}

fn find_toolkit() -> Result<Toolkit, CudaError> {
    // The fixed homes first: asking Python where its packages are starts a process (tens of milliseconds, a
    // good part of a warm rebuild), so it is asked only where they hold no NVRTC. The first home that has one
    // is the same either way.
    let found = fixed_homes().iter().find_map(|h| nvrtc_in(h));
    let Some((lib_dir, include_dir)) = found.or_else(|| candidate_homes().iter().find_map(|h| nvrtc_in(h))) else {
        let looked: Vec<String> = candidate_homes().iter().map(|h| h.display().to_string()).collect();
        return Err(CudaError::Unavailable(format!(
            "no CUDA {CUDA_MAJOR} NVRTC found (looked for lib/libnvrtc.so.{CUDA_MAJOR} and include/cuda_fp16.h in: {}); \
             install the CUDA toolkit, or `pip install nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.88 \
             nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85`, or set TESSERA_CUDA_HOME",
            looked.join(", ")
        )));
    };
    // NVRTC opens its builtins library by name at compile time: load it first, by path.
    if let Ok(rd) = std::fs::read_dir(&lib_dir) {
        let mut builtins: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libnvrtc-builtins.so"))).collect();
        builtins.sort();
        for b in builtins {
            open_global(&b)?;
        }
    }
    open_global(&lib_dir.join(format!("libnvrtc.so.{CUDA_MAJOR}")))?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is loaded (above), so cudarc's lookup by name finds it; plain out-parameters.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::Unavailable(format!("NVRTC in {} does not answer its version ({r:?})", lib_dir.display())));
    }
    Ok(Toolkit { lib_dir, include_dir, nvrtc_version: format!("{major}.{minor}") })
}

/// The CUDA toolkit of this machine (found and loaded once), or why there is none.
pub fn toolkit() -> Result<&'static Toolkit, CudaError> {
    static FOUND: OnceLock<Result<Toolkit, CudaError>> = OnceLock::new();
    FOUND.get_or_init(find_toolkit).as_ref().map_err(Clone::clone)
}

/// Whether the CUDA driver library can be loaded here (the probe before cudarc's driver API is touched).
pub fn driver() -> Result<(), CudaError> {
    static FOUND: OnceLock<Result<(), CudaError>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let names = cudarc::get_lib_name_candidates("cuda");
            for n in &names {
                // SAFETY: as in `open_global`.
                if let Ok(lib) = unsafe { libloading::os::unix::Library::open(Some(n), libc::RTLD_NOW | libc::RTLD_GLOBAL) } {
                    std::mem::forget(lib);
                    return Ok(());
                }
            }
            Err(CudaError::Unavailable("no CUDA driver on this machine (libcuda.so.1 not found: no NVIDIA GPU driver installed)".to_string()))
        })
        .clone()
}

#[cfg(test)]
#[path = "libs_tests.rs"]
mod tests;
