//! `tessera store ...`: (being written) store maintenance commands.

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum StoreCommand {
    /// Object and memo counts, bytes, hits and misses.
    Stats,
}

pub fn run(cmd: StoreCommand) -> anyhow::Result<()> {
    anyhow::bail!("tessera store {cmd:?} is not implemented yet")
}
