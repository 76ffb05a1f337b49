//! TLS for the remote tier (`rediss://`, `https://`, an `https` S3 endpoint): rustls with the ring provider, and
//! which certificate authorities are trusted.
//!
//! By default the operating system's CA certificates (`rustls-native-certs`, which also honours
//! `SSL_CERT_FILE` and `SSL_CERT_DIR`). With a CA file (`--remote-ca FILE`, `TESSERA_REMOTE_CA`: PEM, one or
//! more certificates) only the authorities in it are trusted, as with `curl --cacert` and `redis-cli --cacert`:
//! a private CA's server, and no other. Server names are always verified; there is no "insecure" mode.
//!
//! One [`Tls`] serves the three clients that connect: the probe ([`super::probe`]) and the HTTP client
//! (reqwest) take its [`rustls::ClientConfig`]; the Redis client takes the CA file's PEM, which the `redis`
//! crate turns into the same trust (its own configuration, built with the process's default provider, which
//! [`Tls::new`] makes ring).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The environment variable for `--remote-ca`.
pub const CA_ENV: &str = "TESSERA_REMOTE_CA";

/// The TLS configuration of one remote.
#[derive(Clone)]
pub struct Tls {
    config: Arc<rustls::ClientConfig>,
    /// The CA file and its PEM, when one was given (None: the system's roots).
    ca: Option<(PathBuf, Vec<u8>)>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("ca_file", &self.ca.as_ref().map(|(p, _)| p)).finish()
    }
}

/// The crypto provider every TLS client here uses.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Tls {
    /// Trusts the authorities in `ca_file` (PEM), or the system's when None. `Err` names the file and why.
    pub fn new(ca_file: Option<&Path>) -> Result<Tls, String> {
        // The redis crate builds its rustls configuration with the process default provider; make it ring
        // (a no-op when one is installed already), so that a second provider linked in by some other crate can
        // never leave it without one.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut roots = rustls::RootCertStore::empty();
        let ca = match ca_file {
            Some(path) => {
                let bad = |why: String| format!("CA file {}: {why}", path.display());
                let pem = std::fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
                let certs: Vec<CertificateDer<'static>> =
                    CertificateDer::pem_slice_iter(&pem).collect::<Result<_, _>>().map_err(|e| bad(format!("not PEM certificates: {e}")))?;
                if certs.is_empty() {
                    return Err(bad("no certificate in it (expected PEM '-----BEGIN CERTIFICATE-----' blocks)".into()));
                }
                for c in certs {
                    roots.add(c).map_err(|e| bad(format!("a certificate in it cannot be a trust anchor: {e}")))?;
                }
                Some((path.to_path_buf(), pem))
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                // Unreadable entries in the system's store are skipped (as the redis crate does not); an empty
                // store shows at the first handshake, whose error says which certificate was not trusted.
                roots.add_parsable_certificates(found.certs);
                None
            }
        };
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS configuration: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls { config: Arc::new(config), ca })
    }

    /// The client configuration (the probe's and the HTTP client's).
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        self.config.clone()
    }

    /// The CA file, if one was given.
    pub fn ca_file(&self) -> Option<&Path> {
        self.ca.as_ref().map(|(p, _)| p.as_path())
    }

    /// The Redis client's certificates: the CA file's PEM as its only root, or None for the system's.
    pub(crate) fn redis_certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates { client_tls: None, root_cert: self.ca.as_ref().map(|(_, pem)| pem.clone()) }
    }

    /// What to add to a TLS error that is about the server's certificate: where trust comes from.
    pub fn trust_hint(&self) -> String {
        match self.ca_file() {
            Some(f) => format!("this client trusts only the CA certificates in {}", f.display()),
            None => format!("this client trusts the system's CA certificates; for a private CA, name its certificate with --remote-ca or {CA_ENV}"),
        }
    }
}
