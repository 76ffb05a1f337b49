//! The Redis client of the remote tier, shared by its objects and memo entries and by the leases
//! ([`crate::lease`]): the `redis` crate's synchronous connections, TLS through rustls (`rediss://`, a private
//! CA from [`Tls`]), an ACL user and password (or a password alone), a connect timeout that also bounds the
//! handshake and authentication, and a read/write timeout on every request. Connections are pooled: the tier
//! serves many threads at once (the zoo compiles models in parallel).

use super::credentials::Secret;
use super::tls::Tls;
use std::sync::Mutex;
use std::time::Duration;

/// Idle connections kept for reuse; more are opened while more threads ask at once, and closed after.
const MAX_IDLE: usize = 16;

/// A Redis server's client.
pub struct RedisConn {
    client: redis::Client,
    idle: Mutex<Vec<redis::Connection>>,
    connect_timeout: Duration,
    request_timeout: Duration,
    /// Whether a user or password is sent (messages about refused credentials say so).
    authenticates: bool,
}

impl std::fmt::Debug for RedisConn {
    // Not derived: the client's connection info holds the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConn").field("server", &self.client.get_connection_info().addr.to_string()).finish()
    }
}

impl RedisConn {
    /// A client for the server at `host:port`, database `db` (nothing is sent yet). `tls`: the connection is
    /// encrypted, trusting what it names.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        host: &str,
        port: u16,
        tls: Option<&Tls>,
        db: i64,
        user: Option<String>,
        password: Option<Secret>,
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> Result<RedisConn, String> {
        let addr = match tls {
            Some(_) => redis::ConnectionAddr::TcpTls { host: host.to_string(), port, insecure: false, tls_params: None },
            None => redis::ConnectionAddr::Tcp(host.to_string(), port),
        };
        let authenticates = user.is_some() || password.is_some();
        let info = redis::ConnectionInfo {
            addr,
            redis: redis::RedisConnectionInfo { db, username: user, password: password.map(|p| p.expose().to_string()), protocol: redis::ProtocolVersion::RESP2 },
        };
        let client = match tls {
            Some(t) => redis::Client::build_with_tls(info, t.redis_certificates()),
            None => redis::Client::open(info),
        }
        .map_err(|e| format!("configuring the Redis client: {e}"))?;
        Ok(RedisConn { client, idle: Mutex::new(Vec::new()), connect_timeout, request_timeout, authenticates })
    }

    /// Runs one command on a pooled connection (opened, authenticated and given its database if none is idle);
    /// a connection that failed is dropped, not pooled. Errors say what went wrong in words (refused
    /// credentials, a command the ACL user may not run) without any credential.
    pub fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, String> {
        let pooled = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => self.connect().map_err(|e| self.describe(e))?,
        };
        let out = cmd.query(&mut conn);
        if out.is_ok() {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < MAX_IDLE {
                idle.push(conn);
            }
        }
        out.map_err(|e| self.describe(e))
    }

    fn connect(&self) -> redis::RedisResult<redis::Connection> {
        let c = self.client.get_connection_with_timeout(self.connect_timeout)?;
        c.set_read_timeout(Some(self.request_timeout))?;
        c.set_write_timeout(Some(self.request_timeout))?;
        Ok(c)
    }

    fn describe(&self, e: redis::RedisError) -> String {
        let code = e.code().unwrap_or_default();
        if e.kind() == redis::ErrorKind::AuthenticationFailed || code == "WRONGPASS" {
            format!("the server refused the credentials ({e})")
        } else if code == "NOAUTH" && !self.authenticates {
            format!("the server requires authentication and none was given ({e}): set TESSERA_REMOTE_USER and TESSERA_REMOTE_PASSWORD, or a credentials file")
        } else if code == "NOPERM" {
            format!("the server's ACL does not let this user run the command ({e}): the user needs at least +get +set +exists (+eval for leases) on the tier's keys")
        } else if e.is_timeout() {
            format!("no answer within {} ms ({e})", self.request_timeout.max(self.connect_timeout).as_millis())
        } else {
            e.to_string()
        }
    }
}
