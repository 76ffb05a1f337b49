//! Real cache servers for the remote-tier tests, started on 127.0.0.1 with a free port and killed on drop:
//! Redis (Debian's `redis-server`), nginx with its WebDAV modules (Debian's `nginx` and
//! `libnginx-mod-http-dav-ext`), both also over TLS with authentication (a Redis ACL user; WebDAV basic
//! authentication), and an S3-compatible server (moto's server mode, over TLS, with IAM authentication on),
//! which `scripts/test.sh` installs. TLS servers use a CA and a certificate for 127.0.0.1 that the test makes
//! ([`Pki`], rcgen); clients trust only that CA.
//!
//! A missing server fails the test with what to install. `TESSERA_SKIP_SERVER_TESTS=1` skips instead, for local
//! use only: under CI (`CI` set) it is ignored, so CI can never skip these tests silently.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tessera_store::remote::Secret;
use tessera_store::{Credentials, RemoteOptions};

/// The ports this process's live servers hold, killed ones waiting for `restart_empty` included. The lock is
/// held from choosing a port until the server listens on it: tests run in parallel threads, and without it two
/// tests could both be handed a port that was free between `free_port`'s probe and the first server's bind;
/// the second server then fails to bind, but `wait_listening` connects to the first and the test silently
/// shares another test's server (seen once in 100 full-suite runs: a "fresh" remote already held entries).
static PORTS: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// The port registry, whether or not a test panicked while holding it (a panic elsewhere must not fail
/// every later test).
fn ports() -> MutexGuard<'static, BTreeSet<u16>> {
    PORTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Finds a server binary, or decides the test must be skipped (None, locally and on request only).
/// Panics with what to install when it is missing.
pub fn server_binary(name: &str, package: &str) -> Option<PathBuf> {
    let dirs = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default();
    let found = dirs.iter().chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")].iter()).map(|d| d.join(name)).find(|p| p.is_file());
    if found.is_some() {
        return found;
    }
    missing(&format!("{name} not found (looked in PATH, /usr/sbin, /usr/bin)"), &format!("install Debian's `{package}` (`bash scripts/test.sh` does: apt-get install {package})"))
}

/// A server that is not installed: None (skip) locally when asked, else a panic saying what to install.
fn missing<T>(what: &str, install: &str) -> Option<T> {
    let skip = std::env::var("TESSERA_SKIP_SERVER_TESTS").is_ok_and(|v| v == "1");
    let ci = std::env::var_os("CI").is_some();
    if skip && !ci {
        eprintln!("SKIPPED: {what} and TESSERA_SKIP_SERVER_TESTS=1 (local use only)");
        return None;
    }
    panic!("{what}: the remote-tier tests need a real server; {install}, or set TESSERA_SKIP_SERVER_TESTS=1 to skip them locally");
}

/// A certificate authority and a server certificate it signed for 127.0.0.1 and localhost, as PEM files in a
/// folder: what a private CA gives a cache server.
pub struct Pki {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pki {
    pub fn new(dir: &Path) -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "tessera test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut server = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        server.distinguished_name.push(DnType::CommonName, "127.0.0.1");
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = server.signed_by(&key, &Issuer::new(ca, ca_key)).unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let pki = Pki { ca: dir.join("ca.pem"), cert: dir.join("server.pem"), key: dir.join("server.key") };
        std::fs::write(&pki.ca, ca_cert.pem()).unwrap();
        std::fs::write(&pki.cert, cert.pem()).unwrap();
        std::fs::write(&pki.key, key.serialize_pem()).unwrap();
        pki
    }
}

/// The ACL user and password of the authenticating servers.
pub const USER: &str = "tessera";
pub const PASSWORD: &str = "c0rrect-h0rse-battery";
/// The bucket the S3 server is given.
pub const BUCKET: &str = "tessera-test";

/// What a client must present to a server.
#[derive(Clone, Debug)]
enum Auth {
    None,
    /// An ACL user (Redis) or basic authentication (WebDAV).
    UserPassword,
    /// An S3 access key the server made, in this file of the server's folder (`ID SECRET`): a restart makes a new one.
    S3Key(PathBuf),
}

/// A port nothing listens on now and no live server of this process holds.
pub fn free_port() -> u16 {
    let held = ports();
    unused_port(&held)
}

fn unused_port(held: &BTreeSet<u16>) -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if !held.contains(&port) {
            return port;
        }
    }
}

fn wait_listening(port: u16, child: &mut Child, what: &str, log: &Path) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited ({status}) before listening on port {port}; its log {}:\n{}", log.display(), std::fs::read_to_string(log).unwrap_or_default());
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} did not listen on port {port} within 20 s; its log {}:\n{}", log.display(), std::fs::read_to_string(log).unwrap_or_default());
}

/// Starts a server in a folder on a port: its process and its log file.
type Starter = Box<dyn Fn(&Path, u16) -> (Child, PathBuf) + Send + Sync>;

/// One server process; stopped (SIGKILL) on drop.
pub struct Server {
    pub port: u16,
    pub url: String,
    /// The CA file that signed a TLS server's certificate.
    pub ca: Option<PathBuf>,
    auth: Auth,
    dir: tempfile::TempDir,
    child: Option<Child>,
    start: Starter,
    what: String,
}

impl Server {
    /// Redis with no persistence: a restart comes back empty.
    pub fn redis() -> Option<Server> {
        Server::redis_with(false)
    }

    /// Redis over TLS only (`--port 0`), its certificate signed by a CA the test made, with an ACL user
    /// ([`USER`], [`PASSWORD`]) allowed every command on the tier's keys (`~tessera*`: `tessera/…` and
    /// `tessera-lease/…`) and the `default` user off, so nothing unauthenticated gets through.
    pub fn redis_tls() -> Option<Server> {
        Server::redis_with(true)
    }

    fn redis_with(tls: bool) -> Option<Server> {
        let bin = server_binary("redis-server", "redis-server")?;
        let start = move |dir: &Path, port: u16| {
            let log = dir.join("redis.log");
            let mut cmd = Command::new(&bin);
            cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"]);
            if tls {
                let pki = Pki::new(&dir.join("pki"));
                cmd.args(["--port", "0", "--tls-port", &port.to_string(), "--tls-auth-clients", "no"]);
                cmd.arg("--tls-cert-file").arg(&pki.cert).arg("--tls-key-file").arg(&pki.key).arg("--tls-ca-cert-file").arg(&pki.ca);
                cmd.args(["--user", "default", "off", "--user", USER, "on", &format!(">{PASSWORD}"), "~tessera*", "+@all"]);
            } else {
                cmd.args(["--port", &port.to_string()]);
            }
            let child = cmd
                .arg("--dir")
                .arg(dir)
                .arg("--logfile")
                .arg(&log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
            (child, log)
        };
        let (scheme, auth) = if tls { ("rediss", Auth::UserPassword) } else { ("redis", Auth::None) };
        Some(Server::start("redis-server", Box::new(start), move |port| format!("{scheme}://127.0.0.1:{port}"), tls, auth))
    }

    /// nginx serving a WebDAV folder (PUT, DELETE, MKCOL from its dav module, PROPFIND from dav_ext), one
    /// process (`master_process off`). A restart comes back with an empty folder.
    pub fn webdav() -> Option<Server> {
        Server::webdav_with(false)
    }

    /// The same over TLS (https, a certificate signed by a CA the test made), behind basic authentication
    /// ([`USER`], [`PASSWORD`]; nginx's `auth_basic` with a password file).
    pub fn webdav_tls() -> Option<Server> {
        Server::webdav_with(true)
    }

    fn webdav_with(tls: bool) -> Option<Server> {
        let bin = server_binary("nginx", "nginx libnginx-mod-http-dav-ext")?;
        let module = ["/usr/lib/nginx/modules/ngx_http_dav_ext_module.so", "/usr/share/nginx/modules/ngx_http_dav_ext_module.so"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_file());
        let Some(module) = module else {
            server_binary("ngx_http_dav_ext_module.so (nginx's WebDAV PROPFIND module)", "libnginx-mod-http-dav-ext")?;
            return None;
        };
        let start = move |dir: &Path, port: u16| {
            let root = dir.join("dav");
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(&root).unwrap();
            std::fs::create_dir_all(dir.join("tmp")).unwrap();
            let log = dir.join("error.log");
            let (listen, secure) = if tls {
                let pki = Pki::new(&dir.join("pki"));
                // nginx's `{PLAIN}` scheme (RFC 2307 syntax): a test's throwaway password, in a file only the test reads.
                let htpasswd = dir.join("htpasswd");
                std::fs::write(&htpasswd, format!("{USER}:{{PLAIN}}{PASSWORD}\n")).unwrap();
                (
                    format!("127.0.0.1:{port} ssl"),
                    format!(
                        "ssl_certificate {};\n    ssl_certificate_key {};\n    auth_basic \"tessera cache\";\n    auth_basic_user_file {};\n",
                        pki.cert.display(),
                        pki.key.display(),
                        htpasswd.display()
                    ),
                )
            } else {
                (format!("127.0.0.1:{port}"), String::new())
            };
            let conf = format!(
                "load_module {module};\n\
                 daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {log} warn;\n\
                 events {{ worker_connections 256; }}\n\
                 http {{\n  access_log off;\n  client_body_temp_path {d}/tmp/body;\n  proxy_temp_path {d}/tmp/proxy;\n\
                   fastcgi_temp_path {d}/tmp/fastcgi;\n  uwsgi_temp_path {d}/tmp/uwsgi;\n  scgi_temp_path {d}/tmp/scgi;\n\
                   server {{\n    listen {listen};\n    {secure}    root {root};\n    client_max_body_size 0;\n\
                     location / {{\n      dav_methods PUT DELETE MKCOL COPY MOVE;\n      dav_ext_methods PROPFIND OPTIONS;\n\
                       create_full_put_path on;\n      dav_access user:rw group:r all:r;\n    }}\n  }}\n}}\n",
                module = module.display(),
                d = dir.display(),
                log = log.display(),
                root = root.display(),
            );
            let conf_path = dir.join("nginx.conf");
            std::fs::write(&conf_path, conf).unwrap();
            let child = Command::new(&bin)
                .arg("-p")
                .arg(dir)
                .arg("-c")
                .arg(&conf_path)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
            (child, log)
        };
        let (scheme, auth) = if tls { ("https", Auth::UserPassword) } else { ("http", Auth::None) };
        Some(Server::start("nginx", Box::new(start), move |port| format!("{scheme}://127.0.0.1:{port}/cache"), tls, auth))
    }

    /// An S3-compatible server: moto's server mode (`python3 -m moto.server`; the Python of
    /// `TESSERA_TEST_PYTHON`, else `python3`), over TLS with a certificate signed by a CA the test made. Once it
    /// listens, boto3 (which moto depends on) makes an IAM user with an access key allowed `s3:*` and the bucket
    /// [`BUCKET`], then turns moto's IAM authentication on: from then on every request must be signed with that
    /// key. Objects go under the prefix `cache/`; the endpoint is given as `?endpoint=`. A restart comes back empty,
    /// with the bucket and a new key.
    pub fn s3() -> Option<Server> {
        let python = std::env::var_os("TESSERA_TEST_PYTHON").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("python3"));
        let has_moto = Command::new(&python).args(["-c", "import moto.server, boto3, flask"]).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
        if !has_moto {
            return missing(
                &format!("moto's server mode not found ({} -c 'import moto.server, boto3, flask' failed)", python.display()),
                "install it with `pip install 'moto[server]'` into a virtual environment and name its python in TESSERA_TEST_PYTHON (`bash scripts/test.sh` does)",
            );
        }
        let start = move |dir: &Path, port: u16| {
            let pki = Pki::new(&dir.join("pki"));
            let log = dir.join("moto.log");
            let out = std::fs::File::create(&log).unwrap();
            let mut child = Command::new(&python)
                .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
                .arg("-c")
                .arg(&pki.cert)
                .arg("-k")
                .arg(&pki.key)
                .env("INITIAL_NO_AUTH_ACTION_COUNT", "inf")
                .stdin(Stdio::null())
                .stdout(out.try_clone().unwrap())
                .stderr(out)
                .spawn()
                .unwrap_or_else(|e| panic!("starting {} -m moto.server: {e}", python.display()));
            wait_listening(port, &mut child, "moto", &log);
            let setup = Command::new(&python)
                .args(["-c", MOTO_SETUP, &format!("https://127.0.0.1:{port}")])
                .arg(&pki.ca)
                .arg(BUCKET)
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert!(setup.status.success(), "setting up moto (user, key, bucket): {}\nits log:\n{}", String::from_utf8_lossy(&setup.stderr), std::fs::read_to_string(&log).unwrap_or_default());
            std::fs::write(dir.join("s3.key"), &setup.stdout).unwrap();
            (child, log)
        };
        Some(Server::start("moto", Box::new(start), |port| format!("s3://{BUCKET}/cache?endpoint=https://127.0.0.1:{port}"), true, Auth::S3Key(PathBuf::from("s3.key"))))
    }

    fn start(what: &str, start: Starter, url: impl Fn(u16) -> String, tls: bool, auth: Auth) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let mut held = ports();
        let port = unused_port(&held);
        let (mut child, log) = start(dir.path(), port);
        wait_listening(port, &mut child, what, &log);
        held.insert(port);
        drop(held);
        let ca = tls.then(|| dir.path().join("pki/ca.pem"));
        Server { port, url: url(port), ca, auth, dir, child: Some(child), start, what: what.to_string() }
    }

    /// The credentials a client of this server needs (none for the plain servers).
    pub fn credentials(&self) -> Credentials {
        match &self.auth {
            Auth::None => Credentials::default(),
            Auth::UserPassword => Credentials { user: Some(USER.into()), password: Some(Secret::new(PASSWORD)), ..Default::default() },
            Auth::S3Key(file) => {
                let text = std::fs::read_to_string(self.dir.path().join(file)).unwrap();
                let (id, secret) = text.trim().split_once(' ').expect("ID SECRET");
                Credentials { access_key_id: Some(id.into()), secret_access_key: Some(Secret::new(secret)), ..Default::default() }
            }
        }
    }

    /// The same with the secret replaced (a client with the wrong password or secret key).
    pub fn wrong_credentials(&self) -> Credentials {
        let mut c = self.credentials();
        let wrong = Some(Secret::new("not-the-password"));
        match self.auth {
            Auth::None => panic!("{}: takes no credentials", self.url),
            Auth::UserPassword => c.password = wrong,
            Auth::S3Key(_) => c.secret_access_key = wrong,
        }
        c
    }

    /// What a client of this server is configured with: its credentials, its CA.
    pub fn options(&self) -> RemoteOptions {
        RemoteOptions { credentials: self.credentials(), ca_file: self.ca.clone(), ..Default::default() }
    }

    /// A credentials file (mode 0600) in this server's folder, as `--remote-credentials` reads it.
    pub fn credentials_file(&self) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let c = self.credentials();
        let mut text = String::from("# written by the test\n");
        for (name, value) in [
            ("TESSERA_REMOTE_USER", c.user.clone()),
            ("TESSERA_REMOTE_PASSWORD", c.password.as_ref().map(|p| p.expose().to_string())),
            ("AWS_ACCESS_KEY_ID", c.access_key_id.clone()),
            ("AWS_SECRET_ACCESS_KEY", c.secret_access_key.as_ref().map(|p| p.expose().to_string())),
        ] {
            if let Some(v) = value {
                text.push_str(&format!("{name}={v}\n"));
            }
        }
        let path = self.dir.path().join("credentials");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    }

    /// The secret a client of this server sends (for checks that it is never shown).
    pub fn secret(&self) -> Option<String> {
        let c = self.credentials();
        c.password.or(c.secret_access_key).map(|s| s.expose().to_string())
    }

    /// The folder the WebDAV server serves (its files are the remote objects).
    pub fn dav_root(&self) -> PathBuf {
        self.dir.path().join("dav")
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart_empty(&mut self) {
        self.kill();
        let _held = ports();
        let (mut child, log) = (self.start)(self.dir.path(), self.port);
        wait_listening(self.port, &mut child, &self.what, &log);
        self.child = Some(child);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        ports().remove(&self.port);
    }
}

/// Redis and WebDAV, plain (an empty Vec only when skipping locally).
pub fn plain() -> Vec<Server> {
    [Server::redis(), Server::webdav()].into_iter().flatten().collect()
}

/// Every kind of server, each started: Redis and WebDAV plain and over TLS with authentication, and S3 (an empty
/// Vec only when skipping locally).
pub fn all() -> Vec<Server> {
    [Server::redis(), Server::webdav(), Server::redis_tls(), Server::webdav_tls(), Server::s3()].into_iter().flatten().collect()
}

/// The servers that authenticate over TLS.
pub fn secured() -> Vec<Server> {
    [Server::redis_tls(), Server::webdav_tls(), Server::s3()].into_iter().flatten().collect()
}

/// Makes an IAM user with an access key allowed `s3:*`, the bucket, then turns IAM authentication on; prints
/// `ACCESS_KEY_ID SECRET`. Arguments: the endpoint, the CA file, the bucket.
const MOTO_SETUP: &str = r#"
import boto3, json, ssl, sys, urllib.request
endpoint, ca, bucket = sys.argv[1:4]
kw = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="setup", aws_secret_access_key="setup", verify=ca)
iam = boto3.client("iam", **kw)
iam.create_user(UserName="tessera")
key = iam.create_access_key(UserName="tessera")["AccessKey"]
policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
iam.put_user_policy(UserName="tessera", PolicyName="cache", PolicyDocument=json.dumps(policy))
boto3.client("s3", **kw).create_bucket(Bucket=bucket)
urllib.request.urlopen(urllib.request.Request(endpoint + "/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}), context=ssl.create_default_context(cafile=ca))
print(key["AccessKeyId"], key["SecretAccessKey"])
"#;
