//! verify, gc, repair, import refusal and the writer lock, on real stores in temp directories.

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;
use tessera_store::{Digest, KeyBuilder, MemoEntry, OpenOptions, Store, StoreError};

fn open(dir: &Path) -> Store {
    Store::open(dir, OpenOptions::writable()).unwrap()
}

fn make_writable(p: &Path) {
    let mut perms = fs::metadata(p).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    fs::set_permissions(p, perms).unwrap();
}

fn flip_byte(p: &Path, at: u64) {
    make_writable(p);
    let mut bytes = fs::read(p).unwrap();
    bytes[at as usize] ^= 0x80;
    fs::write(p, bytes).unwrap();
}

/// Objects of many sizes, including the boundaries of blake3's 1 KiB chunks and a multi-MiB one.
fn sample_objects() -> Vec<Vec<u8>> {
    [1usize, 2, 1023, 1024, 1025, 4096, 100_000, 3 << 20]
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|j| (j * 7 + i * 13) as u8).collect())
        .collect()
}

#[test]
fn verify_catches_a_flipped_byte_in_any_object() {
    let objs = sample_objects();
    for (victim, content) in objs.iter().enumerate() {
        // First, last and a middle byte of each object.
        let mut positions = vec![0, content.len() as u64 - 1, content.len() as u64 / 2];
        positions.dedup();
        for at in positions {
            let t = tempfile::tempdir().unwrap();
            let mut s = open(t.path());
            let ds: Vec<Digest> = objs.iter().map(|o| s.put(o).unwrap()).collect();
            let key = KeyBuilder::new("compile", 1).input("victim", &victim).finish().unwrap();
            s.memo_record("compile", &key, &MemoEntry::new(ds[victim], content.len() as u64, Duration::ZERO)).unwrap();
            let clean = s.verify(false).unwrap();
            assert!(clean.is_clean(), "{:?}", clean.lines());

            let path = s.objects().path_of(&ds[victim]);
            flip_byte(&path, at);
            let err = s.get(&ds[victim]).unwrap_err();
            assert!(matches!(err, StoreError::Corrupt { .. }), "get must refuse the damaged object: {err}");

            let rep = s.verify(false).unwrap();
            assert!(!rep.is_clean());
            assert_eq!(rep.bad_objects.len(), 1, "object {victim} byte {at}: {:?}", rep.lines());
            assert_eq!(rep.bad_objects[0].digest, Some(ds[victim]));
            let q = rep.bad_objects[0].quarantined_to.clone().unwrap();
            assert!(q.starts_with(t.path().join("quarantine")) && q.exists());
            assert!(!path.exists(), "the bad object left objects/");
            assert_eq!(rep.dangling_memo.len(), 1, "the memo entry naming it is reported");
            // The others are untouched.
            for (i, d) in ds.iter().enumerate() {
                if i != victim {
                    assert_eq!(&s.get(d).unwrap(), &objs[i]);
                }
            }
            // The memo entry is now a miss, and repair removes it; then the store verifies clean.
            assert_eq!(s.memo_lookup("compile", &key).unwrap(), None);
            let rep = s.verify(true).unwrap();
            assert!(rep.repairs.iter().any(|r| r.contains("memo")), "{:?}", rep.lines());
            assert!(s.verify(false).unwrap().is_clean());
        }
    }
}

#[test]
fn verify_quarantines_stray_files_and_truncation() {
    let t = tempfile::tempdir().unwrap();
    let mut s = open(t.path());
    let d = s.put(&[5u8; 5000]).unwrap();
    let p = s.objects().path_of(&d);
    make_writable(&p);
    fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(4000).unwrap();
    let stray = p.parent().unwrap().join("not-a-digest");
    fs::write(&stray, b"?").unwrap();
    let rep = s.verify(false).unwrap();
    assert_eq!(rep.bad_objects.len(), 2, "{:?}", rep.lines());
    assert!(!stray.exists());
}

#[test]
fn gc_keeps_what_roots_reach() {
    let t = tempfile::tempdir().unwrap();
    let mut s = open(t.path());
    let keep = s.put(b"kept").unwrap();
    let drop_ = s.put(b"dropped").unwrap();
    let k1 = KeyBuilder::new("link", 1).input("x", &1u8).finish().unwrap();
    let k2 = KeyBuilder::new("link", 1).input("x", &2u8).finish().unwrap();
    s.memo_record("link", &k1, &MemoEntry::new(keep, 4, Duration::ZERO)).unwrap();
    s.memo_record("link", &k2, &MemoEntry::new(drop_, 7, Duration::ZERO)).unwrap();
    s.set_root("model-a", &[keep]).unwrap();

    let dry = s.gc(true).unwrap();
    assert_eq!((dry.objects_kept, dry.objects_removed, dry.memo_entries_removed), (1, 1, 1));
    assert!(s.contains(&drop_), "dry run removes nothing");

    let rep = s.gc(false).unwrap();
    assert_eq!((rep.objects_removed, rep.bytes_removed, rep.memo_entries_removed), (1, 7, 1));
    assert!(s.contains(&keep) && !s.contains(&drop_));
    assert!(s.memo_lookup("link", &k1).unwrap().is_some());
    assert!(s.memo_lookup("link", &k2).unwrap().is_none());
    assert!(s.verify(false).unwrap().is_clean());
    drop(s);
    // The compacted journal alone still rebuilds the same index.
    fs::remove_dir_all(t.path().join("index")).unwrap();
    let s = open(t.path());
    assert!(s.memo_lookup("link", &k1).unwrap().is_some());
    assert!(s.memo_lookup("link", &k2).unwrap().is_none());
    assert_eq!(s.root("model-a").unwrap(), Some(vec![keep]));
}

#[test]
fn undecodable_index_record_is_repaired_from_the_journal() {
    let t = tempfile::tempdir().unwrap();
    let key = KeyBuilder::new("tune", 1).input("sig", "gemm").finish().unwrap();
    let e = {
        let s = open(t.path());
        let out = s.put(b"best config").unwrap();
        let e = MemoEntry::new(out, 11, Duration::from_secs(3));
        s.memo_record("tune", &key, &e).unwrap();
        e
    };
    // Damage the memo record inside the index database (as a bug or disk error might).
    {
        let db = rusqlite::Connection::open(t.path().join("index").join("index.sqlite")).unwrap();
        let n = db.execute("UPDATE kv SET v = x'ffffff' WHERE k >= x'6d' AND k < x'6e'", []).unwrap();
        assert_eq!(n, 1);
    }
    let mut s = open(t.path());
    assert!(matches!(s.memo_lookup("tune", &key), Err(StoreError::IndexDamaged { .. })));
    let rep = s.verify(false).unwrap();
    assert_eq!(rep.bad_index_records.len(), 1, "{:?}", rep.lines());
    let rep = s.verify(true).unwrap();
    assert!(rep.repairs.iter().any(|r| r.contains("rebuilt the index")), "{:?}", rep.lines());
    assert_eq!(s.memo_lookup("tune", &key).unwrap(), Some(e));
    assert!(s.verify(false).unwrap().is_clean());
}

#[test]
fn damaged_journal_is_reported_and_rewritten() {
    let t = tempfile::tempdir().unwrap();
    let key = KeyBuilder::new("partition", 1).input("g", "resnet").finish().unwrap();
    {
        let s = open(t.path());
        for i in 0..5u8 {
            let out = s.put(&[i; 10]).unwrap();
            s.memo_record(
                "partition",
                &KeyBuilder::new("partition", 1).input("i", &i).finish().unwrap(),
                &MemoEntry::new(out, 10, Duration::ZERO),
            )
            .unwrap();
        }
        let out = s.put(b"p").unwrap();
        s.memo_record("partition", &key, &MemoEntry::new(out, 1, Duration::ZERO)).unwrap();
    }
    // Flip a byte in the middle of the journal.
    let jp = t.path().join("journal");
    let len = fs::metadata(&jp).unwrap().len();
    let mut f = fs::OpenOptions::new().read(true).write(true).open(&jp).unwrap();
    f.seek(SeekFrom::Start(len / 2)).unwrap();
    f.write_all(&[0xAA, 0x55]).unwrap();
    drop(f);
    let mut s = open(t.path());
    let rep = s.verify(false).unwrap();
    assert!(!rep.journal_problems.is_empty(), "{:?}", rep.lines());
    let rep = s.verify(true).unwrap();
    assert!(rep.repairs.iter().any(|r| r.contains("journal")));
    assert!(s.verify(false).unwrap().is_clean());
    drop(s);
    fs::remove_dir_all(t.path().join("index")).unwrap();
    let s = open(t.path());
    assert_eq!(s.memo_entries().unwrap().len(), 6, "the rewritten journal holds every entry");
    assert!(s.memo_lookup("partition", &key).unwrap().is_some());
}

#[test]
fn import_refuses_a_tampered_archive() {
    let t = tempfile::tempdir().unwrap();
    let a = open(&t.path().join("a"));
    let content = b"weights weights weights weights".repeat(50);
    let d = a.put(&content).unwrap();
    let key = KeyBuilder::new("link", 1).input("m", "bert").finish().unwrap();
    a.memo_record("link", &key, &MemoEntry::new(d, content.len() as u64, Duration::ZERO)).unwrap();
    a.set_root("bert", &[d]).unwrap();
    let archive = t.path().join("bert.tar");
    a.export(&archive, None).unwrap();
    // Corrupt the object's bytes inside the tar (they are stored raw).
    let mut bytes = fs::read(&archive).unwrap();
    let at = bytes.windows(content.len()).position(|w| w == &content[..]).unwrap() + 100;
    bytes[at] ^= 1;
    fs::write(&archive, &bytes).unwrap();
    let b = open(&t.path().join("b"));
    let err = b.import(&archive).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("corrupt") && msg.contains(&d.to_hex()) && msg.contains("bert.tar"), "{msg}");
    assert!(!b.contains(&d));
    assert_eq!(b.root("bert").unwrap(), None);
    assert!(b.memo_entries().unwrap().is_empty());
    // Export of an unknown root names the ones there are.
    let err = a.export(&t.path().join("x.tar"), Some("gpt2")).unwrap_err();
    assert!(err.to_string().contains("bert"), "{err}");
}

#[test]
fn wait_queues_behind_an_exclusive_holder_and_sharers_do_not_wait() {
    let t = tempfile::tempdir().unwrap();
    drop(open(t.path()));
    let sharer = open(t.path());
    // Sharers open at once, alongside each other.
    let start = std::time::Instant::now();
    drop(open(t.path()));
    assert!(start.elapsed() < Duration::from_secs(5));
    drop(sharer);
    let first = Store::open(t.path(), OpenOptions::writable().exclusive(true)).unwrap();
    let dir = t.path().to_path_buf();
    let start = std::time::Instant::now();
    let waiter =
        std::thread::spawn(move || Store::open(&dir, OpenOptions::writable().wait(true)).map(|_| start.elapsed()));
    std::thread::sleep(Duration::from_millis(300));
    drop(first);
    let waited = waiter.join().unwrap().unwrap();
    assert!(waited >= Duration::from_millis(250), "the second open waited for the exclusive one ({waited:?})");
}

/// `verify` while another handle (another process, in practice) keeps writing: the index and the journal are
/// read together, so a write between them is never taken for a disagreement.
#[test]
fn verify_while_another_handle_writes_finds_nothing_wrong() {
    let t = tempfile::tempdir().unwrap();
    let writer = open(t.path());
    let mut checker = open(t.path());
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..150u32 {
                let out = writer.put(&i.to_le_bytes()).unwrap();
                let key = KeyBuilder::new("lower", 1).input("i", &i).finish().unwrap();
                writer.memo_record("lower", &key, &MemoEntry::new(out, 4, Duration::ZERO)).unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let mut runs = 0;
        while !done.load(std::sync::atomic::Ordering::Relaxed) || runs < 3 {
            let rep = checker.verify(false).unwrap();
            assert!(rep.is_clean(), "verify run {runs} during writes: {}", rep.lines().join("\n"));
            runs += 1;
        }
    });
}
