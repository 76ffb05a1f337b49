//! The size cap: least-recently-used eviction of memo entries, and of the objects only they name.
//!
//! Why it is shaped this way:
//! - **What may go.** Roots are what builds promised to keep (gc's rule), so an object a root lists is never
//!   evicted, and neither is an entry whose output a root lists (removing it would free nothing and cost a
//!   hit). Everything else a memo entry names is a cache: evicting the entry makes the next build that
//!   needs it recompute it (the driver treats a missing entry as a miss), and the object goes once no
//!   remaining entry and no root names it. Objects no entry and no root names (a graph's constants, whose
//!   document names them by digest without a memo call) are left alone: eviction cannot tell who reads
//!   them; plain `gc` removes them together with every unrooted entry. That an evicted output is recomputed
//!   wherever it is needed rests on the pipeline's rule that a stage reaches another stage's output only
//!   through a memo call (`stage::run`, ARCHITECTURE.md), never by a digest read out of a cached output.
//! - **Least recently used, cheaply.** Every writable open of the store is a session with its own tick
//!   (`Index::next_tick`, a counter, not a clock). A memo hit or record notes (stage, key) -> tick in
//!   memory; the notes go to the index as one small record per entry with the next index write, in the
//!   same index transaction as the hit counters: no object is rewritten, nothing is journaled, and an entry used
//!   many times in one build is written once. So ticks are coarse (a whole build shares one) and order
//!   entries by the build that last used them; ties go to the older `recorded_unix`. Entries without a
//!   tick (written before ticks existed, or after an index rebuild, which starts without them) count as
//!   never used. Ticks are metadata: nothing hashed, keyed or emitted into an artifact reads them.
//! - **The size** is the bytes of the object files (what `store stats` calls object bytes). The index and
//!   journal are metadata of a few hundred bytes per entry and are not counted.
//! - **Crash safety.** Entries go before objects: an intent file (`EVICTING`, the digests about to be
//!   deleted) is written and fsynced, then the entries' removal is journaled and applied like any index
//!   change, then the objects are deleted, then the intent file. A crash before the removal is durable
//!   leaves every entry and object in place; after it, at worst objects no entry names yet, which the next
//!   writable open deletes from the intent file (`finish_interrupted`, evict_intent.rs), deleting only what
//!   no entry and no root names at that moment. At no point does an entry or a root name a missing object.

use crate::error::{Result, StoreError};
use crate::journal::JournalRecord;
use crate::evict_intent::{clear_intent, remove_objects, write_intent};
use crate::layout::{fsync_dir, write_atomically};
use crate::memo::MemoRecord;
use crate::stats::human_bytes;
use crate::store::{lock, rewrite_journal, Store};
use crate::Digest;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;

/// Parses a size: a number of bytes, or a number with a binary unit `K`, `M`, `G` or `T` (1K = 1024 bytes),
/// optionally followed by `iB` or `B`, in any case: `4096`, `500M`, `2G`, `1.5GiB`.
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim());
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("'{text}' is not a size: unknown unit '{unit}' (use bytes, or K, M, G, T: e.g. 500M, 2G)")),
    };
    let bad = || format!("'{text}' is not a size (use bytes, or a number with K, M, G, T: e.g. 500M, 2G)");
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') || num.matches('.').count() > 1 {
        return Err(bad());
    }
    let bytes = if let Some((whole, frac)) = num.split_once('.') {
        // Exact for the fractions people write (1.5G), without floating point.
        let whole: u128 = whole.parse().map_err(|_| bad())?;
        let digits = frac.len().min(18) as u32;
        let frac: u128 = frac[..digits as usize].parse().map_err(|_| bad())?;
        (whole << shift) + ((frac << shift) / 10u128.pow(digits))
    } else {
        let n: u128 = num.parse().map_err(|_| bad())?;
        n << shift
    };
    u64::try_from(bytes).map_err(|_| format!("'{text}' is too large a size"))
}

/// What an eviction found and did (`tessera store gc --max-size SIZE [--json]`, and the cap a compile
/// enforces).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictReport {
    pub dry_run: bool,
    /// The cap, in bytes of object files.
    pub max_size: u64,
    /// Object bytes before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Memo entries evicted, and per stage.
    pub entries_evicted: u64,
    pub evicted_by_stage: BTreeMap<String, u64>,
    /// Objects deleted (named by evicted entries only) and their bytes.
    pub objects_evicted: u64,
    pub bytes_evicted: u64,
    /// Bytes of objects some root lists: never evicted.
    pub root_bytes: u64,
    /// Bytes of objects neither a root nor an entry names: left alone (plain `gc` removes them).
    pub loose_bytes: u64,
    /// Whether the store is now within the cap (false when roots and loose objects alone exceed it).
    pub within_cap: bool,
    /// Set when a compile could not enforce the cap because other processes kept using the store (the
    /// eviction would pull objects from under them): who they were. The report is then what the
    /// eviction would do; the last of them to finish enforces it.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub deferred_for: Option<String>,
}

impl EvictReport {
    /// A report for people, one line per fact.
    pub fn lines(&self) -> Vec<String> {
        let verb = if self.dry_run { "would evict" } else { "evicted" };
        let mut v = Vec::new();
        if let Some(others) = &self.deferred_for {
            v.push(format!(
                "not enforced yet: other processes use the store ({others}); the last compile to finish, or `tessera store gc --max-size`, enforces it"
            ));
        }
        if self.entries_evicted == 0 && self.bytes_before <= self.max_size {
            v.push(format!(
                "store holds {}, within the cap of {}: nothing to evict",
                human_bytes(self.bytes_before),
                human_bytes(self.max_size)
            ));
            return v;
        }
        let stages: Vec<String> = self.evicted_by_stage.iter().map(|(s, n)| format!("{s}: {n}")).collect();
        v.push(format!(
            "{verb} {} least recently used memo entr(ies){} and {} object(s), {}",
            self.entries_evicted,
            if stages.is_empty() { String::new() } else { format!(" ({})", stages.join(", ")) },
            self.objects_evicted,
            human_bytes(self.bytes_evicted)
        ));
        v.push(format!(
            "store {} {} of the cap of {} (was {})",
            if self.dry_run { "would hold" } else { "holds" },
            human_bytes(self.bytes_after),
            human_bytes(self.max_size),
            human_bytes(self.bytes_before)
        ));
        if !self.within_cap {
            v.push(format!(
                "still over the cap by {}: roots keep {} and {} is in objects no root or entry names (`tessera store gc` without --max-size removes those with every unrooted entry)",
                human_bytes(self.bytes_after - self.max_size),
                human_bytes(self.root_bytes),
                human_bytes(self.loose_bytes)
            ));
        }
        v
    }
}

impl Store {
    /// The configured cap (`MAX_SIZE` in the store directory, bytes), if any. A file that does not hold a
    /// size is an error naming it.
    pub fn max_size(&self) -> Result<Option<u64>> {
        let path = self.layout.max_size_file();
        match fs::read_to_string(&path) {
            Ok(text) => parse_size(&text)
                .map(Some)
                .map_err(|detail| StoreError::BadConfig { path: path.clone(), detail }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::io("reading the store's size cap", &path)(e)),
        }
    }

    /// Sets (or with `None` removes) the cap that [`enforce_max_size`](Self::enforce_max_size) applies.
    /// Written atomically (temp file, fsync, rename).
    pub fn set_max_size(&self, max: Option<u64>) -> Result<()> {
        self.check_writable("set the size cap")?;
        let path = self.layout.max_size_file();
        match max {
            Some(bytes) => write_atomically(&self.layout, &path, format!("{bytes}\n").as_bytes())?,
            None => match fs::remove_file(&path) {
                Ok(()) => fsync_dir(&self.layout.dir)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io("removing the store's size cap", &path)(e)),
            },
        }
        Ok(())
    }

    /// Evicts down to the configured cap, if one is configured: what a compile runs when it is done.
    ///
    /// Eviction deletes, so it needs the store alone: this waits up to [`CAP_WAIT`] for the other
    /// processes using the store to close it (compiles finishing together release it within
    /// milliseconds of each other). If they keep it, the report says what would go and who is in the way
    /// ([`EvictReport::deferred_for`]), and nothing is deleted: each of them enforces the cap in turn when
    /// it finishes, so the last one out leaves the store within it.
    pub fn enforce_max_size(&mut self) -> Result<Option<EvictReport>> {
        let Some(max) = self.max_size()? else { return Ok(None) };
        if self.lock.is_exclusive() {
            return self.evict_to(max, false).map(Some);
        }
        if !self.lock.upgrade(CAP_WAIT)? {
            let mut rep = self.evict_to(max, true)?;
            rep.deferred_for = Some(self.other_holders());
            return Ok(Some(rep));
        }
        let rep = self.evict_to(max, false);
        self.lock.downgrade()?;
        rep.map(Some)
    }

    /// Evicts least recently used memo entries, and the objects only they name, until the object bytes
    /// are at most `max` or nothing evictable is left; never an object a root lists. With `dry_run`, only
    /// reports. Takes `&mut self`: no other thread of the process is using the store meanwhile.
    pub fn evict_to(&mut self, max: u64, dry_run: bool) -> Result<EvictReport> {
        self.check_writable("evict")?;
        if dry_run {
            self.evict_inner(max, true)
        } else {
            self.alone("evict", |s| s.evict_inner(max, false))
        }
    }

    fn evict_inner(&mut self, max: u64, dry_run: bool) -> Result<EvictReport> {
        // This session's hits become last-use ticks in the index before the order is read.
        self.flush()?;
        let sizes: BTreeMap<Digest, u64> =
            self.objects.scan()?.into_iter().filter_map(|f| f.digest.map(|d| (d, f.size))).collect();
        let total: u64 = sizes.values().sum();
        let rooted: BTreeSet<Digest> = self.roots()?.into_values().flatten().collect();
        let entries = self.memo_entries()?;
        let mut names: BTreeMap<Digest, u32> = BTreeMap::new();
        for e in &entries {
            *names.entry(e.entry.output).or_default() += 1;
        }
        let mut rep = EvictReport {
            dry_run,
            max_size: max,
            bytes_before: total,
            root_bytes: rooted.iter().filter_map(|d| sizes.get(d)).sum(),
            loose_bytes: sizes.iter().filter(|(d, _)| !rooted.contains(d) && !names.contains_key(d)).map(|(_, s)| s).sum(),
            ..Default::default()
        };
        let mut evicted: Vec<&MemoRecord> = Vec::new();
        let mut doomed: Vec<Digest> = Vec::new();
        let mut now = total;
        if now > max {
            let uses = self.index.last_uses()?;
            let mut candidates: Vec<(u64, &MemoRecord)> = entries
                .iter()
                .filter(|e| !rooted.contains(&e.entry.output))
                .map(|e| (uses.get(&(e.stage.clone(), e.key)).copied().unwrap_or(0), e))
                .collect();
            candidates.sort_by(|(ta, a), (tb, b)| {
                (ta, a.entry.recorded_unix, &a.stage, a.key).cmp(&(tb, b.entry.recorded_unix, &b.stage, b.key))
            });
            for (_, e) in candidates {
                if now <= max {
                    break;
                }
                evicted.push(e);
                *rep.evicted_by_stage.entry(e.stage.clone()).or_default() += 1;
                let left = names.get_mut(&e.entry.output).expect("every entry's output was counted");
                *left -= 1;
                if *left == 0 {
                    if let Some(size) = sizes.get(&e.entry.output) {
                        doomed.push(e.entry.output);
                        now -= size;
                        rep.bytes_evicted += size;
                    }
                }
            }
        }
        rep.entries_evicted = evicted.len() as u64;
        rep.objects_evicted = doomed.len() as u64;
        rep.bytes_after = now;
        rep.within_cap = now <= max;
        if dry_run || evicted.is_empty() {
            return Ok(rep);
        }
        // Entries before objects (module doc): intent, entries' removal, objects, intent gone.
        write_intent(&self.layout, &doomed)?;
        let removals =
            evicted.iter().map(|e| JournalRecord::MemoRemove { stage: e.stage.clone(), key: e.key }).collect();
        self.write(removals)?;
        remove_objects(&self.objects, &doomed)?;
        clear_intent(&self.layout)?;
        // Compact the journal, as gc does: the removed entries' history is no longer needed.
        let mut j = lock(&self.journal);
        self.index.write(|w| rewrite_journal(&self.layout, w, &mut j))?;
        Ok(rep)
    }
}

/// How long a compile's eviction waits for the other processes using the store to close it.
pub const CAP_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoEntry, OpenOptions};
    use std::time::Duration;

    #[test]
    fn sizes_people_write() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("500M"), Ok(500 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("2 GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("64kb"), Ok(64 << 10));
        assert_eq!(parse_size(" 7B\n"), Ok(7));
        assert_eq!(parse_size("0"), Ok(0));
        for bad in ["", "M", "-1G", "2X", "1..5G", ".5G", "5.G", "G5", "1e9", "99999999999T"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains(&format!("'{bad}'")), "{bad}: {e}");
        }
    }

    /// An object of `n` bytes recorded as stage `s`'s output for key `k`; returns (key, output).
    fn entry(s: &Store, stage: &str, k: &str, n: usize) -> (Digest, Digest) {
        let bytes: Vec<u8> = (0..n).map(|i| (i as u8) ^ k.as_bytes()[0]).chain(k.bytes()).collect();
        let d = s.put(&bytes).unwrap();
        let key = Digest::of(k.as_bytes());
        s.memo_record(stage, &key, &MemoEntry::new(d, bytes.len() as u64, Duration::ZERO)).unwrap();
        (key, d)
    }

    fn object_bytes(s: &Store) -> u64 {
        s.stats().unwrap().object_bytes
    }

    #[test]
    fn least_recently_used_go_first_and_roots_and_shared_outputs_stay() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path();
        // Session 1: four entries, one rooted, one sharing its output with a session-2 entry.
        // (`sh` is recorded first, so it is older than `b` whether or not a second passes in between.)
        let (old_a, old_b, rooted, shared_old) = {
            let s = Store::open(dir, OpenOptions::writable()).unwrap();
            let sh = entry(&s, "compile", "sh", 1000);
            let a = entry(&s, "lower", "a", 1000);
            let b = entry(&s, "lower", "b", 1000);
            let r = entry(&s, "link", "r", 1000);
            s.set_root("model:m", &[r.1]).unwrap();
            (a, b, r, sh)
        };
        // Session 2: `a` is used again (a hit), a new entry, and a second entry naming the shared object.
        let fresh = {
            let s = Store::open(dir, OpenOptions::writable()).unwrap();
            assert!(s.memo_lookup("lower", &old_a.0).unwrap().is_some());
            let bytes = s.get(&shared_old.1).unwrap();
            let k2 = Digest::of(b"sh2");
            s.memo_record("compile", &k2, &MemoEntry::new(shared_old.1, bytes.len() as u64, Duration::ZERO)).unwrap();
            entry(&s, "lower", "c", 1000)
        };
        let mut s = Store::open(dir, OpenOptions::writable()).unwrap();
        let before = object_bytes(&s);
        // Room for everything but one object: the least recently used entry that frees one is `b`
        // (session 1, not hit since); `sh` (also session 1) goes first but frees nothing, as the
        // session-2 entry still names its output.
        let r = s.evict_to(before - 1, false).unwrap();
        assert_eq!(r.entries_evicted, 2, "{r:?}");
        assert_eq!(r.objects_evicted, 1, "{r:?}");
        assert_eq!(r.bytes_evicted, 1001);
        assert_eq!(r.evicted_by_stage, BTreeMap::from([("compile".to_string(), 1), ("lower".to_string(), 1)]));
        assert!(r.within_cap && r.bytes_after == before - 1001, "{r:?}");
        assert!(s.memo_lookup("lower", &old_b.0).unwrap().is_none());
        assert!(!s.objects().contains(&old_b.1));
        assert!(s.memo_lookup("compile", &shared_old.0).unwrap().is_none());
        assert!(s.objects().contains(&shared_old.1), "still named by the session-2 entry");
        for (stage, (k, _)) in [("lower", old_a), ("lower", fresh), ("link", rooted)] {
            assert!(s.memo_lookup(stage, &k).unwrap().is_some(), "{stage} entry kept");
        }
        // A cap of zero evicts everything evictable and never what the root lists.
        let r = s.evict_to(0, false).unwrap();
        assert!(!r.within_cap);
        assert_eq!(r.bytes_after, r.root_bytes);
        assert_eq!(r.root_bytes, 1001);
        assert!(s.memo_lookup("link", &rooted.0).unwrap().is_some());
        assert_eq!(s.get(&rooted.1).unwrap().len(), 1001);
        assert!(r.lines().iter().any(|l| l.contains("still over the cap")), "{:?}", r.lines());
        let v = s.verify(false).unwrap();
        assert!(v.is_clean(), "{:?}", v.lines());
        assert!(!s.layout.evict_intent().exists());
    }

    #[test]
    fn dry_run_and_a_store_within_the_cap_change_nothing() {
        let t = tempfile::tempdir().unwrap();
        let mut s = Store::open(t.path(), OpenOptions::writable()).unwrap();
        let (k, d) = entry(&s, "lower", "a", 500);
        let total = object_bytes(&s);
        let r = s.evict_to(0, true).unwrap();
        assert!(r.dry_run && r.entries_evicted == 1 && r.bytes_evicted == total && r.bytes_after == 0, "{r:?}");
        assert!(r.lines()[0].starts_with("would evict 1"), "{:?}", r.lines());
        let r = s.evict_to(total, false).unwrap();
        assert_eq!(r.entries_evicted, 0);
        assert!(r.lines()[0].contains("nothing to evict"), "{:?}", r.lines());
        assert!(s.memo_lookup("lower", &k).unwrap().is_some() && s.objects().contains(&d));
    }

    #[test]
    fn the_cap_is_configured_in_the_store_and_bad_files_are_named() {
        let t = tempfile::tempdir().unwrap();
        let mut s = Store::open(t.path(), OpenOptions::writable()).unwrap();
        assert_eq!(s.max_size().unwrap(), None);
        assert_eq!(s.enforce_max_size().unwrap(), None);
        entry(&s, "lower", "a", 2000);
        entry(&s, "lower", "b", 10);
        s.set_max_size(Some(100)).unwrap();
        assert_eq!(s.max_size().unwrap(), Some(100));
        let r = s.enforce_max_size().unwrap().expect("a cap is configured");
        assert!(r.within_cap && r.bytes_after <= 100, "{r:?}");
        s.set_max_size(None).unwrap();
        assert_eq!(s.max_size().unwrap(), None);
        fs::write(t.path().join("MAX_SIZE"), "lots\n").unwrap();
        let e = s.max_size().unwrap_err().to_string();
        assert!(e.contains("MAX_SIZE") && e.contains("'lots"), "{e}");
        fs::write(t.path().join("MAX_SIZE"), "2G\n").unwrap();
        assert_eq!(s.max_size().unwrap(), Some(2 << 30));
    }

    /// A crash after the entries' removal and before the objects' deletion: the next open deletes what
    /// the intent lists and nothing names, keeps what something names again, and the store verifies.
    #[test]
    fn an_interrupted_eviction_is_finished_by_the_next_open() {
        let t = tempfile::tempdir().unwrap();
        let (gone, renamed, rooted) = {
            let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
            let gone = entry(&s, "lower", "a", 300);
            let renamed = entry(&s, "lower", "b", 300);
            let rooted = entry(&s, "link", "c", 300);
            s.set_root("model:m", &[rooted.1]).unwrap();
            // What evict_to does up to the crash: the intent, then the entries' removal.
            write_intent(&s.layout, &[gone.1, renamed.1, rooted.1]).unwrap();
            s.write(vec![
                JournalRecord::MemoRemove { stage: "lower".into(), key: gone.0 },
                JournalRecord::MemoRemove { stage: "lower".into(), key: renamed.0 },
            ])
            .unwrap();
            // `renamed`'s object is named again (another key produced the same bytes) before the crash.
            let k = Digest::of(b"again");
            s.memo_record("lower", &k, &MemoEntry::new(renamed.1, 301, Duration::ZERO)).unwrap();
            (gone, renamed, rooted)
        };
        let mut s = Store::open(t.path(), OpenOptions::writable()).unwrap();
        assert_eq!(s.open_report().eviction_finished, Some(1));
        assert!(s.open_report().lines().iter().any(|l| l.contains("finished an eviction")));
        assert!(!s.objects().contains(&gone.1));
        assert!(s.objects().contains(&renamed.1) && s.objects().contains(&rooted.1));
        assert!(!t.path().join("EVICTING").exists());
        let v = s.verify(false).unwrap();
        assert!(v.is_clean(), "{:?}", v.lines());
        drop(s);
        let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
        assert_eq!(s.open_report().eviction_finished, None);
    }

    /// Hits are written as ticks without a memo or root change in the session (with the counters, when
    /// the store closes), and removed with their entry.
    #[test]
    fn ticks_are_written_with_the_counters_and_go_with_their_entry() {
        let t = tempfile::tempdir().unwrap();
        let (k, _) = {
            let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
            entry(&s, "lower", "a", 10)
        };
        let tick_of = |s: &Store| s.index.last_uses().unwrap().get(&("lower".to_string(), k)).copied();
        let first = {
            let s = Store::open(t.path(), OpenOptions::read_only()).unwrap();
            tick_of(&s).expect("recorded entries have a tick")
        };
        {
            let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
            assert!(s.memo_lookup("lower", &k).unwrap().is_some());
        }
        let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
        let second = tick_of(&s).unwrap();
        assert!(second > first, "{second} > {first}");
        s.write(vec![JournalRecord::MemoRemove { stage: "lower".into(), key: k }]).unwrap();
        assert_eq!(tick_of(&s), None);
    }
}
