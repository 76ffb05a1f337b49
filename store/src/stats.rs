//! Counters kept in the index and the `stats` report built from them.
//!
//! Counters are statistics, not correctness: lookups count in memory and the counts are written to the
//! index with the next memo record, root change, explicit `flush`, or when the store is dropped. A
//! crash loses at most the counts since the last of those.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Memo hits and misses of one stage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageCounts {
    pub hits: u64,
    pub misses: u64,
}

impl StageCounts {
    pub fn add(&mut self, o: &StageCounts) {
        self.hits += o.hits;
        self.misses += o.misses;
    }
}

/// Puts and what dedupe saved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupeCounts {
    /// Every put call.
    pub puts: u64,
    /// Bytes of every put call (what would be on disk without dedupe).
    pub put_bytes: u64,
    /// Puts whose content was already present.
    pub dedupe_puts: u64,
    /// Bytes of those puts: what dedupe saved writing.
    pub dedupe_bytes: u64,
}

impl DedupeCounts {
    pub fn add(&mut self, o: &DedupeCounts) {
        self.puts += o.puts;
        self.put_bytes += o.put_bytes;
        self.dedupe_puts += o.dedupe_puts;
        self.dedupe_bytes += o.dedupe_bytes;
    }
}

/// All counters (persisted, or a pending delta).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub stages: BTreeMap<String, StageCounts>,
    pub dedupe: DedupeCounts,
    /// Pending only: the last-use tick of each memo entry used (hit or recorded) since the last index
    /// write, by (stage, key). Written with the counters, one small index record per entry, never an
    /// object or journal write (see evict.rs); never read back into a `Counters`.
    pub last_use: BTreeMap<(String, crate::Digest), u64>,
}

impl Counters {
    pub fn is_zero(&self) -> bool {
        !self.has_counts() && self.last_use.is_empty()
    }

    /// Whether any hit, miss or put is counted (last-use ticks aside).
    pub fn has_counts(&self) -> bool {
        !(self.stages.values().all(|c| c.hits == 0 && c.misses == 0) && self.dedupe == DedupeCounts::default())
    }

    pub fn add(&mut self, o: &Counters) {
        for (s, c) in &o.stages {
            self.stages.entry(s.clone()).or_default().add(c);
        }
        self.dedupe.add(&o.dedupe);
        for (id, tick) in &o.last_use {
            let t = self.last_use.entry(id.clone()).or_default();
            *t = (*t).max(*tick);
        }
    }
}

/// One stage's line in the report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageStats {
    pub entries: u64,
    pub hits: u64,
    pub misses: u64,
}

/// What `tessera store stats` shows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub dir: String,
    /// Object files and their total size.
    pub objects: u64,
    pub object_bytes: u64,
    pub memo_entries: u64,
    pub roots: u64,
    /// Per stage: memo entries, hits and misses (sorted by stage name).
    pub stages: BTreeMap<String, StageStats>,
    pub hits: u64,
    pub misses: u64,
    pub puts: u64,
    pub dedupe_puts: u64,
    /// Bytes that puts of content already present did not write.
    pub bytes_saved_by_dedupe: u64,
    /// Bytes put / bytes written (1.0 when nothing was deduped).
    pub dedupe_ratio: f64,
    /// Files in quarantine/ (objects verify found bad).
    pub quarantined: u64,
}

impl Stats {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("Stats has no map with non-string keys")
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "store          {}", self.dir)?;
        writeln!(f, "objects        {} ({})", self.objects, human_bytes(self.object_bytes))?;
        writeln!(f, "memo entries   {}", self.memo_entries)?;
        writeln!(f, "roots          {}", self.roots)?;
        let rate = if self.hits + self.misses == 0 {
            0.0
        } else {
            100.0 * self.hits as f64 / (self.hits + self.misses) as f64
        };
        writeln!(f, "memo lookups   {} hits, {} misses ({rate:.1}% hit)", self.hits, self.misses)?;
        writeln!(
            f,
            "dedupe         {} of {} puts were already present, {} saved (ratio {:.2})",
            self.dedupe_puts,
            self.puts,
            human_bytes(self.bytes_saved_by_dedupe),
            self.dedupe_ratio
        )?;
        if self.quarantined > 0 {
            writeln!(f, "quarantined    {} file(s) in quarantine/", self.quarantined)?;
        }
        if !self.stages.is_empty() {
            let w = self.stages.keys().map(|s| s.len()).max().unwrap_or(5).max(5);
            writeln!(f)?;
            writeln!(f, "{:<w$}  {:>9}  {:>9}  {:>9}", "stage", "entries", "hits", "misses")?;
            for (s, c) in &self.stages {
                writeln!(f, "{s:<w$}  {:>9}  {:>9}  {:>9}", c.entries, c.hits, c.misses)?;
            }
        }
        Ok(())
    }
}

/// Pretty JSON of any report (stats, verify, gc), for `--json` outputs.
pub fn to_json<T: Serialize + ?Sized>(v: &T) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(v)
}

/// Bytes in binary units, for people.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(64 << 20), "64.0 MiB");
    }
}
