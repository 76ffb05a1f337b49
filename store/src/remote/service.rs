//! The three operations the tier needs from a server, over either client: Redis (the `redis` crate) or an HTTP
//! service (opendal's WebDAV or S3). Paths are the tier's layout (`objects/<hex>`, `memo/<stage>/<hex>`); Redis
//! keys are those paths under `tessera/`, as opendal's Redis service (which earlier versions used) named them,
//! so a cache filled by an earlier tessera is still read.

use super::http::{describe, HttpService};
use super::redis_conn::RedisConn;
use std::sync::Arc;

/// The prefix of the tier's Redis keys.
const REDIS_PREFIX: &str = "tessera/";

/// The name the access check asks for: an object name no blake3 digest is expected to have.
const ACCESS_CHECK: &str = "objects/0000000000000000000000000000000000000000000000000000000000000000";

pub(crate) enum Service {
    Redis(Arc<RedisConn>),
    Http(HttpService),
}

impl Service {
    /// Whether the server holds `path`.
    pub fn exists(&self, path: &str) -> Result<bool, String> {
        match self {
            Service::Redis(c) => c.query::<i64>(redis::cmd("EXISTS").arg(format!("{REDIS_PREFIX}{path}"))).map(|n| n > 0),
            Service::Http(h) => h.op.exists(path).map_err(|e| describe(&e)),
        }
    }

    /// `path`'s bytes; None when the server does not have it.
    pub fn read(&self, path: &str) -> Result<Option<Vec<u8>>, String> {
        match self {
            Service::Redis(c) => c.query::<Option<Vec<u8>>>(redis::cmd("GET").arg(format!("{REDIS_PREFIX}{path}"))),
            Service::Http(h) => match h.op.read(path) {
                Ok(b) => Ok(Some(b.to_vec())),
                Err(e) if e.kind() == opendal::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(describe(&e)),
            },
        }
    }

    /// Writes `path` (replacing what was there).
    pub fn write(&self, path: &str, bytes: &[u8]) -> Result<(), String> {
        match self {
            Service::Redis(c) => c.query::<()>(redis::cmd("SET").arg(format!("{REDIS_PREFIX}{path}")).arg(bytes)),
            Service::Http(h) => h.op.write(path, bytes.to_vec()).map(|_| ()).map_err(|e| describe(&e)),
        }
    }

    /// One authenticated request that changes nothing, so that refused credentials show before the first real
    /// request (an error naming them rather than a failed read): Redis `PING` on a new connection (which
    /// authenticates and selects the database first), or a read of one object that is not there (a GET, which
    /// needs no listing permission, and whose refusal has a body that says why: S3 names a wrong key or
    /// signature there); its answer does not matter, only that the server took the request.
    pub fn check_access(&self) -> Result<(), String> {
        match self {
            Service::Redis(c) => c.query::<String>(&redis::cmd("PING")).map(|_| ()),
            Service::Http(h) => match h.op.read(ACCESS_CHECK) {
                Ok(_) => Ok(()),
                Err(e) if e.kind() == opendal::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(describe(&e)),
            },
        }
    }
}
