//! One process at a time: an exclusive advisory lock (flock, through fs4) on `LOCK`, which holds the
//! holder's pid and command line so the next process can say who is in the way.
//!
//! Every open takes the lock exclusively, read-only opens included: sled 0.34 itself takes an exclusive
//! lock on its database files, so two processes can never have the index open at once, and saying so
//! clearly here is better than sled's "could not acquire lock". Read-only commands are short (stats),
//! and `--wait` makes any command queue behind the holder instead of failing.
//! The lock is released by the kernel when the holder exits, however it exits (SIGKILL included).

use crate::error::{Result, StoreError};
use fs4::FileExt;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

pub(crate) struct WriterLock {
    file: File,
    /// Whether the previous holder exited without closing the store (killed, crashed): what it left in
    /// the lock file was its pid, not [`CLOSED`].
    pub previous_holder_died: bool,
}

/// What a holder writes into the lock file when it closes the store, after everything else is closed.
const CLOSED: &str = "closed cleanly";

impl WriterLock {
    /// Takes the lock on `path` (creating the file), or fails with [`StoreError::Locked`] naming the
    /// holder; with `wait`, blocks until the holder is gone.
    pub fn acquire(dir: &Path, path: &Path, wait: bool) -> Result<WriterLock> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(StoreError::io("opening lock file", path))?;
        // Fully qualified: since Rust 1.89 `File` has inherent lock methods of the same names.
        match FileExt::try_lock(&file) {
            Ok(()) => {}
            Err(fs4::TryLockError::WouldBlock) => {
                if wait {
                    FileExt::lock(&file).map_err(StoreError::io("waiting for the lock on", path))?;
                } else {
                    return Err(StoreError::Locked { dir: dir.to_path_buf(), holder: read_holder(&mut file) });
                }
            }
            Err(fs4::TryLockError::Error(e)) => return Err(StoreError::io("locking", path)(e)),
        }
        let previous = read_holder(&mut file);
        let previous_holder_died = !previous.starts_with(CLOSED) && !previous.starts_with("holder unknown");
        let who = format!("pid {}: {}\n", std::process::id(), command_line());
        let res =
            file.set_len(0).and_then(|_| file.seek(SeekFrom::Start(0))).and_then(|_| file.write_all(who.as_bytes()));
        res.map_err(StoreError::io("writing holder into lock file", PathBuf::from(path)))?;
        Ok(WriterLock { file, previous_holder_died })
    }
}

impl Drop for WriterLock {
    /// Runs last when a store closes (the lock is its last field): marks the close as clean, so the next
    /// holder knows a damaged index is not a crash's doing (see `Store::open`). Best effort: a failure
    /// only makes the next open treat this close as a crash, which costs an index rebuild at most.
    fn drop(&mut self) {
        let _ = self.file.set_len(0).and_then(|_| self.file.seek(SeekFrom::Start(0))).and_then(|_| self.file.write_all(CLOSED.as_bytes()));
    }
}

fn read_holder(file: &mut File) -> String {
    let mut s = String::new();
    let _ = file.seek(SeekFrom::Start(0)).and_then(|_| file.read_to_string(&mut s));
    let s = s.trim();
    if s.is_empty() {
        "holder unknown: it has not written its pid yet".to_string()
    } else {
        s.to_string()
    }
}

fn command_line() -> String {
    let args: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    args.join(" ")
}
