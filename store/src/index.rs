//! The index: memo table, named roots, counters and the journal position, in sled 0.34.
//!
//! This is the only module that names sled. Its interface is a handful of reads and one atomic,
//! flushed `apply` of [`JournalRecord`]s, so moving to another embedded store (redb) means rewriting
//! this file and nothing else.
//!
//! One sled tree holds every record, distinguished by a one-byte prefix, so that one sled batch (which
//! is atomic within a tree) can carry a memo change, the counters and the journal position together:
//!
//! | key                                 | value                          |
//! |-------------------------------------|--------------------------------|
//! | `m` + postcard((stage, key digest)) | postcard(MemoEntry)            |
//! | `r` + root name (UTF-8)             | postcard(Vec<Digest>)          |
//! | `c` + stage name (UTF-8)            | postcard(StageCounts)          |
//! | `d`                                 | postcard(DedupeCounts)         |
//! | `x`                                 | postcard(JournalMeta)          |
//! | `u` + postcard((stage, key digest)) | postcard(u64): last-use tick   |
//! | `t`                                 | postcard(u64): last tick given |
//!
//! `u` and `t` are eviction's bookkeeping (evict.rs), metadata like the counters: not journaled, so an
//! index rebuilt from the journal starts without them (every entry then counts as unused, oldest
//! recorded first). Stores written before they existed simply lack them; older builds ignore them.

use crate::error::{Result, StoreError};
use crate::journal::{JournalMeta, JournalRecord};
use crate::memo::{MemoEntry, MemoRecord};
use crate::stats::{Counters, DedupeCounts, StageCounts};
use crate::Digest;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const TREE: &str = "tessera";
const MEMO: u8 = b'm';
const ROOT: u8 = b'r';
const COUNT: u8 = b'c';
const DEDUPE: &[u8] = b"d";
const META: &[u8] = b"x";
const USE: u8 = b'u';
const TICK: &[u8] = b"t";

/// Root name -> the digests it lists.
pub(crate) type Roots = BTreeMap<String, Vec<Digest>>;

pub(crate) struct Index {
    path: PathBuf,
    db: sled::Db,
    tree: sled::Tree,
    /// Declared last, so it drops after `db` and `tree`: see [`ClosedOnDrop`].
    _closed: ClosedOnDrop,
}

/// How long an open waits for sled's file lock, and a drop for sled to release it.
/// (Short under `cfg(test)`, so the test of a lock that stays held is quick.)
const LOCK_WAIT: Duration = if cfg!(test) { Duration::from_millis(300) } else { Duration::from_secs(20) };

/// Makes closing the index complete when its drop returns.
///
/// sled 0.34 keeps its database file (and the exclusive flock on it) in a reference-counted config
/// that its I/O thread pool also holds while it finishes writing the last log buffer or truncating a
/// segment (`threadpool::spawn` in `pagecache/iobuf.rs` and `segment.rs`). Dropping `sled::Db`
/// therefore returns while a `sled-io` thread may still hold the lock for a few milliseconds, and a
/// store reopened at once (a test, or the next process once our writer lock is released) found sled
/// "locked". Waiting here until the lock can be taken closes that window.
struct ClosedOnDrop {
    lock_file: PathBuf,
}

impl Drop for ClosedOnDrop {
    fn drop(&mut self) {
        // Bounded: a drop must never hang. Errors are ignored (nothing to report to from a drop).
        let _ = wait_for_sled_lock(&self.lock_file);
    }
}

/// Whether a sled open failed because its file lock is held (sled reports it as an `Io` error whose
/// message is its own; 0.34 has no dedicated variant).
fn is_lock_error(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().contains("could not acquire lock"))
}

/// Waits (bounded by [`LOCK_WAIT`]) until sled's lock file is free. Returns whether it became free.
fn wait_for_sled_lock(lock_file: &Path) -> bool {
    let Ok(file) = std::fs::File::open(lock_file) else { return true };
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        // Fully qualified: since Rust 1.89 `File` has inherent lock methods of the same names.
        match fs4::FileExt::try_lock(&file) {
            Ok(()) => {
                let _ = fs4::FileExt::unlock(&file);
                return true;
            }
            Err(fs4::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(_) => return false,
        }
    }
}

/// An index record that could not be decoded (reported by verify, removed by repair).
#[derive(Clone, Debug)]
pub(crate) struct BadRecord {
    pub raw_key: Vec<u8>,
    pub detail: String,
}

impl Index {
    pub fn open(path: &Path) -> Result<Index> {
        let damaged = |e: sled::Error| StoreError::IndexDamaged { path: path.to_path_buf(), detail: e.to_string() };
        // The file sled locks (sled's `Config::db_path`).
        let lock_file = path.join("db");
        // sled's own background flush is left on; durability comes from the explicit flush in `apply`.
        let open = || sled::Config::new().path(path).open();
        let db = match open() {
            // Our writer lock is held, so the holder is a handle of this process still closing (see
            // `ClosedOnDrop`), or a process that ignores the writer lock: wait for it, bounded, and
            // report a lock that stays held as held, never as damage (repair would rebuild the index).
            Err(e) if is_lock_error(&e) => {
                if !wait_for_sled_lock(&lock_file) {
                    return Err(StoreError::IndexLocked { path: path.to_path_buf(), detail: e.to_string() });
                }
                open().map_err(|e| {
                    if is_lock_error(&e) {
                        StoreError::IndexLocked { path: path.to_path_buf(), detail: e.to_string() }
                    } else {
                        damaged(e)
                    }
                })?
            }
            other => other.map_err(damaged)?,
        };
        let tree = db.open_tree(TREE).map_err(damaged)?;
        Ok(Index { path: path.to_path_buf(), db, tree, _closed: ClosedOnDrop { lock_file } })
    }

    fn damaged(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::IndexDamaged { path: self.path.clone(), detail: e.to_string() }
    }

    fn decode<T: DeserializeOwned>(&self, what: &str, key: &[u8], bytes: &[u8]) -> Result<T> {
        postcard::from_bytes(bytes)
            .map_err(|e| self.damaged(format!("{what} record {} does not decode: {e}", show_key(key))))
    }

    /// Applies changes, counter deltas, last-use ticks and the new journal position in one atomic batch,
    /// then flushes (fsync) so the change is durable when this returns.
    pub fn apply(&self, ops: &[JournalRecord], counters: &Counters, meta: Option<JournalMeta>) -> Result<()> {
        let mut batch = sled::Batch::default();
        // Last-use ticks first: a removal of the same entry later in this batch wins over them (a later
        // operation on a key replaces an earlier one in a sled batch), so no tick outlives its entry.
        for ((stage, key), tick) in &counters.last_use {
            batch.insert(use_key(stage, key)?, encode(tick)?);
        }
        for op in ops {
            match op {
                JournalRecord::MemoSet(r) => batch.insert(memo_key(&r.stage, &r.key)?, encode(&r.entry)?),
                JournalRecord::MemoRemove { stage, key } => {
                    batch.remove(memo_key(stage, key)?);
                    batch.remove(use_key(stage, key)?);
                }
                JournalRecord::RootSet { name, digests } => batch.insert(root_key(name), encode(digests)?),
                JournalRecord::RootRemove { name } => batch.remove(root_key(name)),
            }
        }
        if counters.has_counts() {
            let current = self.counters()?;
            for (stage, delta) in &counters.stages {
                let mut c = current.stages.get(stage).copied().unwrap_or_default();
                c.add(delta);
                batch.insert(counter_key(stage), encode(&c)?);
            }
            let mut d = current.dedupe;
            d.add(&counters.dedupe);
            batch.insert(DEDUPE, encode(&d)?);
        }
        if let Some(m) = meta {
            batch.insert(META, encode(&m)?);
        }
        self.tree.apply_batch(batch).map_err(|e| self.damaged(e))?;
        self.db.flush().map_err(|e| self.damaged(e))?;
        Ok(())
    }

    pub fn memo_get(&self, stage: &str, key: &Digest) -> Result<Option<MemoEntry>> {
        let k = memo_key(stage, key)?;
        match self.tree.get(&k).map_err(|e| self.damaged(e))? {
            Some(v) => Ok(Some(self.decode("memo", &k, &v)?)),
            None => Ok(None),
        }
    }

    /// Every memo entry in key order, and the records that do not decode.
    pub fn memo_all(&self) -> Result<(Vec<MemoRecord>, Vec<BadRecord>)> {
        let mut good = Vec::new();
        let mut bad = Vec::new();
        for item in self.tree.scan_prefix([MEMO]) {
            let (k, v) = item.map_err(|e| self.damaged(e))?;
            let decoded = postcard::from_bytes::<(String, Digest)>(&k[1..]).and_then(|(stage, key)| {
                postcard::from_bytes::<MemoEntry>(&v).map(|entry| MemoRecord { stage, key, entry })
            });
            match decoded {
                Ok(r) => good.push(r),
                Err(e) => bad.push(BadRecord {
                    raw_key: k.to_vec(),
                    detail: format!("memo record {} does not decode: {e}", show_key(&k)),
                }),
            }
        }
        Ok((good, bad))
    }

    /// The last-use tick of every memo entry that has one (see evict.rs). A record that does not decode
    /// is left out: it is metadata, and an entry without a tick is merely evicted earlier.
    pub fn last_uses(&self) -> Result<BTreeMap<(String, Digest), u64>> {
        let mut out = BTreeMap::new();
        for item in self.tree.scan_prefix([USE]) {
            let (k, v) = item.map_err(|e| self.damaged(e))?;
            if let (Ok(id), Ok(tick)) =
                (postcard::from_bytes::<(String, Digest)>(&k[1..]), postcard::from_bytes::<u64>(&v))
            {
                out.insert(id, tick);
            }
        }
        Ok(out)
    }

    /// Hands out the next last-use tick (one per writable open: a "session"). Not flushed here: it goes
    /// to disk with the next flushed write; a crash before that only means the next session may reuse
    /// the tick, which makes two sessions' uses look simultaneous to eviction, nothing worse.
    pub fn next_tick(&self) -> Result<u64> {
        let last = match self.tree.get(TICK).map_err(|e| self.damaged(e))? {
            Some(v) => postcard::from_bytes::<u64>(&v).unwrap_or(0),
            None => 0,
        };
        let next = last.saturating_add(1);
        self.tree.insert(TICK, encode(&next)?).map_err(|e| self.damaged(e))?;
        Ok(next)
    }

    pub fn root_get(&self, name: &str) -> Result<Option<Vec<Digest>>> {
        let k = root_key(name);
        match self.tree.get(&k).map_err(|e| self.damaged(e))? {
            Some(v) => Ok(Some(self.decode("root", &k, &v)?)),
            None => Ok(None),
        }
    }

    /// Every root, and the records that do not decode.
    pub fn roots(&self) -> Result<(Roots, Vec<BadRecord>)> {
        let mut good = BTreeMap::new();
        let mut bad = Vec::new();
        for item in self.tree.scan_prefix([ROOT]) {
            let (k, v) = item.map_err(|e| self.damaged(e))?;
            match (std::str::from_utf8(&k[1..]), postcard::from_bytes::<Vec<Digest>>(&v)) {
                (Ok(name), Ok(ds)) => {
                    good.insert(name.to_string(), ds);
                }
                (_, e) => bad.push(BadRecord {
                    raw_key: k.to_vec(),
                    detail: format!("root record {} does not decode ({:?})", show_key(&k), e.err()),
                }),
            }
        }
        Ok((good, bad))
    }

    pub fn counters(&self) -> Result<Counters> {
        let mut c = Counters::default();
        for item in self.tree.scan_prefix([COUNT]) {
            let (k, v) = item.map_err(|e| self.damaged(e))?;
            let stage = String::from_utf8_lossy(&k[1..]).into_owned();
            let sc: StageCounts = self.decode("counter", &k, &v)?;
            c.stages.insert(stage, sc);
        }
        if let Some(v) = self.tree.get(DEDUPE).map_err(|e| self.damaged(e))? {
            c.dedupe = self.decode::<DedupeCounts>("dedupe counter", DEDUPE, &v)?;
        }
        Ok(c)
    }

    pub fn meta(&self) -> Result<Option<JournalMeta>> {
        match self.tree.get(META).map_err(|e| self.damaged(e))? {
            Some(v) => Ok(Some(self.decode("journal position", META, &v)?)),
            None => Ok(None),
        }
    }

    /// Removes records by raw key (repair of records that do not decode), flushed.
    pub fn remove_raw(&self, keys: &[Vec<u8>]) -> Result<()> {
        let mut batch = sled::Batch::default();
        for k in keys {
            batch.remove(k.as_slice());
        }
        self.tree.apply_batch(batch).map_err(|e| self.damaged(e))?;
        self.db.flush().map_err(|e| self.damaged(e))?;
        Ok(())
    }

    /// Writes out whatever sled holds in memory (used on close).
    pub fn flush(&self) -> Result<()> {
        self.db.flush().map(|_| ()).map_err(|e| self.damaged(e))
    }
}

fn encode<T: serde::Serialize + ?Sized>(v: &T) -> Result<Vec<u8>> {
    postcard::to_allocvec(v).map_err(|cause| StoreError::Encode { what: "index record".into(), cause })
}

fn memo_key(stage: &str, key: &Digest) -> Result<Vec<u8>> {
    let mut k = vec![MEMO];
    k.extend(encode(&(stage, key))?);
    Ok(k)
}

fn use_key(stage: &str, key: &Digest) -> Result<Vec<u8>> {
    let mut k = vec![USE];
    k.extend(encode(&(stage, key))?);
    Ok(k)
}

fn root_key(name: &str) -> Vec<u8> {
    let mut k = vec![ROOT];
    k.extend_from_slice(name.as_bytes());
    k
}

fn counter_key(stage: &str) -> Vec<u8> {
    let mut k = vec![COUNT];
    k.extend_from_slice(stage.as_bytes());
    k
}

/// A raw key shown for error messages: printable bytes as text, the rest as hex.
fn show_key(k: &[u8]) -> String {
    k.iter().map(|&b| if b.is_ascii_graphic() { (b as char).to_string() } else { format!("\\x{b:02x}") }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (issue 10): a store reopened right after its drop found sled's lock still held by a
    /// sled I/O thread and reported the index as damaged, 2 times in 6 runs.
    #[test]
    fn reopen_right_after_drop_never_finds_the_lock_held() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("index");
        for i in 0..60u64 {
            let idx = Index::open(&path).unwrap_or_else(|e| panic!("open {i}: {e}"));
            // A write makes sled hand a log buffer to its I/O threads, which is what held the lock.
            idx.apply(&[], &Counters::default(), Some(JournalMeta { generation: 1, applied: i })).unwrap();
            drop(idx);
        }
    }

    #[test]
    fn a_lock_that_stays_held_is_reported_as_held_not_damage() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("index");
        let holder = sled::Config::new().path(&path).open().unwrap();
        match Index::open(&path) {
            Err(StoreError::IndexLocked { path: p, .. }) => assert_eq!(p, path),
            Err(e) => panic!("expected IndexLocked, got {e}"),
            Ok(_) => panic!("sled let two handles open one database"),
        }
        drop(holder);
        Index::open(&path).expect("opens once the holder is gone");
    }

    #[test]
    fn apply_and_read_back() {
        let t = tempfile::tempdir().unwrap();
        let idx = Index::open(&t.path().join("index")).unwrap();
        let rec = MemoRecord {
            stage: "tune".into(),
            key: Digest::of(b"k"),
            entry: MemoEntry { output: Digest::of(b"o"), size: 1, compute_micros: 5, recorded_unix: 6 },
        };
        let mut counters = Counters::default();
        counters.stages.insert("tune".into(), StageCounts { hits: 2, misses: 1 });
        let meta = JournalMeta { generation: 7, applied: 100 };
        idx.apply(
            &[
                JournalRecord::MemoSet(rec.clone()),
                JournalRecord::RootSet { name: "b".into(), digests: vec![rec.entry.output] },
            ],
            &counters,
            Some(meta),
        )
        .unwrap();
        idx.apply(&[], &counters, None).unwrap();
        assert_eq!(idx.memo_get("tune", &rec.key).unwrap(), Some(rec.entry));
        assert_eq!(idx.memo_get("other", &rec.key).unwrap(), None);
        assert_eq!(idx.memo_all().unwrap().0, vec![rec.clone()]);
        assert_eq!(idx.root_get("b").unwrap(), Some(vec![rec.entry.output]));
        assert_eq!(idx.counters().unwrap().stages["tune"], StageCounts { hits: 4, misses: 2 });
        assert_eq!(idx.meta().unwrap(), Some(meta));
        idx.apply(&[JournalRecord::MemoRemove { stage: "tune".into(), key: rec.key }], &Counters::default(), None)
            .unwrap();
        assert!(idx.memo_all().unwrap().0.is_empty());
    }
}
