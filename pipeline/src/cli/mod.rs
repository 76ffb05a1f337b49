//! The `tessera` command line: one module per subcommand.

pub mod baselines;
pub mod bench;
pub mod build_options;
pub mod explain;
pub mod inspect;
pub mod compile;
pub mod entry;
pub mod run;
pub mod run_artifact;
pub mod run_report;
pub mod store;
pub mod summary;
pub mod targets;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
// The version names the source revision too (pipeline/build.rs), as every artifact's provenance does.
#[command(name = "tessera", version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("TESSERA_SOURCE_REVISION"), ")"), about = "A batch compiler for deep-learning models")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// More log output on stderr: -v each stage executed, -vv cache hits too, -vvv everything
    /// ($TESSERA_LOG, a tracing filter such as `info` or `tessera_store=debug`, overrides).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Errors only on stderr: no warnings, no progress.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
}

impl Cli {
    /// The log filter the flags ask for (warnings by default).
    pub fn log_filter(&self) -> &'static str {
        match (self.quiet, self.verbose) {
            (true, _) => "error",
            (false, 0) => "warn",
            (false, 1) => "info",
            (false, 2) => "debug",
            (false, _) => "trace",
        }
    }
}

/// Installs the one log subscriber: events at or above `default` (or as $TESSERA_LOG says) to stderr.
pub fn init_logging(default: &str) {
    let filter = std::env::var("TESSERA_LOG")
        .ok()
        .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(default));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).without_time().with_target(false).try_init();
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
    /// JSON or an SVG of the graph colored by backend. Given an artifact (.tsr): what it records of its plan.
    Explain(explain::ExplainArgs),
    /// The searched mix of backends against each backend alone, compiled and benchmarked in one run.
    Baselines(baselines::BaselinesArgs),
    /// What a compiled artifact holds: how it was built (provenance), inputs and outputs, memory, modules by
    /// backend and target, partitions, constants, digests.
    Inspect(inspect::InspectArgs),
    /// Merge the summaries of a sharded build (`compile --shard I/N`) into one report; checks every shard is there.
    Summary(summary::SummaryArgs),
    /// Print the completion script of a shell (bash, zsh, fish, elvish, powershell) to stdout, e.g.
    /// `tessera completions bash > ~/.local/share/bash-completion/completions/tessera`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether `-q` was given: commands print no progress and no warnings (errors still).
pub fn quiet() -> bool {
    QUIET.load(std::sync::atomic::Ordering::Relaxed)
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    QUIET.store(cli.quiet, std::sync::atomic::Ordering::Relaxed);
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Store(cmd) => store::run(cmd),
        Command::Compile(args) => compile::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Targets(args) => targets::run(args),
        Command::Explain(args) => explain::run(args),
        Command::Baselines(args) => baselines::run(args),
        Command::Summary(args) => summary::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "tessera", &mut std::io::stdout());
            Ok(())
        }
    }
}
