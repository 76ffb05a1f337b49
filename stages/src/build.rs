//! The stage DAG of one model, every stage a [`Stage`](crate::stage::Stage) (one module each: [`crate::load`],
//! [`crate::partition::stage`], [`crate::tune`], [`crate::lower`], [`crate::compile`], [`crate::link`]) run
//! through the [`Driver`]:
//!
//! load (graph document) -> [precision (the document in fp16, for `-precision=fp16`)] -> partition (execution plan; asks tune for costs) -> lower (one call per distinct
//! kernel) -> compile (one module per backend, module-at-a-time) -> link (one artifact).
//!
//! Keys are built from upstream output digests, so an unchanged output cuts off everything after it; the
//! model graph itself is built or reloaded only when a stage that needs it misses.

use crate::backend::{Backend, Module};
use crate::compile::Compile;
use crate::ir::{serial::GraphDoc, Graph, Tensor};
use crate::link::{Link, LinkInput, LinkStep, ValueRef};
use tessera_kernels::artifact::FORMAT_VERSION;
use crate::load::{load_model, GraphSource};
use crate::lower::{kernel_graph, Lower};
use crate::partition::plan::{ExecPlan, PlanRef};
use crate::partition::stage::{CostMode, Partition};
use crate::stage::{load_value, run, run_digest, Driver};
use crate::target::{Target, TargetSet};
use anyhow::{Context, Result};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use tessera_kernels::runtime::Registry;
use tessera_store::Digest;

/// What is shared by every model of a run.
pub struct Ctx<'a> {
    pub driver: &'a dyn Driver,
    pub targets: &'a TargetSet,
    pub backends: &'a [Box<dyn Backend>],
    /// Where partition costs come from (default: measured).
    pub costs: CostMode,
    /// A backend that takes every node it can run, the fallback the rest: the single-backend baseline
    /// Collage compares against. `None` (the default) is the searched mix.
    pub prefer: Option<String>,
    /// How the runtime loads each module format, for the kernels and plans the compiler measures: the
    /// built-in formats, plus those of backends added from outside.
    pub runtime: &'a Registry,
}

impl<'a> Ctx<'a> {
    pub fn new(driver: &'a dyn Driver, targets: &'a TargetSet, backends: &'a [Box<dyn Backend>]) -> Self {
        Ctx { driver, targets, backends, costs: CostMode::default(), prefer: None, runtime: Registry::builtin() }
    }

    pub fn with_runtime(mut self, runtime: &'a Registry) -> Self {
        self.runtime = runtime;
        self
    }

    pub fn with_prefer(mut self, backend: Option<String>) -> Self {
        self.prefer = backend;
        self
    }

    pub fn with_costs(mut self, costs: CostMode) -> Self {
        self.costs = costs;
        self
    }

    pub fn backend(&self, t: &Target) -> Result<&'a dyn Backend> {
        self.backends
            .iter()
            .find(|b| b.name() == t.backend_name())
            .map(|b| b.as_ref())
            .with_context(|| format!("target '{t}': backend '{}' is not part of this build", t.backend_name()))
    }
}

// ---- one model --------------------------------------------------------------------------------------

/// The model graph, built or loaded at most once per model and only when needed.
pub struct LazyGraph<'a> {
    driver: &'a dyn Driver,
    doc: Digest,
    fresh: OnceLock<Graph>,
}

impl<'a> LazyGraph<'a> {
    pub fn new(driver: &'a dyn Driver, doc: Digest, built: Option<Graph>) -> Self {
        let fresh = OnceLock::new();
        if let Some(g) = built {
            let _ = fresh.set(g);
        }
        LazyGraph { driver, doc, fresh }
    }

    pub fn get(&self) -> Result<&Graph> {
        if let Some(g) = self.fresh.get() {
            return Ok(g);
        }
        let doc: GraphDoc = load_value(self.driver, &self.doc)?;
        let store = self.driver.store();
        let g = doc.to_graph(|d| store.get(d).map_err(|e| e.to_string()))?;
        Ok(self.fresh.get_or_init(|| g))
    }
}

/// A model after the load and partition stages: what `tessera explain` shows and compile continues from.
pub struct PlannedModel<'a> {
    /// The graph document's digest.
    pub doc: Digest,
    pub plan_digest: Digest,
    pub plan: ExecPlan,
    pub graph: LazyGraph<'a>,
}

/// Runs the load and partition stages of one model.
pub fn plan_model<'a>(ctx: &Ctx<'a>, source: &dyn GraphSource) -> Result<PlannedModel<'a>> {
    let name = source.name();
    let (doc, built) = load_model(ctx, source).with_context(|| format!("model {name}: load"))?;
    let graph = LazyGraph::new(ctx.driver, doc, built);
    let (doc, graph) = crate::precision::for_targets(ctx, doc, graph).with_context(|| format!("model {name}: precision"))?;
    let stage = Partition::new(ctx, &doc, &graph);
    let (plan_digest, plan) = run(ctx.driver, &stage).with_context(|| format!("model {name}: partition"))?;
    Ok(PlannedModel { doc, plan_digest, plan, graph })
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
    // Stage: lower, once per distinct (target, kernel, configuration).
    /// A distinct lowering: target, kernel, configuration (`None`: the backend's default).
    type Lowering = (Target, Digest, Option<String>);
    let mut distinct: BTreeMap<Lowering, usize> = BTreeMap::new();
    for (i, p) in plan.partitions.iter().enumerate() {
        distinct.entry((p.target.clone(), p.kernel, p.config.clone())).or_insert(i);
    }
    let lowered: Vec<(Lowering, Digest)> = distinct
        .par_iter()
        .map(|((target, kernel, config), &first)| -> Result<(Lowering, Digest)> {
            let p = &plan.partitions[first];
            let backend = ctx.backend(target)?;
            let kernel_graph = || kernel_graph(graph()?, &p.nodes, kernel, backend.inline_const_max());
            let config_name = config.clone().unwrap_or_else(|| backend.default_config(target));
            let stage = Lower { kernel: *kernel, target, backend, graph: &kernel_graph, symbol: &p.symbol, config: &config_name };
            Ok(((target.clone(), *kernel, config.clone()), run_digest(ctx.driver, &stage)?))
        })
        .collect::<Result<_>>()
        .context("lower")?;
    let lowered: BTreeMap<Lowering, Digest> = lowered.into_iter().collect();

    // Stage: compile, one module per target that won partitions, in target-set order.
    let used_targets: Vec<&Target> = ctx.targets.targets.iter().filter(|t| plan.partitions.iter().any(|p| &p.target == *t)).collect();
    let mut modules: Vec<(Digest, Module)> = Vec::new();
    for t in &used_targets {
        let backend = ctx.backend(t)?;
        let kernels: Vec<Digest> = lowered.iter().filter(|((lt, _, _), _)| lt == *t).map(|(_, d)| *d).collect();
        let stage = Compile { target: t, backend, lowered: &kernels, toolchain: backend.environment(t), driver: ctx.driver };
        modules.push(run(ctx.driver, &stage).with_context(|| format!("compile for {t}"))?);
    }

    // Stage: link.
    let module_digests: Vec<Digest> = modules.iter().map(|(d, _)| *d).collect();
    let input = || link_input(ctx, plan, &used_targets, &modules);
    let artifact = run_digest(ctx.driver, &Link { plan_digest, modules: &module_digests, format_version: FORMAT_VERSION, input: &input }).context("link")?;
    Ok(BuiltArtifact { artifact, lowered: lowered.into_values().collect(), modules: module_digests })
}

fn link_input(ctx: &Ctx, plan: &ExecPlan, used_targets: &[&Target], modules: &[(Digest, Module)]) -> Result<LinkInput> {
    let store = ctx.driver.store();
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

#[cfg(test)]
#[path = "build_tests.rs"]
mod tests;
