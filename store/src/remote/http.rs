//! The HTTP services of the remote tier, WebDAV and S3, through opendal's clients on an HTTP client this module
//! builds (reqwest: the tier's connect timeout, TLS through [`Tls`]), driven by a small tokio runtime the
//! service owns (opendal's blocking API runs on it).
//!
//! S3 is configured explicitly, never from opendal's own loading of `~/.aws` files, the environment or the EC2
//! metadata service: the endpoint, region and key are the ones [`S3Settings`] and the credentials give, so a
//! build's remote does not change with files it never named (and no request ever goes to a metadata address).

use super::credentials::{S3Key, WebdavAuth};
use super::probe::Target;
use super::tls::Tls;
use super::url::check_endpoint;
use std::time::Duration;

/// The S3 settings that come from the environment rather than the URL (the URL's options win): the endpoint
/// (`AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL`; none: AWS itself) and the region (`AWS_REGION`, else
/// `AWS_DEFAULT_REGION`; none: [`DEFAULT_S3_REGION`]). The standard names of the AWS tools.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct S3Settings {
    pub endpoint: Option<String>,
    pub region: Option<String>,
}

/// The region when neither the URL nor the environment names one (what S3-compatible servers expect too).
pub const DEFAULT_S3_REGION: &str = "us-east-1";

impl S3Settings {
    /// The settings of this process's environment (empty variables are unset).
    pub fn from_env() -> S3Settings {
        let get = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        S3Settings { endpoint: get("AWS_ENDPOINT_URL_S3").or_else(|| get("AWS_ENDPOINT_URL")), region: get("AWS_REGION").or_else(|| get("AWS_DEFAULT_REGION")) }
    }
}

/// Where an S3 remote is, once the URL's options and the settings are combined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct S3Place {
    /// The server (`https://HOST[:PORT]`), without the bucket.
    pub endpoint: String,
    pub region: String,
    pub virtual_host: bool,
}

impl S3Place {
    /// The URL's endpoint and region, else the settings', else AWS in the default region. Path-style addressing
    /// (`ENDPOINT/BUCKET/KEY`) with a custom endpoint, which S3-compatible servers take; virtual-host style
    /// (`BUCKET.ENDPOINT/KEY`) on AWS, or when the URL asks for it.
    pub fn resolve(endpoint: Option<&str>, region: Option<&str>, virtual_host: bool, settings: &S3Settings) -> Result<S3Place, String> {
        let region = region.or(settings.region.as_deref()).unwrap_or(DEFAULT_S3_REGION).to_string();
        let (endpoint, virtual_host) = match endpoint {
            Some(e) => (e.to_string(), virtual_host),
            None => match &settings.endpoint {
                Some(e) => (check_endpoint(e).map_err(|why| format!("AWS_ENDPOINT_URL: {why}"))?, virtual_host),
                None => (format!("https://s3.{region}.amazonaws.com"), true),
            },
        };
        Ok(S3Place { endpoint, region, virtual_host })
    }

    /// The server the probe checks: the endpoint's host, or `BUCKET.host` in virtual-host style.
    pub fn probe_target(&self, bucket: &str, tls: Option<&Tls>) -> Result<Target, String> {
        let u = url::Url::parse(&self.endpoint).map_err(|e| format!("endpoint {}: {e}", self.endpoint))?;
        let host = u.host_str().unwrap_or_default().trim_matches(['[', ']']).to_string();
        let port = u.port_or_known_default().unwrap_or(443);
        let default_port = if u.scheme() == "https" { 443 } else { 80 };
        let tls = if u.scheme() == "https" { tls.map(|t| (t.client_config(), t.trust_hint())) } else { None };
        Ok(if self.virtual_host { Target::http(&format!("{bucket}.{host}"), port, default_port, tls, "/") } else { Target::http(&host, port, default_port, tls, &format!("/{bucket}/")) })
    }
}

/// An opendal operator for one HTTP service, and the runtime it runs on.
pub(crate) struct HttpService {
    // Declared before the runtime: the operator's connections close while the runtime still runs.
    pub op: opendal::blocking::Operator,
    _runtime: tokio::runtime::Runtime,
}

/// The bounds of the HTTP client: connecting (`connect`, the tier's timeout) and every request's I/O
/// (`request`, which bounds a server that stops answering mid-run; objects can be large, so it bounds each
/// step of a transfer, not the whole of one).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    pub connect: Duration,
    pub request: Duration,
}

fn config_err(e: impl std::fmt::Display) -> String {
    format!("configuring the client: {e}")
}

impl HttpService {
    /// A WebDAV client for `endpoint` (`http(s)://HOST[:PORT]`), objects under `root`.
    pub fn webdav(endpoint: &str, root: &str, auth: &WebdavAuth, tls: Option<&Tls>, bounds: Bounds) -> Result<HttpService, String> {
        let mut b = opendal::services::Webdav::default().endpoint(endpoint).root(root);
        match auth {
            WebdavAuth::None => {}
            WebdavAuth::Basic(user, password) => b = b.username(user).password(password.expose()),
            WebdavAuth::Bearer(token) => b = b.token(token.expose()),
        }
        HttpService::finish(opendal::Operator::new(b).map_err(config_err)?, tls, bounds)
    }

    /// An S3 client for `bucket` at `place`, objects under `root`; anonymous without a key (a public bucket).
    pub fn s3(bucket: &str, root: &str, place: &S3Place, key: Option<&S3Key>, tls: Option<&Tls>, bounds: Bounds) -> Result<HttpService, String> {
        let mut b = opendal::services::S3::default()
            .bucket(bucket)
            .root(root)
            .endpoint(&place.endpoint)
            .region(&place.region)
            .disable_config_load()
            .disable_ec2_metadata();
        if place.virtual_host {
            b = b.enable_virtual_host_style();
        }
        match key {
            Some(k) => {
                b = b.access_key_id(&k.id).secret_access_key(k.secret.expose());
                if let Some(t) = &k.session_token {
                    b = b.session_token(t.expose());
                }
            }
            None => b = b.allow_anonymous(),
        }
        HttpService::finish(opendal::Operator::new(b).map_err(config_err)?, tls, bounds)
    }

    fn finish(builder: opendal::OperatorBuilder<impl opendal::raw::Access>, tls: Option<&Tls>, bounds: Bounds) -> Result<HttpService, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tessera-remote")
            .enable_all()
            .build()
            .map_err(|e| format!("starting the client's runtime: {e}"))?;
        let mut client = reqwest::Client::builder().connect_timeout(bounds.connect).read_timeout(bounds.request);
        if let Some(t) = tls {
            client = client.use_preconfigured_tls((*t.client_config()).clone());
        }
        let client = {
            let _guard = runtime.enter();
            client.build().map_err(config_err)?
        };
        let timeout = opendal::layers::TimeoutLayer::new().with_timeout(bounds.request).with_io_timeout(bounds.request);
        let op = builder.layer(opendal::layers::HttpClientLayer::new(opendal::raw::HttpClient::with(client))).layer(timeout).finish();
        let op = {
            let _guard = runtime.enter();
            opendal::blocking::Operator::new(op).map_err(config_err)?
        };
        Ok(HttpService { op, _runtime: runtime })
    }
}

/// A decoded path as it goes in a request line: percent-encoded except for unreserved characters and `/`.
pub(crate) fn encode_path(path: &str) -> String {
    path.bytes().map(|b| if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

/// An opendal error in words: refused credentials said plainly, other errors as opendal gives them (the
/// request's URI and the response's status and headers, never the request's: no credential is in them).
pub(crate) fn describe(e: &opendal::Error) -> String {
    let text = e.to_string();
    let status = ["401", "403"].into_iter().find(|s| text.contains(&format!("status: {s}")));
    // S3's codes for an unknown key or a signature made with the wrong secret (in the body of answers that have one).
    let bad_key = ["InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidClientTokenId"].into_iter().find(|c| text.contains(c));
    match (e.kind(), status, bad_key) {
        (_, Some("401"), _) => "the server refused the credentials (HTTP 401 Unauthorized)".into(),
        (_, _, Some(code)) => format!("the server refused the credentials ({code})"),
        (opendal::ErrorKind::PermissionDenied, _, _) | (_, Some(_), _) => {
            format!("the server refused the request (HTTP 403 Forbidden: wrong or missing credentials, or they may not do this): {text}")
        }
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_places_resolve_url_then_environment_then_aws() {
        let env = S3Settings { endpoint: Some("http://minio.internal:9000".into()), region: Some("eu-west-1".into()) };
        let p = S3Place::resolve(None, None, false, &env).unwrap();
        assert_eq!(p, S3Place { endpoint: "http://minio.internal:9000".into(), region: "eu-west-1".into(), virtual_host: false });
        let p = S3Place::resolve(Some("https://127.0.0.1:9443"), Some("us-west-2"), false, &env).unwrap();
        assert_eq!((p.endpoint.as_str(), p.region.as_str()), ("https://127.0.0.1:9443", "us-west-2"));
        let p = S3Place::resolve(None, None, false, &S3Settings::default()).unwrap();
        assert_eq!(p, S3Place { endpoint: "https://s3.us-east-1.amazonaws.com".into(), region: "us-east-1".into(), virtual_host: true });
        let t = p.probe_target("builds", None).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("builds.s3.us-east-1.amazonaws.com", 443));
        let t = S3Place::resolve(None, None, false, &env).unwrap().probe_target("builds", None).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("minio.internal", 9000));
        assert!(String::from_utf8(t.request).unwrap().starts_with("OPTIONS /builds/ HTTP/1.1\r\nHost: minio.internal:9000\r\n"));
        let bad = S3Settings { endpoint: Some("https://k:secret@h".into()), region: None };
        let e = S3Place::resolve(None, None, false, &bad).unwrap_err();
        assert!(e.contains("AWS_ENDPOINT_URL") && !e.contains("secret"), "{e}");
    }
}
