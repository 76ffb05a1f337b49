//! Memo table records: what a stage produced for a key.

use crate::Digest;
use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A memo entry: the output object a stage produced for one key, and metadata about it.
/// The metadata (`compute_micros`, `recorded_unix`) is for reports only: it is never part of a key
/// or of anything hashed, so it cannot make two builds differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoEntry {
    /// The stage's output object (must be in the store when the entry is recorded).
    pub output: Digest,
    /// Size of the output object in bytes.
    pub size: u64,
    /// How long the stage took to compute the output, in microseconds.
    pub compute_micros: u64,
    /// When the entry was recorded, seconds since the Unix epoch.
    pub recorded_unix: u64,
}

impl MemoEntry {
    /// An entry recorded now.
    pub fn new(output: Digest, size: u64, compute: Duration) -> Self {
        MemoEntry {
            output,
            size,
            compute_micros: compute.as_micros().min(u64::MAX as u128) as u64,
            recorded_unix: unix_now(),
        }
    }

    pub fn compute_time(&self) -> Duration {
        Duration::from_micros(self.compute_micros)
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it). Metadata only.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A memo entry with its stage and key: the unit that export, import and the journal carry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoRecord {
    pub stage: String,
    pub key: Digest,
    pub entry: MemoEntry,
}
