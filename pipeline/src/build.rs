//! Compiling models: the pipeline's side of the stage DAG (the stages themselves are in
//! `tessera_stages`: [`tessera_stages::build`] runs one model's load -> partition -> lower -> compile ->
//! link). Here: where models come from (fixtures, ONNX files), the zoo's scheduling of models over the
//! cores, and what a compiled model reports.

use anyhow::{Context, Result};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use tessera_stages::artifact::build_artifact;
use tessera_stages::build::{plan_model, PlannedModel};
use tessera_stages::load::GraphSource;
pub use tessera_stages::context::Ctx;
use tessera_stages::ir::Graph;
use crate::provenance::ModelOrigin;
use tessera_store::{canonical_digest, Digest};

/// Where a model comes from.
#[derive(Clone, Debug)]
pub enum ModelSource {
    Fixture { model: String, options: tessera_fixtures::ModelOptions },
    Onnx { path: PathBuf, shapes: BTreeMap<String, Vec<usize>> },
}

/// One model to compile.
#[derive(Clone, Debug)]
pub struct ModelJob {
    pub name: String,
    pub source: ModelSource,
}

/// The outcome of compiling one model.
#[derive(Clone, Debug, Serialize)]
pub struct ModelResult {
    pub name: String,
    pub graph: Digest,
    pub plan: Digest,
    /// The artifact's payload digest: the store's object, as the linker wrote it (the file written from it
    /// also records provenance; see `tessera_kernels::artifact::provenance`).
    pub artifact: Digest,
    /// The payload's size.
    pub artifact_bytes: u64,
    pub partitions: usize,
    /// Partitions per backend name.
    pub partitions_by_backend: BTreeMap<String, usize>,
    /// Partitions per tuned configuration other than their backend's default (what measurement changed).
    pub tuned_configs: BTreeMap<String, usize>,
    /// Distinct kernel signatures of this model.
    pub kernels: BTreeSet<Digest>,
    /// Distinct (backend, kernel) pairs lowered for this model.
    pub lowered: BTreeSet<(String, Digest)>,
    pub nodes: usize,
    pub estimated_us: f64,
    pub cost_source: String,
    /// Every object the build uses (graph document, constants, plan, kernels, modules, artifact), for gc roots.
    #[serde(skip)]
    pub objects: Vec<Digest>,
    /// Where the model came from, for the provenance its artifact file records.
    #[serde(skip)]
    pub origin: ModelOrigin,
}

/// Imports or builds a model's graph and runs the graph passes every stage expects.
pub fn load_graph(job: &ModelJob) -> Result<Graph> {
    let mut g = match &job.source {
        ModelSource::Fixture { model, options } => tessera_fixtures::build_with(model, options)?,
        ModelSource::Onnx { path, shapes } => {
            let opts = tessera_stages::onnx::ImportOptions { shapes: shapes.clone() };
            tessera_stages::onnx::import_file(path, &opts)?
        }
    };
    g.name = job.name.clone();
    tessera_stages::passes::simplify::simplify(&mut g).with_context(|| format!("model {}: simplification", job.name))?;
    tessera_stages::passes::fold::fold_constants(&mut g).with_context(|| format!("model {}: constant folding", job.name))?;
    tessera_stages::ir::verify(&g)?;
    Ok(g)
}

impl GraphSource for ModelJob {
    fn name(&self) -> &str {
        &self.name
    }

    /// Fixture models are keyed by their recipe, so a hit skips generating weights; ONNX files are
    /// imported every time and keyed by the graph they produce.
    fn recipe(&self) -> Result<Option<Digest>> {
        match &self.source {
            ModelSource::Fixture { model, options } => Ok(Some(canonical_digest(&(
                &self.name,
                (model, options.batch, options.seq, options.image),
                tessera_fixtures::code_version(),
            ))?)),
            ModelSource::Onnx { .. } => Ok(None),
        }
    }

    fn build(&self) -> Result<Graph> {
        load_graph(self)
    }
}

/// Compiles several models, in parallel, each model's outcome in `jobs` order; `on_model` sees each success.
///
/// With measured costs, the partition stages (where measuring happens) first run one model at a time, each
/// using every core for its own compiles, and only the stages after partition run models in parallel.
/// Measured on the bundled zoo: with partition stages in parallel, the work of one model that the
/// measurement lock does not cover (graph loads, signatures, store reads and hashing) ran beside another
/// model's timing runs, and multi-threaded gemm kernels measured up to 4x their cost in the model
/// (bench/collage.md); one model at a time, they measure as in a single-model build.
pub fn compile_models(ctx: &Ctx, jobs: &[ModelJob], on_model: &(dyn Fn(&ModelResult) + Sync)) -> Vec<Result<ModelResult>> {
    if ctx.costs.measures() {
        for j in jobs {
            // A failure here is reported by `compile_model` below, which runs the stage again.
            let _ = plan_model(ctx, j);
        }
    }
    jobs.par_iter()
        .map(|j| {
            let r = compile_model(ctx, j)?;
            on_model(&r);
            Ok(r)
        })
        .collect()
}

/// Compiles one model; the artifact stays in the store (see [`ModelResult::artifact`]).
pub fn compile_model(ctx: &Ctx, job: &ModelJob) -> Result<ModelResult> {
    let PlannedModel { doc, plan_digest, plan, graph, layout, .. } = plan_model(ctx, job)?;
    // After the load stage read the model, so a file it cannot read is reported by it, as every build reports it.
    let origin = ModelOrigin::of(job)?;
    let built = build_artifact(ctx, &plan_digest, &plan, &|| graph.get()).with_context(|| format!("model {}", job.name))?;

    let (mut by_backend, mut tuned_configs) = (BTreeMap::new(), BTreeMap::new());
    for p in &plan.partitions {
        *by_backend.entry(p.target.backend_name().to_string()).or_insert(0) += 1;
        if let Some(c) = &p.config {
            *tuned_configs.entry(c.clone()).or_insert(0) += 1;
        }
    }
    let mut objects = vec![doc, plan_digest, built.artifact];
    objects.extend(plan.constants.iter().map(|(d, _)| *d));
    objects.extend(built.lowered.iter().copied());
    objects.extend(built.modules.iter().copied());
    // The validation's trial plans (small), so `tessera explain --trial` still finds them after a gc.
    objects.extend(plan.validation.iter().flat_map(|v| v.trials.iter().map(|t| t.plan)));
    // The layout `-layout=auto` did not choose: its document, plan and timed artifact, so a warm rebuild finds
    // them rather than building and timing them again.
    objects.extend(layout.iter().flat_map(|l| l.roots()));
    let artifact_bytes = ctx.driver.store().objects().size_of(&built.artifact).unwrap_or(0);
    Ok(ModelResult {
        name: job.name.clone(),
        graph: doc,
        plan: plan_digest,
        artifact: built.artifact,
        artifact_bytes,
        partitions: plan.partitions.len(),
        partitions_by_backend: by_backend,
        tuned_configs,
        kernels: plan.partitions.iter().map(|p| p.kernel).collect(),
        lowered: plan.partitions.iter().map(|p| (p.target.backend_name().to_string(), p.kernel)).collect(),
        nodes: plan.partitions.iter().map(|p| p.nodes.len()).sum(),
        estimated_us: plan.estimated_us(),
        cost_source: plan.cost_source.clone(),
        objects,
        origin,
    })
}
