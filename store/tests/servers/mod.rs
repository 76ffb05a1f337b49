//! Real cache servers for the remote-tier tests, started on 127.0.0.1 with a free port and killed on drop:
//! Redis (Debian's `redis-server`) and nginx with its WebDAV modules (Debian's `nginx` and
//! `libnginx-mod-http-dav-ext`, which `scripts/test.sh` installs).
//!
//! A missing server binary fails the test with what to install. `TESSERA_SKIP_SERVER_TESTS=1` skips instead,
//! for local use only: under CI (`CI` set) it is ignored, so CI can never skip these tests silently.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

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
    let skip = std::env::var("TESSERA_SKIP_SERVER_TESTS").is_ok_and(|v| v == "1");
    let ci = std::env::var_os("CI").is_some();
    if skip && !ci {
        eprintln!("SKIPPED: {name} not found and TESSERA_SKIP_SERVER_TESTS=1 (local use only)");
        return None;
    }
    panic!(
        "{name} not found (looked in PATH, /usr/sbin, /usr/bin): the remote-tier tests need a real server; install Debian's \
         `{package}` (`bash scripts/test.sh` does: apt-get install {package}), or set TESSERA_SKIP_SERVER_TESTS=1 to skip them locally"
    );
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
    dir: tempfile::TempDir,
    child: Option<Child>,
    start: Starter,
    what: String,
}

impl Server {
    /// Redis with no persistence: a restart comes back empty.
    pub fn redis() -> Option<Server> {
        let bin = server_binary("redis-server", "redis-server")?;
        let start = move |dir: &Path, port: u16| {
            let log = dir.join("redis.log");
            let child = Command::new(&bin)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"])
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
        Some(Server::start("redis-server", Box::new(start), |port| format!("redis://127.0.0.1:{port}")))
    }

    /// nginx serving a WebDAV folder (PUT, DELETE, MKCOL from its dav module, PROPFIND from dav_ext), one
    /// process (`master_process off`). A restart comes back with an empty folder.
    pub fn webdav() -> Option<Server> {
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
            let conf = format!(
                "load_module {module};\n\
                 daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {log} warn;\n\
                 events {{ worker_connections 256; }}\n\
                 http {{\n  access_log off;\n  client_body_temp_path {d}/tmp/body;\n  proxy_temp_path {d}/tmp/proxy;\n\
                   fastcgi_temp_path {d}/tmp/fastcgi;\n  uwsgi_temp_path {d}/tmp/uwsgi;\n  scgi_temp_path {d}/tmp/scgi;\n\
                   server {{\n    listen 127.0.0.1:{port};\n    root {root};\n    client_max_body_size 0;\n\
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
        Some(Server::start("nginx", Box::new(start), |port| format!("http://127.0.0.1:{port}/cache")))
    }

    fn start(what: &str, start: Starter, url: impl Fn(u16) -> String) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let mut held = ports();
        let port = unused_port(&held);
        let (mut child, log) = start(dir.path(), port);
        wait_listening(port, &mut child, what, &log);
        held.insert(port);
        drop(held);
        Server { port, url: url(port), dir, child: Some(child), start, what: what.to_string() }
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

/// Both kinds of server, each started (an empty Vec only when skipping locally).
pub fn all() -> Vec<Server> {
    [Server::redis(), Server::webdav()].into_iter().flatten().collect()
}
