//! `tessera baselines INPUT... [--target T]... [--iters N] [--warmup N] [--json]`: the searched mix against
//! each backend alone, measured in one run (see [`crate::baselines`]).

use crate::baselines::{configurations, render_markdown, run_baselines, BenchSettings, Machine, Report};
use crate::explain::jobs_from_specs;
use crate::memo::Memo;
use crate::zoo::all_backends;
use anyhow::{bail, Result};
use super::build_options::BuildOptions;
use clap::Args;

#[derive(Args, Debug)]
#[command(after_help = "Configurations: `mix` (every target; the partitioner chooses), each non-fallback backend with its\n\
device's fallback, and each fallback alone. The ratio is best single / mix: above 1 when the mix is faster.\n\
The text output is Markdown, ready to paste into bench/collage.md.")]
pub struct BaselinesArgs {
    /// ONNX models, zoo manifests (.toml), or fixture specs `fixture:MODEL[:bN][:sN][:iN]`.
    #[arg(required = true)]
    pub inputs: Vec<String>,
    #[command(flatten)]
    pub build: BuildOptions,
    /// Timed runs per artifact (the median is reported).
    #[arg(long, default_value_t = 50)]
    pub iters: usize,
    /// Untimed runs before timing starts.
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print JSON instead of Markdown.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: BaselinesArgs) -> Result<()> {
    if args.iters == 0 {
        bail!("--iters must be at least 1");
    }
    let shapes = args.build.shapes()?;
    let costs = args.build.cost_mode()?;
    let jobs = jobs_from_specs(&args.inputs, &shapes)?;
    let backends = all_backends();
    let targets = args.build.targets(&backends)?;
    let store = args.build.open_store()?;
    let memo = Memo::new(&store);
    let bench = BenchSettings { iters: args.iters, warmup: args.warmup, seed: args.seed };
    let quiet = args.json;
    let models = run_baselines(&memo, &backends, &targets, &jobs, bench, costs, args.build.tuning, args.build.gpus.0.clone(), &|line| {
        if !quiet {
            eprintln!("{line}");
        }
    })?;
    store.flush()?;
    let report = Report {
        machine: Machine::detect(),
        targets: targets.targets.iter().map(|t| t.to_string()).collect(),
        configs: configurations(&targets)?,
        bench,
        models,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render_markdown(&report));
    }
    Ok(())
}
