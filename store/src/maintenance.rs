//! verify and gc: the operations that walk the whole store. Both take `&mut Store`, so no other thread
//! of the process can be using the store while objects are moved or deleted.

use crate::error::{Result, StoreError};
use crate::journal::{JournalRecord, HEADER_LEN};
use crate::layout::fsync_dir;
use crate::memo::MemoRecord;
use crate::stats::human_bytes;
use crate::store::{lock, retire_index, rewrite_journal, switch_to_new_index, sync_journal, Store};
use crate::Digest;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// An object file that failed verification.
#[derive(Clone, Debug, Serialize)]
pub struct BadObject {
    pub path: PathBuf,
    /// The digest its name claims (None: the name is not a digest in its fan-out directory).
    pub digest: Option<Digest>,
    pub problem: String,
    /// Where it was moved.
    pub quarantined_to: Option<PathBuf>,
}

/// What verify found and did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct VerifyReport {
    pub objects_checked: u64,
    pub bytes_checked: u64,
    pub bad_objects: Vec<BadObject>,
    /// Index records that do not decode.
    pub bad_index_records: Vec<String>,
    /// Memo entries whose output object is missing.
    pub dangling_memo: Vec<MemoRecord>,
    /// Roots that list objects which are missing: (root, missing digests).
    pub incomplete_roots: Vec<(String, Vec<Digest>)>,
    /// Journal damage or disagreement with the index.
    pub journal_problems: Vec<String>,
    /// What `--repair` changed.
    pub repairs: Vec<String>,
}

impl VerifyReport {
    /// Whether nothing was wrong (repairs done do not make a damaged store clean: the run still fails,
    /// so CI notices).
    pub fn is_clean(&self) -> bool {
        self.bad_objects.is_empty()
            && self.bad_index_records.is_empty()
            && self.dangling_memo.is_empty()
            && self.incomplete_roots.is_empty()
            && self.journal_problems.is_empty()
    }

    /// A report for people: one line per problem.
    pub fn lines(&self) -> Vec<String> {
        let mut v = vec![format!("checked {} object(s), {}", self.objects_checked, human_bytes(self.bytes_checked))];
        for b in &self.bad_objects {
            let what = b.digest.map(|d| format!("object {d}")).unwrap_or_else(|| "stray file".into());
            let to = b.quarantined_to.as_ref().map(|p| format!("; moved to {}", p.display())).unwrap_or_default();
            v.push(format!("BAD {what} at {}: {}{to}", b.path.display(), b.problem));
        }
        for r in &self.bad_index_records {
            v.push(format!("BAD index record: {r}"));
        }
        for m in &self.dangling_memo {
            v.push(format!("MISSING output {} of memo entry stage '{}' key {}", m.entry.output, m.stage, m.key));
        }
        for (root, missing) in &self.incomplete_roots {
            v.push(format!(
                "MISSING {} object(s) of root '{root}', e.g. {} (re-running the build that made the root puts them back)",
                missing.len(),
                missing[0]
            ));
        }
        for j in &self.journal_problems {
            v.push(format!("JOURNAL {j}"));
        }
        for r in &self.repairs {
            v.push(format!("repaired: {r}"));
        }
        v.push(if self.is_clean() { "store is intact".into() } else { "store has problems (see above)".into() });
        v
    }
}

/// What gc found and did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GcReport {
    pub dry_run: bool,
    pub roots: usize,
    pub objects_kept: u64,
    pub bytes_kept: u64,
    pub objects_removed: u64,
    pub bytes_removed: u64,
    pub memo_entries_removed: u64,
    /// Files under objects/ whose names are not digests: left alone for verify to quarantine.
    pub stray_files: Vec<PathBuf>,
}

impl GcReport {
    pub fn lines(&self) -> Vec<String> {
        let verb = if self.dry_run { "would remove" } else { "removed" };
        let mut v = vec![
            format!("{} root(s) keep {} object(s), {}", self.roots, self.objects_kept, human_bytes(self.bytes_kept)),
            format!("{verb} {} object(s), {}", self.objects_removed, human_bytes(self.bytes_removed)),
            format!("{verb} {} memo entr(ies) whose output is not kept", self.memo_entries_removed),
        ];
        for s in &self.stray_files {
            v.push(format!("left alone: {} (not an object name; `tessera store verify` quarantines it)", s.display()));
        }
        v
    }
}

impl Store {
    /// Re-hashes every object; moves bad ones to `quarantine/`; checks that every index record decodes,
    /// that memo entries and roots name present objects, and that the journal is intact and agrees with
    /// the index. With `repair`: removes undecodable index records and dangling memo entries (restoring
    /// from the journal what it holds), and rewrites a damaged journal from the index.
    pub fn verify(&mut self, repair: bool) -> Result<VerifyReport> {
        self.check_writable("verify")?;
        if repair {
            self.alone("verify --repair", |s| s.verify_inner(true))
        } else {
            self.verify_inner(false)
        }
    }

    fn verify_inner(&mut self, repair: bool) -> Result<VerifyReport> {
        let mut rep = VerifyReport::default();
        self.verify_objects(&mut rep)?;
        // Index and journal are read in one write section, so no other process's write falls between the two
        // reads and shows up as a disagreement; the journal is first brought up to date (frames of a process
        // that crashed between its append and its commit, a journal another process compacted).
        let (memo, bad_memo, roots, bad_roots, journal_clean) = self.index.write(|w| {
            {
                let mut j = lock(&self.journal);
                // A failure here (an index whose position does not decode) is what the comparison reports.
                let _ = sync_journal(&self.layout, w, &mut j, &mut crate::store::OpenReport::default());
            }
            let (memo, bad_memo) = w.memo_all()?;
            let (roots, bad_roots) = w.roots()?;
            let clean = self.verify_journal(&memo, &roots, bad_memo.is_empty() && bad_roots.is_empty(), &mut rep)?;
            Ok((memo, bad_memo, roots, bad_roots, clean))
        })?;
        rep.bad_index_records.extend(bad_memo.iter().chain(&bad_roots).map(|b| b.detail.clone()));
        for m in &memo {
            if !self.objects.contains(&m.entry.output) {
                rep.dangling_memo.push(m.clone());
            }
        }
        for (name, ds) in &roots {
            let missing: Vec<Digest> = ds.iter().filter(|d| !self.objects.contains(d)).copied().collect();
            if !missing.is_empty() {
                rep.incomplete_roots.push((name.clone(), missing));
            }
        }
        if repair {
            if !rep.bad_index_records.is_empty() && journal_clean {
                // The journal holds every acknowledged change: rebuild the index from it.
                self.rebuild_index()?;
                rep.repairs.push(format!(
                    "rebuilt the index from the journal ({} bad record(s))",
                    rep.bad_index_records.len()
                ));
            } else if !rep.bad_index_records.is_empty() {
                let keys: Vec<Vec<u8>> = bad_memo.iter().chain(&bad_roots).map(|b| b.raw_key.clone()).collect();
                self.index.remove_raw(&keys)?;
                rep.repairs.push(format!("removed {} undecodable index record(s)", keys.len()));
            }
            let dangling: Vec<JournalRecord> = self
                .index
                .memo_all()?
                .0
                .into_iter()
                .filter(|m| !self.objects.contains(&m.entry.output))
                .map(|m| JournalRecord::MemoRemove { stage: m.stage, key: m.key })
                .collect();
            if !dangling.is_empty() {
                rep.repairs.push(format!("removed {} memo entr(ies) whose output is missing", dangling.len()));
                self.write(dangling)?;
            }
            if !journal_clean || !rep.repairs.is_empty() {
                let mut j = lock(&self.journal);
                self.index.write(|w| rewrite_journal(&self.layout, w, &mut j))?;
                rep.repairs.push("rewrote the journal from the index".into());
            }
        }
        Ok(rep)
    }

    fn verify_objects(&self, rep: &mut VerifyReport) -> Result<()> {
        for f in self.objects.scan()? {
            let problem = match f.digest {
                None => Some("the file name is not a lower-case digest in its fan-out directory".to_string()),
                Some(d) => match self.objects.verify(&d) {
                    Ok(size) => {
                        rep.objects_checked += 1;
                        rep.bytes_checked += size;
                        None
                    }
                    Err(StoreError::Corrupt { actual, size, .. }) => {
                        rep.objects_checked += 1;
                        rep.bytes_checked += size;
                        Some(format!("content hashes to {actual} ({size} bytes)"))
                    }
                    Err(StoreError::Io { cause, .. }) => Some(format!("cannot be read: {cause}")),
                    Err(e) => Some(e.to_string()),
                },
            };
            if let Some(problem) = problem {
                let to = quarantine(&self.layout.quarantine(), &f.path)?;
                rep.bad_objects.push(BadObject { path: f.path, digest: f.digest, problem, quarantined_to: Some(to) });
            }
        }
        if !rep.bad_objects.is_empty() {
            self.objects.sync_fans()?;
            fsync_dir(&self.layout.quarantine())?;
        }
        Ok(())
    }

    /// Scans the whole journal; returns whether it is intact and agrees with the index.
    fn verify_journal(
        &self,
        memo: &[MemoRecord],
        roots: &BTreeMap<String, Vec<Digest>>,
        index_decodes: bool,
        rep: &mut VerifyReport,
    ) -> Result<bool> {
        let mut j = lock(&self.journal);
        let scan = j.scan_from(HEADER_LEN)?;
        let mut clean = true;
        if let Some((at, detail)) = &scan.damage {
            rep.journal_problems.push(format!("{} is damaged at byte {at}: {detail}", j.path().display()));
            clean = false;
        }
        let mut jm: BTreeMap<(String, Digest), crate::memo::MemoEntry> = BTreeMap::new();
        let mut jr: BTreeMap<String, Vec<Digest>> = BTreeMap::new();
        for (_, r) in scan.records {
            match r {
                JournalRecord::MemoSet(m) => {
                    jm.insert((m.stage, m.key), m.entry);
                }
                JournalRecord::MemoRemove { stage, key } => {
                    jm.remove(&(stage, key));
                }
                JournalRecord::RootSet { name, digests } => {
                    jr.insert(name, digests);
                }
                JournalRecord::RootRemove { name } => {
                    jr.remove(&name);
                }
            }
        }
        if index_decodes && clean {
            let im: BTreeMap<(String, Digest), crate::memo::MemoEntry> =
                memo.iter().map(|m| ((m.stage.clone(), m.key), m.entry)).collect();
            let memo_diff = jm.iter().filter(|(k, v)| im.get(*k) != Some(*v)).count()
                + im.keys().filter(|k| !jm.contains_key(*k)).count();
            let root_diff = jr.iter().filter(|(k, v)| roots.get(*k) != Some(*v)).count()
                + roots.keys().filter(|k| !jr.contains_key(*k)).count();
            if memo_diff + root_diff > 0 {
                rep.journal_problems.push(format!(
                    "the journal and the index disagree on {memo_diff} memo entr(ies) and {root_diff} root(s)"
                ));
                clean = false;
            }
        }
        Ok(clean)
    }

    /// Rebuilds the index from the journal into a new directory, switches to it and moves the old one
    /// aside (`index….damaged-N`). Pending counters are carried over; persisted ones are kept when the
    /// old index can still read them.
    pub fn rebuild_index(&mut self) -> Result<()> {
        self.check_writable("rebuild index")?;
        self.alone("rebuild the index", |s| s.rebuild_index_inner())
    }

    fn rebuild_index_inner(&mut self) -> Result<()> {
        let mut carried = self.index.counters().unwrap_or_default();
        carried.add(&std::mem::take(&mut *lock(&self.pending)));
        let (fresh, old_name) = switch_to_new_index(&self.layout)?;
        drop(std::mem::replace(&mut self.index, fresh));
        retire_index(&self.layout, &old_name)?;
        let mut j = lock(&self.journal);
        let scan = j.scan_from(HEADER_LEN)?;
        let records: Vec<JournalRecord> = scan.records.into_iter().map(|(_, r)| r).collect();
        let meta = crate::journal::JournalMeta { generation: j.generation(), applied: scan.valid_end };
        self.index.apply(&records, &carried, Some(meta))?;
        if scan.valid_end < scan.file_len {
            j.truncate(scan.valid_end)?;
        }
        Ok(())
    }

    /// Removes every object no root lists, and the memo entries whose output goes with them. With
    /// `dry_run`, only reports. Objects put but not yet named by a root are collected: run gc between
    /// builds, not during one.
    pub fn gc(&mut self, dry_run: bool) -> Result<GcReport> {
        self.check_writable("gc")?;
        if dry_run {
            self.gc_inner(true)
        } else {
            self.alone("gc", |s| s.gc_inner(false))
        }
    }

    fn gc_inner(&mut self, dry_run: bool) -> Result<GcReport> {
        let roots = self.roots()?;
        let live: BTreeSet<Digest> = roots.values().flatten().copied().collect();
        let mut rep = GcReport { dry_run, roots: roots.len(), ..Default::default() };
        let mut dead = Vec::new();
        for f in self.objects.scan()? {
            match f.digest {
                None => rep.stray_files.push(f.path),
                Some(d) if live.contains(&d) => {
                    rep.objects_kept += 1;
                    rep.bytes_kept += f.size;
                }
                Some(d) => {
                    rep.objects_removed += 1;
                    rep.bytes_removed += f.size;
                    dead.push(d);
                }
            }
        }
        let drop_memo: Vec<JournalRecord> = self
            .memo_entries()?
            .into_iter()
            .filter(|m| !live.contains(&m.entry.output))
            .map(|m| JournalRecord::MemoRemove { stage: m.stage, key: m.key })
            .collect();
        rep.memo_entries_removed = drop_memo.len() as u64;
        if dry_run {
            return Ok(rep);
        }
        // Memo entries first: an entry never outlives its output by more than a crash, and a lookup
        // treats an entry whose output is gone as a miss anyway.
        if !drop_memo.is_empty() {
            self.write(drop_memo)?;
        }
        for d in &dead {
            self.objects.remove(d)?;
        }
        self.objects.sync_fans()?;
        self.objects.clean_tmp()?;
        // Compact the journal: history of removed entries is no longer needed.
        let mut j = lock(&self.journal);
        self.index.write(|w| rewrite_journal(&self.layout, w, &mut j))?;
        Ok(rep)
    }
}

/// Moves a bad file into `quarantine/`, under its own name (suffixed `.N` if taken).
fn quarantine(qdir: &Path, path: &Path) -> Result<PathBuf> {
    fs::create_dir_all(qdir).map_err(StoreError::io("creating", qdir))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "unnamed".into());
    let mut to = qdir.join(&name);
    let mut n = 1;
    while to.exists() {
        to = qdir.join(format!("{name}.{n}"));
        n += 1;
    }
    fs::rename(path, &to).map_err(StoreError::io("moving bad object into quarantine", path))?;
    Ok(to)
}
