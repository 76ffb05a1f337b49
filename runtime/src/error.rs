//! One error type for every API (Rust, and through it C and Python): a kind to branch on, and a message
//! that names the file, model, input or output at fault.

use std::fmt;

/// What went wrong, broadly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The artifact could not be read, or is truncated, corrupted or of another format version.
    Artifact,
    /// The artifact is intact but cannot be loaded here: a module fails to load, needs an instruction set
    /// this CPU lacks, or needs a GPU that is not there; memory cannot be allocated.
    Load,
    /// An input is unknown, missing, given twice, or of the wrong dtype, shape or byte length.
    Input,
    /// An output buffer is unknown, given twice, or of the wrong dtype, shape or byte length.
    Output,
    /// A run failed (a kernel reported an error, the GPU failed).
    Run,
}

/// An error with its [`ErrorKind`] and a message naming what is at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into() }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}
