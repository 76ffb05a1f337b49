//! `tessera explain MODEL [--manifest FILE] [--target T]... [--shape N=DxD]... [--store DIR] [--svg FILE] [--json]`,
//! or `tessera explain ARTIFACT.tsr [--json]`: what a compiled artifact records of its plan.

use crate::build::Ctx;
use crate::explain::{explain_plan, job_for_model, plan_model, render_text, svg};
use crate::memo::Memo;
use crate::zoo::all_backends;
use tessera_stages::partition::plan::ExecPlan;
use anyhow::{bail, Context, Result};
use super::build_options::BuildOptions;
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
#[command(after_help = "MODEL is one of:\n  \
  an ONNX file:        tessera explain model.onnx --shape input_ids=1x128\n  \
  a fixture spec:      tessera explain fixture:bert-base:b1:s128   (fixture:MODEL[:bBATCH][:sSEQ][:iIMAGE], batch 1 by default)\n  \
  a manifest entry:    tessera explain resnet18-b1 --manifest fixtures/zoo.toml\n  \
  a compiled artifact: tessera explain out/mlp3-b1.tsr             (what it records: provenance, partitions, backends)\n\n\
The model is compiled through the memoized pipeline (a warm store only reads), so the report shows the plan\n\
the artifact executes. Node identifiers are indices into the loaded graph (after simplification and folding).")]
pub struct ExplainArgs {
    /// The model: an ONNX file, a fixture spec `fixture:MODEL[:bN][:sN][:iN]`, with --manifest an entry name,
    /// or a compiled artifact (.tsr).
    pub model: String,
    /// Read MODEL as the name of an entry of this zoo manifest.
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    #[command(flatten)]
    pub build: BuildOptions,
    /// Also write an SVG of the graph colored by backend to this file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Print the report as JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Show one of the whole-model plans the validation measured instead of the plan used: `searched` (the
    /// Collage search's own result), a backend's name (that backend preferred), or `c alone`.
    #[arg(long, value_name = "LABEL")]
    pub trial: Option<String>,
}

/// The plan of the validation trial named `label`, read from the store; it carries the used plan's
/// validation report, so the comparison stays in view.
fn trial_plan(memo: &Memo, used: &ExecPlan, label: &str) -> Result<ExecPlan> {
    let Some(v) = &used.validation else {
        bail!("its plan was not validated (analytical costs, a single target, or a baseline), so there are no trials to show");
    };
    let labels: Vec<&str> = v.trials.iter().map(|t| t.label.as_str()).collect();
    let t = v.trials.iter().find(|t| t.label == label).with_context(|| format!("no trial is labelled '{label}'; trials: {}", labels.join(", ")))?;
    let mut plan: ExecPlan = tessera_stages::stage::load_value(memo, &t.plan).with_context(|| format!("reading the '{label}' plan"))?;
    plan.validation = used.validation.clone();
    Ok(plan)
}

/// Whether MODEL names a compiled artifact.
fn is_artifact(model: &str) -> bool {
    model.to_ascii_lowercase().ends_with(".tsr")
}

/// `tessera explain ARTIFACT`: read with inspect's reader; options that build a model do not apply.
fn explain_artifact(args: &ExplainArgs) -> Result<()> {
    let refused = [
        (args.manifest.is_some(), "--manifest"),
        (!args.build.targets.is_empty(), "--target"),
        (!args.build.shapes.is_empty(), "--shape"),
        (args.svg.is_some(), "--svg"),
        (args.trial.is_some(), "--trial"),
    ];
    if let Some((_, flag)) = refused.iter().find(|(given, _)| *given) {
        bail!("{}: {flag} does not apply to a compiled artifact, which records its own targets and plan", args.model);
    }
    let report = crate::inspect::describe(std::path::Path::new(&args.model))?;
    let ex = crate::explain::artifact::explain(&report);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&ex)?);
    } else {
        print!("{}", crate::explain::artifact::render_text(&ex));
    }
    Ok(())
}

pub fn run(args: ExplainArgs) -> Result<()> {
    if is_artifact(&args.model) {
        return explain_artifact(&args);
    }
    let shapes = args.build.shapes()?;
    let costs = args.build.cost_mode()?;
    let job = job_for_model(&args.model, args.manifest.as_deref(), &shapes)?;
    let backends = all_backends();
    let targets = args.build.targets(&backends)?;
    let store = args.build.open_store()?;
    let memo = Memo::new(&store);
    let calibration = args.build.calibration()?;
    let ctx = Ctx::new(&memo, &targets, &backends).with_costs(costs).with_tuning(args.build.tuning).with_gpus(args.build.gpus.0.clone()).with_calibration(calibration.as_ref());
    let planned = plan_model(&ctx, &job)?;
    store.flush()?;
    let graph = planned.graph.get()?;
    let plan = match &args.trial {
        None => planned.plan.clone(),
        Some(label) => trial_plan(&memo, &planned.plan, label).with_context(|| format!("model {}", job.name))?,
    };
    let kept = match &planned.calibrated {
        Some(c) => c.kept()?,
        None => Vec::new(),
    };
    let mut ex = explain_plan(&job.name, &plan, graph, &targets, &kept)?;
    ex.layout = planned.layout.clone();
    if let Some(path) = &args.svg {
        std::fs::write(path, svg::render(graph, &ex, &backends)).with_context(|| format!("writing {}", path.display()))?;
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
