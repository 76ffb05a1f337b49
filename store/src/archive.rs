//! Export and import of a build's closure as one file, to carry a cache between CI runs.
//!
//! The archive is a plain tar file (the `tar` crate; `tar tf` lists it), deterministic for the same
//! content (entries in digest order, mtime 0, uid/gid 0, mode 0444), so a CI cache keyed on its hash
//! is stable:
//!
//! 1. `tessera-archive.postcard`: [`Manifest`] (format name and version, the roots, the memo entries
//!    whose output is in the closure, and the list of objects with sizes), postcard-encoded;
//! 2. `objects/<64 hex>` for every object in the closure, raw bytes.
//!
//! Import streams each object through the same hashing writer as `put_reader` and refuses any whose
//! content does not match its name, before anything is recorded; the memo entries and roots are
//! recorded only once every object listed is present.

use crate::error::{Result, StoreError};
use crate::journal::JournalRecord;
use crate::memo::MemoRecord;
use crate::objects::PutMismatch;
use crate::store::Store;
use crate::Digest;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

const MANIFEST_NAME: &str = "tessera-archive.postcard";
const FORMAT: &str = "tessera-store-archive";
const VERSION: u32 = 1;
/// A manifest larger than this is refused rather than read into memory.
const MAX_MANIFEST: u64 = 1 << 30;

/// The first member of an archive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub roots: BTreeMap<String, Vec<Digest>>,
    pub memo: Vec<MemoRecord>,
    /// Every object in the archive, in digest order, with its size.
    pub objects: Vec<(Digest, u64)>,
}

/// What an export wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ExportReport {
    pub roots: usize,
    pub objects: u64,
    pub bytes: u64,
    pub memo_entries: u64,
}

/// What an import added.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ImportReport {
    pub roots: usize,
    pub objects_added: u64,
    pub objects_already_present: u64,
    pub bytes_added: u64,
    pub memo_entries: u64,
}

impl Store {
    /// Writes the closure of `root` (or of every root when `None`) to `file`: the root(s), the objects
    /// they list, and the memo entries whose output is one of those objects. The file appears
    /// atomically (temp file beside it, fsync, rename).
    pub fn export(&self, file: &Path, root: Option<&str>) -> Result<ExportReport> {
        self.export_with(file, root, &[])
    }

    /// [`export`](Self::export), plus every memo entry of the named `stages` and its output, e.g. the
    /// measurements (`tune`, `time-plans`) another machine needs to build from records (`--frozen`). With
    /// stages and no `root`, no root is exported: only those records.
    pub fn export_with(&self, file: &Path, root: Option<&str>, stages: &[String]) -> Result<ExportReport> {
        let all = self.roots()?;
        let roots: BTreeMap<String, Vec<Digest>> = match root {
            Some(name) => {
                let ds = all.get(name).ok_or_else(|| StoreError::Archive {
                    path: file.to_path_buf(),
                    detail: format!("the store has no root named '{name}' (roots: {})", list_names(&all)),
                })?;
                BTreeMap::from([(name.to_string(), ds.clone())])
            }
            None if stages.is_empty() => all,
            None => BTreeMap::new(),
        };
        let entries = self.memo_entries()?;
        if let Some(s) = stages.iter().find(|s| !entries.iter().any(|m| &m.stage == *s)) {
            let present: BTreeSet<&str> = entries.iter().map(|m| m.stage.as_str()).collect();
            return Err(StoreError::Archive {
                path: file.to_path_buf(),
                detail: format!("the store holds no records of stage '{s}' (stages with records: {})", present.into_iter().collect::<Vec<_>>().join(", ")),
            });
        }
        let mut closure: BTreeSet<Digest> = roots.values().flatten().copied().collect();
        closure.extend(entries.iter().filter(|m| stages.contains(&m.stage)).map(|m| m.entry.output));
        let memo: Vec<MemoRecord> = entries.into_iter().filter(|m| closure.contains(&m.entry.output)).collect();
        let mut objects = Vec::with_capacity(closure.len());
        for d in &closure {
            let size = self
                .objects
                .size_of(d)
                .ok_or_else(|| StoreError::NotFound { digest: *d, path: self.objects.path_of(d) })?;
            objects.push((*d, size));
        }
        let manifest = Manifest { format: FORMAT.into(), version: VERSION, roots, memo, objects };
        let report = ExportReport {
            roots: manifest.roots.len(),
            objects: manifest.objects.len() as u64,
            bytes: manifest.objects.iter().map(|o| o.1).sum(),
            memo_entries: manifest.memo.len() as u64,
        };

        let parent = match file.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let tmp = tempfile::Builder::new()
            .prefix(".tessera-export-")
            .tempfile_in(&parent)
            .map_err(StoreError::io("creating temp file in", &parent))?;
        let mut builder = tar::Builder::new(BufWriter::new(tmp));
        let mbytes = postcard::to_allocvec(&manifest)
            .map_err(|cause| StoreError::Encode { what: "archive manifest".into(), cause })?;
        append(&mut builder, MANIFEST_NAME, mbytes.len() as u64, &mbytes[..], file)?;
        for (d, size) in &manifest.objects {
            // Objects are verified as they are read: a corrupt object fails the export, never ships.
            let r = self.objects.open_verified(d)?;
            append(&mut builder, &format!("objects/{}", d.to_hex()), *size, r, file)?;
        }
        let buf = builder.into_inner().map_err(StoreError::io("finishing archive", file))?;
        let tmp = buf.into_inner().map_err(|e| StoreError::io("writing archive", file)(e.into_error()))?;
        tmp.as_file().sync_all().map_err(StoreError::io("fsyncing archive", file))?;
        tmp.persist(file).map_err(|e| StoreError::io("renaming archive into place at", file)(e.error))?;
        crate::layout::fsync_dir(&parent)?;
        Ok(report)
    }

    /// Reads an archive made by [`export`](Self::export): every object is verified against its name
    /// before it enters the store; then the memo entries and roots are recorded (replacing entries and
    /// roots of the same names). Durable when this returns.
    pub fn import(&self, file: &Path) -> Result<ImportReport> {
        self.check_writable("import")?;
        let bad = |detail: String| StoreError::Archive { path: file.to_path_buf(), detail };
        let f = File::open(file).map_err(StoreError::io("opening archive", file))?;
        let mut archive = tar::Archive::new(BufReader::new(f));
        let mut entries = archive.entries().map_err(StoreError::io("reading archive", file))?;
        let manifest: Manifest = {
            let mut first = match entries.next() {
                Some(e) => e.map_err(StoreError::io("reading archive", file))?,
                None => return Err(bad("the archive is empty".into())),
            };
            let name = entry_name(&first);
            if name != MANIFEST_NAME {
                return Err(bad(format!("the first member is '{name}', expected '{MANIFEST_NAME}'")));
            }
            if first.size() > MAX_MANIFEST {
                return Err(bad(format!("the manifest is {} bytes, more than this reader accepts", first.size())));
            }
            let mut bytes = Vec::new();
            first.read_to_end(&mut bytes).map_err(StoreError::io("reading archive manifest", file))?;
            postcard::from_bytes(&bytes).map_err(|e| bad(format!("the manifest does not decode: {e}")))?
        };
        if manifest.format != FORMAT || manifest.version != VERSION {
            return Err(bad(format!(
                "it is '{} v{}', this build reads '{FORMAT} v{VERSION}'",
                manifest.format, manifest.version
            )));
        }
        let listed: BTreeMap<Digest, u64> = manifest.objects.iter().copied().collect();
        let mut report = ImportReport::default();
        let mut seen = BTreeSet::new();
        for entry in entries {
            let entry = entry.map_err(StoreError::io("reading archive", file))?;
            let name = entry_name(&entry);
            if entry.header().entry_type() != tar::EntryType::Regular {
                return Err(bad(format!("member '{name}' is not a regular file")));
            }
            let digest: Digest = name
                .strip_prefix("objects/")
                .and_then(|h| h.parse().ok())
                .ok_or_else(|| bad(format!("member '{name}' is not objects/<digest>")))?;
            if !listed.contains_key(&digest) {
                return Err(bad(format!("member '{name}' is not listed in the manifest")));
            }
            match self.objects.put_reader_expecting(entry, &digest) {
                Ok(o) => {
                    self.count_put(&o);
                    if o.already_present {
                        report.objects_already_present += 1;
                    } else {
                        report.objects_added += 1;
                        report.bytes_added += o.size;
                    }
                }
                Err(PutMismatch::Hash { actual, size }) => {
                    return Err(bad(format!(
                        "member '{name}' is corrupt: its {size} bytes hash to {actual}; nothing was recorded"
                    )))
                }
                Err(PutMismatch::Store(e)) => return Err(e),
            }
            seen.insert(digest);
        }
        let missing: Vec<&Digest> = listed.keys().filter(|d| !seen.contains(d) && !self.objects.contains(d)).collect();
        if let Some(first) = missing.first() {
            return Err(bad(format!(
                "{} object(s) listed in the manifest are missing, e.g. {first}; nothing was recorded",
                missing.len()
            )));
        }
        let mut records: Vec<JournalRecord> = Vec::new();
        for m in &manifest.memo {
            if !self.objects.contains(&m.entry.output) {
                return Err(bad(format!(
                    "memo entry of stage '{}' names output {} which the archive lacks",
                    m.stage, m.entry.output
                )));
            }
            records.push(JournalRecord::MemoSet(m.clone()));
        }
        for (name, ds) in &manifest.roots {
            if let Some(d) = ds.iter().find(|d| !self.objects.contains(d)) {
                return Err(bad(format!("root '{name}' names object {d} which the archive lacks")));
            }
            records.push(JournalRecord::RootSet { name: name.clone(), digests: ds.clone() });
        }
        report.memo_entries = manifest.memo.len() as u64;
        report.roots = manifest.roots.len();
        if !records.is_empty() {
            self.write(records)?;
        } else {
            self.flush()?;
        }
        Ok(report)
    }
}

fn append(builder: &mut tar::Builder<impl Write>, name: &str, size: u64, data: impl Read, file: &Path) -> Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_size(size);
    h.set_mode(0o444);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_entry_type(tar::EntryType::Regular);
    builder.append_data(&mut h, name, data).map_err(StoreError::io("writing archive member into", file))
}

fn entry_name<R: Read>(e: &tar::Entry<'_, R>) -> String {
    e.path().map(|p| p.to_string_lossy().into_owned()).unwrap_or_else(|_| "<unreadable name>".into())
}

fn list_names(roots: &BTreeMap<String, Vec<Digest>>) -> String {
    if roots.is_empty() {
        "none".into()
    } else {
        roots.keys().cloned().collect::<Vec<_>>().join(", ")
    }
}
