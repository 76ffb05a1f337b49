//! `tessera._tessera.cli_main(argv)`: the `tessera` command of the wheel. maturin ships binaries only in a
//! `bin` project, not beside a PyO3 extension, so the wheel's `tessera` is a console script
//! (`tessera._cli:main`, pyproject.toml) that calls this: the pipeline's command-line entry
//! (`tessera::cli::entry::main`), the same function the `tessera` binary's `main` is, run in the Python process.
//! Built only with the `compiler` feature.

use pyo3::prelude::*;
use std::ffi::OsString;

/// Runs the `tessera` command line `argv` (the program name first, as `sys.argv`) and returns its exit status;
/// output goes straight to the process's stdout and stderr. The GIL is released while it runs. Meant for a
/// process that is the command (the console script): it sets SIGPIPE and SIGINT to their default actions, as
/// the binary has them, so Ctrl-C and a closed pipe end the process as they end the binary.
#[pyfunction]
pub fn cli_main(py: Python<'_>, argv: Vec<OsString>) -> i32 {
    py.detach(|| tessera::cli::entry::main(argv))
}
