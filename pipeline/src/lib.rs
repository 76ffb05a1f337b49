//! The tessera pipeline library: plans and runs the stage DAG; the CLI's subcommands live in `cli`.

pub mod cli;
