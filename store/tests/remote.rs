//! The remote tier against real servers (Redis, nginx WebDAV) started on 127.0.0.1: fall-through and
//! back-fill, verification of every remote object, trust of remote memo entries, read-only clients, and a
//! server that dies or comes back empty. Each test runs against both services.

mod servers;

use servers::Server;
use std::time::Duration;
use tessera_store::{Digest, MemoEntry, OpenOptions, Remote, RemoteOptions, RemoteUrl, Store, StoreError};

fn url(s: &Server) -> RemoteUrl {
    s.url.parse().unwrap()
}

fn store_with(dir: &std::path::Path, url: &RemoteUrl) -> Store {
    Store::open(dir, OpenOptions::writable()).unwrap().with_remote(Remote::new(url, RemoteOptions::default()).unwrap()).unwrap()
}

/// A client that only looks (what is on the server).
fn probe(url: &RemoteUrl) -> Remote {
    Remote::new(url, RemoteOptions { read_only: true }).unwrap()
}

#[test]
fn a_second_store_is_served_from_the_remote_and_back_filled() {
    for server in servers::all() {
        let u = url(&server);
        let t = tempfile::tempdir().unwrap();
        let key = Digest::of(b"key");
        let (out, entry) = {
            let a = store_with(&t.path().join("a"), &u);
            let out = a.put(b"stage output").unwrap();
            let big = a.put_reader(&vec![7u8; 3 << 20][..]).unwrap();
            let entry = MemoEntry::new(out, 12, Duration::from_millis(3));
            a.memo_record("lower", &key, &entry).unwrap();
            let st = a.remote_stats().unwrap();
            assert_eq!((st.objects_uploaded, st.memo_uploaded, st.disabled.clone()), (2, 1, None), "{}: {st:?}", server.url);
            assert!(probe(&u).has_object(&big).unwrap());
            (out, entry)
        };
        let b = store_with(&t.path().join("b"), &u);
        assert!(!b.objects().contains(&out));
        assert_eq!(b.memo_lookup("lower", &key).unwrap(), Some(entry), "{}", server.url);
        // Back-filled: the output and the entry are local now.
        assert!(b.objects().contains(&out));
        assert_eq!(b.get(&out).unwrap(), b"stage output");
        let big = Digest::of(&vec![7u8; 3 << 20]);
        assert_eq!(b.get(&big).unwrap().len(), 3 << 20);
        assert_eq!(b.memo_lookup("compile", &key).unwrap(), None);
        let st = b.remote_stats().unwrap();
        assert_eq!((st.memo_hits, st.memo_misses, st.objects_fetched, st.objects_rejected), (1, 1, 2, 0), "{}: {st:?}", server.url);
        assert_eq!(st.bytes_fetched, 12 + (3 << 20));
        // Served from the local store now, not the remote.
        drop(b);
        let b = Store::open(&t.path().join("b"), OpenOptions::writable()).unwrap();
        assert_eq!(b.memo_lookup("lower", &key).unwrap(), Some(entry));
        assert!(matches!(b.get(&Digest::of(b"never")), Err(StoreError::NotFound { .. })));
    }
}

#[test]
fn a_tampered_remote_object_is_rejected_never_served_and_repaired_by_the_next_put() {
    for server in servers::all() {
        let u = url(&server);
        let t = tempfile::tempdir().unwrap();
        let key = Digest::of(b"key");
        let a = store_with(&t.path().join("a"), &u);
        let out = a.put(b"the real output").unwrap();
        a.memo_record("link", &key, &MemoEntry::new(out, 15, Duration::ZERO)).unwrap();
        drop(a);
        // Whoever can write the server replaces the object's bytes under its name.
        Remote::new(&u, RemoteOptions::default()).unwrap().put_object(&out, b"evil bytes").unwrap();

        let b = store_with(&t.path().join("b"), &u);
        assert_eq!(b.memo_lookup("link", &key).unwrap(), None, "{}: an entry whose output fails verification is not trusted", server.url);
        let err = b.get(&out).unwrap_err();
        assert!(matches!(err, StoreError::NotFound { .. }), "{}: {err}", server.url);
        assert!(!b.objects().contains(&out), "nothing unverified reaches the local store");
        let st = b.remote_stats().unwrap();
        assert_eq!((st.objects_rejected, st.memo_rejected, st.memo_hits), (2, 1, 0), "{}: {st:?}", server.url);
        assert_eq!(st.disabled, None, "a bad object does not disable the tier");
        assert!(st.warnings().iter().any(|w| w.contains("failed verification")), "{:?}", st.warnings());
        // Recomputed: the put overwrites the bad copy on the server, although the server "has" it.
        assert_eq!(b.put(b"the real output").unwrap(), out);
        drop(b);
        assert_eq!(probe(&u).get_object(&out).unwrap().as_deref(), Some(&b"the real output"[..]), "{}", server.url);
    }
}

#[test]
fn a_read_only_client_writes_nothing() {
    for server in servers::all() {
        let u = url(&server);
        let t = tempfile::tempdir().unwrap();
        let key = Digest::of(b"key");
        for (i, (u, opts)) in [(u.clone(), RemoteOptions { read_only: true }), (format!("{}?ro", server.url).parse().unwrap(), RemoteOptions::default())]
            .into_iter()
            .enumerate()
        {
            let s = Store::open(&t.path().join(format!("ro{i}")), OpenOptions::writable()).unwrap().with_remote(Remote::new(&u, opts).unwrap()).unwrap();
            let out = s.put(b"local only").unwrap();
            s.put_reader(&b"streamed, local only"[..]).unwrap();
            s.memo_record("partition", &key, &MemoEntry::new(out, 10, Duration::ZERO)).unwrap();
            let st = s.remote_stats().unwrap();
            assert!(st.read_only);
            assert_eq!((st.objects_uploaded, st.memo_uploaded, st.disabled), (0, 0, None), "{u}");
            assert!(matches!(s.remote().unwrap().put_object(&out, b"local only"), Err(StoreError::RemoteReadOnly { .. })));
            let p = probe(&u);
            assert!(!p.has_object(&out).unwrap(), "{u}");
            assert!(!p.has_object(&Digest::of(b"streamed, local only")).unwrap(), "{u}");
            assert_eq!(p.get_memo("partition", &key).unwrap(), None, "{u}");
        }
    }
}

#[test]
fn a_dead_server_disables_the_tier_once_and_the_store_goes_on_locally() {
    for mut server in servers::all() {
        let u = url(&server);
        let t = tempfile::tempdir().unwrap();
        let s = store_with(&t.path().join("s"), &u);
        let first = s.put(b"before").unwrap();
        assert_eq!(s.remote_stats().unwrap().objects_uploaded, 1);
        server.kill();
        let key = Digest::of(b"k");
        let out = s.put(b"after").unwrap();
        s.memo_record("compile", &key, &MemoEntry::new(out, 5, Duration::ZERO)).unwrap();
        assert_eq!(s.memo_lookup("compile", &Digest::of(b"other")).unwrap(), None);
        assert!(matches!(s.get(&Digest::of(b"absent")), Err(StoreError::NotFound { .. })));
        let st = s.remote_stats().unwrap();
        let why = st.disabled.clone().unwrap_or_else(|| panic!("{}: the tier must be disabled: {st:?}", server.url));
        assert!(why.contains(&server.url), "the error names the server: {why}");
        assert!(!s.remote().unwrap().is_enabled());
        assert_eq!(st.warnings().len(), 1, "{:?}", st.warnings());
        // Everything is local and intact.
        assert_eq!(s.get(&out).unwrap(), b"after");
        assert_eq!(s.get(&first).unwrap(), b"before");
        assert_eq!(s.memo_lookup("compile", &key).unwrap().map(|e| e.output), Some(out));
        // Once disabled, nothing more is sent, even when the server is back.
        server.restart_empty();
        s.put(b"later").unwrap();
        assert!(!probe(&u).has_object(&Digest::of(b"later")).unwrap(), "{}", server.url);
        drop(s);
        // A new process with the server back (empty) refills it.
        let s2 = store_with(&t.path().join("s2"), &u);
        s2.put(b"after").unwrap();
        assert!(probe(&u).has_object(&out).unwrap(), "{}", server.url);
    }
}

#[test]
fn a_bad_memo_record_on_the_server_is_not_trusted() {
    for server in servers::all() {
        let u = url(&server);
        let t = tempfile::tempdir().unwrap();
        let a = store_with(&t.path().join("a"), &u);
        let out = a.put(b"x").unwrap();
        let (k1, k2) = (Digest::of(b"k1"), Digest::of(b"k2"));
        a.memo_record("lower", &k1, &MemoEntry::new(out, 1, Duration::ZERO)).unwrap();
        // An entry whose output the server does not have.
        let missing = MemoEntry::new(Digest::of(b"not uploaded"), 12, Duration::ZERO);
        a.remote().unwrap().put_memo("lower", &k2, &missing).unwrap();
        drop(a);
        let b = store_with(&t.path().join("b"), &u);
        assert_eq!(b.memo_lookup("lower", &k2).unwrap(), None);
        assert!(b.memo_lookup("lower", &k1).unwrap().is_some());
        let st = b.remote_stats().unwrap();
        assert_eq!((st.memo_rejected, st.memo_hits), (1, 1), "{}: {st:?}", server.url);
    }
}
