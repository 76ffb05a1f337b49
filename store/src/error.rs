//! The store's one error type. Every variant names the file, digest or entry at fault, so that a
//! message read in a CI log says where to look without a debugger.

use crate::Digest;
use std::path::PathBuf;

/// Result alias for store operations.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Every variant's message is complete: a cause (an OS error, an encoder's error) is written into it and is
/// not also returned by `source()`. Errors are printed with anyhow's `{:#}`, which appends each `source()` in
/// the chain, so a cause both in the message and in the chain would be printed twice ("...: No such file or
/// directory (os error 2): No such file or directory (os error 2)"); a field named `source` (thiserror's
/// implicit `#[source]`) is therefore called `cause` here.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An I/O call failed; `what` says which step (e.g. "writing object temp file"). The OS error is in the
    /// message and deliberately not the error's `source()` (see the note on [`StoreError`]).
    #[error("{what} {path}: {cause}")]
    Io {
        what: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },

    /// An I/O call failed because the store's filesystem is full. Everything recorded before is intact
    /// (objects are written to a temp file and renamed, memo entries only name complete objects).
    #[error("no space left on device for the store: {what} {path} failed; free space on that filesystem (or run `tessera store gc`) and run again, nothing already in the store is lost")]
    NoSpace { what: &'static str, path: PathBuf },

    /// An object file's content does not hash to its name (torn, truncated or tampered).
    /// Its bytes are never returned.
    #[error("object {digest} at {path} is corrupt: its content hashes to {actual} ({size} bytes); run `tessera store verify` to quarantine it")]
    Corrupt { digest: Digest, path: PathBuf, actual: Digest, size: u64 },

    /// No object with this digest is in the store.
    #[error("object {digest} is not in the store (looked for {path})")]
    NotFound { digest: Digest, path: PathBuf },

    /// A memo entry names an output object that is not in the store.
    #[error("memo entry for stage '{stage}' key {key} names output {output}, which is not in the store: put the output before recording it")]
    MissingOutput { stage: String, key: Digest, output: Digest },

    /// A memo entry's size does not match its output object.
    #[error("memo entry for stage '{stage}' key {key} says its output {output} has {claimed} bytes, but the object has {actual}")]
    OutputSizeMismatch { stage: String, key: Digest, output: Digest, claimed: u64, actual: u64 },

    /// Another process holds the store in a way this open cannot share: alone (gc, eviction, repair),
    /// or, for an open that needs it alone, at all.
    #[error("the store {dir} is in use by another process ({holder}); wait for it to finish, or pass --wait")]
    Locked { dir: PathBuf, holder: String },

    /// An operation that deletes (gc, eviction, repair) was asked of a handle that shares the store.
    #[error("'{op}' needs the store {dir} to itself, and other processes use it ({holders}); wait for them to finish")]
    NotAlone { dir: PathBuf, op: &'static str, holders: String },

    /// The store was opened read-only and a write was attempted.
    #[error("the store {dir} was opened read-only; '{op}' needs a writable store")]
    ReadOnly { dir: PathBuf, op: &'static str },

    /// The directory is not a tessera store (read-only open of a missing store, or a foreign format).
    #[error("{path} is not a tessera store: {reason}")]
    NotAStore { path: PathBuf, reason: String },

    /// The index could not be opened or a record in it could not be decoded.
    #[error("the store index at {path} is damaged ({detail}); run `tessera store verify --repair` to rebuild it from the journal and the objects")]
    IndexDamaged { path: PathBuf, detail: String },

    /// The index's write lock stayed held by another process for longer than a write section may take.
    /// The index is not damaged.
    #[error("the store index at {path} is busy: {detail}; the index is not damaged: retry once the other process is done")]
    IndexLocked { path: PathBuf, detail: String },

    /// A journal frame could not be decoded (only reported by verify / repair; see journal.rs).
    #[error("the journal {path} is damaged at byte {offset}: {detail}")]
    JournalDamaged { path: PathBuf, offset: u64, detail: String },

    /// An export archive is malformed or one of its objects does not match its name.
    #[error("archive {path}: {detail}")]
    Archive { path: PathBuf, detail: String },

    /// A value could not be encoded canonically (postcard).
    #[error("cannot encode {what} canonically: {cause}")]
    Encode { what: String, cause: postcard::Error },

    /// The remote tier's server failed a request (refused, timed out, answered with an error). The store
    /// disables the tier for the rest of the process after the first one and goes on locally.
    #[error("remote tier {url}: {what} failed: {detail}")]
    Remote { url: String, what: String, detail: String },

    /// An object the remote tier returned does not hash to its name. Its bytes are never served.
    #[error("remote tier {url}: object {digest} failed verification: its content hashes to {actual} ({size} bytes); ignored, it will be recomputed")]
    RemoteCorrupt { url: String, digest: Digest, actual: Digest, size: u64 },

    /// A memo record on the remote tier cannot be trusted as the entry asked for.
    #[error("remote tier {url}: memo entry for stage '{stage}' key {key} is not trusted: {why}")]
    RemoteBadEntry { url: String, stage: String, key: Digest, why: String },

    /// A memo record on the remote tier without a valid signature from a key this client trusts (only
    /// when trusted keys are configured).
    #[error("remote tier {url}: memo entry for stage '{stage}' key {key} is not trusted: {why}")]
    RemoteUntrustedEntry { url: String, stage: String, key: Digest, why: String },

    /// A write to a remote tier configured read-only.
    #[error("remote tier {url} is read-only; '{op}' is not sent to it")]
    RemoteReadOnly { url: String, op: &'static str },

    /// A configuration file in the store directory (`MAX_SIZE`, the size cap) does not hold what it should.
    #[error("the store's configuration file {path} is not valid: {detail}; write it again with `tessera store config --max-size SIZE` (`none` removes the cap)")]
    BadConfig { path: PathBuf, detail: String },

    /// A name given by the caller is unusable (empty stage or root name, ...).
    #[error("invalid {what} '{value}': {reason}")]
    InvalidName { what: &'static str, value: String, reason: &'static str },
}

impl StoreError {
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> StoreError {
        let path = path.into();
        move |source| {
            if source.kind() == std::io::ErrorKind::StorageFull {
                StoreError::NoSpace { what, path }
            } else {
                StoreError::Io { what, path, cause: source }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_named_as_such_with_the_path_once() {
        let e = StoreError::io("writing object temp file", "/s/tmp/put-1")(std::io::Error::from_raw_os_error(28));
        let msg = e.to_string();
        assert!(matches!(e, StoreError::NoSpace { .. }), "{e:?}");
        assert!(msg.starts_with("no space left on device for the store: writing object temp file /s/tmp/put-1 failed"), "{msg}");
        // No source: the OS's own "No space left on device" would repeat it in an error chain.
        assert!(std::error::Error::source(&e).is_none());
        let other = StoreError::io("reading", "/s/x")(std::io::Error::from_raw_os_error(2));
        assert!(matches!(other, StoreError::Io { .. }));
    }

    /// What anyhow's `{:#}` prints (how `tessera` prints every error): the message, then each `source()`.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut s = e.to_string();
        let mut next = e.source();
        while let Some(c) = next {
            s += &format!(": {c}");
            next = c.source();
        }
        s
    }

    #[test]
    fn causes_are_printed_once_in_the_error_chain() {
        let io = StoreError::io("opening object", "/s/objects/ab/cd")(std::io::Error::from_raw_os_error(2));
        let text = chain(&io);
        assert_eq!(text.matches("No such file or directory").count(), 1, "{text}");
        assert!(text.starts_with("opening object /s/objects/ab/cd: No such file or directory"), "{text}");
        let postcard = postcard::to_slice(&[1u8; 8], &mut [0u8; 2]).unwrap_err();
        let encode = StoreError::Encode { what: "index record".into(), cause: postcard.clone() };
        let text = chain(&encode);
        assert_eq!(text.matches(&postcard.to_string()).count(), 1, "{text}");
    }
}
