//! Device fingerprints: the facts of the machine a measured cost depends on, part of every tune key, so a
//! cost measured on one machine is never served on another. Plain data, below both the code that reads them
//! ([`crate::device`]) and the cache that keeps a GPU's across processes ([`crate::gpu_facts`]). Everything in
//! them is a plain string, number or sorted vector, so their canonical encoding is stable.

use serde::{Deserialize, Serialize};

/// The machine a cost was measured on.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DeviceFingerprint {
    Cpu(CpuFingerprint),
    Gpu(GpuFingerprint),
}

/// What makes one GPU time a kernel differently from another. The toolchain that built the kernel (NVRTC)
/// and the libraries that run library calls (cuBLASLt, cuDNN) are in their backends' environments
/// (`Backend::environment`), which tune keys also hold.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GpuFingerprint {
    /// The device name ("NVIDIA H100 80GB HBM3").
    pub name: String,
    /// Compute capability as an architecture (`sm_90`).
    pub arch: String,
    pub sm_count: i32,
    pub memory_bytes: u64,
    pub l2_bytes: i32,
    /// Peak SM clock, kHz.
    pub clock_khz: i32,
    /// The driver's CUDA version (`13.0`): the driver JIT-links and schedules graphs.
    pub driver_cuda: String,
    /// The cuBLASLt and cuDNN versions loaded here ("absent: why" where one cannot be loaded). They decide
    /// how the `cublas` and `cudnn` backends' calls run (the algorithms their heuristics offer), so a new
    /// version re-measures them. They are the machine's, not the build's: those backends' modules are call
    /// descriptions that do not depend on the version, so only the measurements (tune keys, through this
    /// fingerprint) hold it.
    pub cublaslt_version: String,
    pub cudnn_version: String,
}

/// What makes one CPU time a kernel differently from another.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CpuFingerprint {
    /// `vendor_id` of /proc/cpuinfo ("GenuineIntel"), empty if unknown.
    pub vendor: String,
    /// `model name` of /proc/cpuinfo, empty if unknown.
    pub model_name: String,
    /// `cpu family`, `model` and `stepping`, as listed.
    pub family_model_stepping: String,
    /// Hex blake3 of the sorted `flags` list: a VM can mask AVX-512 on the same model name.
    pub flags_digest: String,
    /// Processors listed in /proc/cpuinfo.
    pub logical_cores: u32,
    /// Threads this process may use (affinity and cgroup limits included): multi-threaded kernels scale with it.
    pub available_threads: u32,
    /// Caches of cpu0: (level, type, size as listed, e.g. "48K"), sorted.
    pub caches: Vec<(u32, String, String)>,
    pub os: String,
    pub arch: String,
}
