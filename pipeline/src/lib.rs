//! The tessera pipeline library: the memo driver (`memo`), the zoo's scheduling and reports (`zoo`,
//! `build`, `baselines`, `explain`, `bench`), sharded builds (`shard`); the CLI's subcommands live in `cli`. The stages themselves
//! are in `tessera_stages`.

pub mod baselines;
pub mod bench;
pub mod build;
pub mod cli;
pub mod explain;
pub mod inspect;
pub mod job;
pub mod memo;
pub mod provenance;
pub mod request;
pub mod shard;
pub mod zoo;
