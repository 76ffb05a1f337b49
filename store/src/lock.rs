//! Who uses the store: many processes at once, or one alone for the maintenance that deletes.
//!
//! Every open takes an advisory lock (flock, through fs4) on `LOCK`: **shared** for everything that
//! reads or adds (compile, run, stats, verify, explain, import, export), so any number of those run at
//! once; **exclusive** for what deletes or replaces (gc, eviction, `verify --repair`, an index rebuild),
//! which must not pull an object from under a build that is about to name it. The index (SQLite in WAL
//! mode) and the journal serialize the individual writes themselves (index.rs, store.rs).
//!
//! Each holder also leaves a record `sessions/<pid>-<n>` with its pid and command line, flock'ed by it
//! for as long as it has the store open and removed when it closes. They serve two purposes:
//! - saying who is in the way when an exclusive open cannot proceed;
//! - noticing a holder that died without closing (its record is there but no longer locked), which
//!   is what lets an open repair a crash's damage without being asked (see `Store::open`).
//!
//! A record is created under a dot-name, locked, then renamed into place, so nobody ever sees a record
//! that is not yet locked and takes its process for dead. Locks are released by the kernel when a
//! holder exits, however it exits (SIGKILL included).

use crate::error::{Result, StoreError};
use fs4::FileExt;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How a holder uses the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    Shared,
    Exclusive,
}

pub(crate) struct StoreLock {
    dir: PathBuf,
    path: PathBuf,
    file: File,
    access: Mutex<Access>,
    /// This holder's record in `sessions/` (None where it could not be written: a read-only directory).
    session: Option<(PathBuf, File)>,
    /// Whether a holder died without closing since its record was left (found and removed by this open).
    pub previous_holder_died: bool,
}

/// How long a shared open (without `--wait`) waits for an exclusive holder before naming it: longer than
/// an opener's crash cleanup, far shorter than a gc.
const BRIEF_EXCLUSIVE: Duration = Duration::from_secs(5);

/// Makes session record names unique within a process (tests open one store twice).
static SESSION_COUNTER: AtomicU64 = AtomicU64::new(0);

impl StoreLock {
    /// Takes the lock on `dir`'s LOCK file in `access` mode, or fails with [`StoreError::Locked`] naming
    /// the holders in the way; with `wait`, blocks until they are gone.
    pub fn acquire(dir: &Path, path: &Path, access: Access, wait: bool) -> Result<StoreLock> {
        let lock = StoreLock::unlocked(dir, path, access)?;
        lock.take(access, wait)?;
        Ok(lock.with_session())
    }

    /// Like [`acquire`](Self::acquire) with `Shared`, but exclusive where nobody else holds the store at
    /// this moment: returns the lock and whether it is alone (then the caller may do the cleanup that
    /// only a lone holder may do, and [`downgrade`](Self::downgrade) afterwards).
    pub fn acquire_alone_or_shared(dir: &Path, path: &Path, wait: bool) -> Result<(StoreLock, bool)> {
        let mut lock = StoreLock::unlocked(dir, path, Access::Exclusive)?;
        // Fully qualified: since Rust 1.89 `File` has inherent lock methods of the same names.
        match FileExt::try_lock(&lock.file) {
            Ok(()) => Ok((lock.with_session(), true)),
            Err(fs4::TryLockError::WouldBlock) => {
                *lock.access.get_mut().unwrap_or_else(|e| e.into_inner()) = Access::Shared;
                lock.take(Access::Shared, wait)?;
                Ok((lock.with_session(), false))
            }
            Err(fs4::TryLockError::Error(e)) => Err(StoreError::io("locking", path)(e)),
        }
    }

    /// The LOCK file opened (created if needed), not yet locked.
    fn unlocked(dir: &Path, path: &Path, access: Access) -> Result<StoreLock> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(StoreError::io("opening lock file", path))?;
        Ok(StoreLock {
            dir: dir.to_path_buf(),
            path: path.to_path_buf(),
            file,
            access: Mutex::new(access),
            session: None,
            previous_holder_died: false,
        })
    }

    fn take(&self, access: Access, wait: bool) -> Result<()> {
        let tried = match access {
            Access::Shared => FileExt::try_lock_shared(&self.file),
            Access::Exclusive => FileExt::try_lock(&self.file),
        };
        match tried {
            Ok(()) => Ok(()),
            Err(fs4::TryLockError::WouldBlock) if wait => {
                let res = match access {
                    Access::Shared => FileExt::lock_shared(&self.file),
                    Access::Exclusive => FileExt::lock(&self.file),
                };
                res.map_err(StoreError::io("waiting for the lock on", &self.path))
            }
            Err(fs4::TryLockError::WouldBlock) => {
                // An opener that found the store unused holds it alone for the milliseconds of its crash
                // cleanup (`Store::open`): a sharer waits that out. Only an exclusive holder that stays
                // (gc, repair) is reported.
                if access == Access::Shared {
                    let deadline = Instant::now() + BRIEF_EXCLUSIVE;
                    while Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(5));
                        match FileExt::try_lock_shared(&self.file) {
                            Ok(()) => return Ok(()),
                            Err(fs4::TryLockError::WouldBlock) => {}
                            Err(fs4::TryLockError::Error(e)) => return Err(StoreError::io("locking", &self.path)(e)),
                        }
                    }
                }
                Err(StoreError::Locked { dir: self.dir.clone(), holder: holders(&self.dir, &self.path) })
            }
            Err(fs4::TryLockError::Error(e)) => Err(StoreError::io("locking", &self.path)(e)),
        }
    }

    /// Writes this holder's session record and removes the records of holders that died.
    fn with_session(mut self) -> StoreLock {
        let sessions = self.dir.join("sessions");
        if fs::create_dir_all(&sessions).is_err() {
            return self; // a read-only directory: no record, nothing else changes
        }
        self.previous_holder_died = remove_dead_sessions(&sessions);
        let name = format!("{}-{}", std::process::id(), SESSION_COUNTER.fetch_add(1, Ordering::Relaxed));
        let (hidden, record) = (sessions.join(format!(".new-{name}")), sessions.join(&name));
        let written = (|| -> std::io::Result<File> {
            let mut f = OpenOptions::new().write(true).create_new(true).open(&hidden)?;
            FileExt::lock(&f)?;
            f.write_all(format!("pid {}: {}\n", std::process::id(), command_line()).as_bytes())?;
            fs::rename(&hidden, &record)?;
            Ok(f)
        })();
        match written {
            Ok(f) => self.session = Some((record, f)),
            Err(_) => {
                let _ = fs::remove_file(&hidden);
            }
        }
        self
    }

    pub fn is_exclusive(&self) -> bool {
        *self.access.lock().unwrap_or_else(|e| e.into_inner()) == Access::Exclusive
    }

    /// Tries to hold the store alone, for up to `bound` (polling: other holders finishing their work
    /// release their shared locks within milliseconds of each other). Returns whether it got it; if
    /// not, the shared lock is held again (waiting only for an exclusive holder, never for sharers).
    pub fn upgrade(&self, bound: Duration) -> Result<bool> {
        let mut access = self.access.lock().unwrap_or_else(|e| e.into_inner());
        if *access == Access::Exclusive {
            return Ok(true);
        }
        let deadline = Instant::now() + bound;
        loop {
            // On Linux a conversion that fails drops the shared lock (flock(2)): it is retaken below.
            match FileExt::try_lock(&self.file) {
                Ok(()) => {
                    *access = Access::Exclusive;
                    return Ok(true);
                }
                Err(fs4::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(fs4::TryLockError::WouldBlock) => {
                    FileExt::lock_shared(&self.file).map_err(StoreError::io("locking", &self.path))?;
                    return Ok(false);
                }
                Err(fs4::TryLockError::Error(e)) => return Err(StoreError::io("locking", &self.path)(e)),
            }
        }
    }

    /// Goes back from exclusive to shared, letting other processes in.
    pub fn downgrade(&self) -> Result<()> {
        let mut access = self.access.lock().unwrap_or_else(|e| e.into_inner());
        if *access == Access::Shared {
            return Ok(());
        }
        FileExt::lock_shared(&self.file).map_err(StoreError::io("locking", &self.path))?;
        *access = Access::Shared;
        Ok(())
    }

    /// The other holders, for messages ("pid 12: tessera compile zoo.toml; ...").
    pub fn others(&self) -> String {
        holders(&self.dir, &self.path)
    }
}

impl Drop for StoreLock {
    /// Removes this holder's record (the lock on LOCK goes when the file closes). A record left behind by
    /// a failure here is taken for a crash by the next open, which costs at most a needless check.
    fn drop(&mut self) {
        if let Some((path, _file)) = self.session.take() {
            let _ = fs::remove_file(path);
        }
    }
}

/// Removes the records of holders that are gone (record unlocked); returns whether there were any.
fn remove_dead_sessions(sessions: &Path) -> bool {
    let mut died = false;
    let Ok(rd) = fs::read_dir(sessions) else { return false };
    for e in rd.flatten() {
        if e.file_name().to_string_lossy().starts_with('.') {
            continue; // being created: locked before it is renamed into view
        }
        let Ok(f) = File::open(e.path()) else { continue };
        if FileExt::try_lock(&f).is_ok() {
            died = true;
            let _ = fs::remove_file(e.path());
        }
    }
    died
}

/// Who holds the store now: the live session records, or (a holder from before session records)
/// what it wrote into LOCK.
fn holders(dir: &Path, lock_path: &Path) -> String {
    let mut live = Vec::new();
    if let Ok(rd) = fs::read_dir(dir.join("sessions")) {
        let mut entries: Vec<_> = rd.flatten().filter(|e| !e.file_name().to_string_lossy().starts_with('.')).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let Ok(mut f) = File::open(e.path()) else { continue };
            if FileExt::try_lock_shared(&f).is_ok() {
                continue; // its holder is gone
            }
            let mut s = String::new();
            let _ = f.read_to_string(&mut s);
            if !s.trim().is_empty() {
                live.push(s.trim().to_string());
            }
        }
    }
    if live.is_empty() {
        let s = fs::read_to_string(lock_path).unwrap_or_default();
        return if s.trim().is_empty() { "holder unknown".into() } else { s.trim().to_string() };
    }
    live.join("; ")
}

fn command_line() -> String {
    let args: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    args.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharers_coexist_and_exclusive_names_them() {
        let t = tempfile::tempdir().unwrap();
        let (dir, path) = (t.path(), t.path().join("LOCK"));
        let a = StoreLock::acquire(dir, &path, Access::Shared, false).unwrap();
        let b = StoreLock::acquire(dir, &path, Access::Shared, false).unwrap();
        let err = StoreLock::acquire(dir, &path, Access::Exclusive, false).err().expect("exclusive must wait for sharers");
        assert!(err.to_string().contains(&format!("pid {}", std::process::id())), "{err}");
        drop((a, b));
        let x = StoreLock::acquire(dir, &path, Access::Exclusive, false).unwrap();
        assert!(StoreLock::acquire(dir, &path, Access::Shared, false).is_err(), "sharers wait for the exclusive holder");
        x.downgrade().unwrap();
        StoreLock::acquire(dir, &path, Access::Shared, false).unwrap();
    }

    #[test]
    fn upgrade_waits_for_sharers_and_gives_up_keeping_its_share() {
        let t = tempfile::tempdir().unwrap();
        let (dir, path) = (t.path(), t.path().join("LOCK"));
        let a = StoreLock::acquire(dir, &path, Access::Shared, false).unwrap();
        let b = StoreLock::acquire(dir, &path, Access::Shared, false).unwrap();
        assert!(!a.upgrade(Duration::from_millis(50)).unwrap());
        // Still shared: an exclusive open is refused.
        assert!(StoreLock::acquire(dir, &path, Access::Exclusive, false).is_err());
        let released = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(b);
        });
        assert!(a.upgrade(Duration::from_secs(20)).unwrap());
        released.join().unwrap();
        assert!(a.is_exclusive());
    }

    #[test]
    fn a_dead_holders_record_is_noticed() {
        let t = tempfile::tempdir().unwrap();
        let (dir, path) = (t.path(), t.path().join("LOCK"));
        // What a killed holder leaves: a record nobody locks.
        fs::create_dir_all(dir.join("sessions")).unwrap();
        fs::write(dir.join("sessions").join("4242-0"), "pid 4242: tessera compile zoo.toml\n").unwrap();
        let a = StoreLock::acquire(dir, &path, Access::Shared, false).unwrap();
        assert!(a.previous_holder_died);
        assert!(!dir.join("sessions").join("4242-0").exists());
        let b = StoreLock::acquire(dir, &path, Access::Shared, false).unwrap();
        assert!(!b.previous_holder_died, "a live holder's record is not a death");
        drop((a, b));
        assert_eq!(fs::read_dir(dir.join("sessions")).unwrap().count(), 0, "records go on close");
    }
}
