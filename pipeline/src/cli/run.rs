//! `tessera run`: (being written) run an ONNX model with the reference interpreter or a compiled artifact.

use clap::Args;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The model (.onnx) or artifact (.tsr) to run.
    pub model: std::path::PathBuf,
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    anyhow::bail!("tessera run {} is not implemented yet", args.model.display())
}
