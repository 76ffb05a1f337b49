//! The whole `tessera` command as one function: what the binary's `main` is, and what the Python package's
//! `tessera` command (python/src/cli.rs, the console script of the wheel) calls, so the two parse the same
//! arguments, print the same output and exit with the same statuses.

use clap::Parser;
use std::ffi::OsString;
use std::io::Write;

/// Runs the command line `args` (the program name first) in this process and returns its exit status: 0, 1
/// with `error: ...` on stderr when the command fails, or clap's status for `--help`, `--version` (0) and
/// argument errors (2). Call it only from a process that *is* the command: it sets the signal dispositions the
/// command relies on (below) and installs the process's one log subscriber.
pub fn main<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    default_signals();
    let cli = match super::Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout, argument errors to stderr, as `Cli::parse` prints them; the status
            // is returned rather than `exit`ed so that an embedding interpreter finishes normally.
            let _ = e.print();
            return e.exit_code();
        }
    };
    super::init_logging(cli.log_filter());
    let status = match super::run(cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    };
    // The binary's runtime flushes stdout when `main` returns; a host interpreter never runs that code, so
    // output without a final newline (`print!`) would be lost there.
    let _ = std::io::stdout().flush();
    status
}

/// SIGPIPE and SIGINT at their default actions.
///
/// SIGPIPE: a closed stdout (`tessera targets | head -1`, `tessera explain --json | head`) ends the process
/// quietly, as it ends `cat`, `ls` or `git log`. Rust's runtime (and Python's) ignores SIGPIPE, so a write to a
/// closed pipe returns EPIPE and `println!` panics on it (exit 101 with a panic message); with the default
/// action restored, the kernel ends the process on that write and the shell sees the conventional status 141
/// (128 + SIGPIPE), which `set -o pipefail` scripts and `PIPESTATUS` recognize as "the reader stopped early",
/// not as a failure to hide. One place for every command, rather than handling EPIPE at each of the prints.
/// Sockets are unaffected: Rust's `TcpStream` (and through it mio, tokio, the Redis client and the HTTP client
/// of the remote tier) sends with MSG_NOSIGNAL on Linux, so a server that closes a connection is still an error
/// the remote tier handles, never a signal. Child processes (the C compiler) get SIGPIPE's default from the
/// standard library anyway, and tessera writes to no child's stdin.
///
/// SIGINT: Python catches it with a handler that only sets a flag its interpreter checks between bytecodes, so
/// under the Python command Ctrl-C would wait for a whole compile to end; at the default action it ends the
/// process at once (status 130 in the shell), as it ends the binary. An ignored SIGINT stays ignored: a shell
/// starts background commands so (`tessera compile ... &` in a script), and Python keeps an ignored SIGINT too.
fn default_signals() {
    #[cfg(unix)]
    // SAFETY: sigaction with a null new action only reads the current one into a zeroed struct; SIG_DFL is a
    // valid disposition for both signals. Called before the command starts any thread of its own.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        let mut current: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGINT, std::ptr::null(), &mut current) == 0 && current.sa_sigaction != libc::SIG_IGN {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
        }
    }
}
