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

use crate::error::{Result, StoreError};
use crate::journal::{JournalMeta, JournalRecord};
use crate::memo::{MemoEntry, MemoRecord};
use crate::stats::{Counters, DedupeCounts, StageCounts};
use crate::Digest;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const TREE: &str = "tessera";
const MEMO: u8 = b'm';
const ROOT: u8 = b'r';
const COUNT: u8 = b'c';
const DEDUPE: &[u8] = b"d";
const META: &[u8] = b"x";

/// Root name -> the digests it lists.
pub(crate) type Roots = BTreeMap<String, Vec<Digest>>;

pub(crate) struct Index {
    path: PathBuf,
    db: sled::Db,
    tree: sled::Tree,
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
        // sled's own background flush is left on; durability comes from the explicit flush in `apply`.
        let db = sled::Config::new().path(path).open().map_err(damaged)?;
        let tree = db.open_tree(TREE).map_err(damaged)?;
        Ok(Index { path: path.to_path_buf(), db, tree })
    }

    fn damaged(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::IndexDamaged { path: self.path.clone(), detail: e.to_string() }
    }

    fn decode<T: DeserializeOwned>(&self, what: &str, key: &[u8], bytes: &[u8]) -> Result<T> {
        postcard::from_bytes(bytes)
            .map_err(|e| self.damaged(format!("{what} record {} does not decode: {e}", show_key(key))))
    }

    /// Applies changes, counter deltas and the new journal position in one atomic batch, then flushes
    /// (fsync) so the change is durable when this returns.
    pub fn apply(&self, ops: &[JournalRecord], counters: &Counters, meta: Option<JournalMeta>) -> Result<()> {
        let mut batch = sled::Batch::default();
        for op in ops {
            match op {
                JournalRecord::MemoSet(r) => batch.insert(memo_key(&r.stage, &r.key)?, encode(&r.entry)?),
                JournalRecord::MemoRemove { stage, key } => batch.remove(memo_key(stage, key)?),
                JournalRecord::RootSet { name, digests } => batch.insert(root_key(name), encode(digests)?),
                JournalRecord::RootRemove { name } => batch.remove(root_key(name)),
            }
        }
        if !counters.is_zero() {
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
    postcard::to_allocvec(v).map_err(|source| StoreError::Encode { what: "index record".into(), source })
}

fn memo_key(stage: &str, key: &Digest) -> Result<Vec<u8>> {
    let mut k = vec![MEMO];
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
}
