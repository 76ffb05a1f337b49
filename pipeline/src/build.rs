//! Compiling models: the pipeline's side of the stage DAG (the stages themselves are in
//! `tessera_stages`: [`tessera_stages::build`] runs one model's load -> partition -> lower -> compile ->
//! link). Here: where models come from (fixtures, ONNX files), the zoo's scheduling of models over the
//! cores, and what a compiled model reports.

use anyhow::{Context, Result};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use tessera_stages::stages::artifact::build_artifact;
use tessera_stages::build::{plan_model, PlannedModel};
pub use tessera_stages::context::Ctx;
use crate::job::{ModelJob, Prepared};
use crate::provenance::ModelOrigin;
use tessera_fixtures::batch::batches_text;
use tessera_kernels::artifact::BATCHED_FORMAT_VERSION;
use tessera_stages::stages::link::LinkBatches;
use tessera_store::{Digest};

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
    /// A batched artifact's plans (one per batch size, ascending); empty for one plan.
    pub plans: Vec<PlanResult>,
    /// Every object the build uses (graph document, constants, plan, kernels, modules, artifact), for gc roots.
    #[serde(skip)]
    pub objects: Vec<Digest>,
    /// Where the model came from, for the provenance its artifact file records.
    #[serde(skip)]
    pub origin: ModelOrigin,
}

/// One plan of a batched artifact: the model compiled at one batch size.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PlanResult {
    pub batch: usize,
    /// The payload digest of the model's single-plan artifact at this batch size (in the store).
    pub artifact: Digest,
    pub partitions: usize,
    pub estimated_us: f64,
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
    // One job per plan (per batch size of a batched job).
    let plan_jobs: Vec<Result<Vec<ModelJob>>> = jobs.iter().map(ModelJob::plan_jobs).collect();
    // Each job is prepared (an ONNX file hashed) once for both passes.
    let prepared: Vec<Result<Vec<Prepared>>> = plan_jobs
        .par_iter()
        .map(|p| match p {
            Ok(plans) => plans.iter().map(|j| j.prepare(ctx.driver)).collect(),
            Err(e) => Err(anyhow::anyhow!("{e:#}")),
        })
        .collect();
    if ctx.costs.measures() {
        for p in prepared.iter().flatten().flatten() {
            // A failure here is reported by `compile_model` below, which runs the stage again.
            let _ = plan_model(ctx, p);
        }
    }
    prepared
        .into_par_iter()
        .zip(jobs)
        .map(|(p, job)| {
            let r = compile_plans(ctx, job, &p?)?;
            on_model(&r);
            Ok(r)
        })
        .collect()
}

/// Compiles one model; the artifact stays in the store (see [`ModelResult::artifact`]).
pub fn compile_model(ctx: &Ctx, job: &ModelJob) -> Result<ModelResult> {
    let plans = job.plan_jobs()?;
    let prepared: Vec<Prepared> = plans.iter().map(|j| j.prepare(ctx.driver)).collect::<Result<_>>()?;
    compile_plans(ctx, job, &prepared)
}

/// Compiles `job` from its plans' prepared jobs: the one plan's artifact, or every batch size's joined into one
/// batched artifact (the `link-batches` stage: the weights stored once).
fn compile_plans(ctx: &Ctx, job: &ModelJob, prepared: &[Prepared]) -> Result<ModelResult> {
    if job.batches.is_empty() {
        return compile_prepared(ctx, &prepared[0]);
    }
    let results: Vec<ModelResult> = prepared.par_iter().map(|p| compile_prepared(ctx, p)).collect::<Result<_>>()?;
    let plans: Vec<(u64, Digest)> = job.batches.iter().zip(&results).map(|(&b, r)| (b as u64, r.artifact)).collect();
    let store = ctx.driver.store();
    let payloads = || plans.iter().map(|(_, d)| Ok(store.get(d)?)).collect::<Result<Vec<Vec<u8>>>>();
    let stage = LinkBatches { model: &job.name, plans: &plans, format_version: BATCHED_FORMAT_VERSION, payloads: &payloads };
    let artifact = tessera_stages::stage::run_digest(ctx.driver, &stage).with_context(|| format!("model {}: joining the plans of batch sizes {}", job.name, batches_text(&job.batches)))?;
    Ok(joined_result(job, results, artifact, store.objects().size_of(&artifact).unwrap_or(0)))
}

/// The result of a batched job: its joined artifact, with the per-plan results summed (partitions, kernels,
/// objects) and listed ([`ModelResult::plans`]); the estimate is the largest plan's.
fn joined_result(job: &ModelJob, results: Vec<ModelResult>, artifact: Digest, artifact_bytes: u64) -> ModelResult {
    let plans = job
        .batches
        .iter()
        .zip(&results)
        .map(|(&batch, r)| PlanResult { batch, artifact: r.artifact, partitions: r.partitions, estimated_us: r.estimated_us })
        .collect();
    let mut it = results.into_iter();
    let mut joined = it.next().expect("a batched job has plans");
    for r in it {
        joined.partitions += r.partitions;
        for (k, v) in r.partitions_by_backend {
            *joined.partitions_by_backend.entry(k).or_insert(0) += v;
        }
        for (k, v) in r.tuned_configs {
            *joined.tuned_configs.entry(k).or_insert(0) += v;
        }
        joined.kernels.extend(r.kernels);
        joined.lowered.extend(r.lowered);
        joined.nodes += r.nodes;
        joined.estimated_us = r.estimated_us;
        joined.objects.extend(r.objects);
    }
    joined.objects.push(artifact);
    joined.objects.sort();
    joined.objects.dedup();
    joined.artifact = artifact;
    joined.artifact_bytes = artifact_bytes;
    joined.plans = plans;
    // The source is the smallest plan's (its fixture spec or ONNX file); `batch` lists every plan.
    joined.origin.options.insert("batch".into(), batches_text(&job.batches));
    joined
}

fn compile_prepared(ctx: &Ctx, prepared: &Prepared) -> Result<ModelResult> {
    let job = prepared.job;
    let PlannedModel { doc, plan_digest, plan, graph, layout, .. } = plan_model(ctx, prepared)?;
    // After the load stage read the model, so a file it cannot read is reported by it, as every build reports it.
    let origin = ModelOrigin::of(job, prepared.file)?;
    let built = build_artifact(ctx, &plan_digest, &plan, &|| graph.get(), graph.resident()).with_context(|| format!("model {}", job.name))?;

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
        plans: Vec::new(),
        objects,
        origin,
    })
}
