//! Where a store lives and what its directory holds. See store/README.md for the format on disk.

use crate::error::{Result, StoreError};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The store directory used when neither `--store` nor `TESSERA_STORE` says otherwise, relative to the
/// working directory.
pub const DEFAULT_DIR: &str = ".tessera";

/// The environment variable that overrides the default store directory.
pub const STORE_ENV: &str = "TESSERA_STORE";

/// First line of the `FORMAT` file; a store with another line is refused rather than misread.
pub const FORMAT_LINE: &str = "tessera-store 1";

/// The store directory to use: `explicit` (from `--store`) if given, else `$TESSERA_STORE` if set and
/// non-empty, else `.tessera` in the working directory. `tessera compile` and `tessera store` share it.
pub fn resolve_dir(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_path_buf();
    }
    match std::env::var_os(STORE_ENV) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => PathBuf::from(DEFAULT_DIR),
    }
}

/// The default store directory: `$TESSERA_STORE` if set and non-empty, else `.tessera`.
pub fn default_dir() -> PathBuf {
    resolve_dir(None)
}

/// The paths inside one store directory.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    pub fn new(dir: &Path) -> Self {
        Layout { dir: dir.to_path_buf() }
    }
    pub fn format_file(&self) -> PathBuf {
        self.dir.join("FORMAT")
    }
    pub fn lock_file(&self) -> PathBuf {
        self.dir.join("LOCK")
    }
    pub fn journal(&self) -> PathBuf {
        self.dir.join("journal")
    }
    /// The file naming the live index directory (absent: `index`). Rebuilding the index writes a new
    /// directory and then switches this name atomically, so there is never a moment without an index.
    pub fn index_pointer(&self) -> PathBuf {
        self.dir.join("INDEX")
    }
    /// The name of the live index directory.
    pub fn index_name(&self) -> Result<String> {
        match fs::read_to_string(self.index_pointer()) {
            Ok(s) => {
                let name = s.trim().to_string();
                if name.starts_with("index") && !name.contains('/') && !name.contains('\\') {
                    Ok(name)
                } else {
                    Err(StoreError::IndexDamaged {
                        path: self.index_pointer(),
                        detail: format!("it names '{name}', not an index directory"),
                    })
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok("index".to_string()),
            Err(e) => Err(StoreError::io("reading", self.index_pointer())(e)),
        }
    }
    /// Points INDEX at `name` (temp file, fsync, rename, directory fsync).
    pub fn set_index_name(&self, name: &str) -> Result<()> {
        let tmp = self.tmp().join("INDEX.new");
        let mut f = File::create(&tmp).map_err(StoreError::io("creating", &tmp))?;
        writeln!(f, "{name}").map_err(StoreError::io("writing", &tmp))?;
        f.sync_all().map_err(StoreError::io("fsyncing", &tmp))?;
        fs::rename(&tmp, self.index_pointer()).map_err(StoreError::io("renaming into place", self.index_pointer()))?;
        fsync_dir(&self.dir)
    }
    pub fn objects(&self) -> PathBuf {
        self.dir.join("objects")
    }
    pub fn tmp(&self) -> PathBuf {
        self.dir.join("tmp")
    }
    pub fn quarantine(&self) -> PathBuf {
        self.dir.join("quarantine")
    }
    /// The store's size cap, if one is configured (`tessera store config --max-size`; see evict.rs).
    pub fn max_size_file(&self) -> PathBuf {
        self.dir.join("MAX_SIZE")
    }
    /// The objects an eviction in progress deletes (present only while one runs, or after a crash in one).
    pub fn evict_intent(&self) -> PathBuf {
        self.dir.join("EVICTING")
    }

    /// Whether the directory holds a store already; errors if it holds something else.
    pub fn check_existing(&self) -> Result<bool> {
        match fs::read_to_string(self.format_file()) {
            Ok(s) => {
                let first = s.lines().next().unwrap_or("");
                if first == FORMAT_LINE {
                    Ok(true)
                } else {
                    Err(StoreError::NotAStore {
                        path: self.dir.clone(),
                        reason: format!("FORMAT says '{first}', this build reads '{FORMAT_LINE}'"),
                    })
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // A directory that exists with other files in it (other than a LOCK left by an interrupted
                // creation) is someone else's: refuse rather than scatter our files into it.
                if let Ok(rd) = fs::read_dir(&self.dir) {
                    for ent in rd.flatten() {
                        let name = ent.file_name();
                        let known = ["LOCK", "sessions", "LEASES", "objects", "tmp", "index", "INDEX", "journal", "quarantine", "MAX_SIZE", "EVICTING", "machine"];
                        if !known.iter().any(|k| name == *k) {
                            return Err(StoreError::NotAStore {
                                path: self.dir.clone(),
                                reason: format!(
                                    "it has no FORMAT file and is not empty (found '{}')",
                                    name.to_string_lossy()
                                ),
                            });
                        }
                    }
                }
                Ok(false)
            }
            Err(e) => Err(StoreError::io("reading", self.format_file())(e)),
        }
    }

    /// Creates the directory skeleton (idempotent). FORMAT is written last and atomically, so a store
    /// whose creation was interrupted is simply created again.
    pub fn create(&self) -> Result<()> {
        for d in [self.objects(), self.tmp(), self.quarantine()] {
            fs::create_dir_all(&d).map_err(StoreError::io("creating directory", &d))?;
        }
        self.create_fan_dirs()?;
        fsync_dir(&self.objects())?;
        if !self.format_file().exists() {
            let tmp = self.tmp().join("FORMAT.new");
            let mut f = File::create(&tmp).map_err(StoreError::io("creating", &tmp))?;
            writeln!(f, "{FORMAT_LINE}").map_err(StoreError::io("writing", &tmp))?;
            f.sync_all().map_err(StoreError::io("syncing", &tmp))?;
            fs::rename(&tmp, self.format_file()).map_err(StoreError::io("renaming into place", self.format_file()))?;
        }
        fsync_dir(&self.dir)
    }

    /// The 256 fan-out directories `objects/00` .. `objects/ff`, created up front so that a put never
    /// has to create (and fsync) a directory.
    pub fn create_fan_dirs(&self) -> Result<()> {
        for i in 0..=255u8 {
            let d = self.objects().join(format!("{i:02x}"));
            if !d.is_dir() {
                fs::create_dir_all(&d).map_err(StoreError::io("creating directory", &d))?;
            }
        }
        Ok(())
    }
}

/// fsyncs a directory so that renames and unlinks in it survive a power cut.
pub(crate) fn fsync_dir(dir: &Path) -> Result<()> {
    let f = File::open(dir).map_err(StoreError::io("opening directory for fsync", dir))?;
    f.sync_all().map_err(StoreError::io("fsyncing directory", dir))
}

/// Writes a small file in the store directory whole or not at all (temp file in `tmp/`, fsync, rename,
/// directory fsync).
pub(crate) fn write_atomically(layout: &Layout, path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = tempfile::Builder::new()
        .prefix("config-")
        .tempfile_in(layout.tmp())
        .map_err(StoreError::io("creating temp file in", layout.tmp()))?;
    let mut f = tmp.as_file();
    f.write_all(bytes).map_err(StoreError::io("writing", tmp.path()))?;
    f.sync_all().map_err(StoreError::io("fsyncing", tmp.path()))?;
    tmp.persist(path).map_err(|e| StoreError::Io { what: "renaming into place", path: path.to_path_buf(), cause: e.error })?;
    fsync_dir(&layout.dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_dir_wins() {
        assert_eq!(resolve_dir(Some(Path::new("/x/y"))), PathBuf::from("/x/y"));
    }

    #[test]
    fn refuses_foreign_directory() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("notes.txt"), "mine").unwrap();
        let err = Layout::new(t.path()).check_existing().unwrap_err();
        assert!(err.to_string().contains("notes.txt"), "{err}");
    }

    #[test]
    fn refuses_other_format() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("FORMAT"), "tessera-store 99\n").unwrap();
        let err = Layout::new(t.path()).check_existing().unwrap_err();
        assert!(err.to_string().contains("tessera-store 99"), "{err}");
    }
}
