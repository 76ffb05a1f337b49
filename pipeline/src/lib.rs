//! The tessera pipeline library: plans and runs the stage DAG for a zoo (`zoo`, `build`, `memo`, `plan`);
//! the CLI's subcommands live in `cli`.

pub mod baselines;
pub mod bench;
pub mod build;
pub mod cli;
pub mod explain;
pub mod device;
pub mod memo;
pub mod partitioning;
pub mod plan;
pub mod tune;
pub mod validate;
pub mod zoo;
