//! Single flight across the processes sharing one store: "I am computing (stage, key); wait for my memo
//! entry", so that concurrent compiles on one machine execute each distinct stage output once in total,
//! as the memo driver's in-flight table already does between the threads of one process.
//!
//! A lease is a one-byte write lock (`fcntl(F_OFD_SETLK)`, an open-file-description lock) on the file
//! `LEASES` in the store directory, at an offset derived from (stage, key). The kernel releases it when
//! its holder closes the file or exits, however it exits, so a killed holder never blocks the others and
//! nothing needs expiring or renewing (unlike the remote tier's Redis leases, lease.rs). Open-file-
//! description locks (not classic POSIX record locks) because each claim opens its own description:
//! two claims in one process exclude each other, and closing one never drops another's lock.
//!
//! A waiter blocks in the kernel (`F_OFD_SETLKW`), which wakes it the moment the holder releases, and
//! then looks in the index: the holder recorded its entry before releasing, so the waiter is served it.
//! (Polling instead, backing off to 100 ms, cost eight concurrent compiles a third of their wall time
//! in wake-up latency along chains of dependent stages.) There is no bound on the wait: the holder is
//! a live process on this machine (the kernel releases a dead one's lock), and Ctrl-C ends a waiter. A holder that
//! failed releases without an entry, and the waiter computes. Offsets are 62 bits of a blake3 hash, so
//! two different keys sharing one is a 2^-62 event, and would only make one wait for the other.
//! Deadlock needs a cycle of stages each waiting on the next, which the build's DAG cannot form.
//!
//! Within one process, a claimant never waits for another claimant of the same process: it computes the
//! output itself instead (the same bytes, recorded twice: harmless). Waiting there can deadlock: a thread
//! holding a lease runs parallel work on rayon's pool, and a worker joining that work steals a job of
//! another build in the same process (two `Store` handles: concurrent test threads, Python threads each
//! calling `tessera.compile`) that claims a lease this thread, lower in its own stack, holds, or holds a lease
//! the other waiter needs. Seen on a 16-core GPU machine: the runtime's GPU tests, three threads compiling into
//! one store, hung with two workers in `F_OFD_SETLKW`. A process-wide table of the (lease file, offset) pairs
//! this process is claiming (`IN_PROCESS`) decides; only other processes' holders are waited for.
//!
//! Linux only (OFD locks); elsewhere claims are unleased and processes may compute an output twice,
//! which costs time, never correctness: outputs are identical and recording one twice is harmless.

use crate::error::{Result, StoreError};
use crate::memo::MemoEntry;
use crate::{Digest, Store};
use std::fs::File;
use std::path::PathBuf;

/// What [`Store::claim_local`] decided for a (stage, key) that missed.
pub enum LocalClaim {
    /// This claimant holds the lease: compute, record, then drop it.
    Held(LocalLease),
    /// Another process computed it while this one waited: its entry.
    Served(MemoEntry),
    /// No lease (a read-only store, a platform without OFD locks): compute.
    Unleased,
}

impl std::fmt::Debug for LocalClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LocalClaim::Held(l) => write!(f, "Held(offset {})", l.offset),
            LocalClaim::Served(e) => write!(f, "Served({})", e.output),
            LocalClaim::Unleased => f.write_str("Unleased"),
        }
    }
}

/// A held lease; dropping it (closing its file) releases it.
pub struct LocalLease {
    _file: File,
    offset: u64,
    _claim: InProcessClaim,
}

/// One lease of one store: the lease file's identity (device, inode: two handles may spell the store's path
/// differently) and the offset.
type Slot = (u64, u64, u64);

/// The slots a claimant of this process is claiming or holding (see the module doc).
static IN_PROCESS: std::sync::Mutex<std::collections::BTreeSet<Slot>> = std::sync::Mutex::new(std::collections::BTreeSet::new());

/// This process's claim on one slot, given up on drop.
struct InProcessClaim {
    slot: Slot,
}

impl InProcessClaim {
    /// The claim, or None when another claimant of this process already has it.
    fn take(file: &File, offset: u64) -> std::io::Result<Option<InProcessClaim>> {
        let (dev, ino) = file_identity(file)?;
        let slot = (dev, ino, offset);
        // A panic while the set is locked leaves it whole (insert and remove only).
        let mut set = IN_PROCESS.lock().unwrap_or_else(|p| p.into_inner());
        Ok(set.insert(slot).then(|| InProcessClaim { slot })) // `then`, not `then_some`: a claim made and dropped here would remove the holder's slot
    }
}

#[cfg(unix)]
fn file_identity(file: &File) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata()?;
    Ok((m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn file_identity(_file: &File) -> std::io::Result<(u64, u64)> {
    Ok((0, 0)) // leases are Linux-only; try_local_lease fails on lock_byte there
}

impl Drop for InProcessClaim {
    fn drop(&mut self) {
        IN_PROCESS.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.slot);
    }
}

/// The lock offset of (stage, key).
fn offset_of(stage: &str, key: &Digest) -> u64 {
    let mut h = blake3::Hasher::new_derive_key("tessera local lease offset");
    h.update(stage.as_bytes());
    h.update(&[0]);
    h.update(key.as_bytes());
    u64::from_le_bytes(h.finalize().as_bytes()[..8].try_into().unwrap()) & 0x3fff_ffff_ffff_ffff
}

#[cfg(target_os = "linux")]
fn lock_byte(file: &File, offset: u64, wait: bool) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: `flock` is plain old data and fully initialized below; the fd is open for the call.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = offset as libc::off_t;
    fl.l_len = 1;
    fl.l_pid = 0; // required by F_OFD_*
    let cmd = if wait { libc::F_OFD_SETLKW } else { libc::F_OFD_SETLK };
    loop {
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &fl) };
        if rc == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) if wait => continue,
            Some(libc::EAGAIN) | Some(libc::EACCES) => return Ok(false),
            _ => return Err(e),
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn lock_byte(_file: &File, _offset: u64, _wait: bool) -> std::io::Result<bool> {
    Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "no open-file-description locks on this platform"))
}

impl Store {
    fn lease_file(&self) -> PathBuf {
        self.layout.dir.join("LEASES")
    }

    /// Tries once to take the lease on (stage, key). Ok(None): another claimant holds it.
    pub fn try_local_lease(&self, stage: &str, key: &Digest) -> Result<Option<LocalLease>> {
        self.local_lease(stage, key, false)
    }

    /// Takes the lease on (stage, key); with `wait`, blocks until its holder (another process) releases it.
    /// Ok(None): another claimant holds it, or, with `wait`, another claimant of this process does (which is
    /// never waited for: see the module doc).
    fn local_lease(&self, stage: &str, key: &Digest, wait: bool) -> Result<Option<LocalLease>> {
        let path = self.lease_file();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(StoreError::io("opening the lease file", &path))?;
        let offset = offset_of(stage, key);
        let Some(claim) = InProcessClaim::take(&file, offset).map_err(StoreError::io("reading the lease file's metadata", &path))? else {
            return Ok(None);
        };
        match lock_byte(&file, offset, wait) {
            Ok(true) => Ok(Some(LocalLease { _file: file, offset, _claim: claim })),
            Ok(false) => Ok(None),
            Err(e) => Err(StoreError::io("taking a lease in", &path)(e)),
        }
    }

    /// Called by the memo driver on a miss, before computing (stage, key): takes the lease, or waits for
    /// the process that holds it and is served its entry; another claimant of this process makes it
    /// Unleased (compute, do not wait: see the module doc).
    pub fn claim_local(&self, stage: &str, key: &Digest) -> Result<LocalClaim> {
        if self.read_only || !cfg!(target_os = "linux") {
            return Ok(LocalClaim::Unleased);
        }
        let Some(lease) = self.local_lease(stage, key, true)? else { return Ok(LocalClaim::Unleased) };
        // The last holder may have recorded its entry and released between our miss and now.
        if let Some(e) = self.index.memo_get(stage, key)?.filter(|e| self.objects.contains(&e.output)) {
            self.mark_used(stage, key);
            return Ok(LocalClaim::Served(e));
        }
        Ok(LocalClaim::Held(lease))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::OpenOptions;
    use std::time::Duration;

    /// Two handles of one store in one process: the second claimant of a held key neither takes it nor
    /// waits for it (it computes: waiting in-process can deadlock through rayon's work stealing), another key
    /// is free, and once the holder is done the key is claimable again. Another process's holder is waited for
    /// and serves its entry: pipeline/tests/lease.rs, with processes.
    #[test]
    fn two_handles_exclude_each_other_and_never_wait_in_process() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (Store::open(t.path(), OpenOptions::writable()).unwrap(), Store::open(t.path(), OpenOptions::writable()).unwrap());
        let key = Digest::of(b"k");
        let LocalClaim::Held(lease) = a.claim_local("lower", &key).unwrap() else { panic!("the first claimant holds") };
        assert!(b.try_local_lease("lower", &key).unwrap().is_none(), "held by a");
        assert!(b.try_local_lease("lower", &Digest::of(b"other")).unwrap().is_some(), "another key is free");
        let waited = std::thread::scope(|s| {
            let t0 = std::time::Instant::now();
            let claim = s.spawn(|| b.claim_local("lower", &key).unwrap()).join().unwrap();
            assert!(matches!(claim, LocalClaim::Unleased), "{claim:?}");
            t0.elapsed()
        });
        assert!(waited < Duration::from_secs(5), "the in-process claimant did not wait ({waited:?})");
        drop(lease);
        assert!(matches!(b.claim_local("lower", &key).unwrap(), LocalClaim::Held(_)));
    }

    #[test]
    fn a_holder_that_fails_releases_without_an_entry() {
        let t = tempfile::tempdir().unwrap();
        let a = Store::open(t.path(), OpenOptions::writable()).unwrap();
        let key = Digest::of(b"k");
        drop(a.claim_local("tune", &key).unwrap());
        assert!(matches!(a.claim_local("tune", &key).unwrap(), LocalClaim::Held(_)));
    }
}
