//! Leases in the remote tier: "I am computing (stage, key); wait for my memo entry", so that machines
//! sharing one remote execute each stage output once in total.
//!
//! A lease is a Redis key `tessera-lease/<stage>/<64 hex key>` holding a token unique to its holder,
//! created atomically only if absent (`SET key token NX PX expiry`): of two machines asking at once,
//! exactly one gets it. It expires on its own, so a holder that dies mid-work (killed, machine lost)
//! blocks the others for at most one expiry; a live holder renews it every expiry/3 from a heartbeat
//! thread. Renewal and release go through small Lua scripts that touch the key only while it still holds
//! the holder's token, so a holder that lost its lease (it expired and another took it over) can never
//! extend or delete the new holder's lease.
//!
//! Only Redis: opendal 0.55 offers no conditional create on its Redis or WebDAV services, and nginx's
//! DAV module ignores `If-None-Match: *` on PUT (it overwrites; checked against the real server), so a
//! WebDAV remote has no lease that would be atomic and runs without one (machines may then compute the
//! same output at once, as before leases: the outputs are identical, only time is spent twice).
//!
//! Leases go through the tier's own Redis client ([`RedisConn`]: its pooled connections, TLS, credentials and
//! timeouts), as the tier's objects and memo entries do.

use crate::error::{Result, StoreError};
use crate::remote::redis_conn::RedisConn;
use crate::Digest;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The lease expiry when the URL does not say (`?lease=`).
pub const DEFAULT_LEASE_EXPIRY: Duration = Duration::from_secs(30);

/// Renews the lease if it still holds our token; 1 when renewed, 0 when it is gone or someone else's.
const RENEW: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
/// Deletes the lease if it still holds our token.
const RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

/// A lease client for one Redis server.
pub struct Leases {
    /// The remote URL, as messages name it.
    url: String,
    /// The tier's client (connections opened within the tier's timeout, each request bounded).
    conn: Arc<RedisConn>,
    pub expiry: Duration,
    /// Makes tokens unique within the process.
    counter: AtomicU64,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases").field("url", &self.url).field("expiry", &self.expiry).finish()
    }
}

impl Leases {
    /// A lease client on the tier's Redis client `conn`; nothing is sent yet.
    pub fn new(url: &str, conn: Arc<RedisConn>, expiry: Duration) -> Leases {
        Leases { url: url.into(), conn, expiry, counter: AtomicU64::new(0) }
    }

    fn lease_key(stage: &str, key: &Digest) -> String {
        // Same encoding as the memo paths: a stage name cannot reach another key.
        let safe: String = stage
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c.to_string() } else { format!("%{:02x}", c as u32) })
            .collect();
        format!("tessera-lease/{safe}/{}", key.to_hex())
    }

    /// Runs one command, naming the server and the lease key on failure.
    fn run<T: redis::FromRedisValue>(&self, what: &str, lease: &str, cmd: &redis::Cmd) -> Result<T> {
        self.conn.query(cmd).map_err(|detail| StoreError::Remote { url: self.url.clone(), what: format!("{what} lease {lease}"), detail })
    }

    /// Tries to take the lease on (stage, key): `Some(token)` when this caller now holds it, `None` when
    /// someone else does.
    pub fn try_acquire(&self, stage: &str, key: &Digest) -> Result<Option<String>> {
        let lease = Self::lease_key(stage, key);
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let token = format!("{}-{}-{nanos}", std::process::id(), self.counter.fetch_add(1, Ordering::Relaxed));
        let ms = self.expiry.as_millis().max(1) as u64;
        let set: Option<String> = self.run("taking", &lease, redis::cmd("SET").arg(&lease).arg(&token).arg("NX").arg("PX").arg(ms))?;
        Ok(set.map(|_| token))
    }

    /// Extends a held lease by one expiry; false when it is no longer ours (it expired and was taken over).
    pub fn renew(&self, stage: &str, key: &Digest, token: &str) -> Result<bool> {
        let lease = Self::lease_key(stage, key);
        let ms = self.expiry.as_millis().max(1) as u64;
        let n: i64 = self.run("renewing", &lease, redis::cmd("EVAL").arg(RENEW).arg(1).arg(&lease).arg(token).arg(ms))?;
        Ok(n == 1)
    }

    /// Gives a held lease back (a no-op when it is no longer ours).
    pub fn release(&self, stage: &str, key: &Digest, token: &str) -> Result<()> {
        let lease = Self::lease_key(stage, key);
        let _: i64 = self.run("releasing", &lease, redis::cmd("EVAL").arg(RELEASE).arg(1).arg(&lease).arg(token))?;
        Ok(())
    }
}

/// A lease this process holds, renewed by a heartbeat thread until dropped; dropping it releases it.
pub struct LeaseGuard {
    leases: Arc<Leases>,
    stage: String,
    key: Digest,
    token: String,
    stop: Arc<(Mutex<bool>, std::sync::Condvar)>,
    heartbeat: Option<std::thread::JoinHandle<()>>,
    /// Set by the heartbeat when a renewal found the lease gone or failed (reports and tests).
    lost: Arc<AtomicBool>,
}

impl LeaseGuard {
    /// Starts renewing `token`'s lease every expiry/3.
    pub fn hold(leases: Arc<Leases>, stage: &str, key: Digest, token: String) -> LeaseGuard {
        let stop = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let lost = Arc::new(AtomicBool::new(false));
        let heartbeat = {
            let (leases, stage, token, stop, lost) = (leases.clone(), stage.to_string(), token.clone(), stop.clone(), lost.clone());
            std::thread::Builder::new()
                .name("tessera-lease".into())
                .spawn(move || {
                    let every = leases.expiry / 3;
                    let (m, cv) = &*stop;
                    let mut stopped = m.lock().unwrap_or_else(|e| e.into_inner());
                    loop {
                        let (g, _) = cv.wait_timeout(stopped, every).unwrap_or_else(|e| e.into_inner());
                        stopped = g;
                        if *stopped {
                            return;
                        }
                        match leases.renew(&stage, &key, &token) {
                            Ok(true) => {}
                            Ok(false) => {
                                // Someone took it over after it expired (this process stalled): keep computing;
                                // the output is the same whoever records it.
                                tracing::warn!(stage, key = %key, "remote lease lost before the work finished");
                                lost.store(true, Ordering::Relaxed);
                                return;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "renewing a remote lease failed");
                                lost.store(true, Ordering::Relaxed);
                                return;
                            }
                        }
                    }
                })
                .ok()
        };
        LeaseGuard { leases, stage: stage.to_string(), key, token, stop, heartbeat, lost }
    }

    /// Whether a renewal found the lease gone (or failed).
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    fn stop_heartbeat(&mut self) {
        {
            let (m, cv) = &*self.stop;
            *m.lock().unwrap_or_else(|e| e.into_inner()) = true;
            cv.notify_all();
        }
        if let Some(h) = self.heartbeat.take() {
            let _ = h.join();
        }
    }

    /// Stops renewing without releasing, as a holder that died would (tests of the takeover path).
    pub fn abandon(mut self) {
        self.stop_heartbeat();
        self.token.clear();
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.stop_heartbeat();
        if self.token.is_empty() {
            return; // abandoned
        }
        if let Err(e) = self.leases.release(&self.stage, &self.key, &self.token) {
            // It expires on its own; the waiters lose at most one expiry.
            tracing::warn!(error = %e, "releasing a remote lease failed");
        }
    }
}

/// Parses a lease expiry: `500ms`, `2s`, or a number of seconds.
pub fn parse_expiry(s: &str) -> std::result::Result<Duration, String> {
    let d = if let Some(ms) = s.strip_suffix("ms") {
        ms.parse::<u64>().map(Duration::from_millis)
    } else {
        s.strip_suffix('s').unwrap_or(s).parse::<u64>().map(Duration::from_secs)
    }
    .map_err(|_| format!("lease expiry '{s}' is not a duration (e.g. 30s, 2000ms)"))?;
    if d < Duration::from_millis(100) {
        return Err(format!("lease expiry '{s}' is below 100ms"));
    }
    Ok(d)
}

/// What [`Store::claim`] decided for a (stage, key) that missed locally and on the remote.
pub enum Claim {
    /// This process holds the lease: compute, record, then drop the guard (which releases it).
    Held(LeaseGuard),
    /// Another machine computed it while this one waited: its entry, trusted and recorded locally.
    Served(crate::MemoEntry),
    /// No lease (no remote, read-only, WebDAV, `lease=off`, the tier disabled, or the wait bound passed):
    /// compute as without leases.
    Unleased,
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Claim::Held(_) => f.write_str("Held"),
            Claim::Served(e) => write!(f, "Served({})", e.output),
            Claim::Unleased => f.write_str("Unleased"),
        }
    }
}

/// How long a waiter waits for a live holder (one that keeps renewing) before computing anyway: a bound
/// against a holder that hangs, generous because a stage may legitimately take minutes.
const WAIT_BOUND_EXPIRIES: u32 = 60;

impl crate::Store {
    /// Called by the memo driver on a local and remote miss, before computing (stage, key): takes the
    /// remote lease, or waits for the machine that holds it, polling for its memo entry, and takes the
    /// work over when the lease expires (its holder died) or is released without an entry (its holder
    /// failed). A server error disables the tier, as everywhere, and the caller computes unleased.
    pub fn claim(&self, stage: &str, key: &Digest) -> Result<Claim> {
        let Some(r) = self.remote() else { return Ok(Claim::Unleased) };
        let Some(leases) = r.leases().cloned() else { return Ok(Claim::Unleased) };
        // Polls are one small GET each; a short interval keeps a waiter from lagging its holder by much.
        let poll = (leases.expiry / 10).clamp(Duration::from_millis(50), Duration::from_millis(250));
        let start = std::time::Instant::now();
        let mut waited = false;
        loop {
            match leases.try_acquire(stage, key) {
                Err(e) => {
                    r.disable(&e);
                    return Ok(Claim::Unleased);
                }
                Ok(Some(token)) => {
                    let guard = LeaseGuard::hold(leases, stage, *key, token);
                    // The last holder may have recorded its entry and released between our miss and now.
                    if let Some(entry) = self.poll_remote_entry(stage, key)? {
                        drop(guard);
                        r.count_lease(|s| s.lease_served += u64::from(waited));
                        return Ok(Claim::Served(entry));
                    }
                    r.count_lease(|s| {
                        s.lease_taken += 1;
                        s.lease_takeovers += u64::from(waited);
                    });
                    return Ok(Claim::Held(guard));
                }
                Ok(None) => {
                    if !waited {
                        waited = true;
                        r.count_lease(|s| s.lease_waits += 1);
                    }
                    if start.elapsed() > leases.expiry * WAIT_BOUND_EXPIRIES {
                        tracing::warn!(remote = %r.url().url, stage, key = %key, "gave up waiting for the remote lease's holder; computing here");
                        r.count_lease(|s| s.lease_timeouts += 1);
                        return Ok(Claim::Unleased);
                    }
                    std::thread::sleep(poll);
                    if let Some(entry) = self.poll_remote_entry(stage, key)? {
                        r.count_lease(|s| s.lease_served += 1);
                        return Ok(Claim::Served(entry));
                    }
                    if !r.is_enabled() {
                        return Ok(Claim::Unleased);
                    }
                }
            }
        }
    }

    /// The remote's entry for (stage, key) once one is there, trusted and recorded locally: a cheap
    /// read while there is none (no miss counted per poll), the full checked lookup once there is.
    fn poll_remote_entry(&self, stage: &str, key: &Digest) -> Result<Option<crate::MemoEntry>> {
        let Some(r) = self.remote().filter(|r| r.is_enabled()) else { return Ok(None) };
        match r.get_memo(stage, key) {
            Ok(None) => Ok(None),
            // An entry the caller's lookup just rejected (undecodable, unsigned or signed by an untrusted key,
            // or naming an output that came back corrupt) is still a miss: not counted, not warned again.
            Err(StoreError::RemoteBadEntry { .. } | StoreError::RemoteUntrustedEntry { .. }) => Ok(None),
            Ok(Some(e)) if r.is_known_bad(&e.output) => Ok(None),
            Err(e) => {
                r.disable(&e);
                Ok(None)
            }
            Ok(Some(_)) => self.remote_memo_lookup(stage, key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiries_parse() {
        assert_eq!(parse_expiry("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_expiry("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_expiry("1500ms").unwrap(), Duration::from_millis(1500));
        assert!(parse_expiry("fast").unwrap_err().contains("fast"));
        assert!(parse_expiry("10ms").unwrap_err().contains("below"));
    }

    #[test]
    fn lease_keys_cannot_escape() {
        let k = Digest::of(b"k");
        assert_eq!(Leases::lease_key("../x", &k), format!("tessera-lease/%2e%2e%2fx/{}", k.to_hex()));
    }
}
