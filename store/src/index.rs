//! The index: memo table, named roots, counters and the journal position, in SQLite (WAL mode).
//!
//! This is the only module that names SQLite. Its interface is a handful of reads and a write section
//! ([`Index::write`]) in which the journal append and one [`Writer::apply`] of [`JournalRecord`]s commit
//! together, durable (`synchronous=FULL`) when it returns.
//!
//! Why SQLite (it replaced sled 0.34, 2026-11-26): the store is shared by many processes at once (a CI
//! runner's jobs, `explain` while the zoo builds, several compiles), and sled is single-process: it locks
//! its files exclusively, so every reader queued behind every writer. SQLite in WAL mode lets any number
//! of processes read while one writes, serializes writers for the few milliseconds of a commit
//! (`BEGIN IMMEDIATE`, waiting up to [`BUSY_WAIT`]), survives SIGKILL at any moment, and is the most
//! tested embedded store there is. The journal stays: it is our own format, and rebuilds the index
//! whatever happens to the database file.
//!
//! One table `kv(k BLOB PRIMARY KEY, v BLOB)` holds every record, distinguished by a one-byte prefix
//! (the layout sled had, so nothing above this file changed):
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
//! recorded first).
//!
//! Each `Index` holds two connections: one for reads (never blocked by any writer, in this process or
//! another) and one for write sections, so a read on another thread never sees, or waits on, a write
//! section that has not committed.

use crate::error::{Result, StoreError};
use crate::journal::{JournalMeta, JournalRecord};
use crate::memo::{MemoEntry, MemoRecord};
use crate::stats::{Counters, DedupeCounts, StageCounts};
use crate::Digest;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// The database file inside the index directory.
pub(crate) const DB_FILE: &str = "index.sqlite";
const MEMO: u8 = b'm';
const ROOT: u8 = b'r';
const COUNT: u8 = b'c';
const DEDUPE: &[u8] = b"d";
const META: &[u8] = b"x";
const USE: u8 = b'u';
const TICK: &[u8] = b"t";

/// How long a write section waits for another process's write section (each lasts milliseconds: one
/// journal append and one commit, both fsynced; a journal replay after a crash, longer).
const BUSY_WAIT: Duration = Duration::from_secs(120);

/// The busy handler: called with the number of times it was called for this lock attempt; true to retry.
fn wait_for_writer(attempts: i32) -> bool {
    std::thread::sleep(Duration::from_millis(1));
    (attempts as u128) < BUSY_WAIT.as_millis()
}

/// Root name -> the digests it lists.
pub(crate) type Roots = BTreeMap<String, Vec<Digest>>;

pub(crate) struct Index {
    path: PathBuf,
    read: Mutex<Connection>,
    write: Mutex<Connection>,
}

/// An index record that could not be decoded (reported by verify, removed by repair).
#[derive(Clone, Debug)]
pub(crate) struct BadRecord {
    pub raw_key: Vec<u8>,
    pub detail: String,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Index {
    /// Opens (creating it if needed) the index in directory `path`.
    pub fn open(path: &Path) -> Result<Index> {
        let damaged = |e: &dyn std::fmt::Display| StoreError::IndexDamaged { path: path.to_path_buf(), detail: e.to_string() };
        std::fs::create_dir_all(path).map_err(StoreError::io("creating index directory", path))?;
        let db = path.join(DB_FILE);
        let connect = || -> rusqlite::Result<Connection> {
            let mut c = Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
            // SQLite's own busy timeout sleeps in steps of up to 100 ms; a write section lasts milliseconds, so
            // a waiter polls every millisecond instead (eight concurrent compiles spent seconds asleep).
            c.busy_handler(Some(wait_for_writer))?;
            // Per connection: a commit returns once the WAL is fsynced.
            c.pragma_update(None, "synchronous", "FULL")?;
            Ok(c)
        };
        let write = connect().map_err(|e| damaged(&e))?;
        // Persistent in the file; the first opener sets it (taking the write lock briefly).
        let mode: String = write.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)).map_err(|e| damaged(&e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(damaged(&format!("SQLite would not switch to WAL mode (it reports '{mode}')")));
        }
        write
            .execute_batch("CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY NOT NULL, v BLOB NOT NULL) WITHOUT ROWID;")
            .map_err(|e| damaged(&e))?;
        let read = connect().map_err(|e| damaged(&e))?;
        Ok(Index { path: path.to_path_buf(), read: Mutex::new(read), write: Mutex::new(write) })
    }

    /// Whether directory `path` holds an index database yet (a store written before SQLite holds sled's
    /// files there instead; its index is rebuilt from the journal).
    pub fn exists(path: &Path) -> bool {
        path.join(DB_FILE).is_file()
    }

    /// An index in memory, for a read-only open of a store whose index file does not exist yet: the
    /// caller replays the journal into it, and nothing on disk changes.
    pub fn in_memory(path: &Path) -> Result<Index> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let uri = format!("file:tessera-index-{}-{n}?mode=memory&cache=shared", std::process::id());
        let damaged = |e: rusqlite::Error| StoreError::IndexDamaged { path: path.to_path_buf(), detail: e.to_string() };
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_URI | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let write = Connection::open_with_flags(&uri, flags).map_err(damaged)?;
        write.execute_batch("CREATE TABLE kv (k BLOB PRIMARY KEY NOT NULL, v BLOB NOT NULL) WITHOUT ROWID;").map_err(damaged)?;
        let read = Connection::open_with_flags(&uri, flags).map_err(damaged)?;
        Ok(Index { path: path.to_path_buf(), read: Mutex::new(read), write: Mutex::new(write) })
    }

    fn db<'c>(&'c self, conn: &'c Connection) -> Db<'c> {
        Db { conn, path: &self.path }
    }

    /// Runs `f` in a write section: SQLite's write lock is held (other processes' write sections wait;
    /// readers do not), and everything `f` applies commits together, durably, when it returns Ok. An
    /// error rolls all of it back.
    pub fn write<T>(&self, f: impl FnOnce(&Writer) -> Result<T>) -> Result<T> {
        let mut conn = lock(&self.write);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| self.busy_or_damaged(e))?;
        let out = f(&Writer { db: Db { conn: &tx, path: &self.path } })?;
        tx.commit().map_err(|e| self.busy_or_damaged(e))?;
        Ok(out)
    }

    fn busy_or_damaged(&self, e: rusqlite::Error) -> StoreError {
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) {
            StoreError::IndexLocked { path: self.path.clone(), detail: format!("another process kept the index's write lock for over {} s", BUSY_WAIT.as_secs()) }
        } else {
            self.db(&lock(&self.read)).damaged(e)
        }
    }

    /// Applies changes in a write section of their own (see [`Writer::apply`]).
    pub fn apply(&self, ops: &[JournalRecord], counters: &Counters, meta: Option<JournalMeta>) -> Result<()> {
        self.write(|w| w.apply(ops, counters, meta))
    }

    pub fn memo_get(&self, stage: &str, key: &Digest) -> Result<Option<MemoEntry>> {
        self.db(&lock(&self.read)).memo_get(stage, key)
    }

    /// Every memo entry in key order, and the records that do not decode.
    pub fn memo_all(&self) -> Result<(Vec<MemoRecord>, Vec<BadRecord>)> {
        self.db(&lock(&self.read)).memo_all()
    }

    /// The last-use tick of every memo entry that has one (see evict.rs).
    pub fn last_uses(&self) -> Result<BTreeMap<(String, Digest), u64>> {
        self.db(&lock(&self.read)).last_uses()
    }

    pub fn root_get(&self, name: &str) -> Result<Option<Vec<Digest>>> {
        self.db(&lock(&self.read)).root_get(name)
    }

    /// Every root, and the records that do not decode.
    pub fn roots(&self) -> Result<(Roots, Vec<BadRecord>)> {
        self.db(&lock(&self.read)).roots()
    }

    pub fn counters(&self) -> Result<Counters> {
        self.db(&lock(&self.read)).counters()
    }

    pub fn meta(&self) -> Result<Option<JournalMeta>> {
        self.db(&lock(&self.read)).meta()
    }

    /// Removes records by raw key (repair of records that do not decode).
    pub fn remove_raw(&self, keys: &[Vec<u8>]) -> Result<()> {
        self.write(|w| {
            for k in keys {
                w.db.delete(k)?;
            }
            Ok(())
        })
    }

    /// Moves what the WAL holds into the database file, where it can (used on close; another process
    /// reading keeps part of it in the WAL, which is as durable).
    pub fn flush(&self) -> Result<()> {
        let conn = lock(&self.write);
        let _ = conn.pragma_update(None, "wal_checkpoint", "PASSIVE");
        Ok(())
    }
}

/// A write section's view of the index (see [`Index::write`]): reads see its own uncommitted changes.
pub(crate) struct Writer<'c> {
    db: Db<'c>,
}

impl Writer<'_> {
    /// Applies changes, counter deltas, last-use ticks and the new journal position.
    pub fn apply(&self, ops: &[JournalRecord], counters: &Counters, meta: Option<JournalMeta>) -> Result<()> {
        let db = &self.db;
        // Last-use ticks first: a removal of the same entry later in this batch removes them too, so no
        // tick outlives its entry.
        for ((stage, key), tick) in &counters.last_use {
            db.put(&use_key(stage, key)?, &encode(tick)?)?;
        }
        for op in ops {
            match op {
                JournalRecord::MemoSet(r) => db.put(&memo_key(&r.stage, &r.key)?, &encode(&r.entry)?)?,
                JournalRecord::MemoRemove { stage, key } => {
                    db.delete(&memo_key(stage, key)?)?;
                    db.delete(&use_key(stage, key)?)?;
                }
                JournalRecord::RootSet { name, digests } => db.put(&root_key(name), &encode(digests)?)?,
                JournalRecord::RootRemove { name } => db.delete(&root_key(name))?,
            }
        }
        if counters.has_counts() {
            // Read in the write section: no other process's increments are lost in between.
            let current = db.counters()?;
            for (stage, delta) in &counters.stages {
                let mut c = current.stages.get(stage).copied().unwrap_or_default();
                c.add(delta);
                db.put(&counter_key(stage), &encode(&c)?)?;
            }
            let mut d = current.dedupe;
            d.add(&counters.dedupe);
            db.put(DEDUPE, &encode(&d)?)?;
        }
        if let Some(m) = meta {
            db.put(META, &encode(&m)?)?;
        }
        Ok(())
    }

    pub fn next_tick(&self) -> Result<u64> {
        let last = match self.db.get(TICK)? {
            Some(v) => postcard::from_bytes::<u64>(&v).unwrap_or(0),
            None => 0,
        };
        let next = last.saturating_add(1);
        self.db.put(TICK, &encode(&next)?)?;
        Ok(next)
    }

    pub fn meta(&self) -> Result<Option<JournalMeta>> {
        self.db.meta()
    }

    pub fn memo_all(&self) -> Result<(Vec<MemoRecord>, Vec<BadRecord>)> {
        self.db.memo_all()
    }

    pub fn roots(&self) -> Result<(Roots, Vec<BadRecord>)> {
        self.db.roots()
    }

}

/// The record layout over one connection (a reader's or a write section's).
struct Db<'c> {
    conn: &'c Connection,
    path: &'c Path,
}

impl Db<'_> {
    fn damaged(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::IndexDamaged { path: self.path.to_path_buf(), detail: e.to_string() }
    }

    fn decode<T: DeserializeOwned>(&self, what: &str, key: &[u8], bytes: &[u8]) -> Result<T> {
        postcard::from_bytes(bytes)
            .map_err(|e| self.damaged(format!("{what} record {} does not decode: {e}", show_key(key))))
    }

    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut st = self.conn.prepare_cached("SELECT v FROM kv WHERE k = ?1").map_err(|e| self.damaged(e))?;
        st.query_row(params![k], |r| r.get::<_, Vec<u8>>(0)).optional().map_err(|e| self.damaged(e))
    }

    fn put(&self, k: &[u8], v: &[u8]) -> Result<()> {
        let mut st =
            self.conn.prepare_cached("INSERT OR REPLACE INTO kv (k, v) VALUES (?1, ?2)").map_err(|e| self.damaged(e))?;
        st.execute(params![k, v]).map(|_| ()).map_err(|e| self.damaged(e))
    }

    fn delete(&self, k: &[u8]) -> Result<()> {
        let mut st = self.conn.prepare_cached("DELETE FROM kv WHERE k = ?1").map_err(|e| self.damaged(e))?;
        st.execute(params![k]).map(|_| ()).map_err(|e| self.damaged(e))
    }

    /// Every record whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, prefix: u8) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT k, v FROM kv WHERE k >= ?1 AND k < ?2 ORDER BY k")
            .map_err(|e| self.damaged(e))?;
        let rows = st
            .query_map(params![[prefix].as_slice(), [prefix + 1].as_slice()], |r| {
                Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Vec<u8>>(1)?))
            })
            .map_err(|e| self.damaged(e))?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(|e| self.damaged(e))
    }

    fn memo_get(&self, stage: &str, key: &Digest) -> Result<Option<MemoEntry>> {
        let k = memo_key(stage, key)?;
        match self.get(&k)? {
            Some(v) => Ok(Some(self.decode("memo", &k, &v)?)),
            None => Ok(None),
        }
    }

    fn memo_all(&self) -> Result<(Vec<MemoRecord>, Vec<BadRecord>)> {
        let mut good = Vec::new();
        let mut bad = Vec::new();
        for (k, v) in self.scan_prefix(MEMO)? {
            let decoded = postcard::from_bytes::<(String, Digest)>(&k[1..]).and_then(|(stage, key)| {
                postcard::from_bytes::<MemoEntry>(&v).map(|entry| MemoRecord { stage, key, entry })
            });
            match decoded {
                Ok(r) => good.push(r),
                Err(e) => bad.push(BadRecord {
                    detail: format!("memo record {} does not decode: {e}", show_key(&k)),
                    raw_key: k,
                }),
            }
        }
        Ok((good, bad))
    }

    /// A record that does not decode is left out: it is metadata, and an entry without a tick is merely
    /// evicted earlier.
    fn last_uses(&self) -> Result<BTreeMap<(String, Digest), u64>> {
        let mut out = BTreeMap::new();
        for (k, v) in self.scan_prefix(USE)? {
            if let (Ok(id), Ok(tick)) =
                (postcard::from_bytes::<(String, Digest)>(&k[1..]), postcard::from_bytes::<u64>(&v))
            {
                out.insert(id, tick);
            }
        }
        Ok(out)
    }

    fn root_get(&self, name: &str) -> Result<Option<Vec<Digest>>> {
        let k = root_key(name);
        match self.get(&k)? {
            Some(v) => Ok(Some(self.decode("root", &k, &v)?)),
            None => Ok(None),
        }
    }

    fn roots(&self) -> Result<(Roots, Vec<BadRecord>)> {
        let mut good = BTreeMap::new();
        let mut bad = Vec::new();
        for (k, v) in self.scan_prefix(ROOT)? {
            match (std::str::from_utf8(&k[1..]), postcard::from_bytes::<Vec<Digest>>(&v)) {
                (Ok(name), Ok(ds)) => {
                    good.insert(name.to_string(), ds);
                }
                (_, e) => bad.push(BadRecord {
                    detail: format!("root record {} does not decode ({:?})", show_key(&k), e.err()),
                    raw_key: k,
                }),
            }
        }
        Ok((good, bad))
    }

    fn counters(&self) -> Result<Counters> {
        let mut c = Counters::default();
        for (k, v) in self.scan_prefix(COUNT)? {
            let stage = String::from_utf8_lossy(&k[1..]).into_owned();
            let sc: StageCounts = self.decode("counter", &k, &v)?;
            c.stages.insert(stage, sc);
        }
        if let Some(v) = self.get(DEDUPE)? {
            c.dedupe = self.decode::<DedupeCounts>("dedupe counter", DEDUPE, &v)?;
        }
        Ok(c)
    }

    fn meta(&self) -> Result<Option<JournalMeta>> {
        match self.get(META)? {
            Some(v) => Ok(Some(self.decode("journal position", META, &v)?)),
            None => Ok(None),
        }
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

    /// Two handles on one index (as two processes have): both write, each sees the other's commits,
    /// and counter increments from both add up (read inside the write section).
    #[test]
    fn two_handles_write_and_read_each_other() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("index");
        let (a, b) = (Index::open(&path).unwrap(), Index::open(&path).unwrap());
        let mut one = Counters::default();
        one.stages.insert("s".into(), StageCounts { hits: 1, misses: 0 });
        let threads: Vec<_> = [a, b]
            .into_iter()
            .map(|idx| {
                let one = one.clone();
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        idx.apply(&[], &one, None).unwrap();
                    }
                    idx
                })
            })
            .collect();
        let handles: Vec<Index> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        for idx in &handles {
            assert_eq!(idx.counters().unwrap().stages["s"].hits, 100);
        }
    }

    /// A write section that fails commits nothing.
    #[test]
    fn failed_write_section_rolls_back() {
        let t = tempfile::tempdir().unwrap();
        let idx = Index::open(&t.path().join("index")).unwrap();
        let err = idx.write(|w| {
            w.apply(&[JournalRecord::RootSet { name: "r".into(), digests: vec![] }], &Counters::default(), None)?;
            Err::<(), _>(StoreError::InvalidName { what: "test", value: String::new(), reason: "forced" })
        });
        assert!(err.is_err());
        assert_eq!(idx.root_get("r").unwrap(), None);
    }

    #[test]
    fn garbage_file_is_damage() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("index");
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join(DB_FILE), vec![0xabu8; 8192]).unwrap();
        match Index::open(&path).and_then(|i| i.meta()) {
            Err(StoreError::IndexDamaged { .. }) => {}
            other => panic!("expected IndexDamaged, got {:?}", other.map(|_| ())),
        }
    }
}
