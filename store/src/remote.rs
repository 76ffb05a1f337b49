//! The remote tier: objects and memo entries in a cache server many machines share — Redis, an HTTP/WebDAV
//! server (such as nginx with its DAV module), or an S3-compatible object store — over TLS where the URL says
//! so, with credentials from the environment or a private file.
//!
//! [`Store`](crate::Store) composes it behind its own calls (`Store::with_remote`): reads fall through
//! local -> remote and back-fill the local store; writes go local first, then remote. What this module
//! guarantees, whatever the server holds:
//! - **Nothing unverified is served.** Every object read from the remote is re-hashed (blake3) against the
//!   digest it was asked for; one that does not match is rejected ([`StoreError::RemoteCorrupt`]), counted
//!   and never written to the local store, so the stage that needs it recomputes it, and the recomputed
//!   object then overwrites the bad one on the remote.
//! - **A remote memo entry is trusted only once its output object is here and verified**, with the size
//!   the entry claims (the store checks this before recording the entry locally).
//! - **A failing server costs time, not the build.** The first error (refused connection, timeout, refused
//!   credentials, an answer the client cannot parse) disables the tier for the rest of the process with one
//!   warning; the build goes on with the local store alone.
//! - **A server that is down costs at most its timeout, once.** Before its first request the client checks
//!   that the server is there ([`Remote::probe`], [`probe`]): a TCP connection, the TLS handshake where the
//!   remote uses TLS, and the start of an answer to one small request (`PING` on Redis, `OPTIONS` on HTTP),
//!   all within [`RemoteOptions::timeout`] (default [`DEFAULT_REMOTE_TIMEOUT`], `--remote-timeout-ms`). A
//!   refused connection fails at once, an unreachable host or a server that never answers after the timeout;
//!   either way the tier is disabled before any client library gets to wait or retry. Then one authenticated
//!   request that changes nothing checks the credentials, so refused ones are named as such.
//! - **No secret is shown.** URLs carry no credentials ([`url`] refuses them); they come from the environment
//!   or a file only its owner can read ([`credentials`]), and messages, logs, stats and reports name the URL,
//!   files and variable names, never a value.
//!
//! What it cannot guarantee: a memo entry maps a key to an output, so whoever can write the remote can
//! choose what a key's output is (code included) — only trusted machines should have write access; the
//! others use read-only mode (`?ro`, [`RemoteOptions::read_only`]), which writes nothing. With signing
//! ([`sign`], `Remote::with_signing`), writers sign the entries they write and clients that name trusted keys
//! use only entries signed by one of them: the trust moves from "can write the server" to "holds a key".
//!
//! Layout on the server (the same on every service): `objects/<64 hex>` holds an object's bytes,
//! `memo/<stage>/<64 hex key>` a JSON [`RemoteMemo`] (on Redis, as keys under `tessera/`; on WebDAV and S3,
//! under the URL's path or prefix). Submodules, one job each: [`url`] (parsing), [`credentials`], [`tls`],
//! [`probe`], [`redis_conn`] (the Redis client, shared with the leases), [`http`] (WebDAV and S3 through
//! opendal), `service` (the three operations over either), [`sign`] and [`keyfile`] (signed entries).

pub mod credentials;
pub mod http;
pub mod keyfile;
pub mod probe;
pub mod redis_conn;
mod service;
pub mod sign;
pub mod tls;
pub mod url;

pub use self::credentials::{Credentials, CredentialsError, Secret, CREDENTIALS_ENV};
pub use self::http::{S3Settings, DEFAULT_S3_REGION};
pub use self::tls::CA_ENV;
pub use self::url::{ParseRemoteUrlError, RemoteKind, RemoteUrl};

use crate::error::{Result, StoreError};
use crate::lease::Leases;
use crate::memo::MemoEntry;
use crate::objects::PutOutcome;
use crate::tier::{MemoTier, ObjectTier};
use crate::Digest;
use self::http::{Bounds, HttpService, S3Place};
use self::probe::Target;
use self::redis_conn::RedisConn;
use self::service::Service;
use self::tls::Tls;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The environment variable that names the remote tier when `--remote` is not given.
pub const REMOTE_ENV: &str = "TESSERA_REMOTE";

/// Format of the memo records on the server; a record of another format is not trusted. (The optional
/// `signature` field was added within format 1: older clients ignore it, and records without it read as
/// unsigned.)
pub const REMOTE_MEMO_FORMAT: u32 = 1;

/// How long connecting to the server and its first answer may take before the server counts as down, when
/// the caller does not say ([`RemoteOptions::timeout`]).
pub const DEFAULT_REMOTE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long one whole request may take once the server answered the probe: a request carries a whole object
/// (hundreds of MB for a large model's artifact), so this bounds a server that stops answering mid-run, not
/// a server that is down (the probe's shorter timeout catches that). Never less than the probe's timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How to use a remote.
#[derive(Clone, Debug)]
pub struct RemoteOptions {
    /// Read only: nothing is ever written to the server (also set by `?ro` in the URL).
    pub read_only: bool,
    /// How long connecting to the server (TLS handshake included), and its answer to the first (small)
    /// request, may take before the server counts as down and the tier is disabled for the rest of the process
    /// (`--remote-timeout-ms`; default [`DEFAULT_REMOTE_TIMEOUT`]). Also every new connection's connect timeout
    /// (the lease client's included). Each step of a request, which may carry a whole object, is bounded by the
    /// larger of this and 10 s.
    pub timeout: Duration,
    /// The credentials ([`Credentials::load`]: `--remote-credentials` or the environment). Default: none.
    pub credentials: Credentials,
    /// A PEM file of the CA certificates to trust instead of the system's (`--remote-ca`, [`CA_ENV`]): for a
    /// server whose certificate a private CA signed. Only with a TLS remote (`rediss://`, `https://`, an
    /// `https` S3 endpoint).
    pub ca_file: Option<PathBuf>,
    /// The S3 endpoint and region when the URL does not give them ([`S3Settings::from_env`]).
    pub s3: S3Settings,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions { read_only: false, timeout: DEFAULT_REMOTE_TIMEOUT, credentials: Credentials::default(), ca_file: None, s3: S3Settings::default() }
    }
}

/// What the remote tier did in this process (reports and tests).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteStats {
    /// The server, as configured.
    pub url: String,
    pub read_only: bool,
    /// Objects fetched, verified and written to the local store.
    pub objects_fetched: u64,
    pub bytes_fetched: u64,
    /// Objects asked for that the server did not have.
    pub objects_missing: u64,
    /// Objects the server returned whose content did not hash to their name: rejected, never served.
    pub objects_rejected: u64,
    /// Objects written to the server.
    pub objects_uploaded: u64,
    pub bytes_uploaded: u64,
    /// Memo entries taken from the server (each after its output was fetched and verified).
    pub memo_hits: u64,
    /// Memo lookups the server could not answer with an entry.
    pub memo_misses: u64,
    /// Memo entries on the server not trusted: undecodable, for another key, or naming an output that was
    /// missing, failed verification or had another size.
    pub memo_rejected: u64,
    /// Of `memo_rejected`: entries rejected because a signature from a trusted key was required and the
    /// entry was unsigned or its signature did not verify.
    #[serde(default)]
    pub memo_signature_rejected: u64,
    /// Memo entries written to the server.
    pub memo_uploaded: u64,
    /// Why the tier was disabled (the first error), if it was; after it nothing more was asked.
    pub disabled: Option<String>,
    /// Leases ([`crate::lease`]): taken on a miss before computing (`lease_taken`); found held by another
    /// machine, so this one waited (`lease_waits`); waits that ended with the holder's entry served
    /// (`lease_served`); waits that ended with the lease expired or released without an entry, so this
    /// machine took the work over (`lease_takeovers`); waits given up after the bound, computed anyway
    /// (`lease_timeouts`).
    #[serde(default)]
    pub lease_taken: u64,
    #[serde(default)]
    pub lease_waits: u64,
    #[serde(default)]
    pub lease_served: u64,
    #[serde(default)]
    pub lease_takeovers: u64,
    #[serde(default)]
    pub lease_timeouts: u64,
}

impl RemoteStats {
    /// Adds another run's counters (merged shard summaries); the first disable reason is kept.
    pub fn add(&mut self, o: &RemoteStats) {
        self.objects_fetched += o.objects_fetched;
        self.bytes_fetched += o.bytes_fetched;
        self.objects_missing += o.objects_missing;
        self.objects_rejected += o.objects_rejected;
        self.objects_uploaded += o.objects_uploaded;
        self.bytes_uploaded += o.bytes_uploaded;
        self.memo_hits += o.memo_hits;
        self.memo_misses += o.memo_misses;
        self.memo_rejected += o.memo_rejected;
        self.memo_signature_rejected += o.memo_signature_rejected;
        self.memo_uploaded += o.memo_uploaded;
        self.lease_taken += o.lease_taken;
        self.lease_waits += o.lease_waits;
        self.lease_served += o.lease_served;
        self.lease_takeovers += o.lease_takeovers;
        self.lease_timeouts += o.lease_timeouts;
        if self.disabled.is_none() {
            self.disabled.clone_from(&o.disabled);
        }
    }

    /// The warnings a report should show: a disabled tier, rejected objects or entries.
    pub fn warnings(&self) -> Vec<String> {
        let mut v = Vec::new();
        if let Some(why) = &self.disabled {
            // `why` names the server already.
            v.push(format!("remote tier disabled for the rest of this run after an error ({why}); the build went on with the local store"));
        }
        if self.objects_rejected > 0 {
            v.push(format!("remote tier {}: {} object(s) failed verification (their content does not hash to their name) and were recomputed, never used", self.url, self.objects_rejected));
        }
        if self.memo_rejected > 0 {
            v.push(format!("remote tier {}: {} memo entr(ies) were not trusted (undecodable, or their output was missing or failed verification) and were recomputed", self.url, self.memo_rejected));
        }
        if self.memo_signature_rejected > 0 {
            v.push(format!("remote tier {}: {} of them lacked a valid signature from a trusted key (unsigned, signed by another key, or altered)", self.url, self.memo_signature_rejected));
        }
        v
    }
}

/// One memo entry as the server holds it: with its stage and key, so that an entry copied to another
/// key is recognized and refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteMemo {
    pub format: u32,
    pub stage: String,
    pub key: String,
    pub output: String,
    pub size: u64,
    pub compute_micros: u64,
    pub recorded_unix: u64,
    /// A writer's signature over the entry ([`sign`]); absent in unsigned records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<sign::MemoSignature>,
}

/// A remote tier: one server, its client, and what it did.
pub struct Remote {
    url: RemoteUrl,
    read_only: bool,
    /// The client of the server's service.
    service: Service,
    /// What the probe checks.
    target: Target,
    disabled: AtomicBool,
    stats: Mutex<RemoteStats>,
    /// Objects the server returned corrupt: the next put overwrites them whether or not the server has them.
    bad: Mutex<BTreeSet<Digest>>,
    /// What this client signs with and which signers it requires ([`Remote::with_signing`]).
    signing: sign::SigningState,
    /// The lease client: Redis only, writable clients only, unless `lease=off` ([`crate::lease`]).
    leases: Option<Arc<Leases>>,
    /// The connect and first-answer timeout ([`RemoteOptions::timeout`]).
    timeout: Duration,
    /// The probe's verdict, made once, before the first request (`Err`: why the server counts as down).
    probed: std::sync::OnceLock<std::result::Result<(), String>>,
}

impl fmt::Debug for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Remote").field("url", &self.url.to_string()).field("read_only", &self.read_only).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Remote {
    /// A client for `url` (nothing is sent yet: the first request connects). Read-only when `opts` or the
    /// URL's `?ro` says so. Errors: credentials or a CA file that cannot be used, or that do not fit the URL's
    /// service (a token for Redis, a CA file for a remote without TLS).
    pub fn new(url: &RemoteUrl, opts: RemoteOptions) -> Result<Remote> {
        let err = |what: &str, detail: String| StoreError::Remote { url: url.url.clone(), what: what.into(), detail };
        let creds = |e: credentials::CredentialsError| err("reading the credentials", e.to_string());
        let bounds = Bounds { connect: opts.timeout, request: REQUEST_TIMEOUT.max(opts.timeout) };
        let place = match &url.kind {
            RemoteKind::S3 { endpoint, region, virtual_host, .. } => {
                Some(S3Place::resolve(endpoint.as_deref(), region.as_deref(), *virtual_host, &opts.s3).map_err(|e| err("configuring the client", e))?)
            }
            _ => None,
        };
        let uses_tls = place.as_ref().map_or(url.kind.tls(), |p| p.endpoint.starts_with("https:"));
        let tls = match (&opts.ca_file, uses_tls) {
            (_, true) => Some(Tls::new(opts.ca_file.as_deref()).map_err(|e| err("setting up TLS", e))?),
            (Some(f), false) => {
                return Err(err(
                    "setting up TLS",
                    format!("a CA file is given ({}), but this remote is not encrypted: use rediss:// or https:// (an https endpoint for S3), or drop --remote-ca / {CA_ENV}", f.display()),
                ))
            }
            (None, false) => None,
        };
        let probe_tls = tls.as_ref().map(|t| (t.client_config(), t.trust_hint()));
        // (The service, what the probe checks, whether credentials are sent.)
        let (service, target, authenticates) = match &url.kind {
            RemoteKind::Redis { host, port, db, .. } => {
                let (user, password) = opts.credentials.for_redis().map_err(creds)?;
                let authenticates = user.is_some() || password.is_some();
                let conn = RedisConn::new(host, *port, tls.as_ref(), *db, user, password, bounds.connect, bounds.request).map_err(|e| err("configuring the client", e))?;
                let target = Target { host: host.clone(), port: *port, tls: probe_tls, request: b"PING\r\n".to_vec() };
                (Service::Redis(Arc::new(conn)), target, authenticates)
            }
            RemoteKind::Webdav { endpoint, root } => {
                let auth = opts.credentials.for_webdav().map_err(creds)?;
                let service = HttpService::webdav(endpoint, root, &auth, tls.as_ref(), bounds).map_err(|e| err("configuring the client", e))?;
                let u = ::url::Url::parse(endpoint).map_err(|e| err("configuring the client", e.to_string()))?;
                let host = u.host_str().unwrap_or_default().trim_matches(['[', ']']);
                let default_port = if u.scheme() == "https" { 443 } else { 80 };
                let target = Target::http(host, u.port().unwrap_or(default_port), default_port, probe_tls, &http::encode_path(root));
                (Service::Http(service), target, auth != credentials::WebdavAuth::None)
            }
            RemoteKind::S3 { bucket, root, .. } => {
                let place = place.clone().ok_or_else(|| err("configuring the client", "the S3 endpoint was not resolved".into()))?;
                let key = opts.credentials.for_s3().map_err(creds)?;
                let service = HttpService::s3(bucket, root, &place, key.as_ref(), tls.as_ref(), bounds).map_err(|e| err("configuring the client", e))?;
                let target = place.probe_target(bucket, tls.as_ref()).map_err(|e| err("configuring the client", e))?;
                (Service::Http(service), target, key.is_some())
            }
        };
        if target.tls.is_none() && authenticates {
            tracing::warn!(remote = %url.url, "credentials are sent to this remote unencrypted (no TLS): anyone on the network path can read them; use rediss:// or https://");
        }
        let read_only = opts.read_only || url.read_only;
        // Read-only clients never take leases: they write nothing, so no one could wait on their entry.
        let leases = match (&service, url.lease) {
            (Service::Redis(conn), Some(expiry)) if !read_only => Some(Arc::new(Leases::new(&url.url, conn.clone(), expiry))),
            _ => None,
        };
        let stats = RemoteStats { url: url.url.clone(), read_only, ..Default::default() };
        Ok(Remote {
            url: url.clone(),
            read_only,
            service,
            target,
            disabled: AtomicBool::new(false),
            stats: Mutex::new(stats),
            bad: Mutex::default(),
            signing: sign::SigningState::default(),
            leases,
            timeout: opts.timeout,
            probed: std::sync::OnceLock::new(),
        })
    }

    /// Checks, once per process and before the first request, that the server is there: connects (within
    /// the timeout, TLS handshake included) and sends one small request whose answer must start within the
    /// timeout; then that it takes the credentials (one authenticated request that changes nothing). A server
    /// found down, or refusing the credentials, disables the tier (one warning) and every request returns this
    /// error from then on. Concurrent first requests wait for the one probe.
    fn ready(&self) -> Result<()> {
        match self.probed.get_or_init(|| probe::probe(&self.target, self.timeout).and_then(|()| self.service.check_access())) {
            Ok(()) => Ok(()),
            Err(why) => {
                let e = StoreError::Remote { url: self.url.url.clone(), what: "connecting".into(), detail: why.clone() };
                self.disable(&e);
                Err(e)
            }
        }
    }

    /// Probes the server now (what the first request does): `Err` names why it counts as down. For tests
    /// and diagnostics; the tier itself probes once on its own.
    pub fn probe(&self) -> Result<()> {
        self.ready()
    }

    pub fn url(&self) -> &RemoteUrl {
        &self.url
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Whether requests are still sent (false after the first failure).
    pub fn is_enabled(&self) -> bool {
        !self.disabled.load(Ordering::Acquire)
    }

    /// Whether writes are sent: enabled and not read-only.
    pub fn is_writable(&self) -> bool {
        self.is_enabled() && !self.read_only
    }

    /// The lease client, while the tier is writable and the service has atomic leases (Redis).
    pub fn leases(&self) -> Option<&Arc<Leases>> {
        self.leases.as_ref().filter(|_| self.is_writable())
    }

    /// Whether `d` came back corrupt earlier in this run (a poll does not reject its entry twice).
    pub(crate) fn is_known_bad(&self, d: &Digest) -> bool {
        lock(&self.bad).contains(d)
    }

    /// Counts one lease event (see [`RemoteStats`]'s `lease_*` counters).
    pub(crate) fn count_lease(&self, f: impl FnOnce(&mut RemoteStats)) {
        f(&mut lock(&self.stats));
    }

    /// What the tier did so far.
    pub fn stats(&self) -> RemoteStats {
        lock(&self.stats).clone()
    }

    fn object_path(d: &Digest) -> String {
        format!("objects/{}", d.to_hex())
    }

    fn memo_path(stage: &str, key: &Digest) -> String {
        // Stage names are identifiers; anything else is encoded so that a name cannot reach another path.
        let safe: String = stage
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c.to_string() } else { format!("%{:02x}", c as u32) })
            .collect();
        format!("memo/{safe}/{}", key.to_hex())
    }

    fn failed(&self, what: String, detail: String) -> StoreError {
        StoreError::Remote { url: self.url.url.clone(), what, detail }
    }

    /// Disables the tier after a failure: one warning, the first error kept in the stats.
    pub fn disable(&self, e: &StoreError) {
        if !self.disabled.swap(true, Ordering::AcqRel) {
            let msg = e.to_string();
            tracing::info!(remote = %self.url.url, error = %msg, "remote tier disabled for the rest of this run");
            lock(&self.stats).disabled = Some(msg);
        }
    }

    /// Counts (and warns about) an object the server returned corrupt, so the next put overwrites it.
    pub fn reject_object(&self, e: &StoreError) {
        tracing::info!(remote = %self.url.url, error = %e, "remote object failed verification; recomputing it");
        if let StoreError::RemoteCorrupt { digest, .. } = e {
            lock(&self.bad).insert(*digest);
        }
        lock(&self.stats).objects_rejected += 1;
    }

    /// Counts (and warns about) a memo entry that is not trusted.
    pub fn reject_memo(&self, stage: &str, key: &Digest, why: &str) {
        tracing::info!(remote = %self.url.url, stage, key = %key, why, "remote memo entry not trusted; recomputing");
        lock(&self.stats).memo_rejected += 1;
    }

    pub(crate) fn count_fetched(&self, bytes: u64) {
        let mut s = lock(&self.stats);
        s.objects_fetched += 1;
        s.bytes_fetched += bytes;
    }

    pub(crate) fn count_object_missing(&self) {
        lock(&self.stats).objects_missing += 1;
    }

    pub(crate) fn count_memo(&self, hit: bool) {
        let mut s = lock(&self.stats);
        if hit {
            s.memo_hits += 1;
        } else {
            s.memo_misses += 1;
        }
    }

    /// Whether the server holds an object (no content check: reads verify).
    pub fn has_object(&self, d: &Digest) -> Result<bool> {
        self.ready()?;
        let path = Self::object_path(d);
        self.service.exists(&path).map_err(|e| self.failed(format!("checking for object {d} at {path}"), e))
    }

    /// Reads an object and verifies it: `Ok(None)` when the server does not have it,
    /// [`StoreError::RemoteCorrupt`] when its content does not hash to `d`.
    pub fn get_object(&self, d: &Digest) -> Result<Option<Vec<u8>>> {
        self.ready()?;
        let path = Self::object_path(d);
        let Some(bytes) = self.service.read(&path).map_err(|e| self.failed(format!("reading object {d} at {path}"), e))? else { return Ok(None) };
        let actual = Digest::of(&bytes);
        if actual != *d {
            return Err(StoreError::RemoteCorrupt { url: self.url.url.clone(), digest: *d, actual, size: bytes.len() as u64 });
        }
        Ok(Some(bytes))
    }

    /// Writes an object whose digest the caller computed (the store's put, which just hashed it).
    pub fn put_object(&self, d: &Digest, bytes: &[u8]) -> Result<()> {
        self.check_writable("put object")?;
        self.ready()?;
        let path = Self::object_path(d);
        self.service.write(&path, bytes).map_err(|e| self.failed(format!("writing object {d} to {path}"), e))?;
        lock(&self.bad).remove(d);
        let mut s = lock(&self.stats);
        s.objects_uploaded += 1;
        s.bytes_uploaded += bytes.len() as u64;
        Ok(())
    }

    /// Writes an object unless the server already has a copy not known to be bad (one existence check).
    pub fn ensure_object(&self, d: &Digest, bytes: &[u8]) -> Result<()> {
        let known_bad = lock(&self.bad).contains(d);
        if known_bad || !self.has_object(d)? {
            self.put_object(d, bytes)?;
        }
        Ok(())
    }

    /// Reads a memo entry. `Ok(None)`: none on the server. [`StoreError::RemoteBadEntry`]: a record that
    /// cannot be trusted as an entry for this stage and key. [`StoreError::RemoteUntrustedEntry`]: trusted
    /// keys are configured and the record has no valid signature from one of them.
    pub fn get_memo(&self, stage: &str, key: &Digest) -> Result<Option<MemoEntry>> {
        self.ready()?;
        let path = Self::memo_path(stage, key);
        let Some(bytes) = self.service.read(&path).map_err(|e| self.failed(format!("reading memo entry {path}"), e))? else { return Ok(None) };
        let bad = |why: String| StoreError::RemoteBadEntry { url: self.url.url.clone(), stage: stage.into(), key: *key, why };
        let rec: RemoteMemo = serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a memo record: {e}")))?;
        if rec.format != REMOTE_MEMO_FORMAT {
            return Err(bad(format!("format {} (this tessera reads {REMOTE_MEMO_FORMAT})", rec.format)));
        }
        if rec.stage != stage || rec.key != key.to_hex() {
            return Err(bad(format!("it is the record of stage '{}' key {}", rec.stage, rec.key)));
        }
        let output: Digest = rec.output.parse().map_err(|e| bad(format!("its output: {e}")))?;
        let entry = rec.entry(output);
        self.check_memo_signature(stage, key, &entry, rec.signature.as_ref())?;
        Ok(Some(entry))
    }

    /// Writes a memo entry (the caller wrote its output object first), signed when this client has a key.
    pub fn put_memo(&self, stage: &str, key: &Digest, entry: &MemoEntry) -> Result<()> {
        self.check_writable("memo record")?;
        self.ready()?;
        let path = Self::memo_path(stage, key);
        let rec = RemoteMemo {
            format: REMOTE_MEMO_FORMAT,
            stage: stage.into(),
            key: key.to_hex(),
            output: entry.output.to_hex(),
            size: entry.size,
            compute_micros: entry.compute_micros,
            recorded_unix: entry.recorded_unix,
            signature: self.sign_memo(stage, key, entry),
        };
        let bytes = serde_json::to_vec(&rec).map_err(|e| StoreError::Remote { url: self.url.url.clone(), what: format!("encoding memo entry {path}"), detail: e.to_string() })?;
        self.service.write(&path, &bytes).map_err(|e| self.failed(format!("writing memo entry {path}"), e))?;
        lock(&self.stats).memo_uploaded += 1;
        Ok(())
    }

    fn check_writable(&self, op: &'static str) -> Result<()> {
        if self.read_only {
            return Err(StoreError::RemoteReadOnly { url: self.url.url.clone(), op });
        }
        Ok(())
    }
}

impl ObjectTier for Remote {
    fn contains(&self, d: &Digest) -> bool {
        self.has_object(d).unwrap_or(false)
    }
    /// Buffers the stream (objects go to the server in one request), hashes it, writes it.
    fn put_stream(&self, r: &mut dyn Read) -> Result<PutOutcome> {
        let mut bytes = Vec::new();
        r.read_to_end(&mut bytes).map_err(|e| StoreError::Remote { url: self.url.url.clone(), what: "reading the stream to upload".into(), detail: e.to_string() })?;
        let digest = Digest::of(&bytes);
        self.put_object(&digest, &bytes)?;
        Ok(PutOutcome { digest, size: bytes.len() as u64, already_present: false })
    }
    fn get_stream(&self, d: &Digest, w: &mut dyn Write) -> Result<Option<u64>> {
        match self.get_object(d)? {
            None => Ok(None),
            Some(bytes) => {
                w.write_all(&bytes).map_err(|e| StoreError::Remote { url: self.url.url.clone(), what: format!("writing out object {d}"), detail: e.to_string() })?;
                Ok(Some(bytes.len() as u64))
            }
        }
    }
}

impl MemoTier for Remote {
    fn lookup(&self, stage: &str, key: &Digest) -> Result<Option<MemoEntry>> {
        self.get_memo(stage, key)
    }
    fn record(&self, stage: &str, key: &Digest, entry: &MemoEntry) -> Result<()> {
        self.put_memo(stage, key, entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port nothing listens on (bound, then closed) on 127.0.0.1.
    fn closed_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    #[test]
    fn credentials_and_ca_files_that_do_not_fit_the_service_are_refused() {
        let with = |url: &str, credentials: Credentials, ca_file: Option<PathBuf>| {
            Remote::new(&url.parse().unwrap(), RemoteOptions { credentials, ca_file, ..Default::default() }).map(|_| ()).unwrap_err().to_string()
        };
        let token = Credentials { token: Some(Secret::new("hunter2")), ..Default::default() };
        let e = with("rediss://127.0.0.1:1", token.clone(), None);
        assert!(e.contains("TESSERA_REMOTE_TOKEN") && !e.contains("hunter2"), "{e}");
        let e = with("s3://b?endpoint=http://127.0.0.1:1", token, None);
        assert!(e.contains("AWS_ACCESS_KEY_ID"), "{e}");
        let e = with("redis://127.0.0.1:1", Credentials::default(), Some("/etc/hostname".into()));
        assert!(e.contains("not encrypted") && e.contains("rediss://"), "{e}");
        let e = with("https://127.0.0.1:1/c", Credentials::default(), Some("/nonexistent/ca.pem".into()));
        assert!(e.contains("CA file /nonexistent/ca.pem: cannot read it"), "{e}");
    }

    fn remote(url: &str, timeout_ms: u64) -> Remote {
        Remote::new(&url.parse().unwrap(), RemoteOptions { timeout: Duration::from_millis(timeout_ms), ..Default::default() }).unwrap()
    }

    #[test]
    fn a_closed_port_is_down_at_once_and_disables_the_tier() {
        for scheme in ["redis", "http"] {
            let url = format!("{scheme}://127.0.0.1:{}", closed_port());
            let r = remote(&url, 1000);
            let start = std::time::Instant::now();
            let e = r.has_object(&Digest::of(b"x")).unwrap_err().to_string();
            // Refused: no waiting for the timeout, and no retries (a client library's pool may retry a refused
            // connection until its request timeout).
            assert!(start.elapsed() < Duration::from_millis(500), "{url}: {:?}", start.elapsed());
            assert!(e.contains(&url) && e.contains("cannot connect to 127.0.0.1"), "{e}");
            assert!(!r.is_enabled(), "{url}: a server found down disables the tier");
            assert_eq!(r.stats().disabled.as_deref(), Some(e.as_str()));
            assert_eq!(r.stats().warnings().len(), 1);
            // The verdict is kept: later requests are refused at once with the same error, nothing is sent.
            let start = std::time::Instant::now();
            assert_eq!(r.get_memo("lower", &Digest::of(b"k")).unwrap_err().to_string(), e);
            assert!(start.elapsed() < Duration::from_millis(50));
        }
    }

    #[test]
    fn a_server_that_accepts_but_never_answers_is_down_after_the_timeout() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        // Accepts every connection and holds it open without a byte of answer.
        let held = Arc::new(Mutex::new(Vec::new()));
        let h = held.clone();
        std::thread::spawn(move || {
            for s in listener.incoming().flatten() {
                lock(&h).push(s);
            }
        });
        for scheme in ["redis", "http"] {
            let url = format!("{scheme}://127.0.0.1:{port}");
            let r = remote(&url, 300);
            let start = std::time::Instant::now();
            let e = r.get_object(&Digest::of(b"x")).unwrap_err().to_string();
            let took = start.elapsed();
            assert!(took >= Duration::from_millis(290) && took < Duration::from_millis(900), "{url}: {took:?}");
            assert!(e.contains("did not answer within 300 ms"), "{e}");
            assert!(!r.is_enabled());
        }
        assert!(lock(&held).len() >= 2, "the probes connected");
    }

    #[test]
    fn a_server_that_answers_passes_the_probe() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        std::thread::spawn(move || {
            for mut s in listener.incoming().flatten() {
                let mut buf = [0u8; 256];
                let n = s.read(&mut buf).unwrap_or(0);
                lock(&s2).push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let _ = s.write_all(b"+PONG\r\n");
            }
        });
        for (url, sent) in [(format!("redis://127.0.0.1:{port}/2"), "PING\r\n"), (format!("http://127.0.0.1:{port}/cache%20dir"), "OPTIONS /cache%20dir/ HTTP/1.1\r\n")] {
            let r = remote(&url, 1000);
            // The probe alone: this stand-in answers one line, not the service's whole protocol.
            probe::probe(&r.target, r.timeout).unwrap();
            assert!(r.is_enabled());
            assert!(lock(&seen).last().unwrap().starts_with(sent), "{:?}", lock(&seen));
        }
    }

    #[test]
    fn memo_paths_cannot_escape() {
        let k = Digest::of(b"k");
        assert_eq!(Remote::memo_path("lower", &k), format!("memo/lower/{}", k.to_hex()));
        assert_eq!(Remote::memo_path("../x", &k), format!("memo/%2e%2e%2fx/{}", k.to_hex()));
    }
}
