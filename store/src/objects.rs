//! The local object tier: immutable blobs in `objects/<first 2 hex>/<64 hex>`, named by their blake3 digest.
//!
//! Writes are atomic: the bytes go to a temp file in `tmp/` (same filesystem), are fsynced, renamed into
//! place, and the fan-out directory is fsynced, so after a crash an object file is either absent or whole.
//! (`tmp/` rather than the fan-out directory itself holds the temp files so that cleaning up after a crash
//! is one directory listing, not 256.) Reads re-hash: a file whose content does not hash to its name —
//! torn by a filesystem that lied about fsync, truncated, bit-rotted or edited — is reported with its
//! digest and path and its bytes are never returned.

use crate::error::{Result, StoreError};
use crate::layout::{fsync_dir, Layout};
use crate::Digest;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Buffer size for streaming reads and writes: large enough that syscalls do not dominate, small
/// enough that a stream never holds a meaningful part of a large object in memory.
const CHUNK: usize = 1 << 20;

/// What a put did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PutOutcome {
    pub digest: Digest,
    pub size: u64,
    /// The content was already in the store (a dedupe hit); nothing was written.
    pub already_present: bool,
}

/// One file found in `objects/` by a scan.
#[derive(Clone, Debug)]
pub struct ObjectFile {
    pub path: PathBuf,
    /// The digest its name claims, or `None` for a file whose name is not a digest in the right fan-out dir.
    pub digest: Option<Digest>,
    pub size: u64,
}

/// Local objects on disk.
#[derive(Clone, Debug)]
pub struct LocalObjects {
    objects: PathBuf,
    tmp: PathBuf,
}

impl LocalObjects {
    pub(crate) fn new(layout: &Layout) -> Self {
        LocalObjects { objects: layout.objects(), tmp: layout.tmp() }
    }

    /// Where the object with this digest lives (whether or not it exists).
    pub fn path_of(&self, d: &Digest) -> PathBuf {
        let hex = d.to_hex();
        self.objects.join(&hex[..2]).join(hex)
    }

    /// Whether an object file with this name exists. Cheap (one `stat`); does not re-hash.
    pub fn contains(&self, d: &Digest) -> bool {
        fs::metadata(self.path_of(d)).map(|m| m.is_file()).unwrap_or(false)
    }

    /// Size of the object file, if present.
    pub fn size_of(&self, d: &Digest) -> Option<u64> {
        fs::metadata(self.path_of(d)).ok().filter(|m| m.is_file()).map(|m| m.len())
    }

    /// Stores `bytes`. Content already present (and intact) is not written again.
    pub fn put(&self, bytes: &[u8]) -> Result<PutOutcome> {
        let digest = Digest::of(bytes);
        let size = bytes.len() as u64;
        if self.is_intact(&digest, size) {
            return Ok(PutOutcome { digest, size, already_present: true });
        }
        let mut tmp = self.temp_file()?;
        tmp.as_file_mut().write_all(bytes).map_err(StoreError::io("writing object temp file", tmp.path()))?;
        self.commit(tmp, digest, size)
    }

    /// Streams an object in from `r`, hashing as it goes: memory use is one buffer whatever the size.
    pub fn put_reader(&self, r: impl Read) -> Result<PutOutcome> {
        self.put_reader_checked(r, None)
    }

    /// As [`put_reader`](Self::put_reader), but refuses (and stores nothing) when the content does not
    /// hash to `expected`: what import uses, so a tampered archive member never enters the store.
    pub fn put_reader_expecting(&self, r: impl Read, expected: &Digest) -> Result<PutOutcome, PutMismatch> {
        match self.put_reader_checked(r, Some(expected)) {
            Ok(o) => Ok(o),
            Err(StoreError::Corrupt { actual, size, .. }) => Err(PutMismatch::Hash { actual, size }),
            Err(e) => Err(PutMismatch::Store(e)),
        }
    }

    fn put_reader_checked(&self, mut r: impl Read, expected: Option<&Digest>) -> Result<PutOutcome> {
        let mut tmp = self.temp_file()?;
        let mut hasher = blake3::Hasher::new();
        let mut buf = vec![0u8; CHUNK];
        let mut size = 0u64;
        loop {
            let n = match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(StoreError::io("reading object stream for", tmp.path())(e)),
            };
            hasher.update(&buf[..n]);
            tmp.as_file_mut().write_all(&buf[..n]).map_err(StoreError::io("writing object temp file", tmp.path()))?;
            size += n as u64;
        }
        let digest: Digest = hasher.finalize().into();
        if let Some(exp) = expected {
            if *exp != digest {
                return Err(StoreError::Corrupt { digest: *exp, path: tmp.path().to_path_buf(), actual: digest, size });
            }
        }
        if self.is_intact(&digest, size) {
            return Ok(PutOutcome { digest, size, already_present: true });
        }
        self.commit(tmp, digest, size)
    }

    fn temp_file(&self) -> Result<tempfile::NamedTempFile> {
        tempfile::Builder::new()
            .prefix("put-")
            .tempfile_in(&self.tmp)
            .map_err(StoreError::io("creating temp file in", &self.tmp))
    }

    /// fsync the temp file, make it read-only, rename it into place, fsync the fan-out directory.
    fn commit(&self, tmp: tempfile::NamedTempFile, digest: Digest, size: u64) -> Result<PutOutcome> {
        let path = self.path_of(&digest);
        let f = tmp.as_file();
        f.sync_all().map_err(StoreError::io("fsyncing object temp file", tmp.path()))?;
        let mut perms = f.metadata().map_err(StoreError::io("reading metadata of", tmp.path()))?.permissions();
        perms.set_readonly(true);
        f.set_permissions(perms).map_err(StoreError::io("making read-only", tmp.path()))?;
        let parent = path.parent().expect("object paths have a fan-out parent").to_path_buf();
        if !parent.is_dir() {
            fs::create_dir_all(&parent).map_err(StoreError::io("creating directory", &parent))?;
            fsync_dir(&self.objects)?;
        }
        tmp.persist(&path).map_err(|e| StoreError::Io {
            what: "renaming object into place at",
            path: path.clone(),
            cause: e.error,
        })?;
        fsync_dir(&parent)?;
        Ok(PutOutcome { digest, size, already_present: false })
    }

    /// Whether the object exists with the expected size and content. Used before writing, so that a
    /// damaged copy is replaced rather than trusted.
    fn is_intact(&self, d: &Digest, size: u64) -> bool {
        match self.size_of(d) {
            Some(s) if s == size => self.verify(d).is_ok(),
            _ => false,
        }
    }

    /// Reads a whole object, verified. Memory: the object once.
    pub fn get(&self, d: &Digest) -> Result<Vec<u8>> {
        let path = self.path_of(d);
        let mut f = self.open_file(d)?;
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let mut bytes = Vec::with_capacity(len as usize);
        f.read_to_end(&mut bytes).map_err(StoreError::io("reading object", &path))?;
        let actual = Digest::of(&bytes);
        if actual != *d {
            return Err(StoreError::Corrupt { digest: *d, path, actual, size: bytes.len() as u64 });
        }
        Ok(bytes)
    }

    /// Opens an object for streaming. The whole file is hashed first, so an `Ok` means the content was
    /// intact; the returned reader hashes again as it reads and fails at the end (`InvalidData`, naming
    /// the digest) should the file have changed in between.
    pub fn open_verified(&self, d: &Digest) -> Result<VerifiedReader> {
        let path = self.path_of(d);
        let mut f = self.open_file(d)?;
        let (actual, size) = hash_reader(&mut f).map_err(StoreError::io("reading object", &path))?;
        if actual != *d {
            return Err(StoreError::Corrupt { digest: *d, path, actual, size });
        }
        f.seek(SeekFrom::Start(0)).map_err(StoreError::io("seeking in object", &path))?;
        Ok(VerifiedReader { file: f, hasher: blake3::Hasher::new(), expected: *d, size, read: 0, path })
    }

    /// Streams a verified object into `w`; returns its size. Nothing is written unless the object
    /// verified first.
    pub fn get_to_writer(&self, d: &Digest, w: &mut impl Write) -> Result<u64> {
        let mut r = self.open_verified(d)?;
        let path = r.path.clone();
        let mut buf = vec![0u8; CHUNK];
        let mut n_total = 0u64;
        loop {
            let n = match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(StoreError::io("reading object", &path)(e)),
            };
            w.write_all(&buf[..n]).map_err(StoreError::io("writing out object", &path))?;
            n_total += n as u64;
        }
        Ok(n_total)
    }

    /// Re-hashes an object in a streaming pass; `Ok` with its size when intact.
    pub fn verify(&self, d: &Digest) -> Result<u64> {
        let path = self.path_of(d);
        let mut f = self.open_file(d)?;
        let (actual, size) = hash_reader(&mut f).map_err(StoreError::io("reading object", &path))?;
        if actual != *d {
            return Err(StoreError::Corrupt { digest: *d, path, actual, size });
        }
        Ok(size)
    }

    fn open_file(&self, d: &Digest) -> Result<File> {
        let path = self.path_of(d);
        File::open(&path).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                StoreError::NotFound { digest: *d, path: path.clone() }
            } else {
                StoreError::Io { what: "opening object", path: path.clone(), cause: e }
            }
        })
    }

    /// Every file under `objects/`, sorted by path (deterministic reports).
    pub fn scan(&self) -> Result<Vec<ObjectFile>> {
        let mut out = Vec::new();
        let mut fans: Vec<_> = fs::read_dir(&self.objects)
            .map_err(StoreError::io("listing", &self.objects))?
            .filter_map(|e| e.ok())
            .collect();
        fans.sort_by_key(|e| e.file_name());
        for fan in fans {
            let fan_path = fan.path();
            let fan_name = fan.file_name().to_string_lossy().into_owned();
            if !fan_path.is_dir() {
                let size = fan.metadata().map(|m| m.len()).unwrap_or(0);
                out.push(ObjectFile { path: fan_path, digest: None, size });
                continue;
            }
            let mut ents: Vec<_> =
                fs::read_dir(&fan_path).map_err(StoreError::io("listing", &fan_path))?.filter_map(|e| e.ok()).collect();
            ents.sort_by_key(|e| e.file_name());
            for e in ents {
                let name = e.file_name().to_string_lossy().into_owned();
                let meta = e.metadata().map_err(StoreError::io("reading metadata of", e.path()))?;
                let digest = name
                    .parse::<Digest>()
                    .ok()
                    .filter(|_| meta.is_file() && name.starts_with(&fan_name) && name == name.to_lowercase());
                out.push(ObjectFile { path: e.path(), digest, size: meta.len() });
            }
        }
        Ok(out)
    }

    /// Removes an object file (gc). Missing is not an error.
    pub(crate) fn remove(&self, d: &Digest) -> Result<()> {
        let p = self.path_of(d);
        match fs::remove_file(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::io("removing object", p)(e)),
        }
    }

    /// fsyncs every fan-out directory (after a batch of removals).
    pub(crate) fn sync_fans(&self) -> Result<()> {
        for i in 0..=255u8 {
            let d = self.objects.join(format!("{i:02x}"));
            if d.is_dir() {
                fsync_dir(&d)?;
            }
        }
        Ok(())
    }

    /// Removes leftover temp files of writes that were interrupted (only by an open that has the store to itself: with others present they may be theirs).
    pub(crate) fn clean_tmp(&self) -> Result<usize> {
        let mut n = 0;
        for e in fs::read_dir(&self.tmp).map_err(StoreError::io("listing", &self.tmp))?.flatten() {
            let p = e.path();
            let r = if p.is_dir() { fs::remove_dir_all(&p) } else { fs::remove_file(&p) };
            r.map_err(StoreError::io("removing leftover temp file", &p))?;
            n += 1;
        }
        Ok(n)
    }
}

/// Why a `put_reader_expecting` stored nothing.
#[derive(Debug)]
pub enum PutMismatch {
    /// The stream did not hash to the expected digest.
    Hash {
        actual: Digest,
        size: u64,
    },
    Store(StoreError),
}

/// Hashes a reader to its end: (digest, bytes read).
pub(crate) fn hash_reader(r: &mut impl Read) -> io::Result<(Digest, u64)> {
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; CHUNK];
    let mut size = 0u64;
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((hasher.finalize().into(), size))
}

/// A reader over an object that was verified when opened and is hashed again while read.
#[derive(Debug)]
pub struct VerifiedReader {
    file: File,
    hasher: blake3::Hasher,
    expected: Digest,
    size: u64,
    read: u64,
    path: PathBuf,
}

impl VerifiedReader {
    /// The object's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Read for VerifiedReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        if n == 0 || self.read > self.size {
            let actual: Digest = self.hasher.finalize().into();
            if actual != self.expected || self.read != self.size {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("object {} at {} changed while being read", self.expected, self.path.display()),
                ));
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objects() -> (tempfile::TempDir, LocalObjects) {
        let t = tempfile::tempdir().unwrap();
        let l = Layout::new(t.path());
        l.create().unwrap();
        let o = LocalObjects::new(&l);
        (t, o)
    }

    fn flip_byte(path: &Path, at: u64) {
        let mut perms = fs::metadata(path).unwrap().permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perms.set_readonly(false);
        fs::set_permissions(path, perms).unwrap();
        let mut bytes = fs::read(path).unwrap();
        bytes[at as usize] ^= 0x01;
        fs::write(path, bytes).unwrap();
    }

    #[test]
    fn put_get_and_dedupe() {
        let (_t, o) = objects();
        let a = o.put(b"hello").unwrap();
        assert!(!a.already_present);
        assert_eq!(a.digest, Digest::of(b"hello"));
        assert!(o.put(b"hello").unwrap().already_present);
        assert_eq!(o.get(&a.digest).unwrap(), b"hello");
        assert!(o.contains(&a.digest));
        assert!(o.path_of(&a.digest).starts_with(o.objects.join(&a.digest.to_hex()[..2])));
    }

    #[test]
    fn tampered_object_is_never_returned() {
        let (_t, o) = objects();
        let d = o.put(b"some object bytes").unwrap().digest;
        flip_byte(&o.path_of(&d), 3);
        let err = o.get(&d).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&d.to_hex()) && msg.contains(&o.path_of(&d).display().to_string()), "{msg}");
        assert!(matches!(o.open_verified(&d), Err(StoreError::Corrupt { .. })));
        let mut sink = Vec::new();
        assert!(o.get_to_writer(&d, &mut sink).is_err());
        assert!(sink.is_empty(), "no byte of a corrupt object is written out");
        // A later put of the right content repairs the file.
        assert!(!o.put(b"some object bytes").unwrap().already_present);
        assert_eq!(o.get(&d).unwrap(), b"some object bytes");
    }

    #[test]
    fn truncated_object_is_reported() {
        let (_t, o) = objects();
        let d = o.put(&[7u8; 1000]).unwrap().digest;
        let p = o.path_of(&d);
        let mut perms = fs::metadata(&p).unwrap().permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perms.set_readonly(false);
        fs::set_permissions(&p, perms).unwrap();
        fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(500).unwrap();
        assert!(matches!(o.get(&d), Err(StoreError::Corrupt { size: 500, .. })));
        assert!(o.verify(&d).is_err());
    }

    #[test]
    fn streaming_round_trip_and_expected_digest() {
        let (_t, o) = objects();
        let data: Vec<u8> = (0..3 * CHUNK + 17).map(|i| (i * 31 % 251) as u8).collect();
        let out = o.put_reader(&data[..]).unwrap();
        assert_eq!(out.digest, Digest::of(&data));
        let mut back = Vec::new();
        assert_eq!(o.get_to_writer(&out.digest, &mut back).unwrap(), data.len() as u64);
        assert_eq!(back, data);
        let wrong = Digest::of(b"other");
        assert!(matches!(o.put_reader_expecting(&b"abc"[..], &wrong), Err(PutMismatch::Hash { .. })));
        assert!(!o.contains(&Digest::of(b"abc")), "a mismatched stream stores nothing");
    }

    #[test]
    fn missing_object_names_digest() {
        let (_t, o) = objects();
        let d = Digest::of(b"absent");
        let err = o.get(&d).unwrap_err();
        assert!(matches!(err, StoreError::NotFound { .. }));
        assert!(err.to_string().contains(&d.to_hex()));
    }
}
