//! Facts about this machine that are slow to learn and cheap to prove current, cached across processes in
//! the store directory's `machine/` folder (the GPU's fingerprint: learning it initialises the CUDA driver,
//! 0.19 s on an H200, where a warm rebuild is otherwise a few hashes; bench/compile_times.md).
//!
//! A fact is named by the digest of its *witness*: what the caller reads cheaply to prove the fact current
//! (for the GPU, the driver's version file, the GPUs' identities, the boot, the libraries' files). A changed
//! witness names another file, so a stale fact is never found, only left behind. Facts are not content: they
//! never enter the memo table, roots, exports or the remote tier, and gc leaves them alone (a few hundred
//! bytes each, one per boot and machine).
//!
//! Each file is the blake3 of its content followed by the content, written to a temporary name and renamed,
//! so a reader sees a whole fact or none, and a damaged file reads as absent.

use crate::digest::Digest;
use crate::error::{Result, StoreError};
use std::path::{Path, PathBuf};

/// The `machine/` folder of one store directory.
#[derive(Clone, Debug)]
pub struct MachineFacts {
    store_dir: PathBuf,
}

impl MachineFacts {
    /// The facts of the store at `store_dir` (which need not exist yet: then there are none).
    pub fn in_store(store_dir: &Path) -> MachineFacts {
        MachineFacts { store_dir: store_dir.to_path_buf() }
    }

    fn dir(&self) -> PathBuf {
        self.store_dir.join("machine")
    }

    fn path(&self, name: &Digest) -> PathBuf {
        self.dir().join(name.to_hex())
    }

    /// The fact recorded under `name`, if there is one and it is intact.
    pub fn get(&self, name: &Digest) -> Option<Vec<u8>> {
        let bytes = std::fs::read(self.path(name)).ok()?;
        let (sum, content) = bytes.split_at_checked(32)?;
        (blake3::hash(content).as_bytes() == sum).then(|| content.to_vec())
    }

    /// Records `content` under `name`: a temporary file renamed into place. Only in an existing store (one
    /// with its FORMAT file), so recording a fact never makes a store.
    pub fn put(&self, name: &Digest, content: &[u8]) -> Result<()> {
        if !self.store_dir.join("FORMAT").is_file() {
            return Err(StoreError::NotAStore { path: self.store_dir.clone(), reason: "no FORMAT file: machine facts are kept only in a store".into() });
        }
        let dir = self.dir();
        std::fs::create_dir_all(&dir).map_err(StoreError::io("creating", &dir))?;
        let path = self.path(name);
        let tmp = dir.join(format!(".{}.{}.tmp", name.to_hex(), std::process::id()));
        let mut bytes = Vec::with_capacity(32 + content.len());
        bytes.extend_from_slice(blake3::hash(content).as_bytes());
        bytes.extend_from_slice(content);
        std::fs::write(&tmp, &bytes).map_err(StoreError::io("writing", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            StoreError::io("renaming into place", &path)(e)
        })
    }

    /// Forgets the fact recorded under `name` (found stale by a live reading); absent is not an error.
    pub fn remove(&self, name: &Digest) -> Result<()> {
        let path = self.path(name);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StoreError::io("removing", &path)(e)),
            _ => Ok(()),
        }
    }

    /// Where the fact `name` is kept (for messages).
    pub fn location(&self, name: &Digest) -> PathBuf {
        self.path(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("FORMAT"), "tessera-store 1\n").unwrap();
        dir
    }

    #[test]
    fn a_fact_reads_back_until_removed() {
        let dir = store_dir();
        let facts = MachineFacts::in_store(dir.path());
        let name = Digest::of(b"witness");
        assert_eq!(facts.get(&name), None);
        facts.put(&name, b"fingerprint").unwrap();
        assert_eq!(facts.get(&name).as_deref(), Some(&b"fingerprint"[..]));
        facts.put(&name, b"another").unwrap();
        assert_eq!(facts.get(&name).as_deref(), Some(&b"another"[..]));
        assert_eq!(facts.get(&Digest::of(b"other witness")), None);
        facts.remove(&name).unwrap();
        assert_eq!(facts.get(&name), None);
        facts.remove(&name).unwrap();
    }

    #[test]
    fn a_damaged_fact_reads_as_absent() {
        let dir = store_dir();
        let facts = MachineFacts::in_store(dir.path());
        let name = Digest::of(b"witness");
        facts.put(&name, b"fingerprint").unwrap();
        let path = facts.location(&name);
        let mut bytes = std::fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(facts.get(&name), None);
        std::fs::write(&path, &bytes[..10]).unwrap();
        assert_eq!(facts.get(&name), None);
    }

    #[test]
    fn no_fact_is_kept_outside_a_store() {
        let dir = tempfile::tempdir().unwrap();
        let facts = MachineFacts::in_store(&dir.path().join("nothing"));
        let err = facts.put(&Digest::of(b"w"), b"f").unwrap_err();
        assert!(err.to_string().contains("FORMAT"), "{err}");
        assert!(!dir.path().join("nothing").exists());
    }
}
