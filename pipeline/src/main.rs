//! The `tessera` binary: the command line of `tessera::cli::entry`, which the Python package's `tessera`
//! command runs too.

fn main() -> std::process::ExitCode {
    // Statuses are 0, 1 and 2 (cli::entry::main), each fits a u8.
    std::process::ExitCode::from(u8::try_from(tessera::cli::entry::main(std::env::args_os())).unwrap_or(1))
}
