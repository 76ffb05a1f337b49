//! The journal: an append-only log of every memo and root change, kept beside the index so that the
//! index can always be rebuilt without the database's help.
//!
//! Why: the index is a SQLite database (it was sled's before). If its file is damaged (a bug, a disk
//! error), the memo table and the roots would be gone. The journal is our own, simple format: every
//! change is appended and fsynced *before* it is applied to the index, so at any moment the journal holds
//! at least every acknowledged change.
//!
//! Format: a 16-byte header (`TSJRNL\0\x01` + a u64 generation, little-endian), then frames of
//! `u32 length (LE) | postcard(JournalRecord) | first 16 bytes of blake3(length || payload)`.
//! A frame that is short or fails its checksum ends the valid part: a torn tail left by a crash in the
//! middle of an append (which never returned) is cut off by the next write section.
//!
//! The index stores `(generation, applied offset)` with each change it applies. Many processes append,
//! one at a time (inside the index's write section, store.rs), each first bringing the journal up to date:
//! frames past the applied offset (a crash between an append and its commit) are replayed into the index;
//! if the journal has another generation than the index applied, it was compacted by another process and
//! is reopened; if it is still another, or shorter than what the index applied, the journal is the damaged
//! side and is rewritten from the index. gc compacts the journal the same way.

use crate::error::{Result, StoreError};
use crate::layout::fsync_dir;
use crate::memo::MemoRecord;
use crate::Digest;
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"TSJRNL\0\x01";
pub(crate) const HEADER_LEN: u64 = 16;
const CHECK_LEN: usize = 16;
/// A frame longer than this is taken as damage, not allocated.
const MAX_FRAME: u32 = 64 << 20;

/// One change to the index. The same type is the index's write operation, so journal and index can
/// never disagree on what a change means.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JournalRecord {
    MemoSet(MemoRecord),
    MemoRemove { stage: String, key: Digest },
    RootSet { name: String, digests: Vec<Digest> },
    RootRemove { name: String },
}

/// Where the index stands with respect to the journal (stored in the index with every change).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalMeta {
    pub generation: u64,
    /// Offset just past the last frame applied to the index.
    pub applied: u64,
}

/// The result of reading frames from some offset to the end of the valid part.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Records with the offset just past each one's frame.
    pub records: Vec<(u64, JournalRecord)>,
    /// Offset just past the last valid frame.
    pub valid_end: u64,
    pub file_len: u64,
    /// The first bad frame, if the valid part ends before the file does.
    pub damage: Option<(u64, String)>,
}

pub(crate) struct Journal {
    path: PathBuf,
    file: Option<File>,
    generation: u64,
    end: u64,
}

impl Journal {
    /// Opens (creating it if `create`) the journal; returns it positioned at the end of the file's
    /// valid part as known from the header (call [`scan_from`](Self::scan_from) to find the tail).
    pub fn open(path: &Path, create: bool) -> Result<Journal> {
        match OpenOptions::new().read(true).write(create).open(path) {
            Ok(mut file) => {
                let len = file.metadata().map_err(StoreError::io("reading metadata of", path))?.len();
                let mut hdr = [0u8; HEADER_LEN as usize];
                if len < HEADER_LEN || file.read_exact(&mut hdr).is_err() || &hdr[..8] != MAGIC {
                    if !create {
                        return Err(StoreError::JournalDamaged {
                            path: path.into(),
                            offset: 0,
                            detail: "bad header".into(),
                        });
                    }
                    // A header that never got written (crash during creation) or was damaged: start anew.
                    // The caller notices the generation change and rewrites the journal from the index.
                    // A damaged file that holds frames is kept aside for a post-mortem, not overwritten.
                    drop(file);
                    if len > HEADER_LEN {
                        let aside = path.with_extension("damaged");
                        fs::rename(path, &aside).map_err(StoreError::io("moving damaged journal to", &aside))?;
                    }
                    return Journal::create_fresh(path, new_generation(), &[]);
                }
                let generation = u64::from_le_bytes(hdr[8..16].try_into().unwrap());
                Ok(Journal { path: path.into(), file: Some(file), generation, end: len })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if create {
                    Journal::create_fresh(path, new_generation(), &[])
                } else {
                    Ok(Journal { path: path.into(), file: None, generation: 0, end: HEADER_LEN })
                }
            }
            Err(e) => Err(StoreError::io("opening journal", path)(e)),
        }
    }

    /// Writes a new journal holding `records` (temp file, fsync, rename, directory fsync).
    pub fn create_fresh(path: &Path, generation: u64, records: &[JournalRecord]) -> Result<Journal> {
        let tmp = path.with_extension("new");
        let mut buf = Vec::with_capacity(HEADER_LEN as usize + records.len() * 128);
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&generation.to_le_bytes());
        for r in records {
            encode_frame(r, &mut buf)?;
        }
        {
            let mut f = File::create(&tmp).map_err(StoreError::io("creating", &tmp))?;
            f.write_all(&buf).map_err(StoreError::io("writing", &tmp))?;
            f.sync_all().map_err(StoreError::io("fsyncing", &tmp))?;
        }
        fs::rename(&tmp, path).map_err(StoreError::io("renaming into place", path))?;
        if let Some(parent) = path.parent() {
            fsync_dir(parent)?;
        }
        let file =
            OpenOptions::new().read(true).write(true).open(path).map_err(StoreError::io("opening journal", path))?;
        Ok(Journal { path: path.into(), file: Some(file), generation, end: buf.len() as u64 })
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn end(&self) -> u64 {
        self.end
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads frames from `offset` (a frame boundary) to the end of the valid part.
    pub fn scan_from(&mut self, offset: u64) -> Result<Scan> {
        let Some(file) = self.file.as_mut() else {
            return Ok(Scan { valid_end: HEADER_LEN, file_len: HEADER_LEN, ..Default::default() });
        };
        let file_len = file.metadata().map_err(StoreError::io("reading metadata of", &self.path))?.len();
        let mut scan = Scan { file_len, valid_end: offset, ..Default::default() };
        if offset > file_len {
            scan.damage = Some((file_len, format!("the journal ends at {file_len}, before offset {offset}")));
            scan.valid_end = file_len;
            return Ok(scan);
        }
        file.seek(SeekFrom::Start(offset)).map_err(StoreError::io("seeking in journal", &self.path))?;
        let mut bytes = Vec::with_capacity((file_len - offset) as usize);
        file.read_to_end(&mut bytes).map_err(StoreError::io("reading journal", &self.path))?;
        let mut pos = 0usize;
        while pos < bytes.len() {
            let at = offset + pos as u64;
            match decode_frame(&bytes[pos..]) {
                Ok((rec, used)) => {
                    pos += used;
                    scan.records.push((offset + pos as u64, rec));
                }
                Err(detail) => {
                    scan.damage = Some((at, detail));
                    break;
                }
            }
        }
        scan.valid_end = offset + pos as u64;
        Ok(scan)
    }

    /// Cuts the file at `len` (a torn tail that no returned call wrote).
    pub fn truncate(&mut self, len: u64) -> Result<()> {
        if let Some(f) = self.file.as_mut() {
            f.set_len(len).map_err(StoreError::io("truncating journal", &self.path))?;
            f.sync_all().map_err(StoreError::io("fsyncing journal", &self.path))?;
        }
        self.end = len;
        Ok(())
    }

    /// After a scan up to `valid_end` of a file `file_len` long: cuts a torn tail, or (nothing torn) moves
    /// the append position to the end, past what other processes appended.
    pub fn truncate_to(&mut self, valid_end: u64, file_len: u64) -> Result<()> {
        if valid_end < file_len {
            self.truncate(valid_end)
        } else {
            self.end = valid_end;
            Ok(())
        }
    }

    /// Appends records and fsyncs; returns the new end offset. On a failed write the file is cut back,
    /// so a later append does not land after a half-written frame.
    pub fn append(&mut self, records: &[JournalRecord]) -> Result<u64> {
        let mut buf = Vec::with_capacity(records.len() * 128);
        for r in records {
            encode_frame(r, &mut buf)?;
        }
        let path = self.path.clone();
        let file = self.file.as_mut().ok_or_else(|| StoreError::NotAStore {
            path: path.clone(),
            reason: "journal not open for writing".into(),
        })?;
        let res =
            file.seek(SeekFrom::Start(self.end)).and_then(|_| file.write_all(&buf)).and_then(|_| file.sync_data());
        if let Err(e) = res {
            let _ = file.set_len(self.end);
            return Err(StoreError::io("appending to journal", path)(e));
        }
        self.end += buf.len() as u64;
        Ok(self.end)
    }
}

fn new_generation() -> u64 {
    // Not hashed or emitted anywhere: it only has to differ from the previous journal's.
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let h = blake3::hash(&[nanos.to_le_bytes(), (std::process::id() as u64).to_le_bytes()].concat());
    u64::from_le_bytes(h.as_bytes()[..8].try_into().unwrap()) | 1
}

fn checksum(len: &[u8; 4], payload: &[u8]) -> [u8; CHECK_LEN] {
    let mut h = blake3::Hasher::new();
    h.update(len);
    h.update(payload);
    h.finalize().as_bytes()[..CHECK_LEN].try_into().unwrap()
}

fn encode_frame(r: &JournalRecord, out: &mut Vec<u8>) -> Result<()> {
    let payload =
        postcard::to_allocvec(r).map_err(|cause| StoreError::Encode { what: "journal record".into(), cause })?;
    let len = (payload.len() as u32).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&payload);
    out.extend_from_slice(&checksum(&len, &payload));
    Ok(())
}

/// Decodes one frame at the start of `b`: the record and the bytes it used, or why it is not valid.
fn decode_frame(b: &[u8]) -> std::result::Result<(JournalRecord, usize), String> {
    if b.len() < 4 {
        return Err(format!("torn frame header ({} bytes)", b.len()));
    }
    let len_bytes: [u8; 4] = b[..4].try_into().unwrap();
    let len = u32::from_le_bytes(len_bytes);
    if len > MAX_FRAME {
        return Err(format!("implausible frame length {len}"));
    }
    let total = 4 + len as usize + CHECK_LEN;
    if b.len() < total {
        return Err(format!("torn frame: {} of {total} bytes", b.len()));
    }
    let payload = &b[4..4 + len as usize];
    if checksum(&len_bytes, payload)[..] != b[4 + len as usize..total] {
        return Err("frame checksum mismatch".into());
    }
    let rec = postcard::from_bytes(payload).map_err(|e| format!("frame does not decode: {e}"))?;
    Ok((rec, total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memo::MemoEntry;

    fn rec(i: u8) -> JournalRecord {
        JournalRecord::MemoSet(MemoRecord {
            stage: "s".into(),
            key: Digest::of(&[i]),
            entry: MemoEntry { output: Digest::of(&[i, i]), size: i as u64, compute_micros: 1, recorded_unix: 2 },
        })
    }

    #[test]
    fn append_scan_and_torn_tail() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("journal");
        let mut j = Journal::open(&p, true).unwrap();
        let e1 = j.append(&[rec(1)]).unwrap();
        let e2 = j.append(&[rec(2), JournalRecord::RootRemove { name: "r".into() }]).unwrap();
        // Simulate a crash in the middle of a third append.
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(&[9, 0, 0, 0, 1, 2]).unwrap();
        drop(f);
        let mut j = Journal::open(&p, true).unwrap();
        let s = j.scan_from(HEADER_LEN).unwrap();
        assert_eq!(s.records.len(), 3);
        assert_eq!(s.records[0].0, e1);
        assert_eq!(s.valid_end, e2);
        assert!(s.damage.is_some());
        j.truncate(s.valid_end).unwrap();
        let s = j.scan_from(e1).unwrap();
        assert_eq!(s.records.len(), 2);
        assert!(s.damage.is_none());
    }

    #[test]
    fn flipped_byte_is_detected() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("journal");
        let mut j = Journal::open(&p, true).unwrap();
        j.append(&[rec(1), rec(2)]).unwrap();
        let mut bytes = fs::read(&p).unwrap();
        let n = bytes.len();
        bytes[n - 20] ^= 0x40;
        fs::write(&p, bytes).unwrap();
        let s = Journal::open(&p, true).unwrap().scan_from(HEADER_LEN).unwrap();
        assert_eq!(s.records.len(), 1);
        assert!(s.damage.unwrap().1.contains("checksum"));
    }

    #[test]
    fn fresh_journal_holds_records() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("journal");
        let mut j = Journal::create_fresh(&p, 42, &[rec(1), rec(2)]).unwrap();
        assert_eq!(j.generation(), 42);
        let s = j.scan_from(HEADER_LEN).unwrap();
        assert_eq!(s.records.iter().map(|r| r.1.clone()).collect::<Vec<_>>(), vec![rec(1), rec(2)]);
        assert_eq!(Journal::open(&p, false).unwrap().generation(), 42);
    }
}
