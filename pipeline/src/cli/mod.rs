//! The `tessera` command line: one module per subcommand.

pub mod run;
pub mod store;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "tessera", version, about = "A batch compiler for deep-learning models")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a model: an ONNX file with the reference interpreter (--reference) or a compiled artifact.
    Run(run::RunArgs),
    /// Inspect and maintain the content-addressed store.
    #[command(subcommand)]
    Store(store::StoreCommand),
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Store(cmd) => store::run(cmd),
    }
}
