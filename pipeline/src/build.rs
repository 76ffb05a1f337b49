//! Compiling one model: the stage DAG for one zoo entry, every stage a memoized call.
//!
//! load (graph document) -> partition (execution plan) -> lower (one call per distinct kernel)
//! -> compile (one module per backend, module-at-a-time) -> link (one artifact).
//! Keys are built from upstream output digests, so an unchanged output cuts off everything after it; the
//! model graph itself is built or reloaded only when a stage that needs it misses.

use crate::memo::Memo;
use crate::partitioning::{partition_and_plan, CostMode};
use crate::plan::{kernel_signature, ExecPlan, PlanRef, PLAN_VERSION};
use anyhow::{bail, Context, Result};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::OnceLock;
use tessera_stages::link::{link, LinkInput, LinkStep, ValueRef};
use tessera_stages::backend::{Backend, LoweredKernel, Module};
use tessera_stages::ir::{extract_subgraph, serial::GraphDoc, Graph, NodeId, Tensor};
use tessera_stages::partition::PARTITIONER_VERSION;
use tessera_stages::target::{Target, TargetSet};
use tessera_store::{Digest, KeyBuilder};

/// Code versions of the pipeline's own stages (backends carry their own).
pub const LOAD_VERSION: u32 = 1;
pub const COMPILE_VERSION: u32 = 1;
pub const LINK_VERSION: u32 = 1;

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

/// What is shared by every model of a run.
pub struct Ctx<'a> {
    pub memo: &'a Memo<'a>,
    pub targets: &'a TargetSet,
    pub backends: &'a [Box<dyn Backend>],
    /// Where partition costs come from (default: measured).
    pub costs: CostMode,
    /// A backend that takes every node it can run, the fallback the rest: the single-backend baseline
    /// Collage compares against. `None` (the default) is the searched mix.
    pub prefer: Option<String>,
}

impl<'a> Ctx<'a> {
    pub fn new(memo: &'a Memo<'a>, targets: &'a TargetSet, backends: &'a [Box<dyn Backend>]) -> Self {
        Ctx { memo, targets, backends, costs: CostMode::default(), prefer: None }
    }

    pub fn with_prefer(mut self, backend: Option<String>) -> Self {
        self.prefer = backend;
        self
    }

    pub fn with_costs(mut self, costs: CostMode) -> Self {
        self.costs = costs;
        self
    }
}

impl Ctx<'_> {
    pub fn backend(&self, t: &Target) -> Result<&dyn Backend> {
        self.backends
            .iter()
            .find(|b| b.name() == t.backend_name())
            .map(|b| b.as_ref())
            .with_context(|| format!("target '{t}': backend '{}' is not part of this build", t.backend_name()))
    }
}

/// The outcome of compiling one model.
#[derive(Clone, Debug, Serialize)]
pub struct ModelResult {
    pub name: String,
    pub graph: Digest,
    pub plan: Digest,
    pub artifact: Digest,
    pub artifact_bytes: u64,
    pub partitions: usize,
    /// Partitions per backend name.
    pub partitions_by_backend: BTreeMap<String, usize>,
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
}

/// The model graph, built or loaded at most once per model and only when needed.
struct LazyGraph<'a> {
    memo: &'a Memo<'a>,
    doc: Digest,
    fresh: OnceLock<Graph>,
}

impl LazyGraph<'_> {
    fn get(&self) -> Result<&Graph> {
        if let Some(g) = self.fresh.get() {
            return Ok(g);
        }
        let doc: GraphDoc = self.memo.load(&self.doc)?;
        let store = self.memo.store();
        let g = doc.to_graph(|d| store.get(d).map_err(|e| e.to_string()))?;
        Ok(self.fresh.get_or_init(|| g))
    }
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

/// Stage: load. Fixture models are keyed by their recipe, so a hit skips generating weights; ONNX files are
/// imported every time (the import is the cheapest way to find every external data file the key would need)
/// and keyed by the graph they produce.
fn stage_load(ctx: &Ctx, job: &ModelJob) -> Result<(Digest, Option<Graph>)> {
    let store = ctx.memo.store();
    let store_graph = |g: &Graph| -> Result<Vec<u8>> {
        let doc = GraphDoc::from_graph(g, |t: &Tensor| store.put(t.bytes()))?;
        Ok(postcard::to_stdvec(&doc)?)
    };
    match &job.source {
        ModelSource::Fixture { model, options } => {
            let key = KeyBuilder::new("load", LOAD_VERSION)
                .input("name", &job.name)
                .input("fixture", &(model, options.batch, options.seq, options.image))
                .env("fixtures_version", &tessera_fixtures::FIXTURES_VERSION)
                .env("passes", &tessera_stages::passes::PASSES_VERSION)
                .finish()?;
            let mut built = None;
            let doc = ctx.memo.call("load", key, || {
                let _busy = crate::device::busy();
                let g = load_graph(job)?;
                let bytes = store_graph(&g)?;
                built = Some(g);
                Ok(bytes)
            })?;
            Ok((doc, built))
        }
        ModelSource::Onnx { .. } => {
            let g = {
                let _busy = crate::device::busy();
                load_graph(job)?
            };
            let bytes = store_graph(&g)?;
            let key = KeyBuilder::new("load", LOAD_VERSION).input_bytes("graph_document", &bytes).finish()?;
            let doc = ctx.memo.call("load", key, || Ok(bytes))?;
            Ok((doc, Some(g)))
        }
    }
}

/// The key of the lower stage: one kernel signature for one target. The tune stage lowers candidates under
/// the same key, so a kernel measured during partitioning is never lowered again when the model compiles.
pub fn lower_key(kernel: &Digest, target: &Target, backend: &dyn Backend) -> Result<Digest> {
    Ok(KeyBuilder::new("lower", backend.version())
        .input_digest("kernel", kernel)
        .input_digest("target", &target.digest())
        .input("backend", backend.name())
        .finish()?)
}

fn backend_versions(ctx: &Ctx) -> Vec<(String, String, u32)> {
    ctx.targets.targets.iter().filter_map(|t| ctx.backend(t).ok().map(|b| (t.to_string(), b.name().to_string(), b.version()))).collect()
}

/// A model after the load and partition stages: what `tessera explain` shows and compile continues from.
pub struct Planned<'a> {
    /// The graph document's digest.
    pub doc: Digest,
    pub plan_digest: Digest,
    pub plan: ExecPlan,
    graph: LazyGraph<'a>,
}

impl Planned<'_> {
    /// The model graph the plan's node indices refer to (built or loaded from the store on first use).
    pub fn graph(&self) -> Result<&Graph> {
        self.graph.get()
    }
}

/// Runs the load and partition stages of one model.
pub fn plan_model<'a>(ctx: &Ctx<'a>, job: &ModelJob) -> Result<Planned<'a>> {
    let (doc, built) = stage_load(ctx, job).with_context(|| format!("model {}: load", job.name))?;
    let graph = LazyGraph { memo: ctx.memo, doc, fresh: OnceLock::new() };
    if let Some(g) = built {
        let _ = graph.fresh.set(g);
    }

    // Stage: partition. With measured costs the plan depends on this machine: its fingerprint and the
    // measurement method are in the key (the tune records themselves are keyed the same way).
    let mut key = KeyBuilder::new("partition", PLAN_VERSION)
        .input_digest("graph", &doc)
        .input_digest("targets", &ctx.targets.digest())
        .input("cost_source", ctx.costs.name())
        .input("prefer", &ctx.prefer)
        .env("partitioner", &PARTITIONER_VERSION)
        .env("backends", &backend_versions(ctx));
    if ctx.costs == CostMode::Measured {
        key = key
            .env("tune", &crate::tune::TUNE_VERSION)
            .env("device", &crate::device::cpu_fingerprint())
            .env("measure", &tessera_kernels::runtime::measure::MeasureOptions::default());
    }
    let key = key.finish()?;
    let (plan_digest, plan): (Digest, ExecPlan) = ctx
        .memo
        .call_value("partition", key, || {
            let g = graph.get()?;
            let p = partition_and_plan(ctx, g)?;
            // Constants were stored with the graph document; make sure (cheaply) they still are.
            let store = ctx.memo.store();
            for (d, _) in &p.constants {
                if !store.contains(d) {
                    bail!("constant object {d} is missing from the store");
                }
            }
            Ok(p)
        })
        .with_context(|| format!("model {}: partition", job.name))?;
    Ok(Planned { doc, plan_digest, plan, graph })
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
    if ctx.costs == CostMode::Measured {
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
    let Planned { doc, plan_digest, plan, graph } = plan_model(ctx, job)?;
    let built = build_artifact(ctx, &plan_digest, &plan, &|| graph.get()).with_context(|| format!("model {}", job.name))?;

    let mut by_backend = BTreeMap::new();
    for p in &plan.partitions {
        *by_backend.entry(p.target.backend_name().to_string()).or_insert(0) += 1;
    }
    let mut objects = vec![doc, plan_digest, built.artifact];
    objects.extend(plan.constants.iter().map(|(d, _)| *d));
    objects.extend(built.lowered.iter().copied());
    objects.extend(built.modules.iter().copied());
    // The validation's trial plans (small), so `tessera explain --trial` still finds them after a gc.
    objects.extend(plan.validation.iter().flat_map(|v| v.trials.iter().map(|t| t.plan)));
    let artifact_bytes = ctx.memo.store().objects().size_of(&built.artifact).unwrap_or(0);
    Ok(ModelResult {
        name: job.name.clone(),
        graph: doc,
        plan: plan_digest,
        artifact: built.artifact,
        artifact_bytes,
        partitions: plan.partitions.len(),
        partitions_by_backend: by_backend,
        kernels: plan.partitions.iter().map(|p| p.kernel).collect(),
        lowered: plan.partitions.iter().map(|p| (p.target.backend_name().to_string(), p.kernel)).collect(),
        nodes: plan.partitions.iter().map(|p| p.nodes.len()).sum(),
        estimated_us: plan.estimated_us(),
        cost_source: plan.cost_source.clone(),
        objects,
    })
}

/// What [`build_artifact`] produced: the artifact and the objects it was made from.
pub struct BuiltArtifact {
    pub artifact: Digest,
    /// Lowered kernels, one per distinct (target, kernel).
    pub lowered: Vec<Digest>,
    /// One module per target that won partitions.
    pub modules: Vec<Digest>,
}

/// The stages after partition for one plan (recorded in the store as `plan_digest`): lower each distinct
/// kernel, compile one module per target, link. `graph` gives the model graph the plan's node indices refer
/// to; it is only called when a lower misses.
pub fn build_artifact<'g>(ctx: &Ctx, plan_digest: &Digest, plan: &ExecPlan, graph: &(dyn Fn() -> Result<&'g Graph> + Sync)) -> Result<BuiltArtifact> {
    // Stage: lower, once per distinct (target, kernel).
    let mut distinct: BTreeMap<(Target, Digest), usize> = BTreeMap::new();
    for (i, p) in plan.partitions.iter().enumerate() {
        distinct.entry((p.target.clone(), p.kernel)).or_insert(i);
    }
    let lowered: Vec<((Target, Digest), Digest)> = distinct
        .par_iter()
        .map(|((target, kernel), &first)| -> Result<((Target, Digest), Digest)> {
            let backend = ctx.backend(target)?;
            let key = lower_key(kernel, target, backend)?;
            let out = ctx.memo.call("lower", key, || {
                let _busy = crate::device::busy();
                let g = graph()?;
                let p = &plan.partitions[first];
                let nodes: Vec<NodeId> = p.nodes.iter().map(|&n| NodeId(n)).collect();
                let sig = kernel_signature(g, &nodes);
                if sig.digest != *kernel {
                    bail!("kernel signature changed between partition and lower ({} vs {})", sig.digest, kernel);
                }
                let kg = extract_subgraph(g, &sig);
                let lk = backend.lower(target, &kg, &p.symbol)?;
                Ok(postcard::to_stdvec(&lk)?)
            })?;
            Ok(((target.clone(), *kernel), out))
        })
        .collect::<Result<_>>()
        .context("lower")?;
    let lowered: BTreeMap<(Target, Digest), Digest> = lowered.into_iter().collect();

    // Stage: compile, one module per target that won partitions, in target-set order.
    let used_targets: Vec<&Target> = ctx.targets.targets.iter().filter(|t| plan.partitions.iter().any(|p| &p.target == *t)).collect();
    let mut modules: Vec<(Digest, Module)> = Vec::new();
    for t in &used_targets {
        let backend = ctx.backend(t)?;
        let kernels: Vec<Digest> = lowered.iter().filter(|((lt, _), _)| lt == *t).map(|(_, d)| *d).collect();
        let key = KeyBuilder::new("compile", COMPILE_VERSION)
            .input_digest("target", &t.digest())
            .input("backend", &(backend.name(), backend.version()))
            .input("lowered_kernels", &kernels)
            .env("toolchain", &backend.environment(t))
            .finish()?;
        let m = ctx
            .memo
            .call_value("compile", key, || {
                let _busy = crate::device::busy();
                let lks: Vec<LoweredKernel> = kernels.iter().map(|d| ctx.memo.load(d)).collect::<Result<_>>()?;
                Ok(backend.compile_module(t, &lks)?)
            })
            .with_context(|| format!("compile for {t}"))?;
        modules.push(m);
    }

    // Stage: link.
    let module_digests: Vec<Digest> = modules.iter().map(|(d, _)| *d).collect();
    let key = KeyBuilder::new("link", LINK_VERSION)
        .input_digest("plan", plan_digest)
        .input("modules", &module_digests)
        .env("artifact_format", &tessera_kernels::artifact::FORMAT_VERSION)
        .finish()?;
    let artifact = ctx
        .memo
        .call("link", key, || {
            let _busy = crate::device::busy();
            let input = link_input(ctx, plan, &used_targets, &modules)?;
            Ok(link(&input)?)
        })
        .context("link")?;
    Ok(BuiltArtifact { artifact, lowered: lowered.into_values().collect(), modules: module_digests })
}

fn link_input(ctx: &Ctx, plan: &ExecPlan, used_targets: &[&Target], modules: &[(Digest, Module)]) -> Result<LinkInput> {
    let store = ctx.memo.store();
    let constants: Vec<Tensor> = plan
        .constants
        .iter()
        .map(|(d, ty)| Ok(Tensor::from_bytes(ty.clone(), store.get(d)?)?))
        .collect::<Result<_>>()?;
    let to_ref = |r: &PlanRef| match *r {
        PlanRef::Input(i) => ValueRef::Input(i),
        PlanRef::Value(i) => ValueRef::Value(i),
        PlanRef::Const(i) => ValueRef::Const(i),
    };
    let mut steps = Vec::with_capacity(plan.partitions.len());
    for p in &plan.partitions {
        let mi = used_targets.iter().position(|t| **t == p.target).expect("module per used target");
        let module = &modules[mi].1;
        let fi = module
            .functions
            .iter()
            .position(|f| f.symbol == p.symbol)
            .with_context(|| format!("module for {} has no function {}", p.target, p.symbol))?;
        steps.push(LinkStep { module: mi as u32, function: fi as u32, args: p.args.iter().map(to_ref).collect() });
    }
    Ok(LinkInput {
        model: plan.model.clone(),
        inputs: plan.inputs.clone(),
        input_int_bounds: plan.input_int_bounds.clone(),
        outputs: plan.outputs.iter().map(|(n, r)| (n.clone(), to_ref(r))).collect(),
        values: plan.values.clone(),
        constants,
        modules: modules.iter().map(|(_, m)| m.clone()).collect(),
        steps,
    })
}
