//! The GPU's fingerprint cached across processes, so a warm rebuild keys its stages without initialising the
//! CUDA driver (0.18-0.19 s on an H200) or loading cuBLASLt and cuDNN for their versions (0.06 s), when its
//! stage hits take milliseconds (issue 28, item 4; bench/compile_times.md).
//!
//! The fingerprint ([`GpuFingerprint`]) is recorded in the store's `machine/` folder
//! ([`tessera_store::MachineFacts`]) under the digest of a *witness*: everything that decides what it would
//! read, read without the driver:
//! - the kernel driver: `/proc/driver/nvidia/version`, each GPU's `information` (model, UUID, bus), its
//!   parameters and the MIG capabilities listed under `/proc/driver/nvidia/capabilities`;
//! - the device nodes this process can see (`/dev/nvidia*`: containers expose some GPUs and not others);
//! - the boot (`/proc/sys/kernel/random/boot_id`), so a reboot reads the GPU again;
//! - how CUDA numbers and finds things: `CUDA_VISIBLE_DEVICES`, `CUDA_DEVICE_ORDER`, `LD_LIBRARY_PATH` (and
//!   each of its folders), `LD_PRELOAD`, the loader's cache `/etc/ld.so.cache` and `/etc/ld.so.preload`;
//! - this executable (its file identity: a new tessera, with a new fingerprint format or search path, reads
//!   again).
//!
//! With the fingerprint, the record holds the identity (device, inode, size, modification and change times)
//! of every shared library mapped into the process once the driver, cuBLASLt and cuDNN were loaded, and of the
//! folder holding each. A recalled fingerprint is used only if every one of those files and folders is as
//! recorded: a new driver library, cuBLASLt or cuDNN (installed, replaced or relinked) reads the GPU again.
//!
//! A process that goes on to measure (the tune stage, end-to-end plan timings) initialises the driver anyway;
//! it first reads the fingerprint live and compares ([`confirm`]). A mismatch removes the fact and fails the
//! build before anything is measured, so a measurement is never recorded under a stale fingerprint.
//!
//! This module changes how the fingerprint is learnt, not what it is, so it is not in a key's source unit.

use crate::fingerprint::GpuFingerprint;
use serde::{Deserialize, Serialize};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use tessera_store::{Digest, MachineFacts};

/// The version of the witness and record format: bump it when either changes meaning.
const FACTS_VERSION: u32 = 1;

/// Environment variables that change which GPU is device 0 or which libraries the loader finds.
const ENVIRONMENT: &[&str] = &["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "LD_LIBRARY_PATH", "LD_PRELOAD"];

/// Where this process keeps machine facts: set once by the build that opens a store ([`keep_in`]).
static FACTS: OnceLock<MachineFacts> = OnceLock::new();

/// The fact this process's fingerprint was recalled from, if it was.
static RECALLED: OnceLock<Recalled> = OnceLock::new();

struct Recalled {
    name: Digest,
    fingerprint: GpuFingerprint,
}

/// Keeps this process's machine facts in the store at `store_dir` (the first call wins). Without it the
/// fingerprint is read live, as `tessera targets --gpu-fingerprint` does.
pub fn keep_in(store_dir: &Path) {
    let _ = FACTS.set(MachineFacts::in_store(store_dir));
}

/// A file's identity as the recall compares it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct FileIdentity {
    path: PathBuf,
    /// (device, inode, size, modification time ns, change time ns) of the file, then of its folder.
    file: [i128; 5],
    folder: [i128; 5],
}

/// What is recorded under a witness.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    libraries: Vec<FileIdentity>,
    fingerprint: GpuFingerprint,
}

fn identity(path: &Path) -> Option<[i128; 5]> {
    let m = std::fs::metadata(path).ok()?;
    let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
    Some([m.dev() as i128, m.ino() as i128, m.size() as i128, ns(m.mtime(), m.mtime_nsec()), ns(m.ctime(), m.ctime_nsec())])
}

fn identity_text(path: &Path) -> String {
    identity(path).map_or_else(|| "absent".to_string(), |i| format!("{i:?}"))
}

/// The names under `dir`, recursively (at most `depth` levels), sorted: the MIG instances the driver lists.
fn listing(dir: &Path, depth: usize, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    entries.sort();
    for e in entries {
        out.push(e.display().to_string());
        if depth > 1 && e.is_dir() {
            listing(&e, depth - 1, out);
        }
    }
}

/// The witness of this machine's GPU fingerprint (see the module's comment), its driver files read under
/// `root` (`/`; a test's folder in tests), or None where they cannot be read (no NVIDIA driver, or one that
/// lists no GPU): then nothing is cached.
fn witness(root: &Path) -> Option<Vec<(String, String)>> {
    let read = |p: &str| std::fs::read_to_string(root.join(p)).ok();
    let mut w: Vec<(String, String)> = vec![("driver".into(), read("proc/driver/nvidia/version")?)];
    let mut gpus: Vec<PathBuf> = std::fs::read_dir(root.join("proc/driver/nvidia/gpus")).ok()?.flatten().map(|e| e.path()).collect();
    if gpus.is_empty() {
        return None;
    }
    gpus.sort();
    for g in gpus {
        let bus = g.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        w.push((format!("gpu {bus}"), std::fs::read_to_string(g.join("information")).ok()?));
    }
    w.push(("params".into(), read("proc/driver/nvidia/params").unwrap_or_default()));
    let capabilities = root.join("proc/driver/nvidia/capabilities");
    let mut caps = Vec::new();
    listing(&capabilities, 6, &mut caps);
    let caps: Vec<String> = caps.iter().map(|c| c.trim_start_matches(&*capabilities.to_string_lossy()).to_string()).collect();
    w.push(("capabilities".into(), caps.join("\n")));
    let mut nodes: Vec<String> = std::fs::read_dir(root.join("dev"))
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("nvidia"))
        .map(|e| format!("{} {}", e.file_name().to_string_lossy(), e.metadata().map(|m| m.rdev()).unwrap_or(0)))
        .collect();
    nodes.sort();
    w.push(("device nodes".into(), nodes.join("\n")));
    w.push(("boot".into(), read("proc/sys/kernel/random/boot_id")?));
    for var in ENVIRONMENT {
        w.push((format!("env {var}"), std::env::var(var).unwrap_or_else(|_| "unset".into())));
    }
    for dir in std::env::var("LD_LIBRARY_PATH").unwrap_or_default().split(':').filter(|d| !d.is_empty()) {
        w.push((format!("library folder {dir}"), identity_text(Path::new(dir))));
    }
    w.push(("exe".into(), identity_text(&std::env::current_exe().ok()?)));
    for f in ["etc/ld.so.cache", "etc/ld.so.preload"] {
        w.push((f.into(), identity_text(&root.join(f))));
    }
    Some(w)
}

fn name_of(witness: &[(String, String)]) -> Digest {
    let bytes = postcard::to_stdvec(&(FACTS_VERSION, witness)).expect("strings encode");
    Digest::of(&bytes)
}

/// Every shared library mapped into this process, with its folder; None if one was deleted or replaced
/// since it was mapped (then what the process loaded is not what the files say).
fn mapped_libraries() -> Option<Vec<FileIdentity>> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let mut paths: Vec<&str> = maps
        .lines()
        .filter_map(|l| {
            // The sixth field, where there is one, is the mapped file's path (which may hold spaces).
            l.split_whitespace().nth(5)?;
            Some(l[l.find('/')?..].trim_end())
        })
        .filter(|p| Path::new(p).file_name().is_some_and(|n| n.to_string_lossy().contains(".so")))
        .collect();
    paths.sort_unstable();
    paths.dedup();
    paths
        .into_iter()
        .map(|p| {
            if p.ends_with("(deleted)") {
                return None;
            }
            let path = PathBuf::from(p);
            Some(FileIdentity { file: identity(&path)?, folder: identity(path.parent()?)?, path })
        })
        .collect()
}

fn current(libraries: &[FileIdentity]) -> bool {
    libraries.iter().all(|l| identity(&l.path) == Some(l.file) && l.path.parent().and_then(identity) == Some(l.folder))
}

/// The GPU fingerprint: recalled where this process keeps machine facts and the witness proves a recorded one
/// current; else `live()`, recorded for the next process.
pub(crate) fn recalled_or(live: impl FnOnce() -> Option<GpuFingerprint>) -> Option<GpuFingerprint> {
    let (Some(facts), Some(witness)) = (FACTS.get(), witness(Path::new("/"))) else { return live() };
    let name = name_of(&witness);
    let (fingerprint, recalled) = recall(facts, &name, live)?;
    if recalled {
        let _ = RECALLED.set(Recalled { name, fingerprint: fingerprint.clone() });
    }
    Some(fingerprint)
}

/// The fingerprint recorded under `name` if its libraries are as recorded (and `true`), else `live()`'s,
/// recorded under `name` where it is complete (and `false`).
fn recall(facts: &MachineFacts, name: &Digest, live: impl FnOnce() -> Option<GpuFingerprint>) -> Option<(GpuFingerprint, bool)> {
    if let Some(record) = facts.get(name).and_then(|b| postcard::from_bytes::<Record>(&b).ok()) {
        if current(&record.libraries) {
            tracing::debug!(fact = %name, "GPU fingerprint recalled ({}): the driver is not initialised", record.fingerprint.name);
            return Some((record.fingerprint, true));
        }
    }
    let fingerprint = live()?;
    // A fingerprint that lacks a library says so; it is not cached, so installing the library is noticed.
    let complete = !fingerprint.cublaslt_version.starts_with("absent") && !fingerprint.cudnn_version.starts_with("absent");
    if let (true, Some(libraries)) = (complete, mapped_libraries()) {
        let record = Record { libraries, fingerprint: fingerprint.clone() };
        match postcard::to_stdvec(&record).map_err(|e| e.to_string()).and_then(|b| facts.put(name, &b).map_err(|e| e.to_string())) {
            Ok(()) => tracing::debug!(fact = %name, "GPU fingerprint recorded for later processes"),
            Err(e) => tracing::debug!("GPU fingerprint not cached: {e}"),
        }
    }
    Some((fingerprint, false))
}

/// A recalled GPU fingerprint that is not the GPU's as the driver reads it ([`confirm`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the GPU fingerprint recalled from {} ({recalled:?}) is not this GPU's as the driver reads it now ({live:?}); the fact was removed, so build again to key by the live one", at.display())]
pub struct StaleFingerprint {
    /// Where the fact was (it is removed).
    pub at: std::path::PathBuf,
    pub recalled: Box<GpuFingerprint>,
    pub live: Option<Box<GpuFingerprint>>,
}

/// Before measuring: where this process's fingerprint was recalled, reads it live and compares. A mismatch
/// means the witness missed a change: the fact is removed and the build fails, so nothing is measured and
/// recorded under the stale fingerprint (the next build reads the GPU live).
pub fn confirm(live: impl FnOnce() -> Option<GpuFingerprint>) -> Result<(), StaleFingerprint> {
    static CONFIRMED: OnceLock<Result<(), StaleFingerprint>> = OnceLock::new();
    let Some(recalled) = RECALLED.get() else { return Ok(()) };
    CONFIRMED
        .get_or_init(|| {
            let live = live();
            if live.as_ref() == Some(&recalled.fingerprint) {
                return Ok(());
            }
            let facts = FACTS.get().expect("a recalled fingerprint has a facts folder");
            let at = facts.location(&recalled.name);
            let _ = facts.remove(&recalled.name);
            Err(StaleFingerprint { at, recalled: Box::new(recalled.fingerprint.clone()), live: live.map(Box::new) })
        })
        .clone()
}

#[cfg(test)]
#[path = "gpu_facts_tests.rs"]
mod tests;
