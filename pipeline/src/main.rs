use clap::Parser;

fn main() -> std::process::ExitCode {
    restore_sigpipe();
    let cli = tessera::cli::Cli::parse();
    tessera::cli::init_logging(cli.log_filter());
    match tessera::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A closed stdout (`tessera targets | head -1`, `tessera explain --json | head`) ends the process quietly,
/// as it ends `cat`, `ls` or `git log`: Rust's runtime ignores SIGPIPE, so a write to a closed pipe returns
/// EPIPE and `println!` panics on it (exit 101 with a panic message); with the default action restored, the
/// kernel ends the process on that write and the shell sees the conventional status 141 (128 + SIGPIPE), which
/// `set -o pipefail` scripts and `PIPESTATUS` recognize as "the reader stopped early", not as a failure to hide.
/// One place for every command, rather than handling EPIPE at each of the prints.
///
/// Sockets are unaffected: Rust's `TcpStream` (and through it mio, tokio, the Redis client and the HTTP
/// client of the remote tier) sends with MSG_NOSIGNAL on Linux (SO_NOSIGPIPE elsewhere), so a server that
/// closes a connection is still an error the remote tier handles, never a signal. Child processes (the C
/// compiler) get SIGPIPE's default from the standard library anyway, and tessera writes to no child's stdin.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: called first thing in main, before any thread exists; SIG_DFL is a valid disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
