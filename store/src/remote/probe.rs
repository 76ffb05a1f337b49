//! Whether a server is there, within a deadline, before any client library gets to wait or retry on it: a TCP
//! connection, the TLS handshake where the remote uses TLS, and the start of an answer to one small request
//! (Redis: an inline `PING`, answered `+PONG` or an error such as `-NOAUTH`, either way a live server; HTTP:
//! `OPTIONS`, any status line). Credentials are not sent here: the tier checks them with its first real
//! request ([`super::Remote`]'s `ready`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to probe.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    /// A name or an IP address (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    /// The TLS configuration when the connection is encrypted, and what to say when the server's certificate
    /// is not trusted.
    pub tls: Option<(Arc<rustls::ClientConfig>, String)>,
    /// The request whose answer must start within the deadline.
    pub request: Vec<u8>,
}

impl Target {
    /// An HTTP server's target: `OPTIONS path` with its `Host`.
    pub fn http(host: &str, port: u16, default_port: u16, tls: Option<(Arc<rustls::ClientConfig>, String)>, path: &str) -> Target {
        let bracketed = if host.contains(':') { format!("[{host}]") } else { host.to_string() };
        let authority = if port == default_port { bracketed } else { format!("{bracketed}:{port}") };
        let request = format!("OPTIONS {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n").into_bytes();
        Target { host: host.to_string(), port, tls, request }
    }
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock)
}

/// Probes `target`, all within `timeout` from the start. `Err` says why the server counts as down, naming the
/// address and, for a timeout, how long was waited.
pub(crate) fn probe(target: &Target, timeout: Duration) -> Result<(), String> {
    let start = Instant::now();
    let ms = timeout.as_millis();
    let left = || timeout.saturating_sub(start.elapsed()).max(Duration::from_millis(1));
    let addrs: Vec<SocketAddr> = (target.host.as_str(), target.port).to_socket_addrs().map_err(|e| format!("cannot resolve {}: {e}", target.host))?.collect();
    let mut last = format!("{} resolves to no address", target.host);
    let mut conn = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, left()) {
            Ok(s) => {
                conn = Some((s, *a));
                break;
            }
            Err(e) if timed_out(&e) => last = format!("no connection to {a} within {ms} ms (the remote timeout)"),
            Err(e) => last = format!("cannot connect to {a}: {e}"),
        }
        if start.elapsed() >= timeout {
            break;
        }
    }
    let Some((tcp, a)) = conn else { return Err(last) };
    let silent = || format!("{a} accepted the connection but did not answer within {ms} ms (the remote timeout)");
    tcp.set_write_timeout(Some(left())).and_then(|()| tcp.set_read_timeout(Some(left()))).map_err(|e| format!("connecting to {a}: {e}"))?;
    let mut answer = [0u8; 64];
    let mut exchange = |s: &mut dyn ReadWrite| -> std::io::Result<usize> {
        s.write_all(&target.request)?;
        s.flush()?;
        s.read(&mut answer)
    };
    let io_failed = |e: std::io::Error| if timed_out(&e) { silent() } else { format!("talking to {a}: {e}") };
    let read = match &target.tls {
        None => exchange(&mut { tcp }).map_err(io_failed),
        Some((config, hint)) => {
            let name = rustls::pki_types::ServerName::try_from(target.host.clone()).map_err(|e| format!("'{}' cannot be a TLS server name: {e}", target.host))?;
            let client = rustls::ClientConnection::new(config.clone(), name).map_err(|e| format!("TLS with {a}: {e}"))?;
            let mut stream = rustls::StreamOwned::new(client, tcp);
            // The handshake runs inside the first write and read, under the socket's timeouts.
            exchange(&mut stream).map_err(|e| match tls_error(&e) {
                Some(t @ rustls::Error::InvalidCertificate(_)) => format!("the TLS handshake with {a} failed: {t} ({hint})"),
                Some(t) => format!("the TLS handshake with {a} failed: {t}"),
                None => io_failed(e),
            })
        }
    };
    match read? {
        0 => Err(format!("{a} closed the connection without answering")),
        _ => Ok(()),
    }
}

/// A stream the probe writes its request to and reads the answer from (plain TCP or TLS).
trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// The rustls error inside an I/O error, if it is one.
fn tls_error(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_targets_carry_their_host_header() {
        let t = Target::http("::1", 8443, 443, None, "/cache/");
        assert_eq!(String::from_utf8(t.request).unwrap(), "OPTIONS /cache/ HTTP/1.1\r\nHost: [::1]:8443\r\nConnection: close\r\n\r\n");
        let t = Target::http("dav.example", 443, 443, None, "/");
        assert!(String::from_utf8(t.request).unwrap().contains("Host: dav.example\r\n"));
    }

    #[test]
    fn a_plain_server_on_a_tls_remote_fails_the_handshake_within_the_timeout() {
        // A server that answers in clear text where TLS is expected (a wrong port, or TLS not enabled on it).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for mut s in listener.incoming().flatten() {
                let _ = s.write_all(b"+PONG\r\n");
            }
        });
        let tls = super::super::tls::Tls::new(None).unwrap();
        let t = Target { host: "127.0.0.1".into(), port, tls: Some((tls.client_config(), tls.trust_hint())), request: b"PING\r\n".to_vec() };
        let start = Instant::now();
        let e = probe(&t, Duration::from_millis(500)).unwrap_err();
        assert!(start.elapsed() < Duration::from_millis(600), "{:?}", start.elapsed());
        assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
    }
}
