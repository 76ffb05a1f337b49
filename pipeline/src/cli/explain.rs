//! `tessera explain MODEL [--manifest FILE] [--target T]... [--shape N=DxD]... [--store DIR] [--svg FILE] [--json]`

use crate::build::Ctx;
use crate::explain::{explain_plan, job_for_model, plan_model, render_text, svg};
use crate::memo::Memo;
use crate::zoo::{all_backends, resolve_targets};
use anyhow::{Context, Result};
use clap::Args;
use std::collections::BTreeMap;
use std::path::PathBuf;
use tessera_store::{OpenOptions, Store};

#[derive(Args, Debug)]
#[command(after_help = "MODEL is one of:\n  \
  an ONNX file:        tessera explain model.onnx --shape input_ids=1x128\n  \
  a fixture spec:      tessera explain fixture:bert-base:b1:s128   (fixture:MODEL[:bBATCH][:sSEQ][:iIMAGE], batch 1 by default)\n  \
  a manifest entry:    tessera explain resnet18-b1 --manifest fixtures/zoo.toml\n\n\
The model is compiled through the memoized pipeline (a warm store only reads), so the report shows the plan\n\
the artifact executes. Node identifiers are indices into the loaded graph (after simplification and folding).")]
pub struct ExplainArgs {
    /// The model: an ONNX file, a fixture spec `fixture:MODEL[:bN][:sN][:iN]`, or with --manifest an entry name.
    pub model: String,
    /// Read MODEL as the name of an entry of this zoo manifest.
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Target, e.g. `cpu`, `cpu -compiler=gemm`, or JSON; repeat for several. Default: every backend this
    /// machine can run.
    #[arg(long = "target", short = 't')]
    pub targets: Vec<String>,
    /// Fix an ONNX input's shape, e.g. `--shape input_ids=1x128`.
    #[arg(long = "shape")]
    pub shapes: Vec<String>,
    /// The store (default: $TESSERA_STORE, else .tessera in the working directory).
    #[arg(long, env = "TESSERA_STORE")]
    pub store: Option<PathBuf>,
    /// Wait for another process holding the store instead of failing.
    #[arg(long)]
    pub wait: bool,
    /// Also write an SVG of the graph colored by backend to this file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Print the report as JSON instead of text.
    /// Where partition costs come from: measured on this machine (recorded in the store), or the backends'
    /// analytical estimates.
    #[arg(long, value_enum, default_value_t = crate::partitioning::CostMode::Measured)]
    pub costs: crate::partitioning::CostMode,
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ExplainArgs) -> Result<()> {
    let mut shapes = BTreeMap::new();
    for s in &args.shapes {
        let (name, dims) = tessera_stages::onnx::parse_shape_arg(s).map_err(anyhow::Error::msg)?;
        shapes.insert(name, dims);
    }
    let job = job_for_model(&args.model, args.manifest.as_deref(), &shapes)?;
    let backends = all_backends();
    let targets = resolve_targets(&args.targets, &backends)?;
    let dir = tessera_store::resolve_dir(args.store.as_deref());
    let store = Store::open(&dir, OpenOptions::writable().wait(args.wait))?;
    let memo = Memo::new(&store);
    let ctx = Ctx::new(&memo, &targets, &backends).with_costs(args.costs);
    let planned = plan_model(&ctx, &job)?;
    store.flush()?;
    let graph = planned.graph()?;
    let ex = explain_plan(&job.name, &planned.plan, graph, &targets)?;
    if let Some(path) = &args.svg {
        std::fs::write(path, svg::render(graph, &ex)).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&ex)?);
    } else {
        print!("{}", render_text(&ex));
        if let Some(path) = &args.svg {
            println!("\nSVG written to {}", path.display());
        }
    }
    Ok(())
}
