//! The stage DAG of one model, every stage a [`Stage`] run through the [`Driver`]:
//!
//! load (graph document) -> partition (execution plan; asks tune for costs) -> lower (one call per distinct
//! kernel) -> compile (one module per backend, module-at-a-time) -> link (one artifact).
//!
//! Keys are built from upstream output digests, so an unchanged output cuts off everything after it; the
//! model graph itself is built or reloaded only when a stage that needs it misses.

use crate::backend::{Backend, LoweredKernel, Module};
use crate::ir::{extract_subgraph, serial::GraphDoc, Graph, NodeId, Tensor};
use crate::link::{link, LinkInput, LinkStep, ValueRef};
use crate::partition::plan::{kernel_signature, ExecPlan, PlanRef};
use crate::partition::stage::{CostMode, Partition};
use crate::stage::{load_value, run, run_digest, DevicePolicy, Driver, Stage};
use crate::target::{Target, TargetSet};
use anyhow::{bail, Context, Result};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use tessera_kernels::runtime::Registry;
use tessera_store::Digest;

/// Code versions of the stages that have no version of their own (lower carries its backend's).
pub const LOAD_VERSION: u32 = 2;
pub const COMPILE_VERSION: u32 = 1;
pub const LINK_VERSION: u32 = 1;

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

// ---- stage 0: targets ---------------------------------------------------------------------------------

/// Stage: canonical targets. Recorded so a store says which target sets were compiled for.
pub struct Targets<'a> {
    pub targets: &'a TargetSet,
}

impl Stage for Targets<'_> {
    const NAME: &'static str = "targets";
    const DEVICE: DevicePolicy = DevicePolicy::Own;
    type Output = TargetSet;
    fn version(&self) -> u32 {
        crate::target::REGISTRY_VERSION
    }
    fn key(&self) -> Result<Digest> {
        Ok(self.key_builder().input("targets", self.targets).finish()?)
    }
    fn compute(&self) -> Result<TargetSet> {
        Ok(self.targets.clone())
    }
}

// ---- stage 1: load ------------------------------------------------------------------------------------

/// Where a model's graph comes from (a fixture builder, an ONNX file): implemented by the pipeline, which
/// knows the fixtures.
pub trait GraphSource: Sync {
    /// The model's name.
    fn name(&self) -> &str;
    /// A digest of everything that determines the graph when that is known without building it (a
    /// fixture's recipe and the fixtures' version), so a hit skips building; `None` when the graph must be
    /// built to be keyed (an imported file: the import is the cheapest way to find every external data
    /// file a recipe would need).
    fn recipe(&self) -> Result<Option<Digest>>;
    /// Builds the graph and runs the graph passes every stage expects.
    fn build(&self) -> Result<Graph>;
}

/// Stage: load. Output: the graph document (constants stored separately, by digest).
pub struct Load<'a> {
    pub source: &'a dyn GraphSource,
    pub store: &'a tessera_store::Store,
    /// Key ingredient for sources without a recipe: the document's bytes, from a graph built beforehand.
    pub document: Option<Vec<u8>>,
    built: OnceLock<Graph>,
}

impl Load<'_> {
    fn document_of(&self, g: &Graph) -> Result<Vec<u8>> {
        let doc = GraphDoc::from_graph(g, |t: &Tensor| self.store.put(t.bytes()))?;
        Ok(postcard::to_stdvec(&doc)?)
    }
}

impl Stage for Load<'_> {
    const NAME: &'static str = "load";
    const DEVICE: DevicePolicy = DevicePolicy::Busy;
    type Output = Vec<u8>;
    fn version(&self) -> u32 {
        LOAD_VERSION
    }
    fn key(&self) -> Result<Digest> {
        let k = self.key_builder().env("passes", &crate::passes::PASSES_VERSION);
        Ok(match (&self.document, self.source.recipe()?) {
            (_, Some(recipe)) => k.input_digest("recipe", &recipe),
            (Some(doc), None) => k.input_bytes("graph_document", doc),
            (None, None) => bail!("model {}: a source without a recipe is keyed by its built document", self.source.name()),
        }
        .finish()?)
    }
    fn compute(&self) -> Result<Vec<u8>> {
        if let Some(doc) = &self.document {
            return Ok(doc.clone());
        }
        let g = self.source.build()?;
        let bytes = self.document_of(&g)?;
        let _ = self.built.set(g);
        Ok(bytes)
    }
    // The document is stored as the postcard encoding of `GraphDoc` itself (what `load_value` reads).
    fn encode(out: &Vec<u8>) -> Result<Vec<u8>> {
        Ok(out.clone())
    }
    fn decode(bytes: &[u8]) -> Result<Vec<u8>> {
        Ok(bytes.to_vec())
    }
}

/// Runs the load stage of one model: the graph document's digest, and the graph if it was built.
pub fn load_model(ctx: &Ctx, source: &dyn GraphSource) -> Result<(Digest, Option<Graph>)> {
    let store = ctx.driver.store();
    let mut load = Load { source, store, document: None, built: OnceLock::new() };
    if source.recipe()?.is_none() {
        let g = crate::stage::guarded(DevicePolicy::Busy, || source.build())?;
        load.document = Some(load.document_of(&g)?);
        let _ = load.built.set(g);
    }
    let doc = run_digest(ctx.driver, &load)?;
    Ok((doc, load.built.into_inner()))
}

// ---- stage 3: lower -------------------------------------------------------------------------------------

/// Stage: lower one kernel signature for one target (memoized per distinct kernel: twelve identical layers
/// lower once). The tune stage lowers candidates through this same stage, so a kernel measured while
/// partitioning is never lowered again when the model compiles.
pub struct Lower<'a> {
    pub kernel: Digest,
    pub target: &'a Target,
    pub backend: &'a dyn Backend,
    /// The means: the kernel graph (extracted from the model graph; only called on a miss).
    pub graph: &'a (dyn Fn() -> Result<Graph> + Sync),
    pub symbol: &'a str,
}

impl Stage for Lower<'_> {
    const NAME: &'static str = "lower";
    const DEVICE: DevicePolicy = DevicePolicy::Busy;
    type Output = LoweredKernel;
    fn version(&self) -> u32 {
        self.backend.version()
    }
    fn key(&self) -> Result<Digest> {
        Ok(self
            .key_builder()
            .input_digest("kernel", &self.kernel)
            .input_digest("target", &self.target.digest())
            .input("backend", self.backend.name())
            .finish()?)
    }
    fn compute(&self) -> Result<LoweredKernel> {
        let kg = (self.graph)()?;
        Ok(self.backend.lower(self.target, &kg, self.symbol)?)
    }
}

/// The kernel graph of partition `nodes` of `g`, checked against the signature the plan recorded.
pub fn kernel_graph(g: &Graph, nodes: &[u32], kernel: &Digest) -> Result<Graph> {
    let nodes: Vec<NodeId> = nodes.iter().map(|&n| NodeId(n)).collect();
    let sig = kernel_signature(g, &nodes);
    if sig.digest != *kernel {
        bail!("kernel signature changed between partition and lower ({} vs {})", sig.digest, kernel);
    }
    Ok(extract_subgraph(g, &sig))
}

// ---- stage 3: compile ----------------------------------------------------------------------------------

/// Stage: compile all of one model's lowered kernels for one target into one module (module-at-a-time).
pub struct Compile<'a> {
    pub target: &'a Target,
    pub backend: &'a dyn Backend,
    /// Digests of the lowered kernels, in (target, kernel) order.
    pub lowered: &'a [Digest],
    /// The backend's toolchain facts ([`Backend::environment`]).
    pub toolchain: Vec<(String, String)>,
    pub driver: &'a dyn Driver,
}

impl Stage for Compile<'_> {
    const NAME: &'static str = "compile";
    const DEVICE: DevicePolicy = DevicePolicy::Busy;
    type Output = Module;
    fn version(&self) -> u32 {
        COMPILE_VERSION
    }
    fn key(&self) -> Result<Digest> {
        Ok(self
            .key_builder()
            .input_digest("target", &self.target.digest())
            .input("backend", &(self.backend.name(), self.backend.version()))
            .input("lowered_kernels", self.lowered)
            .env("toolchain", &self.toolchain)
            .finish()?)
    }
    fn compute(&self) -> Result<Module> {
        let lks: Vec<LoweredKernel> = self.lowered.iter().map(|d| load_value(self.driver, d)).collect::<Result<_>>()?;
        Ok(self.backend.compile_module(self.target, &lks)?)
    }
}

// ---- stage 5: link ----------------------------------------------------------------------------------

/// Stage: link one plan's modules and constants into the artifact. Its output is the artifact file's bytes.
pub struct Link<'a> {
    pub plan_digest: &'a Digest,
    pub modules: &'a [Digest],
    /// The means: the link input (built from the plan and the modules named above).
    pub input: &'a (dyn Fn() -> Result<LinkInput> + Sync),
}

impl Stage for Link<'_> {
    const NAME: &'static str = "link";
    const DEVICE: DevicePolicy = DevicePolicy::Busy;
    type Output = Vec<u8>;
    fn version(&self) -> u32 {
        LINK_VERSION
    }
    fn key(&self) -> Result<Digest> {
        Ok(self
            .key_builder()
            .input_digest("plan", self.plan_digest)
            .input("modules", self.modules)
            .env("artifact_format", &tessera_kernels::artifact::FORMAT_VERSION)
            .finish()?)
    }
    fn compute(&self) -> Result<Vec<u8>> {
        Ok(link(&(self.input)()?)?)
    }
    // The artifact is stored as the file's bytes.
    fn encode(out: &Vec<u8>) -> Result<Vec<u8>> {
        Ok(out.clone())
    }
    fn decode(bytes: &[u8]) -> Result<Vec<u8>> {
        Ok(bytes.to_vec())
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
    // Stage: lower, once per distinct (target, kernel).
    let mut distinct: BTreeMap<(Target, Digest), usize> = BTreeMap::new();
    for (i, p) in plan.partitions.iter().enumerate() {
        distinct.entry((p.target.clone(), p.kernel)).or_insert(i);
    }
    let lowered: Vec<((Target, Digest), Digest)> = distinct
        .par_iter()
        .map(|((target, kernel), &first)| -> Result<((Target, Digest), Digest)> {
            let p = &plan.partitions[first];
            let kernel_graph = || kernel_graph(graph()?, &p.nodes, kernel);
            let stage = Lower { kernel: *kernel, target, backend: ctx.backend(target)?, graph: &kernel_graph, symbol: &p.symbol };
            Ok(((target.clone(), *kernel), run_digest(ctx.driver, &stage)?))
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
        let stage = Compile { target: t, backend, lowered: &kernels, toolchain: backend.environment(t), driver: ctx.driver };
        modules.push(run(ctx.driver, &stage).with_context(|| format!("compile for {t}"))?);
    }

    // Stage: link.
    let module_digests: Vec<Digest> = modules.iter().map(|(d, _)| *d).collect();
    let input = || link_input(ctx, plan, &used_targets, &modules);
    let artifact = run_digest(ctx.driver, &Link { plan_digest, modules: &module_digests, input: &input }).context("link")?;
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
