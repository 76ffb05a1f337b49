//! Remote URLs: which service, where, and how to use it, parsed by the `url` crate (the WHATWG URL parser)
//! and then checked against what each service takes.
//!
//! - `redis://HOST[:PORT][/DB]`, `rediss://…` (TLS); port 6379 when not given.
//! - `http://HOST[:PORT][/PATH]`, `https://…` (TLS): a WebDAV server, objects under PATH.
//! - `s3://BUCKET[/PREFIX]`: an S3-compatible object store, objects under PREFIX; the endpoint and region come
//!   from the options below or the standard environment ([`super::S3Settings`]).
//!
//! Options follow `?`, joined by `&`: `ro` (or `read-only`) makes the client read-only; on Redis,
//! `lease=DURATION` (`30s`, `2000ms`) sets the lease expiry (default [`DEFAULT_LEASE_EXPIRY`]) and `lease=off`
//! takes no leases (the other services have no leases: `lease=off` is accepted there, an expiry is refused);
//! on S3, `endpoint=URL` (an `http(s)://HOST[:PORT]` server), `region=NAME`, and `virtual-host` (address the
//! bucket as a host name, `BUCKET.ENDPOINT`; the default with a custom endpoint is path style, `ENDPOINT/BUCKET`).
//!
//! **No credentials in a URL.** A URL is shown in messages, reports, logs and `ps`, so one carrying a user or
//! password (`redis://user:secret@host`) is refused, and the error shows it with its user part masked; the
//! credentials go in the environment or a credentials file ([`super::credentials`]).

use crate::lease::DEFAULT_LEASE_EXPIRY;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The Redis port when a `redis://` or `rediss://` URL names none (Redis's own default, TLS or not).
pub const DEFAULT_REDIS_PORT: u16 = 6379;

/// Which service a remote URL names, and where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoteKind {
    /// `redis://` or `rediss://` (`tls`). `host` is a name or an IP address (IPv6 without brackets).
    Redis { host: String, port: u16, tls: bool, db: i64 },
    /// `http://` or `https://`: a WebDAV server (PUT, GET, PROPFIND, MKCOL). `endpoint` is the scheme and
    /// authority (`https://cache:8443`), `root` the folder on it, decoded, with a `/` at each end.
    Webdav { endpoint: String, root: String },
    /// `s3://BUCKET[/PREFIX]`: `root` is the prefix, decoded, with a `/` at each end; `endpoint` and `region`
    /// as the URL's options gave them (None: from the environment or the defaults, see [`super::S3Settings`]).
    S3 { bucket: String, root: String, endpoint: Option<String>, region: Option<String>, virtual_host: bool },
}

impl RemoteKind {
    /// Whether the connection to the server is encrypted (TLS).
    pub fn tls(&self) -> bool {
        match self {
            RemoteKind::Redis { tls, .. } => *tls,
            RemoteKind::Webdav { endpoint, .. } => endpoint.starts_with("https:"),
            // Decided by the endpoint, which may come from the environment: see `S3Settings::resolve`.
            RemoteKind::S3 { endpoint, .. } => endpoint.as_deref().is_none_or(|e| e.starts_with("https:")),
        }
    }

    /// The service's name in messages.
    pub fn service(&self) -> &'static str {
        match self {
            RemoteKind::Redis { .. } => "Redis",
            RemoteKind::Webdav { .. } => "WebDAV",
            RemoteKind::S3 { .. } => "S3",
        }
    }
}

/// A parsed remote URL (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteUrl {
    /// The URL as given, less its options (`?…`): what messages name. It never carries credentials.
    pub url: String,
    pub kind: RemoteKind,
    /// `?ro` was given.
    pub read_only: bool,
    /// The lease expiry (`?lease=`); None: `lease=off`, or a service without leases (WebDAV, S3).
    pub lease: Option<Duration>,
}

/// A remote URL that cannot be used, with why. `url` is the URL as given less its options, with any user and
/// password masked (`redis://***@host`): the error itself never carries a secret.
#[derive(Debug, thiserror::Error)]
#[error("remote URL '{url}': {reason} (expected redis[s]://HOST[:PORT][/DB], http[s]://HOST[:PORT][/PATH] or s3://BUCKET[/PREFIX], optionally with ?ro)")]
pub struct ParseRemoteUrlError {
    pub url: String,
    pub reason: String,
}

/// `s` less its options and fragment, with the user part of its authority masked: what an error may show of a
/// URL that may carry a secret (before or after it parses).
pub fn redact(s: &str) -> String {
    let base = s.split(['?', '#']).next().unwrap_or_default();
    let Some((scheme, rest)) = base.split_once("://") else { return base.to_string() };
    let end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    match authority.rfind('@') {
        Some(at) => format!("{scheme}://***@{}{path}", &authority[at + 1..]),
        None => base.to_string(),
    }
}

/// Where a credential goes instead of the URL (the error that refuses one says so).
const CREDENTIALS_HINT: &str = "credentials do not belong in the URL, which messages, reports and process lists show: \
     put them in the environment (TESSERA_REMOTE_USER and TESSERA_REMOTE_PASSWORD, TESSERA_REMOTE_TOKEN; for S3 \
     AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY) or in a credentials file of mode 0600 named by \
     --remote-credentials / TESSERA_REMOTE_CREDENTIALS";

impl FromStr for RemoteUrl {
    type Err = ParseRemoteUrlError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: String| ParseRemoteUrlError { url: redact(s), reason };
        if !s.contains("://") {
            return Err(bad("no scheme".into()));
        }
        let u = url::Url::parse(s).map_err(|e| bad(format!("not a URL: {e}")))?;
        // Before anything else, so that no later message can carry the secret.
        if !u.username().is_empty() || u.password().is_some() {
            return Err(bad(CREDENTIALS_HINT.into()));
        }
        if u.fragment().is_some() {
            return Err(bad("a fragment ('#…') means nothing here".into()));
        }
        let host = match u.host() {
            Some(url::Host::Domain(d)) if !d.is_empty() => d.to_string(),
            Some(url::Host::Ipv4(a)) => a.to_string(),
            Some(url::Host::Ipv6(a)) => a.to_string(),
            _ => return Err(bad("no host".into())),
        };
        let opts = Options::parse(&u).map_err(bad)?;
        let scheme = u.scheme();
        let kind = match scheme {
            "redis" | "rediss" => {
                let db = u.path().trim_matches('/');
                let db = if db.is_empty() { 0 } else { db.parse::<i64>().map_err(|_| bad(format!("'{db}' is not a database number")))? };
                if db < 0 {
                    return Err(bad("the database number must not be negative".into()));
                }
                RemoteKind::Redis { host, port: u.port().unwrap_or(DEFAULT_REDIS_PORT), tls: scheme == "rediss", db }
            }
            "http" | "https" => {
                // Scheme and authority, as normalized by the parser (a default port dropped).
                let endpoint = u[..url::Position::BeforePath].to_string();
                RemoteKind::Webdav { endpoint, root: folder(u.path()).map_err(bad)? }
            }
            "s3" => {
                if u.port().is_some() {
                    return Err(bad("an s3:// URL names a bucket, not a server: give the server as ?endpoint=https://HOST:PORT (or AWS_ENDPOINT_URL)".into()));
                }
                if !host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')) || host.len() > 255 {
                    return Err(bad(format!("'{host}' is not a bucket name")));
                }
                RemoteKind::S3 { bucket: host, root: folder(u.path()).map_err(bad)?, endpoint: opts.endpoint.clone(), region: opts.region.clone(), virtual_host: opts.virtual_host }
            }
            other => return Err(bad(format!("unknown scheme '{other}'"))),
        };
        opts.check_for(&kind).map_err(bad)?;
        let lease = match kind {
            RemoteKind::Redis { .. } => opts.lease.unwrap_or(Some(DEFAULT_LEASE_EXPIRY)),
            _ => None,
        };
        let url = s.split(['?', '#']).next().unwrap_or_default().to_string();
        Ok(RemoteUrl { url, kind, read_only: opts.read_only, lease })
    }
}

impl fmt::Display for RemoteUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)?;
        if self.read_only {
            f.write_str("?ro")?;
        }
        Ok(())
    }
}

/// The options after `?`, as given (checked against the service by [`Options::check_for`]).
#[derive(Default)]
struct Options {
    read_only: bool,
    /// `lease=`: Some(None) is `off`.
    lease: Option<Option<Duration>>,
    endpoint: Option<String>,
    region: Option<String>,
    virtual_host: bool,
}

impl Options {
    fn parse(u: &url::Url) -> Result<Options, String> {
        let mut o = Options::default();
        for (k, v) in u.query_pairs() {
            match (k.as_ref(), v.as_ref()) {
                ("ro" | "read-only", "") => o.read_only = true,
                ("lease", "off") => o.lease = Some(None),
                ("lease", d) => o.lease = Some(Some(crate::lease::parse_expiry(d)?)),
                ("endpoint", e) => o.endpoint = Some(check_endpoint(e)?),
                ("region", r) if !r.is_empty() && r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') => o.region = Some(r.to_string()),
                ("region", r) => return Err(format!("'{r}' is not a region name")),
                ("virtual-host", "") => o.virtual_host = true,
                // The option's name only: an unknown option's value could be anything, a secret included.
                (k, _) => return Err(format!("unknown option '{k}' (options: ro, lease=DURATION|off on Redis, endpoint=URL, region=NAME and virtual-host on S3)")),
            }
        }
        Ok(o)
    }

    /// Refuses options the URL's service does not take (rather than ignoring what the user asked for).
    fn check_for(&self, kind: &RemoteKind) -> Result<(), String> {
        let s3 = matches!(kind, RemoteKind::S3 { .. });
        if !s3 && (self.endpoint.is_some() || self.region.is_some() || self.virtual_host) {
            return Err("endpoint=, region= and virtual-host are options of s3:// URLs".into());
        }
        if let (Some(Some(_)), false) = (self.lease, matches!(kind, RemoteKind::Redis { .. })) {
            return Err(format!(
                "leases need Redis (an atomic create-if-absent with an expiry); this {} remote runs without them, so lease=DURATION cannot apply (lease=off is accepted)",
                kind.service()
            ));
        }
        Ok(())
    }
}

/// An S3 endpoint (`?endpoint=` or `AWS_ENDPOINT_URL`): `http(s)://HOST[:PORT]`, no credentials, no path. Returns
/// it normalized (scheme and authority).
pub fn check_endpoint(e: &str) -> Result<String, String> {
    let u = url::Url::parse(e).map_err(|err| format!("endpoint '{}' is not a URL: {err}", redact(e)))?;
    if !u.username().is_empty() || u.password().is_some() {
        return Err(format!("endpoint '{}': {CREDENTIALS_HINT}", redact(e)));
    }
    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none_or(str::is_empty) {
        return Err(format!("endpoint '{}' is not an http:// or https:// server", redact(e)));
    }
    if u.path() != "/" || u.query().is_some() || u.fragment().is_some() {
        return Err(format!("endpoint '{}' must be a server only (http(s)://HOST[:PORT]), no path or options", redact(e)));
    }
    Ok(u[..url::Position::BeforePath].to_string())
}

/// A URL path as a folder: decoded, with a `/` at each end (`/` alone for the root). The parser already
/// resolved `.` and `..` segments.
fn folder(path: &str) -> Result<String, String> {
    let decoded = percent_decode(path).ok_or_else(|| format!("the path '{path}' is not valid percent-encoded UTF-8"))?;
    let inner = decoded.trim_matches('/');
    if inner.split('/').any(|seg| seg.is_empty() || seg == "." || seg == "..") && !inner.is_empty() {
        return Err(format!("the path '{path}' has an empty, '.' or '..' segment"));
    }
    Ok(if inner.is_empty() { "/".to_string() } else { format!("/{inner}/") })
}

/// Decodes `%XX` escapes; None when one is malformed or the result is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kind(s: &str) -> RemoteKind {
        s.parse::<RemoteUrl>().unwrap_or_else(|e| panic!("{s}: {e}")).kind
    }

    #[test]
    fn each_service_parses() {
        assert_eq!(kind("redis://127.0.0.1:6379/2"), RemoteKind::Redis { host: "127.0.0.1".into(), port: 6379, tls: false, db: 2 });
        assert_eq!(kind("rediss://cache.internal"), RemoteKind::Redis { host: "cache.internal".into(), port: 6379, tls: true, db: 0 });
        assert_eq!(kind("rediss://[::1]:6380/"), RemoteKind::Redis { host: "::1".into(), port: 6380, tls: true, db: 0 });
        assert_eq!(kind("http://127.0.0.1:8080/cache/tessera"), RemoteKind::Webdav { endpoint: "http://127.0.0.1:8080".into(), root: "/cache/tessera/".into() });
        assert_eq!(kind("https://dav.example:443/a%20b/"), RemoteKind::Webdav { endpoint: "https://dav.example".into(), root: "/a b/".into() });
        assert_eq!(kind("http://h:1"), RemoteKind::Webdav { endpoint: "http://h:1".into(), root: "/".into() });
        assert_eq!(
            kind("s3://builds/tessera/cache?endpoint=https://127.0.0.1:9000&region=eu-west-1"),
            RemoteKind::S3 { bucket: "builds".into(), root: "/tessera/cache/".into(), endpoint: Some("https://127.0.0.1:9000".into()), region: Some("eu-west-1".into()), virtual_host: false }
        );
        assert_eq!(kind("s3://b?virtual-host"), RemoteKind::S3 { bucket: "b".into(), root: "/".into(), endpoint: None, region: None, virtual_host: true });
        assert!(kind("rediss://h").tls() && !kind("redis://h").tls() && kind("https://h").tls() && !kind("s3://b?endpoint=http://h:9").tls() && kind("s3://b").tls());
    }

    #[test]
    fn options_parse_and_apply_to_their_service() {
        let r: RemoteUrl = "redis://cache:6379?ro".parse().unwrap();
        assert!(r.read_only);
        assert_eq!((r.url.as_str(), r.to_string().as_str(), r.lease), ("redis://cache:6379", "redis://cache:6379?ro", Some(DEFAULT_LEASE_EXPIRY)));
        let r: RemoteUrl = "rediss://cache:6379?lease=2s&ro".parse().unwrap();
        assert_eq!((r.lease, r.read_only), (Some(Duration::from_secs(2)), true));
        let r: RemoteUrl = "redis://cache:6379?lease=off".parse().unwrap();
        assert_eq!((r.lease, r.read_only), (None, false));
        // WebDAV and S3 have no leases: `off` is accepted, an expiry refused.
        assert_eq!("http://h:1/c?lease=off".parse::<RemoteUrl>().unwrap().lease, None);
        assert_eq!("s3://b?ro".parse::<RemoteUrl>().unwrap().lease, None);
    }

    #[test]
    fn bad_urls_say_why() {
        for (bad, says) in [
            ("ftp://h/x", "unknown scheme 'ftp'"),
            ("redis://h:1/x", "'x' is not a database number"),
            ("redis://h:1?rw", "unknown option 'rw'"),
            ("redis://h:1?lease=soon", "'soon' is not a duration"),
            ("http://h:1/c?lease=30s", "leases need Redis"),
            ("s3://b?lease=30s", "this S3 remote runs without them"),
            ("redis://h?region=x", "options of s3:// URLs"),
            ("s3://b:9000", "not a server"),
            ("s3://b?endpoint=ftp://h", "not an http:// or https:// server"),
            ("s3://b?endpoint=https://h/path", "server only"),
            ("s3://b?region=a/b", "not a region name"),
            ("cache:6379", "no scheme"),
            ("redis://:1", "not a URL"),
            ("http://h/c#x", "fragment"),
        ] {
            let e = bad.parse::<RemoteUrl>().unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(e.contains(bad.split(['?', '#']).next().unwrap()), "{bad}: the error names the URL: {e}");
        }
    }

    #[test]
    fn credentials_in_a_url_are_refused_and_never_shown() {
        for bad in [
            "redis://user:hunter2@h:1",
            "rediss://:hunter2@h",
            "https://hunter2@dav.example/c",
            "http://u:hunter2@h/c?ro",
            "s3://hunter2@bucket",
            "s3://b?endpoint=https://k:hunter2@h:9000",
        ] {
            let e = bad.parse::<RemoteUrl>().unwrap_err().to_string();
            assert!(!e.contains("hunter2"), "{bad}: {e}");
            assert!(e.contains("TESSERA_REMOTE_PASSWORD") && e.contains("--remote-credentials"), "{bad}: says where they go: {e}");
        }
        assert_eq!(redact("redis://u:p@h:1/2?ro"), "redis://***@h:1/2");
        assert_eq!(redact("http://h/a@b"), "http://h/a@b");
    }

    fn host() -> impl Strategy<Value = String> {
        prop_oneof![
            (1u8..=254, 0u8..=255, 0u8..=255, 1u8..=254).prop_map(|(a, b, c, d)| format!("{a}.{b}.{c}.{d}")),
            "[a-z][a-z0-9]{0,10}(\\.[a-z][a-z0-9]{0,6}){0,2}",
        ]
    }

    fn segments() -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec("[A-Za-z0-9_.-]{1,8}".prop_filter("not . or ..", |s| s != "." && s != ".."), 0..4)
    }

    proptest! {
        /// Every valid URL parses to the parts it was built from, and its Display parses back to the same.
        #[test]
        fn valid_urls_round_trip(
            host in host(), port in 1u16.., db in 0i64..64, tls: bool, ro: bool, segs in segments(),
            lease in prop::option::of(prop_oneof![Just("off".to_string()), (1u64..600).prop_map(|s| format!("{s}s"))]),
        ) {
            let path = segs.join("/");
            let q = |extra: Vec<String>| { let mut v = extra; if ro { v.push("ro".into()); } if v.is_empty() { String::new() } else { format!("?{}", v.join("&")) } };
            let redis = format!("redis{}://{host}:{port}/{db}{}", if tls { "s" } else { "" }, q(lease.iter().map(|l| format!("lease={l}")).collect()));
            let dav = format!("http{}://{host}:{port}/{path}{}", if tls { "s" } else { "" }, q(vec![]));
            let bucket = host.replace('.', "-");
            let s3 = format!("s3://{bucket}/{path}{}", q(vec![format!("endpoint=http://{host}:{port}")]));
            let s3_endpoint = url::Url::parse(&format!("http://{host}:{port}")).unwrap()[..url::Position::BeforePath].to_string();
            let root = if segs.is_empty() { "/".to_string() } else { format!("/{path}/") };
            for (s, want) in [
                (&redis, RemoteKind::Redis { host: host.clone(), port, tls, db }),
                (&dav, RemoteKind::Webdav { endpoint: url::Url::parse(&dav).unwrap()[..url::Position::BeforePath].to_string(), root: root.clone() }),
                (&s3, RemoteKind::S3 { bucket: bucket.clone(), root: root.clone(), endpoint: Some(s3_endpoint.clone()), region: None, virtual_host: false }),
            ] {
                let r: RemoteUrl = s.parse().map_err(|e| TestCaseError::fail(format!("{s}: {e}")))?;
                prop_assert_eq!(&r.kind, &want, "{}", s);
                prop_assert_eq!(r.read_only, ro);
                prop_assert_eq!(&r.url, s.split('?').next().unwrap());
                if !matches!(r.kind, RemoteKind::S3 { .. }) {
                    // Display keeps the parts and `ro` (not the lease or S3 options, which it does not show).
                    let again: RemoteUrl = r.to_string().parse().unwrap();
                    prop_assert_eq!((&again.kind, again.read_only), (&r.kind, r.read_only));
                }
            }
        }

        /// Whatever is put before the `@`, the error names neither the user nor the password.
        #[test]
        fn userinfo_never_reaches_an_error(user in "(usr[0-9]{4})?", pw in "[A-Za-z0-9!$&'()*+,;=._~-]{6,20}", scheme in prop::sample::select(vec!["redis", "rediss", "http", "https", "s3"])) {
            let s = format!("{scheme}://{user}:{pw}@host/x?ro");
            let e = s.parse::<RemoteUrl>().unwrap_err().to_string();
            prop_assert!(!e.contains(&pw), "{}", e);
            prop_assert!(user.is_empty() || !e.contains(&user), "{}", e);
        }

        /// No input makes the parser panic.
        #[test]
        fn arbitrary_input_never_panics(s in "\\PC{0,40}") {
            let _ = s.parse::<RemoteUrl>();
        }
    }
}
