//! The `tessera` command line: one module per subcommand.

pub mod baselines;
pub mod bench;
pub mod build_options;
pub mod explain;
pub mod compile;
pub mod run;
pub mod run_artifact;
pub mod store;
pub mod summary;
pub mod targets;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "tessera", version, about = "A batch compiler for deep-learning models")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Compile ONNX models and zoo manifests into artifacts (one .tsr per model).
    Compile(compile::CompileArgs),
    /// Run a model: an ONNX file with the reference interpreter (--reference) or a compiled artifact.
    Run(run::RunArgs),
    /// Inspect and maintain the content-addressed store.
    #[command(subcommand)]
    Store(store::StoreCommand),
    /// Latency of compiled artifacts: median, p10 and p90 over N runs after warm-up.
    Bench(bench::BenchArgs),
    /// List target kinds, their attributes and defaults, and which backends run here.
    Targets(targets::TargetsArgs),
    /// Which backend runs which nodes of a model, each partition's cost and the alternative it beat; text,
    /// JSON or an SVG of the graph colored by backend.
    Explain(explain::ExplainArgs),
    /// The searched mix of backends against each backend alone, compiled and benchmarked in one run.
    Baselines(baselines::BaselinesArgs),
    /// Merge the summaries of a sharded build (`compile --shard I/N`) into one report; checks every shard is there.
    Summary(summary::SummaryArgs),
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Store(cmd) => store::run(cmd),
        Command::Compile(args) => compile::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Targets(args) => targets::run(args),
        Command::Explain(args) => explain::run(args),
        Command::Baselines(args) => baselines::run(args),
        Command::Summary(args) => summary::run(args),
    }
}
