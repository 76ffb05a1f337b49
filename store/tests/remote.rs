//! The remote tier against real servers started on 127.0.0.1 — Redis and nginx WebDAV, each plain and over TLS
//! with authentication (an ACL user; basic authentication), and an S3-compatible server (moto, TLS, IAM
//! authentication) — with certificates the test makes: fall-through and back-fill, verification of every remote
//! object, trust of remote memo entries, read-only clients, a server that dies or comes back empty, refused
//! credentials and certificates. Each test runs against every server.

mod servers;

use servers::Server;
use std::time::Duration;
use tessera_store::{Digest, MemoEntry, OpenOptions, Remote, RemoteOptions, RemoteUrl, Store, StoreError};

/// A server's URL and what its clients are configured with (credentials, CA file).
#[derive(Clone)]
struct Client {
    url: RemoteUrl,
    opts: RemoteOptions,
}

impl Client {
    fn remote(&self) -> Remote {
        Remote::new(&self.url, self.opts.clone()).unwrap()
    }
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.url.fmt(f)
    }
}

fn url(s: &Server) -> Client {
    Client { url: s.url.parse().unwrap(), opts: s.options() }
}

fn store_with(dir: &std::path::Path, c: &Client) -> Store {
    Store::open(dir, OpenOptions::writable()).unwrap().with_remote(c.remote()).unwrap()
}

/// A client that only looks (what is on the server).
fn probe(c: &Client) -> Remote {
    Remote::new(&c.url, RemoteOptions { read_only: true, ..c.opts.clone() }).unwrap()
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
        u.remote().put_object(&out, b"evil bytes").unwrap();

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
        let ro_url = Client { url: format!("{}{}ro", server.url, if server.url.contains('?') { "&" } else { "?" }).parse().unwrap(), opts: server.options() };
        for (i, (u, opts)) in [(u.clone(), RemoteOptions { read_only: true, ..server.options() }), (ro_url, server.options())].into_iter().enumerate() {
            let s = Store::open(&t.path().join(format!("ro{i}")), OpenOptions::writable()).unwrap().with_remote(Remote::new(&u.url, opts).unwrap()).unwrap();
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
        assert!(why.contains(&u.url.url), "the error names the server: {why}");
        assert!(!s.remote().unwrap().is_enabled());
        assert_eq!(st.warnings().len(), 1, "{:?}", st.warnings());
        // Everything is local and intact.
        assert_eq!(s.get(&out).unwrap(), b"after");
        assert_eq!(s.get(&first).unwrap(), b"before");
        assert_eq!(s.memo_lookup("compile", &key).unwrap().map(|e| e.output), Some(out));
        // Once disabled, nothing more is sent, even when the server is back.
        server.restart_empty();
        // (A restarted TLS server has a new CA, and the S3 server a new key.)
        let u = url(&server);
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

// ---- signed memo entries ------------------------------------------------------------------------------

use tessera_store::remote::keyfile::{generate, load_signing_key, load_trust};
use tessera_store::remote::RemoteMemo;
use tessera_store::{MemoSigner, PublicKey, Signing, Trust};

/// A fresh key pair in `dir`, through the files `tessera store keygen` writes.
fn key_pair(dir: &std::path::Path) -> (std::path::PathBuf, Vec<PublicKey>) {
    let (secret, public) = generate(dir).unwrap();
    (secret.clone(), load_trust(&public).unwrap())
}

fn signer(secret: &std::path::Path) -> Option<MemoSigner> {
    Some(load_signing_key(secret).unwrap())
}

/// A store whose remote client signs with `signer` and requires a signature from one of `trust`.
fn signing_store(dir: &std::path::Path, c: &Client, signer: Option<MemoSigner>, trust: &[PublicKey]) -> Store {
    let remote = c.remote().with_signing(Signing { signer, trust: Trust::new(trust.to_vec()) });
    Store::open(dir, OpenOptions::writable()).unwrap().with_remote(remote).unwrap()
}

fn raw_record(c: &Client, stage: &str, key: &Digest) -> RemoteMemo {
    serde_json::from_slice(&probe(c).memo_record_raw(stage, key).unwrap().expect("a record on the server")).unwrap()
}

#[test]
fn a_signed_writer_serves_a_trusting_reader_and_a_trusting_writer_signs_its_own_writes() {
    for server in servers::all() {
        let u = url(&server);
        let t = tempfile::tempdir().unwrap();
        let (secret, trusted) = key_pair(&t.path().join("keys"));
        let key = Digest::of(b"key");
        // A writer that also trusts only its own key: its writes are signed, so it could read them back.
        let a = signing_store(&t.path().join("a"), &u, signer(&secret), &trusted);
        let out = a.put(b"signed output").unwrap();
        let entry = MemoEntry::new(out, 13, Duration::from_millis(2));
        a.memo_record("compile", &key, &entry).unwrap();
        drop(a);
        let rec = raw_record(&u, "compile", &key);
        let sig = rec.signature.clone().unwrap_or_else(|| panic!("{}: the writer signs: {rec:?}", server.url));
        assert_eq!(sig.public_key, trusted[0].to_hex());

        let b = signing_store(&t.path().join("b"), &u, None, &trusted);
        assert_eq!(b.memo_lookup("compile", &key).unwrap(), Some(entry), "{}", server.url);
        assert_eq!(b.get(&out).unwrap(), b"signed output");
        let st = b.remote_stats().unwrap();
        assert_eq!((st.memo_hits, st.memo_rejected, st.memo_signature_rejected), (1, 0, 0), "{}: {st:?}", server.url);
        // A client without trusted keys (as before signing) is served the signed entry too.
        let c = store_with(&t.path().join("c"), &u);
        assert_eq!(c.memo_lookup("compile", &key).unwrap(), Some(entry), "{}", server.url);
    }
}

#[test]
fn unsigned_untrusted_replayed_and_tampered_entries_are_rejected_counted_and_recomputed() {
    for server in servers::all() {
        let u = url(&server);
        let t = tempfile::tempdir().unwrap();
        let (secret, trusted) = key_pair(&t.path().join("trusted"));
        let (other_secret, _) = key_pair(&t.path().join("other"));
        let [unsigned, untrusted, replayed, tampered] = ["unsigned", "untrusted", "replayed", "tampered"].map(|k| Digest::of(k.as_bytes()));
        let real = |k: &Digest| format!("real output for {k}").into_bytes();
        // The entries, each with its real output on the server.
        let plain = store_with(&t.path().join("plain"), &u);
        let out = plain.put(&real(&unsigned)).unwrap();
        plain.memo_record("lower", &unsigned, &MemoEntry::new(out, real(&unsigned).len() as u64, Duration::ZERO)).unwrap();
        drop(plain);
        let other = signing_store(&t.path().join("other-writer"), &u, signer(&other_secret), &[]);
        let out = other.put(&real(&untrusted)).unwrap();
        other.memo_record("lower", &untrusted, &MemoEntry::new(out, real(&untrusted).len() as u64, Duration::ZERO)).unwrap();
        drop(other);
        let good = signing_store(&t.path().join("good-writer"), &u, signer(&secret), &trusted);
        let signed_key = Digest::of(b"signed");
        let out = good.put(b"signed elsewhere").unwrap();
        good.memo_record("lower", &signed_key, &MemoEntry::new(out, 16, Duration::ZERO)).unwrap();
        let out = good.put(&real(&tampered)).unwrap();
        good.memo_record("lower", &tampered, &MemoEntry::new(out, real(&tampered).len() as u64, Duration::ZERO)).unwrap();
        let evil = good.put(b"evil code").unwrap();
        drop(good);
        // Whoever can write the server: a trusted signature moved onto another key (its record rewritten to
        // name that key), and a signed entry pointed at another object.
        let writer = u.remote();
        let mut rec = raw_record(&u, "lower", &signed_key);
        rec.key = replayed.to_hex();
        writer.put_memo_record_raw("lower", &replayed, &serde_json::to_vec(&rec).unwrap()).unwrap();
        let mut rec = raw_record(&u, "lower", &tampered);
        (rec.output, rec.size) = (evil.to_hex(), 9);
        writer.put_memo_record_raw("lower", &tampered, &serde_json::to_vec(&rec).unwrap()).unwrap();
        drop(writer);

        // A trusting client that also writes: every one rejected, counted, nothing recorded or fetched.
        let b = signing_store(&t.path().join("b"), &u, signer(&secret), &trusted);
        for k in [unsigned, untrusted, replayed, tampered] {
            assert_eq!(b.memo_lookup("lower", &k).unwrap(), None, "{}: {k} must be rejected", server.url);
        }
        let st = b.remote_stats().unwrap();
        assert_eq!((st.memo_rejected, st.memo_signature_rejected, st.memo_hits, st.objects_fetched), (4, 4, 0, 0), "{}: {st:?}", server.url);
        assert!(!b.objects().contains(&evil), "the tampered entry's object never reaches the local store");
        assert!(st.warnings().iter().any(|w| w.contains("4 of them lacked a valid signature")), "{:?}", st.warnings());
        // Recomputed locally, with the right output; the recomputed entries replace the bad ones, signed.
        for k in [unsigned, untrusted, replayed, tampered] {
            let out = b.put(&real(&k)).unwrap();
            b.memo_record("lower", &k, &MemoEntry::new(out, real(&k).len() as u64, Duration::ZERO)).unwrap();
            assert_eq!(b.memo_lookup("lower", &k).unwrap().map(|e| e.output), Some(out));
        }
        drop(b);
        let local = Store::open(&t.path().join("b"), OpenOptions::writable()).unwrap();
        assert_eq!(local.memo_lookup("lower", &tampered).unwrap().map(|e| e.output), Some(Digest::of(&real(&tampered))));
        drop(local);
        // A fresh trusting reader is now served every one of them, with the real outputs.
        let c = signing_store(&t.path().join("c"), &u, None, &trusted);
        for k in [unsigned, untrusted, replayed, tampered] {
            let e = c.memo_lookup("lower", &k).unwrap().unwrap_or_else(|| panic!("{}: {k} is signed now", server.url));
            assert_eq!(c.get(&e.output).unwrap(), real(&k));
        }
        let st = c.remote_stats().unwrap();
        assert_eq!((st.memo_hits, st.memo_rejected), (4, 0), "{}: {st:?}", server.url);
    }
}

// ---- credentials and TLS --------------------------------------------------------------------------------

/// What a client configured with `opts` reports after one lookup: the reason the tier was disabled.
fn disabled_after_one_lookup(server: &Server, opts: RemoteOptions) -> (String, Vec<String>) {
    let t = tempfile::tempdir().unwrap();
    let s = Store::open(t.path(), OpenOptions::writable()).unwrap().with_remote(Remote::new(&server.url.parse().unwrap(), opts).unwrap()).unwrap();
    let start = std::time::Instant::now();
    assert_eq!(s.memo_lookup("lower", &Digest::of(b"k")).unwrap(), None);
    s.put(b"still stored locally").unwrap();
    assert!(start.elapsed() < Duration::from_secs(5), "{}: refused at once, not after retries: {:?}", server.url, start.elapsed());
    let st = s.remote_stats().unwrap();
    let why = st.disabled.clone().unwrap_or_else(|| panic!("{}: the tier must be disabled: {st:?}", server.url));
    assert_eq!((st.memo_misses, st.objects_uploaded), (0, 0), "{}: nothing was asked after the refusal: {st:?}", server.url);
    (why, st.warnings())
}

#[test]
fn the_right_credentials_are_taken_and_wrong_or_missing_ones_refused_once_by_name_never_shown() {
    for server in servers::secured() {
        let secret = server.secret().unwrap();
        // The right ones work (the other tests use them throughout); the wrong ones are refused, said plainly.
        let (why, warnings) = disabled_after_one_lookup(&server, RemoteOptions { credentials: server.wrong_credentials(), ..server.options() });
        assert!(why.contains("refused the credentials"), "{}: {why}", server.url);
        assert_eq!(warnings.len(), 1, "one warning: {warnings:?}");
        assert!(warnings[0].contains("remote tier disabled") && warnings[0].contains(&why), "{warnings:?}");
        // None at all: the server says it wants some (moto answers an unsigned request with a 500 once its IAM
        // authentication is on, where S3 says 403: only that the tier is disabled is checked there).
        let (why, _) = disabled_after_one_lookup(&server, RemoteOptions { credentials: Default::default(), ..server.options() });
        if !server.url.starts_with("s3:") {
            assert!(["refused the credentials", "requires authentication"].iter().any(|s| why.contains(s)), "{}: {why}", server.url);
        }
        // Nothing shows a secret: errors, warnings, the stats as --json prints them, Debug output.
        let r = Remote::new(&server.url.parse().unwrap(), RemoteOptions { credentials: server.wrong_credentials(), ..server.options() }).unwrap();
        let _ = r.has_object(&Digest::of(b"x"));
        let shown = format!("{why} {:?} {} {r:?} {:?}", r.stats().warnings(), serde_json::to_string(&r.stats()).unwrap(), server.options());
        assert!(!shown.contains(&secret) && !shown.contains("not-the-password"), "{}: a secret was shown: {shown}", server.url);
    }
}

#[test]
fn a_certificate_from_an_untrusted_ca_fails_the_handshake_once_saying_where_trust_comes_from() {
    let t = tempfile::tempdir().unwrap();
    let other = servers::Pki::new(&t.path().join("other-ca"));
    for server in servers::secured() {
        // The system's CAs did not sign the test's certificate.
        let (why, warnings) = disabled_after_one_lookup(&server, RemoteOptions { ca_file: None, ..server.options() });
        assert!(why.contains("TLS handshake") && why.contains("UnknownIssuer") && why.contains("--remote-ca"), "{}: {why}", server.url);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        // Another private CA did not either.
        let (why, _) = disabled_after_one_lookup(&server, RemoteOptions { ca_file: Some(other.ca.clone()), ..server.options() });
        assert!(why.contains("invalid peer certificate") && why.contains(&other.ca.display().to_string()), "{}: {why}", server.url);
    }
}
