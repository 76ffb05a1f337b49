//! `Store`: the local object tier, the index and the journal behind one handle, with the operations
//! the pipeline calls (put, get, memo lookup and record, roots, stats).
//!
//! Order of writes, which is what makes a crash safe:
//! 1. an output object is written (atomically) before any memo entry or root may name it
//!    (`memo_record` and `set_root` check);
//! 2. a memo or root change is appended to the journal and fsynced, then applied to the index and
//!    committed; the call returns only after both.
//!
//! So after a crash at any moment, every entry whose call returned is in the journal, and in the index
//! too unless the index lost it — in which case the next write section replays it from the journal.
//!
//! Many processes share one store (lock.rs): each write runs in the index's write section (SQLite's write
//! lock, index.rs), which also makes the journal append exclusive across processes. Inside it the
//! journal is first brought into agreement with the index ([`sync_journal`]): another process may have
//! appended (its frames are applied already; only our end offset moves), crashed between its append
//! and its commit (its frames are replayed), left a torn tail (cut), or compacted the journal into a
//! new file (reopened).

use crate::error::{Result, StoreError};
use crate::index::{Index, Writer};
use crate::journal::{Journal, JournalMeta, JournalRecord, HEADER_LEN};
use crate::layout::Layout;
use crate::lock::{Access, StoreLock};
use crate::memo::{MemoEntry, MemoRecord};
use crate::objects::{LocalObjects, PutOutcome, VerifiedReader};
use crate::remote::{Remote, RemoteStats};
use crate::stats::{Counters, StageStats, Stats};
use crate::Digest;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// How to open a store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Wait for another process holding the store instead of failing with [`StoreError::Locked`].
    pub wait: bool,
    /// Open without changing anything: no creation, no crash recovery, writes fail with
    /// [`StoreError::ReadOnly`], lookups are not counted.
    pub read_only: bool,
    /// Hold the store alone (gc, eviction, repair: what deletes). Other opens share it.
    pub exclusive: bool,
}

impl OpenOptions {
    pub fn writable() -> Self {
        OpenOptions::default()
    }
    pub fn read_only() -> Self {
        OpenOptions { read_only: true, ..Default::default() }
    }
    pub fn wait(mut self, wait: bool) -> Self {
        self.wait = wait;
        self
    }
    pub fn exclusive(mut self, exclusive: bool) -> Self {
        self.exclusive = exclusive;
        self
    }
}

/// What opening the store found and fixed after an earlier crash.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Temp files of interrupted writes, removed.
    pub tmp_files_removed: usize,
    /// Journal frames applied to the index (changes the index missed in a crash).
    pub journal_frames_replayed: usize,
    /// Bytes of a torn journal tail cut off (an append that never returned).
    pub journal_torn_bytes: u64,
    /// Why the journal was rewritten from the index, if it was.
    pub journal_rewritten: Option<String>,
    /// Where the damaged index was moved, if the index was rebuilt from the journal.
    pub index_rebuilt: Option<PathBuf>,
    /// Objects removed to finish an eviction a crash interrupted (see evict.rs), if one was.
    pub eviction_finished: Option<usize>,
}

impl OpenReport {
    /// One line per thing done, for people.
    pub fn lines(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.tmp_files_removed > 0 {
            v.push(format!("removed {} temp file(s) of interrupted writes", self.tmp_files_removed));
        }
        if self.journal_frames_replayed > 0 {
            v.push(format!("replayed {} journal record(s) into the index", self.journal_frames_replayed));
        }
        if self.journal_torn_bytes > 0 {
            v.push(format!("cut a torn journal tail of {} byte(s)", self.journal_torn_bytes));
        }
        if let Some(why) = &self.journal_rewritten {
            v.push(format!("rewrote the journal from the index ({why})"));
        }
        if let Some(p) = &self.index_rebuilt {
            v.push(format!("rebuilt the index from the journal; the damaged index was moved to {}", p.display()));
        }
        if let Some(n) = self.eviction_finished {
            v.push(format!("finished an eviction a crash interrupted: removed {n} object(s) no entry or root names"));
        }
        v
    }
}

/// A tessera store. `Send + Sync`: share `&Store` between worker threads.
pub struct Store {
    pub(crate) layout: Layout,
    pub(crate) read_only: bool,
    pub(crate) objects: LocalObjects,
    pub(crate) index: Index,
    /// The journal; its mutex also serializes every index write, so journal offsets stay in order.
    pub(crate) journal: Mutex<Journal>,
    /// Counter increments and last-use ticks not yet written to the index.
    pub(crate) pending: Mutex<Counters>,
    /// This session's last-use tick (evict.rs): one per writable open; 0 when read-only.
    pub(crate) tick: u64,
    open_report: OpenReport,
    /// The remote tier, if one is attached ([`Store::with_remote`]).
    remote: Option<Remote>,
    pub(crate) lock: StoreLock,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in another thread while holding one of these leaves consistent data (every mutation is a
    // single assignment after the I/O succeeded), so poisoning is not a reason to fail.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Store {
    /// Opens (creating it if needed, unless read-only) the store in `dir`, taking its lock.
    pub fn open(dir: &Path, opts: OpenOptions) -> Result<Store> {
        Store::open_inner(dir, opts, false)
    }

    /// As [`open`](Self::open), but if the index is damaged (SQLite cannot open it), moves it aside and
    /// rebuilds it from the journal. What `tessera store verify --repair` uses.
    pub fn open_repairing(dir: &Path, opts: OpenOptions) -> Result<Store> {
        match Store::open_inner(dir, opts, false) {
            Err(StoreError::IndexDamaged { .. }) if !opts.read_only => Store::open_inner(dir, opts, true),
            other => other,
        }
    }

    fn open_inner(dir: &Path, opts: OpenOptions, rebuild: bool) -> Result<Store> {
        let layout = Layout::new(dir);
        let exists = layout.check_existing()?;
        if !exists {
            if opts.read_only {
                return Err(StoreError::NotAStore {
                    path: dir.to_path_buf(),
                    reason: "there is no store here yet".into(),
                });
            }
            fs::create_dir_all(dir).map_err(StoreError::io("creating store directory", dir))?;
        }
        // Alone (nobody else has the store open): this open may also clean up after crashed holders, which
        // deletes files others could be using; otherwise it shares the store and leaves that for later.
        let (lock, alone) = if opts.exclusive {
            (StoreLock::acquire(dir, &layout.lock_file(), Access::Exclusive, opts.wait)?, true)
        } else {
            StoreLock::acquire_alone_or_shared(dir, &layout.lock_file(), opts.wait)?
        };
        let recover = alone && !opts.read_only;
        let mut report = OpenReport::default();
        if !opts.read_only {
            // Idempotent: also finishes a creation that a crash interrupted.
            layout.create()?;
        }
        let objects = LocalObjects::new(&layout);
        if recover {
            report.tmp_files_removed = objects.clean_tmp()?;
            remove_stale_indexes(&layout, &layout.index_name()?)?;
        }
        let index_dir = layout.dir.join(layout.index_name()?);
        let index = if rebuild {
            if !alone {
                return Err(StoreError::Locked { dir: dir.to_path_buf(), holder: lock.others() });
            }
            let (index, old_name) = switch_to_new_index(&layout)?;
            report.index_rebuilt = Some(retire_index(&layout, &old_name)?);
            index
        } else if opts.read_only && !Index::exists(&index_dir) {
            // A store whose index was never written by this version (sled's files, or none): read it from
            // the journal into memory, changing nothing on disk.
            let index = Index::in_memory(&index_dir)?;
            let mut journal = Journal::open(&layout.journal(), false)?;
            let scan = journal.scan_from(HEADER_LEN)?;
            let records: Vec<JournalRecord> = scan.records.into_iter().map(|(_, r)| r).collect();
            index.apply(&records, &Counters::default(), None)?;
            index
        } else {
            if recover {
                remove_sled_files(&index_dir);
            }
            let opened = Index::open(&index_dir).and_then(|index| {
                // Reading the journal position also proves the index's records decode.
                index.meta()?;
                Ok(index)
            });
            match opened {
                // A holder died mid-write and the index did not survive it. The journal holds every
                // promised change, so a crash costs a rebuild, never data. A damaged index after clean
                // closes is not a crash's doing: that stays an error for `store verify --repair`.
                Err(StoreError::IndexDamaged { .. }) if lock.previous_holder_died && recover => {
                    let (index, old_name) = switch_to_new_index(&layout)?;
                    report.index_rebuilt = Some(retire_index(&layout, &old_name)?);
                    index
                }
                other => other?,
            }
        };
        let mut journal = Journal::open(&layout.journal(), !opts.read_only)?;
        let mut tick = 0;
        if !opts.read_only {
            tick = index.write(|w| {
                sync_journal(&layout, w, &mut journal, &mut report)?;
                w.next_tick()
            })?;
            if recover {
                // After the replay, so the index it reads names every entry the journal holds.
                report.eviction_finished = crate::evict_intent::finish_interrupted(&layout, &index, &objects)?;
            }
        }
        if alone && !opts.exclusive {
            lock.downgrade()?;
        }
        Ok(Store {
            layout,
            read_only: opts.read_only,
            objects,
            index,
            journal: Mutex::new(journal),
            pending: Mutex::new(Counters::default()),
            tick,
            open_report: report,
            remote: None,
            lock,
        })
    }

    /// Attaches a remote tier: from now on reads fall through local -> remote and back-fill the local
    /// store (every remote object verified first), and writes go local, then remote (unless the remote is
    /// read-only). A remote that fails is disabled for the rest of the process, with one warning. Needs a
    /// writable local store (back-filling writes to it).
    pub fn with_remote(mut self, remote: Remote) -> Result<Store> {
        self.check_writable("attach a remote tier")?;
        self.remote = Some(remote);
        Ok(self)
    }

    /// The attached remote tier.
    pub fn remote(&self) -> Option<&Remote> {
        self.remote.as_ref()
    }

    /// What the remote tier did so far (None without one).
    pub fn remote_stats(&self) -> Option<RemoteStats> {
        self.remote.as_ref().map(|r| r.stats())
    }

    fn remote_live(&self) -> Option<&Remote> {
        self.remote.as_ref().filter(|r| r.is_enabled())
    }

    fn remote_writable(&self) -> Option<&Remote> {
        self.remote.as_ref().filter(|r| r.is_writable())
    }

    /// Fetches `d` from the remote tier into the local store; true when it is now here. A remote object
    /// that fails verification is rejected (counted, warned, never written here); a server error disables
    /// the tier. Only a local write failure is an error.
    fn backfill(&self, d: &Digest) -> Result<bool> {
        let Some(r) = self.remote_live() else { return Ok(false) };
        match r.get_object(d) {
            Ok(Some(bytes)) => {
                // Verified by get_object: the bytes hash to `d`.
                self.objects.put(&bytes)?;
                r.count_fetched(bytes.len() as u64);
                Ok(true)
            }
            Ok(None) => {
                r.count_object_missing();
                Ok(false)
            }
            Err(e @ StoreError::RemoteCorrupt { .. }) => {
                r.reject_object(&e);
                Ok(false)
            }
            Err(e) => {
                r.disable(&e);
                Ok(false)
            }
        }
    }

    /// Makes sure `d` is in the local store, fetching it from the remote tier if needed.
    fn ensure_local(&self, d: &Digest) -> Result<()> {
        if !self.objects.contains(d) {
            self.backfill(d)?;
        }
        Ok(())
    }

    /// Writes an object the local store just took to the remote tier too: unconditionally when it was new
    /// here, after an existence check when it was already here (it may predate the remote).
    fn upload(&self, o: &PutOutcome, bytes: Option<&[u8]>) -> Result<()> {
        let Some(r) = self.remote_writable() else { return Ok(()) };
        let owned;
        let bytes = match bytes {
            Some(b) => b,
            None => {
                owned = self.objects.get(&o.digest)?;
                &owned
            }
        };
        let sent = if o.already_present { r.ensure_object(&o.digest, bytes) } else { r.put_object(&o.digest, bytes) };
        if let Err(e) = sent {
            r.disable(&e);
        }
        Ok(())
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.layout.dir
    }

    /// What opening found and fixed after an earlier crash.
    pub fn open_report(&self) -> &OpenReport {
        &self.open_report
    }

    /// The local object tier (paths, scans, streaming reads).
    pub fn objects(&self) -> &LocalObjects {
        &self.objects
    }

    pub(crate) fn check_writable(&self, op: &'static str) -> Result<()> {
        if self.read_only {
            Err(StoreError::ReadOnly { dir: self.layout.dir.clone(), op })
        } else {
            Ok(())
        }
    }

    // ---- objects ----------------------------------------------------------------------------------

    /// Stores bytes; returns their digest. Content already present is not written again (counted as
    /// dedupe in stats).
    pub fn put(&self, bytes: &[u8]) -> Result<Digest> {
        Ok(self.put_outcome(bytes)?.digest)
    }

    /// As [`put`](Self::put), saying whether the content was already present.
    pub fn put_outcome(&self, bytes: &[u8]) -> Result<PutOutcome> {
        self.check_writable("put")?;
        let o = self.objects.put(bytes)?;
        self.count_put(&o);
        self.upload(&o, Some(bytes))?;
        Ok(o)
    }

    /// Streams an object in (hundreds of MB of weights): one buffer of memory whatever the size.
    pub fn put_reader(&self, r: impl Read) -> Result<Digest> {
        self.check_writable("put")?;
        let o = self.objects.put_reader(r)?;
        self.count_put(&o);
        self.upload(&o, None)?;
        Ok(o.digest)
    }

    pub(crate) fn count_put(&self, o: &PutOutcome) {
        let mut p = lock(&self.pending);
        p.dedupe.puts += 1;
        p.dedupe.put_bytes += o.size;
        if o.already_present {
            p.dedupe.dedupe_puts += 1;
            p.dedupe.dedupe_bytes += o.size;
        }
    }

    /// Reads a whole object, re-hashed: a damaged object is an error naming its digest and path. One not
    /// here is fetched from the remote tier (verified, back-filled) when one is attached.
    pub fn get(&self, d: &Digest) -> Result<Vec<u8>> {
        self.ensure_local(d)?;
        self.objects.get(d)
    }

    /// Streams a verified object into `w`; returns its size. Nothing is written unless it verified.
    pub fn get_to_writer(&self, d: &Digest, w: &mut impl Write) -> Result<u64> {
        self.ensure_local(d)?;
        self.objects.get_to_writer(d, w)
    }

    /// Opens a verified object for streaming reads.
    pub fn open_verified(&self, d: &Digest) -> Result<VerifiedReader> {
        self.ensure_local(d)?;
        self.objects.open_verified(d)
    }

    /// Whether an object is present (one `stat`, no re-hash; `get` verifies). One not here is fetched from
    /// the remote tier when one is attached: true means it is in the local store now.
    pub fn contains(&self, d: &Digest) -> bool {
        self.objects.contains(d) || self.backfill(d).unwrap_or(false)
    }

    // ---- memo ------------------------------------------------------------------------------------

    /// Looks up what `stage` produced for `key`, counting a hit or a miss. An entry whose output object
    /// is gone (quarantined, or a gc interrupted halfway) is a miss.
    ///
    /// With a remote tier, a local miss asks the remote; its entry is trusted only once its output object
    /// is in the local store (fetched and verified) with the size the entry claims, and is then recorded
    /// locally too.
    pub fn memo_lookup(&self, stage: &str, key: &Digest) -> Result<Option<MemoEntry>> {
        let found = self.index.memo_get(stage, key)?.filter(|e| self.objects.contains(&e.output));
        let found = match found {
            Some(e) => Some(e),
            None => self.remote_memo_lookup(stage, key)?,
        };
        if !self.read_only {
            let mut p = lock(&self.pending);
            let c = p.stages.entry(stage.to_string()).or_default();
            if found.is_some() {
                c.hits += 1;
                p.last_use.insert((stage.to_string(), *key), self.tick);
            } else {
                c.misses += 1;
            }
        }
        Ok(found)
    }

    /// The remote tier's entry for (stage, key), trusted and recorded locally, or None.
    pub(crate) fn remote_memo_lookup(&self, stage: &str, key: &Digest) -> Result<Option<MemoEntry>> {
        let Some(r) = self.remote_live() else { return Ok(None) };
        let entry = match r.get_memo(stage, key) {
            Ok(Some(e)) => e,
            Ok(None) => {
                r.count_memo(false);
                return Ok(None);
            }
            Err(e @ StoreError::RemoteBadEntry { .. }) => {
                r.reject_memo(stage, key, &e.to_string());
                return Ok(None);
            }
            Err(e @ StoreError::RemoteUntrustedEntry { .. }) => {
                r.reject_untrusted_memo(&e);
                return Ok(None);
            }
            Err(e) => {
                r.disable(&e);
                return Ok(None);
            }
        };
        // Its output must be here, verified, before the entry is trusted.
        if !self.objects.contains(&entry.output) && !self.backfill(&entry.output)? {
            if r.is_enabled() {
                let why = format!("its output {} is missing on the remote or failed verification", entry.output);
                r.reject_memo(stage, key, &why);
            }
            return Ok(None);
        }
        if let Err(e) = self.check_output(stage, key, &entry) {
            r.reject_memo(stage, key, &e.to_string());
            return Ok(None);
        }
        self.record_local(stage, key, &entry)?;
        r.count_memo(true);
        Ok(Some(entry))
    }

    /// Records what `stage` produced for `key`. The output object must already be in the store with
    /// the size the entry claims. Durable when this returns. With a writable remote tier, the entry is
    /// then written there too (its output went there when it was put).
    pub fn memo_record(&self, stage: &str, key: &Digest, entry: &MemoEntry) -> Result<()> {
        self.record_local(stage, key, entry)?;
        if let Some(r) = self.remote_writable() {
            if let Err(e) = r.put_memo(stage, key, entry) {
                r.disable(&e);
            }
        }
        Ok(())
    }

    fn record_local(&self, stage: &str, key: &Digest, entry: &MemoEntry) -> Result<()> {
        self.check_writable("memo record")?;
        check_name("stage name", stage)?;
        self.check_output(stage, key, entry)?;
        self.mark_used(stage, key);
        self.write(vec![JournalRecord::MemoSet(MemoRecord { stage: stage.into(), key: *key, entry: *entry })])
    }

    /// Records many entries with one journal append and one index flush (import, bulk loads): the
    /// same checks as [`memo_record`](Self::memo_record), all-or-nothing.
    pub fn memo_record_batch(&self, records: &[MemoRecord]) -> Result<()> {
        self.check_writable("memo record")?;
        let mut ops = Vec::with_capacity(records.len());
        for r in records {
            check_name("stage name", &r.stage)?;
            self.check_output(&r.stage, &r.key, &r.entry)?;
            ops.push(JournalRecord::MemoSet(r.clone()));
        }
        if ops.is_empty() {
            return Ok(());
        }
        for r in records {
            self.mark_used(&r.stage, &r.key);
        }
        self.write(ops)
    }

    /// Notes that an entry was used in this session, for eviction's least-recently-used order. Costs a
    /// map insert; written with the next index write (see evict.rs).
    pub(crate) fn mark_used(&self, stage: &str, key: &Digest) {
        lock(&self.pending).last_use.insert((stage.to_string(), *key), self.tick);
    }

    fn check_output(&self, stage: &str, key: &Digest, entry: &MemoEntry) -> Result<()> {
        match self.objects.size_of(&entry.output) {
            None => Err(StoreError::MissingOutput { stage: stage.into(), key: *key, output: entry.output }),
            Some(actual) if actual != entry.size => Err(StoreError::OutputSizeMismatch {
                stage: stage.into(),
                key: *key,
                output: entry.output,
                claimed: entry.size,
                actual,
            }),
            Some(_) => Ok(()),
        }
    }

    /// Every memo entry, sorted by (stage, key).
    pub fn memo_entries(&self) -> Result<Vec<MemoRecord>> {
        let (good, bad) = self.index.memo_all()?;
        if let Some(b) = bad.first() {
            return Err(StoreError::IndexDamaged { path: self.layout.dir.clone(), detail: b.detail.clone() });
        }
        Ok(good)
    }

    // ---- roots -----------------------------------------------------------------------------------

    /// Names what a build produced: gc keeps exactly the objects some root lists. Every digest must be
    /// in the store. Replaces an existing root of that name. Durable when this returns.
    pub fn set_root(&self, name: &str, digests: &[Digest]) -> Result<()> {
        self.check_writable("set root")?;
        check_name("root name", name)?;
        let set: BTreeSet<Digest> = digests.iter().copied().collect();
        for d in &set {
            // An object a remote-served build never needed locally is fetched now: a root names what is here.
            if !self.contains(d) {
                return Err(StoreError::NotFound { digest: *d, path: self.objects.path_of(d) });
            }
        }
        self.write(vec![JournalRecord::RootSet { name: name.into(), digests: set.into_iter().collect() }])
    }

    /// Removes a root (its objects become collectable). Durable when this returns.
    pub fn remove_root(&self, name: &str) -> Result<()> {
        self.check_writable("remove root")?;
        self.write(vec![JournalRecord::RootRemove { name: name.into() }])
    }

    /// The digests a root lists.
    pub fn root(&self, name: &str) -> Result<Option<Vec<Digest>>> {
        self.index.root_get(name)
    }

    /// Every root.
    pub fn roots(&self) -> Result<BTreeMap<String, Vec<Digest>>> {
        let (good, bad) = self.index.roots()?;
        if let Some(b) = bad.first() {
            return Err(StoreError::IndexDamaged { path: self.layout.dir.clone(), detail: b.detail.clone() });
        }
        Ok(good)
    }

    // ---- writes ----------------------------------------------------------------------------------

    /// In one write section: the journal brought up to date, the records appended to it (fsync), then
    /// applied to the index with the pending counters and committed.
    pub(crate) fn write(&self, records: Vec<JournalRecord>) -> Result<()> {
        let mut j = lock(&self.journal);
        let counters = std::mem::take(&mut *lock(&self.pending));
        let res = self.index.write(|w| {
            sync_journal(&self.layout, w, &mut j, &mut OpenReport::default())?;
            let end = j.append(&records)?;
            w.apply(&records, &counters, Some(JournalMeta { generation: j.generation(), applied: end }))
        });
        if res.is_err() {
            lock(&self.pending).add(&counters);
        }
        res
    }

    /// Runs `f` holding the store alone, waiting up to `bound` for the other processes using it to close
    /// it (see [`StoreLock::upgrade`]); then shares it again. None: others kept it for longer, `f` did
    /// not run. A store opened exclusively runs `f` at once.
    pub fn with_store_alone<T>(&self, bound: std::time::Duration, f: impl FnOnce() -> Result<T>) -> Result<Option<T>> {
        let was_exclusive = self.lock.is_exclusive();
        if !self.lock.upgrade(bound)? {
            return Ok(None);
        }
        let out = f();
        if !was_exclusive {
            self.lock.downgrade()?;
        }
        out.map(Some)
    }

    /// Runs `op` (gc, eviction, repair: what deletes) holding the store alone: at once if this handle
    /// was opened exclusively or nobody else has the store open now (then shared again afterwards), else
    /// fails with [`StoreError::NotAlone`] naming the processes in the way.
    pub(crate) fn alone<T>(&mut self, op: &'static str, f: impl FnOnce(&mut Store) -> Result<T>) -> Result<T> {
        let was_exclusive = self.lock.is_exclusive();
        if !self.lock.upgrade(std::time::Duration::ZERO)? {
            return Err(StoreError::NotAlone { dir: self.layout.dir.clone(), op, holders: self.lock.others() });
        }
        let out = f(self);
        if !was_exclusive {
            self.lock.downgrade()?;
        }
        out
    }

    /// The other processes using the store now, for messages.
    pub fn other_holders(&self) -> String {
        self.lock.others()
    }

    /// Writes pending counters to the index (they are also written with every memo or root change and
    /// when the store is dropped).
    pub fn flush(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        let _j = lock(&self.journal);
        let counters = std::mem::take(&mut *lock(&self.pending));
        if counters.is_zero() {
            return Ok(());
        }
        if let Err(e) = self.index.apply(&[], &counters, None) {
            lock(&self.pending).add(&counters);
            return Err(e);
        }
        Ok(())
    }

    // ---- stats -----------------------------------------------------------------------------------

    /// Objects, bytes, memo entries, hits and misses per stage, dedupe savings. Scans `objects/`.
    pub fn stats(&self) -> Result<Stats> {
        let files = self.objects.scan()?;
        let (objects, object_bytes) =
            files.iter().filter(|f| f.digest.is_some()).fold((0u64, 0u64), |(n, b), f| (n + 1, b + f.size));
        let mut counters = self.index.counters()?;
        counters.add(&lock(&self.pending));
        let mut stages: BTreeMap<String, StageStats> = BTreeMap::new();
        let entries = self.memo_entries()?;
        for r in &entries {
            stages.entry(r.stage.clone()).or_default().entries += 1;
        }
        for (s, c) in &counters.stages {
            let st = stages.entry(s.clone()).or_default();
            st.hits = c.hits;
            st.misses = c.misses;
        }
        let d = counters.dedupe;
        let written = d.put_bytes - d.dedupe_bytes;
        let quarantined = fs::read_dir(self.layout.quarantine()).map(|rd| rd.count() as u64).unwrap_or(0);
        Ok(Stats {
            dir: self.layout.dir.display().to_string(),
            objects,
            object_bytes,
            memo_entries: entries.len() as u64,
            roots: self.roots()?.len() as u64,
            hits: stages.values().map(|s| s.hits).sum(),
            misses: stages.values().map(|s| s.misses).sum(),
            stages,
            puts: d.puts,
            dedupe_puts: d.dedupe_puts,
            bytes_saved_by_dedupe: d.dedupe_bytes,
            dedupe_ratio: if written == 0 { 1.0 } else { d.put_bytes as f64 / written as f64 },
            quarantined,
        })
    }
}

/// The local memo table as a tier (tier.rs): the store's own lookups and records.
impl crate::tier::MemoTier for Store {
    fn lookup(&self, stage: &str, key: &Digest) -> Result<Option<MemoEntry>> {
        self.memo_lookup(stage, key)
    }
    fn record(&self, stage: &str, key: &Digest, entry: &MemoEntry) -> Result<()> {
        self.memo_record(stage, key, entry)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // Counters are statistics: losing them to an error here is acceptable, panicking is not.
        let _ = self.flush();
        let _ = self.index.flush();
    }
}

pub(crate) fn check_name(what: &'static str, name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(StoreError::InvalidName { what, value: String::new(), reason: "must not be empty" });
    }
    Ok(())
}

/// Brings the journal and the index into agreement, inside a write section (see journal.rs for the
/// rules): frames the index has not applied are replayed, a torn tail is cut, a journal another process
/// replaced is reopened, and one that is shorter than what the index applied is rewritten from the
/// index. Afterwards `journal` appends at the end of its valid part.
pub(crate) fn sync_journal(layout: &Layout, w: &Writer, journal: &mut Journal, report: &mut OpenReport) -> Result<()> {
    let meta = w.meta()?;
    if meta.is_some_and(|m| m.generation != journal.generation()) {
        // Compacted or rewritten by another process since this one opened it: follow the file.
        *journal = Journal::open(&layout.journal(), true)?;
    }
    let from = match meta {
        Some(m) if m.generation == journal.generation() => m.applied.max(HEADER_LEN),
        Some(_) => {
            report.journal_rewritten = Some("its generation differs from the one the index applied".into());
            return rewrite_journal(layout, w, journal);
        }
        // The index never applied this journal: a new store, or an index rebuilt or lost. Replay it all.
        None => HEADER_LEN,
    };
    let scan = journal.scan_from(from)?;
    if from > scan.file_len {
        report.journal_rewritten =
            Some(format!("it is {} bytes long but the index applied up to byte {from}", scan.file_len));
        return rewrite_journal(layout, w, journal);
    }
    if !scan.records.is_empty() || meta.is_none() {
        let records: Vec<JournalRecord> = scan.records.iter().map(|(_, r)| r.clone()).collect();
        report.journal_frames_replayed = records.len();
        w.apply(
            &records,
            &Counters::default(),
            Some(JournalMeta { generation: journal.generation(), applied: scan.valid_end }),
        )?;
    }
    if scan.valid_end < scan.file_len {
        report.journal_torn_bytes = scan.file_len - scan.valid_end;
    }
    // Also moves the append position past frames other processes appended.
    journal.truncate_to(scan.valid_end, scan.file_len)
}

/// Replaces the journal by one holding the index's current memo entries and roots.
pub(crate) fn rewrite_journal(layout: &Layout, w: &Writer, journal: &mut Journal) -> Result<()> {
    let (memo, bad_memo) = w.memo_all()?;
    let (roots, bad_roots) = w.roots()?;
    if let Some(b) = bad_memo.first().or(bad_roots.first()) {
        return Err(StoreError::IndexDamaged { path: layout.dir.clone(), detail: b.detail.clone() });
    }
    let mut records: Vec<JournalRecord> = memo.into_iter().map(JournalRecord::MemoSet).collect();
    records.extend(roots.into_iter().map(|(name, digests)| JournalRecord::RootSet { name, digests }));
    let generation = journal.generation().wrapping_add(1).max(1);
    *journal = Journal::create_fresh(&layout.journal(), generation, &records)?;
    w.apply(&[], &Counters::default(), Some(JournalMeta { generation, applied: journal.end() }))
}

/// Removes what sled 0.34 (the index before SQLite) left in an index directory; the journal rebuilds
/// its content. Best effort: leftovers only take space.
fn remove_sled_files(index_dir: &Path) {
    for name in ["conf", "db", "blobs", "snap.0000000000000000"] {
        let p = index_dir.join(name);
        let _ = if p.is_dir() { fs::remove_dir_all(&p) } else { fs::remove_file(&p) };
    }
    if let Ok(rd) = fs::read_dir(index_dir) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with("snap.") {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

/// Opens a fresh, empty index directory `index-N` and points INDEX at it; returns it with the name of
/// the index it replaces. The fresh index has no journal position, so the next reconcile (or the
/// caller) replays the whole journal into it. Drop the old handle before [`retire_index`].
pub(crate) fn switch_to_new_index(layout: &Layout) -> Result<(Index, String)> {
    let old_name = layout.index_name()?;
    let new_name = format!("index-{}", next_free_suffix(&layout.dir, "index-"));
    let new_path = layout.dir.join(&new_name);
    let fresh = Index::open(&new_path)?;
    layout.set_index_name(&new_name)?;
    Ok((fresh, old_name))
}

/// Moves a replaced index directory to `<name>.damaged-N` (kept for a post-mortem; delete at will).
pub(crate) fn retire_index(layout: &Layout, old_name: &str) -> Result<PathBuf> {
    let old_path = layout.dir.join(old_name);
    let prefix = format!("{old_name}.damaged-");
    let moved = layout.dir.join(format!("{prefix}{}", next_free_suffix(&layout.dir, &prefix)));
    if old_path.exists() {
        fs::rename(&old_path, &moved).map_err(StoreError::io("moving damaged index to", &moved))?;
    }
    Ok(moved)
}

/// Removes `index-N` directories that INDEX does not name: leftovers of a rebuild a crash interrupted.
fn remove_stale_indexes(layout: &Layout, current: &str) -> Result<()> {
    for e in fs::read_dir(&layout.dir).map_err(StoreError::io("listing", &layout.dir))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let stale = name != current && name.strip_prefix("index-").is_some_and(|n| n.parse::<u64>().is_ok());
        if stale {
            fs::remove_dir_all(e.path()).map_err(StoreError::io("removing stale index", e.path()))?;
        }
    }
    Ok(())
}

fn next_free_suffix(dir: &Path, prefix: &str) -> u64 {
    let mut max = 0u64;
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(rest) = name.strip_prefix(prefix) {
                if let Ok(n) = rest.parse::<u64>() {
                    max = max.max(n);
                }
            }
        }
    }
    max + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn store_is_send_sync() {
        assert_send_sync::<Store>();
    }

    #[test]
    fn memo_requires_output_and_counts() {
        let t = tempfile::tempdir().unwrap();
        let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
        let key = Digest::of(b"key");
        let out = Digest::of(b"out");
        let err = s.memo_record("tune", &key, &MemoEntry::new(out, 3, Duration::from_millis(5))).unwrap_err();
        assert!(matches!(err, StoreError::MissingOutput { .. }), "{err}");
        assert_eq!(s.put(b"out").unwrap(), out);
        let err = s.memo_record("tune", &key, &MemoEntry::new(out, 4, Duration::ZERO)).unwrap_err();
        assert!(matches!(err, StoreError::OutputSizeMismatch { .. }), "{err}");
        assert_eq!(s.memo_lookup("tune", &key).unwrap(), None);
        let e = MemoEntry::new(out, 3, Duration::from_millis(5));
        s.memo_record("tune", &key, &e).unwrap();
        assert_eq!(s.memo_lookup("tune", &key).unwrap(), Some(e));
        assert_eq!(s.memo_lookup("compile", &key).unwrap(), None);
        let st = s.stats().unwrap();
        assert_eq!(st.stages["tune"], StageStats { entries: 1, hits: 1, misses: 1 });
        assert_eq!(st.stages["compile"], StageStats { entries: 0, hits: 0, misses: 1 });
        drop(s);
        // Counters survive a reopen.
        let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
        assert_eq!(s.stats().unwrap().hits, 1);
        assert_eq!(s.stats().unwrap().misses, 2);
    }

    /// Many processes (here: handles) use one store at once; what deletes needs it alone, and is told who
    /// is in the way.
    #[test]
    fn handles_share_the_store_and_gc_needs_it_alone() {
        let t = tempfile::tempdir().unwrap();
        let a = Store::open(t.path(), OpenOptions::writable()).unwrap();
        let b = Store::open(t.path(), OpenOptions::writable()).unwrap();
        let reader = Store::open(t.path(), OpenOptions::read_only()).unwrap();
        let key = Digest::of(b"key");
        let out = a.put(b"out").unwrap();
        a.memo_record("tune", &key, &MemoEntry::new(out, 3, Duration::ZERO)).unwrap();
        // The other handles see the entry at once, and can write too (journal appends interleave).
        assert_eq!(reader.memo_lookup("tune", &key).unwrap().map(|e| e.output), Some(out));
        let out2 = b.put(b"out2").unwrap();
        b.memo_record("tune", &Digest::of(b"key2"), &MemoEntry::new(out2, 4, Duration::ZERO)).unwrap();
        a.memo_record("lower", &key, &MemoEntry::new(out, 3, Duration::ZERO)).unwrap();
        assert_eq!(reader.memo_entries().unwrap().len(), 3);
        let err = Store::open(t.path(), OpenOptions::writable().exclusive(true)).err().expect("gc's open must wait");
        assert!(matches!(err, StoreError::Locked { .. }));
        assert!(err.to_string().contains(&format!("pid {}", std::process::id())), "{err}");
        let mut a = a;
        let err = a.gc(false).unwrap_err();
        assert!(matches!(err, StoreError::NotAlone { .. }), "{err}");
        drop((a, b, reader));
        // The journal holds all three changes in order: the index rebuilt from it agrees.
        fs::remove_dir_all(t.path().join("index")).unwrap();
        let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
        assert_eq!(s.open_report().journal_frames_replayed, 3);
        assert_eq!(s.memo_entries().unwrap().len(), 3);
    }

    #[test]
    fn read_only_refuses_writes_and_missing_store() {
        let t = tempfile::tempdir().unwrap();
        assert!(matches!(
            Store::open(&t.path().join("nope"), OpenOptions::read_only()),
            Err(StoreError::NotAStore { .. })
        ));
        drop(Store::open(t.path(), OpenOptions::writable()).unwrap());
        let s = Store::open(t.path(), OpenOptions::read_only()).unwrap();
        assert!(matches!(s.put(b"x"), Err(StoreError::ReadOnly { .. })));
    }

    #[test]
    fn dedupe_is_counted() {
        let t = tempfile::tempdir().unwrap();
        let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
        s.put(&[1u8; 100]).unwrap();
        s.put(&[1u8; 100]).unwrap();
        s.put_reader(&[1u8; 100][..]).unwrap();
        let st = s.stats().unwrap();
        assert_eq!((st.objects, st.object_bytes), (1, 100));
        assert_eq!((st.puts, st.dedupe_puts, st.bytes_saved_by_dedupe), (3, 2, 200));
        assert!((st.dedupe_ratio - 3.0).abs() < 1e-9);
    }

    #[test]
    fn roots_must_name_present_objects() {
        let t = tempfile::tempdir().unwrap();
        let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
        let a = s.put(b"a").unwrap();
        assert!(s.set_root("build", &[a, Digest::of(b"missing")]).is_err());
        s.set_root("build", &[a, a]).unwrap();
        assert_eq!(s.root("build").unwrap(), Some(vec![a]));
        s.remove_root("build").unwrap();
        assert_eq!(s.root("build").unwrap(), None);
    }

    #[test]
    fn index_lost_is_rebuilt_from_journal() {
        let t = tempfile::tempdir().unwrap();
        let key = Digest::of(b"k");
        let e = {
            let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
            let out = s.put(b"output").unwrap();
            let e = MemoEntry::new(out, 6, Duration::ZERO);
            s.memo_record("partition", &key, &e).unwrap();
            s.set_root("b", &[out]).unwrap();
            e
        };
        fs::remove_dir_all(t.path().join("index")).unwrap();
        let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
        assert_eq!(s.open_report().journal_frames_replayed, 2);
        assert_eq!(s.memo_lookup("partition", &key).unwrap(), Some(e));
        assert_eq!(s.root("b").unwrap(), Some(vec![e.output]));
    }

    /// After a holder died without closing (its pid still in the lock file), a damaged index is rebuilt
    /// from the journal by a plain open: a crash costs time, never data (the SIGKILL crash test once saw
    /// sled, the index before SQLite, fail to reopen its own files).
    #[test]
    fn damaged_index_after_a_crash_is_rebuilt_on_open() {
        let t = tempfile::tempdir().unwrap();
        let key = Digest::of(b"k");
        let e = {
            let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
            let out = s.put(b"output").unwrap();
            let e = MemoEntry::new(out, 6, Duration::ZERO);
            s.memo_record("partition", &key, &e).unwrap();
            e
        };
        // What a killed holder leaves: its session record, unlocked, and (here, forced) an index SQLite cannot open.
        fs::create_dir_all(t.path().join("sessions")).unwrap();
        fs::write(t.path().join("sessions").join("4242-0"), b"pid 4242: tessera compile zoo.toml\n").unwrap();
        fs::write(t.path().join("index").join(crate::index::DB_FILE), vec![0xab; 8192]).unwrap();
        let s = Store::open(t.path(), OpenOptions::writable()).expect("a crash's damage is repaired on open");
        assert!(s.open_report().index_rebuilt.is_some());
        assert_eq!(s.memo_lookup("partition", &key).unwrap(), Some(e));
    }

    #[test]
    fn damaged_index_is_rebuilt_by_open_repairing() {
        let t = tempfile::tempdir().unwrap();
        let key = Digest::of(b"k");
        let e = {
            let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
            let out = s.put(b"output").unwrap();
            let e = MemoEntry::new(out, 6, Duration::ZERO);
            s.memo_record("partition", &key, &e).unwrap();
            e
        };
        // Replace the database by garbage: SQLite refuses it.
        let db = t.path().join("index").join(crate::index::DB_FILE);
        assert!(db.exists());
        for wal in ["-wal", "-shm"] {
            let _ = fs::remove_file(t.path().join("index").join(format!("{}{wal}", crate::index::DB_FILE)));
        }
        fs::write(&db, vec![0xab; 8192]).unwrap();
        let err = Store::open(t.path(), OpenOptions::writable()).err().expect("damaged index must not open");
        assert!(matches!(err, StoreError::IndexDamaged { .. }), "{err}");
        assert!(err.to_string().contains("verify --repair"));
        let s = Store::open_repairing(t.path(), OpenOptions::writable()).unwrap();
        assert!(s.open_report().index_rebuilt.is_some());
        assert_eq!(s.memo_lookup("partition", &key).unwrap(), Some(e));
        drop(s);
        let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
        assert_eq!(s.memo_lookup("partition", &key).unwrap(), Some(e));
    }

    #[test]
    fn torn_journal_tail_is_cut_and_lost_journal_rewritten() {
        let t = tempfile::tempdir().unwrap();
        let key = Digest::of(b"k");
        {
            let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
            let out = s.put(b"o").unwrap();
            s.memo_record("s", &key, &MemoEntry::new(out, 1, Duration::ZERO)).unwrap();
        }
        let jp = t.path().join("journal");
        let mut f = fs::OpenOptions::new().append(true).open(&jp).unwrap();
        f.write_all(&[200, 0, 0, 0, 1, 2, 3]).unwrap();
        drop(f);
        let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
        assert_eq!(s.open_report().journal_torn_bytes, 7);
        drop(s);
        fs::remove_file(&jp).unwrap();
        let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
        assert!(s.open_report().journal_rewritten.is_some(), "{:?}", s.open_report());
        assert!(s.memo_lookup("s", &key).unwrap().is_some());
        drop(s);
        // The rewritten journal alone rebuilds the index.
        fs::remove_dir_all(t.path().join("index")).unwrap();
        let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
        assert!(s.memo_lookup("s", &key).unwrap().is_some());
    }
}
