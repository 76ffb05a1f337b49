//! Property tests: whatever goes in comes out, through put/get, the memo table, reopening, and
//! export/import.

use proptest::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;
use tessera_store::{Digest, KeyBuilder, MemoEntry, OpenOptions, Store};

fn open(dir: &std::path::Path) -> Store {
    Store::open(dir, OpenOptions::writable()).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn put_get_round_trip(blobs in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..5000), 1..8)) {
        let t = tempfile::tempdir().unwrap();
        let s = open(t.path());
        let mut digests = Vec::new();
        for (i, b) in blobs.iter().enumerate() {
            let d = if i % 2 == 0 { s.put(b).unwrap() } else { s.put_reader(&b[..]).unwrap() };
            prop_assert_eq!(d, Digest::of(b));
            digests.push(d);
        }
        for (b, d) in blobs.iter().zip(&digests) {
            prop_assert!(s.contains(d));
            prop_assert_eq!(&s.get(d).unwrap(), b);
            let mut out = Vec::new();
            prop_assert_eq!(s.get_to_writer(d, &mut out).unwrap(), b.len() as u64);
            prop_assert_eq!(&out, b);
        }
        let distinct: std::collections::BTreeSet<_> = digests.iter().collect();
        let st = s.stats().unwrap();
        prop_assert_eq!(st.objects, distinct.len() as u64);
        prop_assert_eq!(st.dedupe_puts, (blobs.len() - distinct.len()) as u64);
    }

    #[test]
    fn memo_record_lookup_round_trip(
        ops in prop::collection::vec((0usize..3, 0u8..12, prop::collection::vec(any::<u8>(), 0..64), 0u64..10_000_000), 1..24)
    ) {
        let stages = ["partition", "compile", "tune"];
        let t = tempfile::tempdir().unwrap();
        let mut model: BTreeMap<(&str, Digest), MemoEntry> = BTreeMap::new();
        {
            let s = open(t.path());
            for (stage, k, content, micros) in &ops {
                let stage = stages[*stage];
                let key = KeyBuilder::new(stage, 1).input("k", k).finish().unwrap();
                let out = s.put(content).unwrap();
                let e = MemoEntry::new(out, content.len() as u64, Duration::from_micros(*micros));
                s.memo_record(stage, &key, &e).unwrap();
                model.insert((stage, key), e);
            }
            for ((stage, key), e) in &model {
                prop_assert_eq!(s.memo_lookup(stage, key).unwrap(), Some(*e));
            }
        }
        // And after reopening.
        let s = open(t.path());
        for ((stage, key), e) in &model {
            prop_assert_eq!(s.memo_lookup(stage, key).unwrap(), Some(*e));
        }
        prop_assert_eq!(s.memo_entries().unwrap().len(), model.len());
        let absent = KeyBuilder::new("partition", 1).input("k", &255u8).finish().unwrap();
        prop_assert_eq!(s.memo_lookup("partition", &absent).unwrap(), None);
    }

    #[test]
    fn export_import_round_trip(
        blobs in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..3000), 1..10),
        rooted in prop::collection::vec(any::<bool>(), 10),
    ) {
        let t = tempfile::tempdir().unwrap();
        let a = open(&t.path().join("a"));
        let mut kept = Vec::new();
        let mut memo = Vec::new();
        for (i, b) in blobs.iter().enumerate() {
            let d = a.put(b).unwrap();
            let key = KeyBuilder::new("compile", 2).input("i", &i).finish().unwrap();
            let e = MemoEntry::new(d, b.len() as u64, Duration::from_millis(i as u64));
            a.memo_record("compile", &key, &e).unwrap();
            if rooted[i] || i == 0 {
                kept.push(d);
                memo.push((key, e));
            }
        }
        a.set_root("build", &kept).unwrap();
        let archive = t.path().join("closure.tar");
        let ex = a.export(&archive, Some("build")).unwrap();
        let kept_set: std::collections::BTreeSet<_> = kept.iter().copied().collect();
        prop_assert_eq!(ex.objects, kept_set.len() as u64);

        let b = open(&t.path().join("b"));
        let im = b.import(&archive).unwrap();
        prop_assert_eq!(im.objects_added, kept_set.len() as u64);
        prop_assert_eq!(b.root("build").unwrap(), a.root("build").unwrap());
        for d in &kept {
            prop_assert_eq!(b.get(d).unwrap(), a.get(d).unwrap());
        }
        for (key, e) in &memo {
            prop_assert_eq!(b.memo_lookup("compile", key).unwrap(), Some(*e));
        }
        // Entries whose output is outside the closure do not travel.
        prop_assert_eq!(b.memo_entries().unwrap().len(), a.memo_entries().unwrap().into_iter().filter(|m| kept_set.contains(&m.entry.output)).count());
        // Exporting the imported closure gives the same bytes: archives are deterministic.
        let again = t.path().join("again.tar");
        b.export(&again, Some("build")).unwrap();
        prop_assert_eq!(std::fs::read(&archive).unwrap(), std::fs::read(&again).unwrap());
        // Importing twice adds nothing.
        let im2 = b.import(&archive).unwrap();
        prop_assert_eq!(im2.objects_added, 0);
    }
}
