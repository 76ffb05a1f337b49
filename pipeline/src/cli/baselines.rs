//! `tessera baselines INPUT... [--target T]... [--iters N] [--warmup N] [--json]`: the searched mix against
//! each backend alone, measured in one run (see [`crate::baselines`]).

use crate::baselines::{configurations, render_markdown, run_baselines, BenchSettings, Machine, Report};
use crate::explain::jobs_from_specs;
use crate::memo::Memo;
use crate::zoo::{all_backends, resolve_targets};
use anyhow::{bail, Result};
use clap::Args;
use std::collections::BTreeMap;
use std::path::PathBuf;
use tessera_store::{OpenOptions, Store};

#[derive(Args, Debug)]
#[command(after_help = "Configurations: `mix` (every target; the partitioner chooses), each non-fallback backend with its\n\
device's fallback, and each fallback alone. The ratio is best single / mix: above 1 when the mix is faster.\n\
The text output is Markdown, ready to paste into bench/collage.md.")]
pub struct BaselinesArgs {
    /// ONNX models, zoo manifests (.toml), or fixture specs `fixture:MODEL[:bN][:sN][:iN]`.
    #[arg(required = true)]
    pub inputs: Vec<String>,
    /// Target, e.g. `cpu`, `cpu -compiler=gemm`; repeat for several. Default: every backend this machine can run.
    #[arg(long = "target", short = 't')]
    pub targets: Vec<String>,
    /// Fix an ONNX input's shape, e.g. `--shape input_ids=1x128` (applies to ONNX files given directly).
    #[arg(long = "shape")]
    pub shapes: Vec<String>,
    /// The store (default: $TESSERA_STORE, else .tessera in the working directory).
    #[arg(long, env = "TESSERA_STORE")]
    pub store: Option<PathBuf>,
    /// Wait for another process holding the store instead of failing.
    #[arg(long)]
    pub wait: bool,
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
    /// Where partition costs come from: measured on this machine (recorded in the store), or the backends'
    /// analytical estimates.
    #[arg(long, value_enum, default_value_t = crate::partitioning::CostMode::Measured)]
    pub costs: crate::partitioning::CostMode,
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: BaselinesArgs) -> Result<()> {
    if args.iters == 0 {
        bail!("--iters must be at least 1");
    }
    let mut shapes = BTreeMap::new();
    for s in &args.shapes {
        let (name, dims) = tessera_stages::onnx::parse_shape_arg(s).map_err(anyhow::Error::msg)?;
        shapes.insert(name, dims);
    }
    let jobs = jobs_from_specs(&args.inputs, &shapes)?;
    let backends = all_backends();
    let targets = resolve_targets(&args.targets, &backends)?;
    let dir = tessera_store::resolve_dir(args.store.as_deref());
    let store = Store::open(&dir, OpenOptions::writable().wait(args.wait))?;
    let memo = Memo::new(&store);
    let bench = BenchSettings { iters: args.iters, warmup: args.warmup, seed: args.seed };
    let quiet = args.json;
    let models = run_baselines(&memo, &backends, &targets, &jobs, bench, args.costs, &|line| {
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
