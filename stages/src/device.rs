//! Device fingerprints: the facts of the machine a measured cost depends on, part of every tune key, so a
//! cost measured on one machine is never served on another.
//!
//! The CPU fingerprint is read from `/proc/cpuinfo` and `/sys/devices/system/cpu` (Linux; elsewhere the
//! fields that cannot be read stay empty and say so) and cached for the process. Everything in it is a plain
//! string, number or sorted vector, so its canonical encoding is stable.
//!
//! Also here: the per-device lock under which measurements are serialized (one measurement at a time per
//! device in this process).

use crate::fingerprint::{CpuFingerprint, DeviceFingerprint, GpuFingerprint};
use std::sync::{Mutex, MutexGuard, OnceLock};
use tessera_kernels::runtime::cuda;

/// What choosing, assuming or confirming a GPU fails with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("--gpus names no GPU")]
    NoGpuNamed,
    #[error("--gpus names GPU {0} twice")]
    NamedTwice(usize),
    #[error("'{0}' is not a GPU index (--gpus takes `all` or indices like 0,1)")]
    NotAnIndex(String),
    /// A GPU named to measure is another part than GPU 0, whose fingerprint keys the tune records.
    #[error("GPU {gpu} ({name}, {sms} SMs, {khz} kHz) is not the same part as GPU 0 ({first}, {first_sms} SMs, {first_khz} kHz), whose fingerprint keys this machine's tune records: measure on GPUs like GPU 0")]
    NotGpu0sKind { gpu: usize, name: String, sms: i32, khz: i32, first: String, first_sms: i32, first_khz: i32 },
    /// A build from recorded measurements asked for a second, different GPU in one process.
    #[error("this process already builds for GPU '{name}' ({arch}); it cannot also build for '{other}' ({other_arch})")]
    AlreadyAssumed { name: String, arch: String, other: String, other_arch: String },
    #[error(transparent)]
    Cuda(#[from] cuda::CudaError),
    #[error(transparent)]
    StaleFingerprint(#[from] crate::gpu_facts::StaleFingerprint),
}

fn library_version(v: Result<usize, cuda::CudaError>) -> String {
    v.map_or_else(|why| format!("absent: {why}"), |v| v.to_string())
}

/// The GPU a build from recorded measurements targets instead of this machine's (see [`assume_gpu`]).
static ASSUMED_GPU: OnceLock<GpuFingerprint> = OnceLock::new();

/// Makes [`gpu_fingerprint`] answer `fp` for the rest of the process: a build from recorded measurements
/// (`--frozen --measured-on FILE`) reads the tune records of the GPU that measured them, on a machine that
/// may have no GPU or another one. Only such builds may call it: nothing is measured under an assumed
/// fingerprint, or a measurement of this machine would be recorded as the other's. Setting a second,
/// different fingerprint is an error.
pub fn assume_gpu(fp: GpuFingerprint) -> Result<(), DeviceError> {
    let set = ASSUMED_GPU.get_or_init(|| fp.clone());
    if *set != fp {
        return Err(DeviceError::AlreadyAssumed { name: set.name.clone(), arch: set.arch.clone(), other: fp.name, other_arch: fp.arch });
    }
    Ok(())
}

/// Whether [`assume_gpu`] replaced this machine's GPU fingerprint.
pub fn gpu_assumed() -> bool {
    ASSUMED_GPU.get().is_some()
}

/// The fingerprint of GPU 0 (read once per process), if this machine has one; the assumed GPU's where a
/// build from recorded measurements set one ([`assume_gpu`]).
pub fn gpu_fingerprint() -> Option<DeviceFingerprint> {
    if let Some(fp) = ASSUMED_GPU.get() {
        return Some(DeviceFingerprint::Gpu(fp.clone()));
    }
    this_gpu().map(DeviceFingerprint::Gpu)
}

/// The fingerprint of this machine's GPU 0, whatever a build assumes (`tessera targets --gpu-fingerprint`):
/// read once per process, live or recalled from an earlier process's reading where the build keeps machine
/// facts and nothing it depends on changed since ([`crate::gpu_facts`]).
pub fn this_gpu() -> Option<GpuFingerprint> {
    static FP: OnceLock<Option<GpuFingerprint>> = OnceLock::new();
    FP.get_or_init(|| crate::gpu_facts::recalled_or(live_gpu)).clone()
}

/// GPU 0's fingerprint as the driver and the libraries report it now.
pub(crate) fn live_gpu() -> Option<GpuFingerprint> {
    let i = cuda::device::info().ok()?;
    Some(GpuFingerprint {
        name: i.name,
        arch: i.arch,
        sm_count: i.sm_count,
        memory_bytes: i.memory_bytes as u64,
        l2_bytes: i.l2_bytes,
        clock_khz: i.clock_khz,
        driver_cuda: i.driver_cuda,
        cublaslt_version: library_version(cuda::blas::version()),
        cudnn_version: library_version(cuda::dnn::version()),
    })
}

/// The GPUs that measure for this process's builds: `requested` (the `--gpus` build option) checked, or by
/// default every GPU of the machine that [`this_gpu`]'s fingerprint describes. Tune records are keyed by
/// GPU 0's fingerprint, so a GPU measures only where it is the same part as GPU 0 (name, architecture, SM
/// count, memory, L2, clock, driver): a host of mixed GPUs measures on GPU 0's kind; naming another kind is
/// an error.
pub fn measuring_gpus(requested: Option<&[usize]>) -> Result<Vec<usize>, DeviceError> {
    if let Some(requested) = requested {
        if requested.is_empty() {
            return Err(DeviceError::NoGpuNamed);
        }
        if let Some(&g) = requested.iter().enumerate().find_map(|(i, g)| requested[..i].contains(g).then_some(g)) {
            return Err(DeviceError::NamedTwice(g));
        }
    }
    // Measuring initialises the driver: a recalled fingerprint is checked against it first.
    crate::gpu_facts::confirm(live_gpu)?;
    let n = cuda::device::count()?;
    let first = cuda::device::info_of(0)?;
    let same = |g: usize| -> Result<bool, DeviceError> { Ok(g == 0 || cuda::device::info_of(g)? == first) };
    let Some(requested) = requested else {
        let mut gpus = Vec::with_capacity(n);
        for g in 0..n {
            if same(g)? {
                gpus.push(g);
            } else {
                let other = cuda::device::info_of(g)?;
                tracing::info!(gpu = g, name = %other.name, "GPU {g} ({}) is not GPU 0's kind ({}): it does not measure", other.name, first.name);
            }
        }
        return Ok(gpus);
    };
    for &g in requested {
        cuda::device::context_of(g)?;
        if !same(g)? {
            let other = cuda::device::info_of(g)?;
            return Err(DeviceError::NotGpu0sKind {
                gpu: g,
                name: other.name,
                sms: other.sm_count,
                khz: other.clock_khz,
                first: first.name,
                first_sms: first.sm_count,
                first_khz: first.clock_khz,
            });
        }
    }
    Ok(requested.to_vec())
}

/// Parses a `--gpus` list: `all`, or GPU indices separated by commas (`0,1,3`).
pub fn parse_gpus(text: &str) -> Result<Option<Vec<usize>>, DeviceError> {
    let text = text.trim();
    if text == "all" {
        return Ok(None);
    }
    let gpus: Vec<usize> = text
        .split(',')
        .map(|g| g.trim().parse::<usize>().map_err(|_| DeviceError::NotAnIndex(g.to_string())))
        .collect::<Result<_, _>>()?;
    Ok(Some(gpus))
}

/// The fingerprint of this machine's CPU (computed once per process).
pub fn cpu_fingerprint() -> DeviceFingerprint {
    static FP: OnceLock<CpuFingerprint> = OnceLock::new();
    DeviceFingerprint::Cpu(FP.get_or_init(read_cpu).clone())
}

fn read_cpu() -> CpuFingerprint {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let mut fp = parse_cpuinfo(&cpuinfo);
    fp.available_threads = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(0);
    fp.caches = read_caches(std::path::Path::new("/sys/devices/system/cpu/cpu0/cache"));
    fp
}

/// Parses the fields of the first processor of /proc/cpuinfo and counts processors.
fn parse_cpuinfo(text: &str) -> CpuFingerprint {
    let field = |name: &str| -> String {
        text.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim().to_string())
            })
            .unwrap_or_default()
    };
    let vendor = field("vendor_id");
    let model_name = field("model name");
    let family_model_stepping = format!("{}/{}/{}", field("cpu family"), field("model"), field("stepping"));
    let mut flags: Vec<String> = field("flags").split_whitespace().map(str::to_string).collect();
    flags.sort();
    flags.dedup();
    let logical_cores = text.lines().filter(|l| l.split_once(':').is_some_and(|(k, _)| k.trim() == "processor")).count() as u32;
    CpuFingerprint {
        vendor,
        model_name,
        family_model_stepping,
        flags_digest: blake3::hash(flags.join(" ").as_bytes()).to_hex().to_string(),
        logical_cores,
        available_threads: 0,
        caches: Vec::new(),
        os: std::env::consts::OS.to_string(),
        arch: std::env::consts::ARCH.to_string(),
    }
}

fn read_caches(dir: &std::path::Path) -> Vec<(u32, String, String)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
    let mut caches: Vec<(u32, String, String)> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
        .map(|e| {
            let p = e.path();
            (read(p.join("level")).parse().unwrap_or(0), read(p.join("type")), read(p.join("size")))
        })
        .collect();
    caches.sort();
    caches
}

/// The lock serializing measurements on the device of a target kind: hold it while timing. On the GPU,
/// each GPU has its own (this thread's current one, [`cuda::device::current`]): measurements on different
/// GPUs run at once.
pub fn measurement_lock(device: &str) -> Exclusive {
    static OTHER: Mutex<()> = Mutex::new(());
    // One lock per GPU ordinal (a host has fewer than 16; beyond, two GPUs would share one and take turns).
    static GPUS: [Mutex<()>; 16] = [const { Mutex::new(()) }; 16];
    // A panic during an earlier measurement leaves nothing to repair: the locks guard no data.
    let lock = |m: &'static Mutex<()>| Exclusive::Other(m.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
    match device {
        // On the CPU, a measurement also waits for our own compile work to drain and holds it off (see `busy`).
        "cpu" => Exclusive::Cpu(CPU_GATE.write().unwrap_or_else(|poisoned| poisoned.into_inner())),
        "cuda" => lock(&GPUS[cuda::device::current() % GPUS.len()]),
        _ => lock(&OTHER),
    }
}

/// Runs `f` with the device to ourselves: under [`measurement_lock`], on a thread of its own that keeps
/// the caller's current GPU. Models and kernels run on the runtime's pool
/// (`tessera_kernels::runtime::on_runtime_pool`) as they do when deployed.
///
/// Why a thread of its own: the caller may be a worker of rayon's global pool, and a worker waiting for
/// another pool (the runtime's) goes on running its own pool's jobs; one of those taking [`busy`] while this
/// thread holds the gate for writing would wait on itself. A plain thread entering the runtime pool blocks
/// without taking work, and so does the caller joining it.
pub fn exclusively<R: Send>(device: &str, f: impl FnOnce() -> R + Send) -> R {
    let _exclusive = measurement_lock(device);
    let gpu = cuda::device::current();
    std::thread::scope(|s| match s.spawn(move || cuda::device::on(gpu, f)).join() {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

/// Held while a measurement runs (see [`measurement_lock`]).
pub enum Exclusive {
    Cpu(#[allow(dead_code)] std::sync::RwLockWriteGuard<'static, ()>),
    Other(#[allow(dead_code)] MutexGuard<'static, ()>),
}

static CPU_GATE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Held by CPU-heavy compile work (building graphs, lowering, C compiles, linking) while it runs, so a CPU
/// measurement never shares the cores with our own compile threads: measurements wait for the work in flight,
/// and new work waits for the measurement. Take it only around leaf work that takes no other such guard.
pub fn busy() -> std::sync::RwLockReadGuard<'static, ()> {
    CPU_GATE.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
#[path = "device_tests.rs"]
mod tests;
